"""Which metric ``metric="auto"`` gives Fisher NUTS on each race target, and why.

    python -m benchmarks.metric_choice        # writes results/metric_choice.json
    python -m benchmarks.metric_choice --targets hmm_drive_0,sblri --warmup 20000 --seed 1
                                              # other targets, lengths, seeds: printed only

Runs ``fm.sample(key, "fisher_nuts", ...)`` with the race's starts and keys (4 chains,
5000 warm-up iterations at most) and records every call of the metric rule
(``FisherHMCWarmup.choose``, on the host between the compiled stages), per chain: the
condition number of the learned correlation matrix, the bound that sampling noise alone
allows (``DIAGONAL_NOISE_FACTOR`` times the Marchenko-Pastur ratio for that many signals),
and the choice. Where the stopping rule looks, the rule is called once, when the Fisher
phase ends.
"""

import argparse
import json
import warnings
from pathlib import Path
from unittest import mock

import jax
import numpy as np

import fisher_mala as fm
from benchmarks import templating
from benchmarks.race_setup import POSTERIORDB, TARGETS, race_start
from fisher_mala import whitened_warmup
from fisher_mala.adaptations.stopping_rule import (
    DIAGONAL_NOISE_FACTOR,
    correlation_condition_number,
    noise_condition_number,
)
from fisher_mala.targets import posteriordb_more

OUT = Path(__file__).resolve().parent / "results" / "metric_choice.json"
WARMUP = 5000


def look(state, dim, choice) -> dict:
    """The metric rule's numbers for the Fisher phase's state of every chain."""
    kappa = correlation_condition_number(state.sqrt_precond)
    noise = noise_condition_number(dim, np.asarray(state.count))
    return {
        "signals": int(np.min(state.count)),
        "condition_number": [float(k) for k in kappa],
        "bound": float(DIAGONAL_NOISE_FACTOR * np.max(noise)),
        "choice": choice,
    }


def row(name: str, num_warmup: int = WARMUP, seed: int = 0) -> dict:
    """Every look of the metric rule in ``fm.sample(key, "fisher_nuts", ...)`` on ``name``
    with the race's starts and keys of ``seed`` (float64 for posteriordb posteriors)."""
    looks = []
    choose = whitened_warmup.FisherHMCWarmup.choose

    def recorded(warmup, fisher_state, learned=None):
        choice = choose(warmup, fisher_state, learned)
        looks.append(look(fisher_state, np.shape(fisher_state.sqrt_precond)[-1], choice))
        return choice

    with jax.enable_x64(name in POSTERIORDB or name in posteriordb_more.POSTERIORS):
        target = fm.targets.get(name)
        positions, key = race_start(target, 4, seed)
        with mock.patch.object(whitened_warmup.FisherHMCWarmup, "choose", recorded):
            fm.sample(key, "fisher_nuts", target.logdensity_fn, positions, num_warmup=num_warmup,
                      num_samples=1, diagnose=False)  # fmt: skip
    return {"target": name, "dim": target.dim, "looks": looks, "choice": looks[-1]["choice"]}


def render(path=OUT) -> str:
    """The table of ``docs/fisher_nuts.md``: every look of the rule, the last one decides."""
    header = ["target", "d", "looks: signals, condition numbers (4 chains), bound", "metric"]
    rows = []
    for r in json.loads(path.read_text()):
        cells = []
        for k in r["looks"]:
            kappa = ", ".join(f"{x:.3g}" for x in k["condition_number"])
            cells.append(f"{k['signals']}: {kappa} (bound {k['bound']:.2f}, {k['choice']})")
        rows.append([r["target"], r["dim"], "; ".join(cells), r["choice"]])
    return templating.table(header, rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", help="comma-separated names (printed, not saved)")
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    names = [t for t in (*TARGETS, *POSTERIORDB) if t != "mnist56"]
    custom = args.targets is not None or args.warmup != WARMUP or args.seed != 0
    if args.targets is not None:
        names = args.targets.split(",")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a one-draw run's checks say nothing
        rows = []
        for name in names:
            rows.append(row(name, args.warmup, args.seed))
            print(rows[-1], flush=True)
    if custom:
        return
    OUT.write_text(json.dumps(rows, indent=1))
    print(render())


if __name__ == "__main__":
    main()
