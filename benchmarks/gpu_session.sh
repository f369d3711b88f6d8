#!/usr/bin/env bash
# Everything that needs an accelerator, in one call, against a deadline.
#
#   benchmarks/gpu_session.sh PYTHON OUTDIR [SECONDS]
#
# 1. (concurrently, one process per cell: their wall-clock times are not comparable) the
#    reproduction cells that 2 CPU cores cannot afford: every MNIST cell, mMALA with a
#    Hessian of 785 x 785 over 11339 rows per iteration (3 repetitions at the paper's
#    length, plus a 2 x 5000 fallback in a separate cache), HMC and mMALA on Caravan;
# 2. (alone, for timings) the BlackJAX race on MNIST, the step-cost benchmark (float32,
#    d >= 785), then the race on the other targets while time is left.
# Float32 matrix products use full precision (JAX_DEFAULT_MATMUL_PRECISION=highest), not
# TF32, so that the chains target the same density as on a CPU. Results are written into
# benchmarks/results/ (race: results/race_gpu/, step cost: results/step_cost_gpu.json) and
# packed into OUTDIR/results.tgz with the logs before SECONDS (default 540) have passed.
# SMOKE=1 shrinks every run to a few iterations (to try the script on a CPU first).
set -u
cd "$(dirname "$0")/.."
PY=${1:?python}; OUT=${2:?outdir}; BUDGET=${3:-540}
T0=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - T0))); }
upto() { local t=$(($(left) - $1)); ((t < 1)) && t=1; echo $t; }  # never "timeout 0"
if [[ -n ${SMOKE:-} ]]; then
    P=(--iterations 50 --repeats 2) R=(--samples 50 --fisher-warmup 50 --nuts-warmup 50)
    S=(--dims 100 --steps 3)
else
    P=() R=() S=(--dims 785,2000,4000 --steps 200)
fi
LOGS=$(mktemp -d)/logs
log() { echo "== +$(($(date +%s) - T0)) s $*"; }
export JAX_DEFAULT_MATMUL_PRECISION=highest XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$LOGS"
pack() {
    log "packing"
    tar czf "$OUT/results.tgz" benchmarks/results/mnist56 benchmarks/results/caravan \
        benchmarks/results/race_gpu benchmarks/results/step_cost_gpu.json \
        benchmarks/results/mmala_fallback -C "$(dirname "$LOGS")" logs 2>/dev/null
    log "packed"
}
trap pack EXIT

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import jax; print('jax', jax.__version__, jax.devices())"
timeout 60 $PY examples/gpu.py --quick > "$LOGS/gpu_example_quick.log" 2>&1
tail -3 "$LOGS/gpu_example_quick.log"

# 1. Reproduction cells, concurrently, until 300 s before the end.
PHASE1=$(upto 260)
cell() {  # name, args...
    local name=$1; shift
    timeout "$PHASE1" $PY -m benchmarks.paper run "$@" "${P[@]}" > "$LOGS/$name.log" 2>&1 &
}
log "phase 1: reproduction cells, ${PHASE1} s"
cell mnist_table1_fast table1 --targets mnist56 --samplers mala,fisher_mala
cell mnist_adamala table1 --targets mnist56 --samplers adamala
cell mnist_hmc table1 --targets mnist56 --samplers hmc
cell mnist_mmala table1 --targets mnist56 --samplers mmala --repeats 3
if [[ -z ${SMOKE:-} ]]; then
    cell mnist_mmala_fallback table1 --targets mnist56 --samplers mmala --repeats 2 \
        --iterations 5000 --root benchmarks/results/mmala_fallback
fi
cell mnist_variants variants --targets mnist56
cell mnist_noncentered noncentered --targets mnist56
cell caravan_hmc table1 --targets caravan --samplers hmc
cell caravan_mmala table1 --targets caravan --samplers mmala
wait
log "phase 1 done"; grep -h "computed\|Error" "$LOGS"/*.log

# 2. Timings, one process at a time.
log "race on MNIST"
timeout "$(upto 150)" $PY -m benchmarks.versus_blackjax --targets mnist56 "${R[@]}" \
    --root benchmarks/results/race_gpu 2>&1 | tee "$LOGS/race_mnist.log"
log "step cost"
timeout "$(upto 60)" $PY -m benchmarks.step_cost "${S[@]}" --dtypes float32 \
    --out benchmarks/results/step_cost_gpu.json 2>&1 | tee "$LOGS/step_cost.log"
log "race on the other targets"
timeout "$(upto 15)" $PY -m benchmarks.versus_blackjax "${R[@]}" \
    --targets ripley,pima,heart,australian,german,gp,inhomogeneous,caravan \
    --root benchmarks/results/race_gpu 2>&1 | tee "$LOGS/race_rest.log"
log "end"
