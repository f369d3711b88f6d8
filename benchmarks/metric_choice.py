"""Which metric ``metric="auto"`` gives Fisher NUTS on each race target, and why.

    python -m benchmarks.metric_choice        # writes results/metric_choice.json

Runs the race's Fisher phase (same starts, keys and length: 4 chains, 5000 warm-up
iterations of which 4500 learn ``R``) in its two parts, and records, at the first look
(``FisherHMCWarmup.first_fisher_iterations``) and at the end of the phase, per chain, the
condition number of the learned correlation matrix, the bound that sampling noise alone
allows (``DIAGONAL_NOISE_FACTOR`` times the Marchenko-Pastur ratio for that many signals)
and the choice (``FisherHMCWarmup.choose``). ``fm.sample`` stops at the first look when
it says diagonal; the end is measured for every target all the same, to show that the
two looks agree.
"""

import json
from pathlib import Path

import jax
import numpy as np

import fisher_mala as fm
from benchmarks import templating
from benchmarks.race_setup import POSTERIORDB, TARGETS, race_start
from fisher_mala import whitened_warmup
from fisher_mala.adaptations import stopping_rule as stopping_rule_checks

OUT = Path(__file__).resolve().parent / "results" / "metric_choice.json"
WARMUP = 5000


def look(warmup, state, dim) -> dict:
    """The metric rule's numbers for the Fisher phase's state of every chain."""
    kappa = stopping_rule_checks.correlation_condition_number(state.sqrt_precond)
    noise = stopping_rule_checks.noise_condition_number(dim, np.asarray(state.count))
    return {
        "signals": int(np.min(state.count)),
        "condition_number": [float(k) for k in kappa],
        "bound": float(stopping_rule_checks.DIAGONAL_NOISE_FACTOR * np.max(noise)),
        "choice": warmup.choose(state),
    }


def row(name: str) -> dict:
    with jax.enable_x64(name in POSTERIORDB):
        target = fm.targets.get(name)
        positions, key_run = race_start(target, 4)
        warmup = whitened_warmup.FisherHMCWarmup(target.logdensity_fn)
        # fm.sample's per-chain keys, then fold_in 0
        keys = jax.vmap(lambda k: jax.random.fold_in(k, 0))(jax.random.split(key_run, 4))
        first = jax.jit(jax.vmap(lambda k, x: warmup.fisher_stage(k, x, WARMUP)))(keys, positions)
        looks = [look(warmup, first[0][0], target.dim)]
        if not warmup.fisher_complete(first, WARMUP):
            whole = jax.jit(jax.vmap(lambda k, out: warmup.fisher_resume(k, out, WARMUP)))(
                keys, first
            )
            looks.append(look(warmup, whole[0][0], target.dim))
        choice = "diagonal" if looks[0]["choice"] == "diagonal" else looks[-1]["choice"]
        return {"target": name, "dim": target.dim, "looks": looks, "choice": choice}


def render(path=OUT) -> str:
    """The table of ``docs/fisher_nuts.md``."""
    header = [
        "target", "d", "first look: signals, condition numbers (4 chains), bound",
        "end of the Fisher phase: signals, condition numbers, bound", "metric",
    ]  # fmt: skip
    rows = []

    def cell(r):
        kappa = ", ".join(f"{k:.3g}" for k in r["condition_number"])
        return f"{r['signals']}: {kappa} (bound {r['bound']:.2f}, {r['choice']})"

    for r in json.loads(path.read_text()):
        looks = r["looks"]
        end = cell(looks[1]) if len(looks) > 1 else "(first look is the end)"
        rows.append([r["target"], r["dim"], cell(looks[0]), end, r["choice"]])
    return templating.table(header, rows)


def main():
    names = [t for t in (*TARGETS, *POSTERIORDB) if t != "mnist56"]
    rows = [row(name) for name in names]
    for r in rows:
        print(r, flush=True)
    OUT.write_text(json.dumps(rows, indent=1))
    print(render())


if __name__ == "__main__":
    main()
