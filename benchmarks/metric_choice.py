"""Which metric ``metric="auto"`` gives Fisher NUTS on each race target, and why.

    python -m benchmarks.metric_choice        # writes results/metric_choice.json

Runs the race's Fisher phase (same starts, keys and length: 4 chains, 5000 warm-up
iterations of which 4500 learn ``R``) and records, per chain, the condition number of the
learned correlation matrix, the bound that sampling noise alone allows
(``DIAGONAL_NOISE_FACTOR`` times the Marchenko-Pastur ratio for that many signals) and
the resulting choice (``fisher_mala.whitened_warmup.FisherHMCWarmup.choose``).
"""

import json
from pathlib import Path

import jax
import numpy as np

import fisher_mala as fm
from benchmarks.versus_blackjax import POSTERIORDB, TARGETS, race_start
from fisher_mala import whitened_warmup

OUT = Path(__file__).resolve().parent / "results" / "metric_choice.json"
WARMUP = 5000


def row(name: str) -> dict:
    with jax.enable_x64(name in POSTERIORDB):
        target = fm.targets.get(name)
        positions, key_run = race_start(target, 4)
        warmup = whitened_warmup.FisherHMCWarmup(target.logdensity_fn)
        keys = jax.random.split(key_run, 4)  # fm.sample's per-chain keys, then fold_in 0

        def first(key, x):
            return warmup.fisher_stage(jax.random.fold_in(key, 0), x, WARMUP)

        state = jax.jit(jax.vmap(first))(keys, positions)[0][0]
        kappa = whitened_warmup.correlation_condition_number(state.sqrt_precond)
        noise = whitened_warmup.noise_condition_number(target.dim, np.asarray(state.count))
        return {"target": name, "dim": target.dim, "signals": int(np.min(state.count)),
                "condition_number": [float(k) for k in kappa],
                "bound": float(whitened_warmup.DIAGONAL_NOISE_FACTOR * np.max(noise)),
                "choice": warmup.choose(state)}


def render(path=OUT) -> str:
    """The table of ``docs/fisher_nuts.md``."""
    if not path.exists():
        return ""
    lines = ["| target | d | learned correlation's condition number (4 chains) | bound | "
             "metric |", "|---|---|---|---|---|"]
    for r in json.loads(path.read_text()):
        kappa = ", ".join(f"{k:.3g}" for k in r["condition_number"])
        lines.append(f"| {r['target']} | {r['dim']} | {kappa} | {r['bound']:.2f} | "
                     f"{r['choice']} |")
    return "\n".join(["Fisher NUTS's `metric=\"auto\"` after the race's Fisher phase "
                      "(`python -m benchmarks.metric_choice`): diagonal when every chain's "
                      "learned correlation matrix is within the sampling-noise bound:", "",
                      *lines])


def main():
    names = [t for t in (*TARGETS, *POSTERIORDB) if t != "mnist56"]
    rows = [row(name) for name in names]
    for r in rows:
        print(r, flush=True)
    OUT.write_text(json.dumps(rows, indent=1))
    print(render())


if __name__ == "__main__":
    main()
