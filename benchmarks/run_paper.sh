#!/usr/bin/env bash
# The reproduction queue, cheapest cells first; every command resumes from the cache.
# Usage: benchmarks/run_paper.sh [python]   (log: benchmarks/results/run.log)
# The MNIST cells (and HMC on Caravan) came from a GPU: benchmarks/gpu_session.sh and
# benchmarks/README.md. mMALA on MNIST (a 785 x 785 Hessian over 11339 rows per iteration)
# is a GPU job; on 2 CPU cores expect hours.
set -u
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
run() { echo "== $(date -u +%H:%M:%S) $*"; "$PY" -m benchmarks.paper run "$@"; }
SMALL=gp,inhomogeneous,pima,heart,german,australian,ripley
run table1 --targets "$SMALL"
run frobenius
run variants --targets "$SMALL"
run noncentered --targets gp,ripley,pima
run table1 --targets caravan --samplers mala,fisher_mala,adamala
run variants --targets caravan
run noncentered --targets caravan
run table1 --targets caravan --samplers hmc
run table1 --targets caravan --samplers mmala --repeats 2 --iterations 5000
run table1 --targets mnist56 --samplers adamala --repeats 3
run table1 --targets mnist56 --samplers mala,fisher_mala
run variants --targets mnist56
run noncentered --targets mnist56
run table1 --targets mnist56 --samplers hmc
echo "== $(date -u +%H:%M:%S) done"
