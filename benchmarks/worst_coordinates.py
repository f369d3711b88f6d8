"""Which coordinates limit FisherMALA's min ESS on a race target, and what their marginals are.

    python -m benchmarks.worst_coordinates --target caravan

Runs FisherMALA with the race's protocol (``benchmarks.versus_blackjax``: 4 chains, same
starts and key, 5000 burn-in iterations, 5000 draws), ranks the coordinates by ArviZ bulk
ESS and reports, for the ``--worst`` lowest and for as many around the median, the bulk
ESS, the skewness and excess kurtosis of the pooled draws, and for a logistic regression the
fraction of data rows in which the coordinate's covariate is nonzero. Results:
``benchmarks/results/race/<target>/worst_coordinates.json``; ``docs/performance.md`` cites
them where FisherMALA loses the race.
"""

import argparse
import json
from pathlib import Path

import jax
import numpy as np
import scipy.stats

import fisher_mala as fm
from benchmarks.race_setup import FULL_PROTOCOL, RESULTS, race_start

__all__ = ["diagnose"]


def diagnose(target_name: str, worst: int = 5) -> dict:
    """Bulk ESS and marginal shape of the worst and of median coordinates."""
    target = fm.targets.get(target_name)
    positions, key_run = race_start(target, FULL_PROTOCOL["chains"])
    result = fm.sample(
        key_run,
        "fisher_mala",
        target.logdensity_fn,
        positions,
        num_warmup=FULL_PROTOCOL["fisher_warmup"],
        num_samples=FULL_PROTOCOL["samples"],
    )
    draws = np.asarray(result.samples, np.float64)
    bulk = fm.ess(draws, method="bulk", per_chain=False)
    flat = draws.reshape(-1, draws.shape[-1])
    order = np.argsort(bulk)
    middle = len(order) // 2
    design = target.extras.get("X")

    def describe(j):
        row = {
            "coordinate": int(j),
            "bulk_ess": float(bulk[j]),
            "skewness": float(scipy.stats.skew(flat[:, j])),
            "excess_kurtosis": float(scipy.stats.kurtosis(flat[:, j])),
        }
        if design is not None:
            row["nonzero_rows"] = float(np.mean(design[:, j] != 0))
        return row

    return {
        "target": target_name,
        "protocol": FULL_PROTOCOL,
        "dim": target.dim,
        "worst": [describe(j) for j in order[:worst]],
        "median": [describe(j) for j in order[middle - worst // 2 : middle - worst // 2 + worst]],
        "device": str(jax.devices()[0]),
        "jax": jax.__version__,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="caravan")
    parser.add_argument("--worst", type=int, default=5)
    parser.add_argument("--root", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    record = diagnose(args.target, args.worst)
    path = args.root / args.target / "worst_coordinates.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    for row in record["worst"] + record["median"]:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
