#!/usr/bin/env bash
# The Fisher NUTS race on MNIST (d = 785, N = 11339) on a GPU, against a deadline.
#
#   benchmarks/gpu_fisher_nuts.sh PYTHON OUTDIR [SECONDS]
#
# One process per cell, one at a time (timings), in this order: Fisher NUTS pooled and per
# chain, Fisher HMC, BlackJAX NUTS with diagonal then dense window adaptation (each cell is
# skipped when less than 30 s are left). Same protocol and settings as gpu_session.sh:
# float32 with JAX_DEFAULT_MATMUL_PRECISION=highest. Results go to
# benchmarks/results/race_gpu/mnist56/ and are packed into OUTDIR/race_gpu.tgz with the log.
set -u
cd "$(dirname "$0")/.."
PY=${1:?python}; OUT=${2:?outdir}; BUDGET=${3:-480}
T0=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - T0))); }
export JAX_DEFAULT_MATMUL_PRECISION=highest XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
pack() { tar czf "$OUT/race_gpu.tgz" benchmarks/results/race_gpu; }
trap pack EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import jax, blackjax, arviz; print('jax', jax.__version__, 'blackjax', blackjax.__version__, 'arviz', arviz.__version__, jax.devices())"
timeout 90 $PY examples/gpu.py --quick 2>&1 | tail -3
for sampler in fisher_nuts_pooled fisher_nuts fisher_hmc nuts_diag nuts_dense; do
    t=$(($(left) - 10))
    if ((t < 30)); then echo "== skipped $sampler (${t} s left)"; continue; fi
    echo "== $sampler, at most $t s"
    timeout "$t" $PY -m benchmarks.versus_blackjax --targets mnist56 --samplers "$sampler" \
        --root benchmarks/results/race_gpu 2>&1 | grep -v "^|" | tail -4
done
