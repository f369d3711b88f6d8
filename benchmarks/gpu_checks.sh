#!/usr/bin/env bash
# The run's own checks and the low-rank preconditioner's scaling on a GPU, in one call,
# against a deadline.
#
#   benchmarks/gpu_checks.sh PYTHON OUTDIR [SECONDS]
#
# One process at a time (timings), each with its own share of the deadline:
# 1. the README's quickstart, full length (examples/quickstart.py: both samplers' compile,
#    warm-up, sampling and whole-call seconds, the checks included);
# 2. the diagnostics-cost cells (python -m benchmarks.diagnostics_cost --no-arviz --rerun:
#    the recorded cells of this device are replaced): the quickstart's and mnist56's
#    fm.sample call against fm.diagnose on its draws; then the pass's plan for the host's
#    cores (--plans: workers and seconds for 2 to 16 cores, on the host's own cores);
# 3. the low-rank learner per iteration, d = 10^3 to 10^6, k = 8, 32, 128, and the memory of
#    its step-size widening (python -m benchmarks.scaling --low-rank / --low-rank-widening);
# 4. the dense R per iteration up to the largest d that fits (python -m benchmarks.scaling
#    --dims).
# Float32 matrix products at full precision (JAX_DEFAULT_MATMUL_PRECISION=highest, not TF32),
# as in gpu_session.sh. Cells land in benchmarks/results/ (diagnostics_cost/*_<device>.json,
# scaling/<device>/); they and the logs are packed into OUTDIR/gpu_checks.tgz at the end.
# SMOKE=1 shrinks every stage to a few iterations (to try the script on a CPU first).
set -u
cd "$(dirname "$0")/.."
PY=${1:?python}; OUT=${2:?outdir}; BUDGET=${3:-540}
T0=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - T0))); }
share() { local t=$(($(left) * $1 / 100)); ((t < 1)) && t=1; echo $t; }  # percent of what is left
log() { echo "== +$(($(date +%s) - T0)) s $*"; }
export JAX_DEFAULT_MATMUL_PRECISION=highest XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LOGS=$(mktemp -d)/logs
mkdir -p "$LOGS"
pack() {  # the cells and the logs, not the quickstart's draws (a 16 MB limit on what returns)
    log "packing"
    rm -f "$LOGS"/quickstart/*.nc
    tar czf "$OUT/gpu_checks.tgz" benchmarks/results/diagnostics_cost benchmarks/results/scaling \
        -C "$(dirname "$LOGS")" logs 2>/dev/null
}
trap pack EXIT
STAGES=${STAGES:-1234}  # which stages to run, e.g. STAGES=124
if [[ -n ${SMOKE:-} ]]; then
    Q=(--quick) LR=(--low-rank 1000 --ranks 8 --steps 64) W=(--low-rank-widening 1000 --ranks 8)
    D=(--dims 1000 --steps 3) CELLS=(--cells quickstart_mala)
else
    Q=() LR=(--low-rank 1000,4000,16000,100000,1000000 --ranks 8,32,128)
    W=(--low-rank-widening 1000,4000,16000,100000,1000000 --ranks 8,32,128)
    D=(--dims ${DENSE_DIMS:-16000,64000,120000,150000,170000} --steps 20)
    CELLS=(--cells quickstart_mala,quickstart_fisher_mala,mnist56_fisher_mala,mnist56_fisher_nuts)
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import jax, arviz; print('jax', jax.__version__, 'arviz', arviz.__version__, jax.devices())"

[[ $STAGES == *1* ]] && log "1. quickstart" && timeout "$(share 30)" $PY examples/quickstart.py "${Q[@]}" --out "$LOGS/quickstart" \
    2>&1 | tee "$LOGS/quickstart.log" | grep -v "^- "
[[ $STAGES == *2* ]] && log "2. diagnostics cost" && timeout "$(share ${SHARE2:-35})" $PY -m benchmarks.diagnostics_cost --no-arviz --rerun "${CELLS[@]}" \
    2>&1 | tee "$LOGS/diagnostics_cost.log" | tail -12
[[ $STAGES == *2* ]] && timeout "$(share 10)" $PY -m benchmarks.diagnostics_cost --plans \
    2>&1 | tee "$LOGS/diagnostics_plans.log"
[[ $STAGES == *3* ]] && log "3. low-rank scaling" && timeout "$(share 50)" \
    $PY -m benchmarks.scaling "${LR[@]}" 2>&1 | tee "$LOGS/low_rank.log" | grep "^low_rank"
[[ $STAGES == *3* ]] && timeout "$(share 30)" $PY -m benchmarks.scaling "${W[@]}" 2>&1 | tee "$LOGS/widening.log" \
    | grep "^low_rank"
[[ $STAGES == *4* ]] && log "4. dense R" && timeout "$(($(left) - 10))" $PY -m benchmarks.scaling "${D[@]}" 2>&1 | tee "$LOGS/dense.log" \
    | grep -v "^ "
log "end"
