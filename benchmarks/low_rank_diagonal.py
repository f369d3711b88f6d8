"""Which diagonal ``D`` the low-rank Fisher preconditioner should learn: the three
``low_rank_diagonal`` choices on the low-rank race's targets of ``d`` about 1000.

    python -m benchmarks.low_rank_diagonal            # every cell, cached
    python -m benchmarks.low_rank_diagonal --seed 1 --targets gaussian_lowrank  # other keys
    python -m benchmarks.low_rank_diagonal --rank 32 --diagonals learned,whitened  # k = 32
    python -m benchmarks.low_rank_diagonal --rank 32 --diagonals whitened \
        --set WHITENED_REFERENCE_RANK=32   # another constant of fisher_mala.low_rank
    python -m benchmarks.low_rank_diagonal --render   # the table only
    python -m benchmarks.low_rank_diagonal --synthetic  # the step of "whitened", d = 200

Each cell is ``benchmarks.low_rank_race``'s ``fisher_nuts_rank8`` cell (4 chains, float64,
5000 warm-up iterations, 2000 draws, the race's starts and keys) with one choice of
``low_rank_diagonal``: ``"learned"`` (``D = sqrt(Var x / F_ii)``), ``"unit"`` (the
identity) and ``"whitened"`` (the default: the correction that the whitened signals and
positions ask for at the end of each cycle, :func:`fisher_mala.low_rank._whitened_correction`).
Reported: min bulk ESS per gradient (warm-up included), and its ratio to the race's dense
Fisher NUTS cell (``benchmarks/results/low_rank_race/<target>/fisher_nuts_dense.json``,
the issue's goal: within 1.2 times, i.e. a ratio of at least 0.83). Seed 0's cells are the
race's own (``fisher_nuts_rank8``, the default, ``_unit``, ``_learned``, cached in
``benchmarks/results/low_rank_race/``); ``--seed N`` draws other starts and keys, the same
protocol, to see how much a cell moves (cells
``benchmarks/results/low_rank_diagonal/<target>/<diagonal>_seed<N>.json``). The table is in
``benchmarks/results/low_rank_diagonal.md``.

``--synthetic`` learns ``R`` alone (FisherMALA's learner, ``d = 200``, ``k = 8``) on the
two Gaussians of ``tests/test_low_rank.py`` (a diagonal spanning ``e^-2 .. e^2`` plus rank 4;
a prior ``N(0, I)`` plus four informed directions) with ``"whitened"`` at several steps
(:data:`fisher_mala.low_rank.WHITENED_STEP`) and delays, and prints the relative Frobenius
error of the trace-normalized ``A`` against the truth (printed, not cached).
"""

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks import low_rank_race, templating

RESULTS = Path(__file__).resolve().parent / "results" / "low_rank_diagonal"
TABLE = RESULTS.parent / "low_rank_diagonal.md"
TARGETS = ("gaussian_lowrank", "hierarchical_logistic", "latent_gp_poisson")
DIAGONALS = ("learned", "unit", "whitened")


#: The race's cell of each diagonal (``benchmarks.low_rank_race``): the seed-0 cells here.
RACE_SAMPLERS = {"learned": "fisher_nuts_rank8_learned", "unit": "fisher_nuts_rank8_unit",
                 "whitened": "fisher_nuts_rank8"}  # fmt: skip


def _cell_path(target_name: str, diagonal: str, seed: int, rank: int = 8) -> Path:
    if rank != 8:  # another rank: every seed kept here
        return RESULTS / target_name / f"{diagonal}_rank{rank}_seed{seed}.json"
    if not seed:  # the race's own cell
        return low_rank_race.RESULTS / target_name / f"{RACE_SAMPLERS[diagonal]}.json"
    return RESULTS / target_name / f"{diagonal}_seed{seed}.json"


def run_cell(target_name: str, diagonal: str, seed: int = 0, rank: int = 8,
             overrides=None) -> dict:  # fmt: skip
    """One cell: seed 0 at rank 8 is the race's (run there, cached there), others are kept
    here. ``overrides``: ``{name: value}`` of :mod:`fisher_mala.low_rank`'s constants for
    this cell (printed, not cached)."""
    if overrides:
        from fisher_mala import low_rank

        saved = {name: getattr(low_rank, name) for name in overrides}
        try:
            for name, value in overrides.items():
                setattr(low_rank, name, type(saved[name])(value))
            return _run(target_name, diagonal, seed, rank, None, overrides)
        finally:
            for name, value in saved.items():
                setattr(low_rank, name, value)
    if not seed and rank == 8:
        return low_rank_race.run_cell(target_name, RACE_SAMPLERS[diagonal])
    path = _cell_path(target_name, diagonal, seed, rank)
    if path.exists():
        return json.loads(path.read_text())
    return _run(target_name, diagonal, seed, rank, path)


def _run(target_name, diagonal, seed, rank, path, overrides=None) -> dict:
    target = low_rank_race.TARGETS[target_name]()
    positions, key_run = low_rank_race.race_start(target, seed)
    start = time.perf_counter()
    out = low_rank_race._fisher(target, positions, key_run, rank, low_rank_diagonal=diagonal)
    record = {"target": target_name, "diagonal": diagonal, "seed": seed, "rank": rank,
              **low_rank_race.record_of(target, out, start)}  # fmt: skip
    if overrides:
        dense = json.loads((low_rank_race.RESULTS / target_name / "fisher_nuts_dense.json")
                           .read_text())["bulk_min_per_grad"]  # fmt: skip
        print(f"{overrides}: {record['bulk_min_per_grad'] / dense:.2f} of the dense R per "
              f"gradient", end=" ")  # fmt: skip
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1))
    print(f"{target_name:22s} {diagonal:9s} k {rank} seed {seed} min ESS "
          f"{record['bulk_min']:8.1f} ESS/grad {record['bulk_min_per_grad']:.2e}",
          flush=True)  # fmt: skip
    return record


def render() -> str:
    header = ["target", "d", "diagonal", "k", "seed", "min bulk ESS", "per gradient",
              "over dense Fisher NUTS, /grad", "per second"]  # fmt: skip
    rows = []
    for target in (*TARGETS, "hierarchical_logistic_10k"):
        dense_path = low_rank_race.RESULTS / target / "fisher_nuts_dense.json"
        dense = json.loads(dense_path.read_text()) if dense_path.exists() else None
        for diagonal in DIAGONALS:
            paths = [_cell_path(target, diagonal, 0)]
            paths += sorted((RESULTS / target).glob(f"{diagonal}_seed*.json"))
            paths += sorted((RESULTS / target).glob(f"{diagonal}_rank*_seed*.json"))
            for path in (p for p in paths if p.exists()):
                c = json.loads(path.read_text())
                ratio = c["bulk_min_per_grad"] / dense["bulk_min_per_grad"] if dense else None
                rows.append([
                target, c["dim"], f"`{diagonal}`", c.get("rank", 8), c.get("seed", 0),
                f"{c['bulk_min']:.0f}",
                f"{c['bulk_min_per_grad']:.2e}", "" if ratio is None else f"{ratio:.2f}",
                f"{c['bulk_min_per_second']:.3g}",
                ])  # fmt: skip
    text = templating.table(header, rows) + "\n"
    TABLE.write_text(text)
    return text


def synthetic(steps=(1.0, 0.5, 0.25), delays=(0, 4)) -> None:
    """The learner alone on the two Gaussians of ``tests/test_low_rank.py`` (docstring)."""
    import sys

    from fisher_mala import low_rank, square_roots

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import test_low_rank as t

    default = (low_rank.WHITENED_STEP, low_rank.WHITENED_DELAY_CYCLES, low_rank.WHITENED_MAX_STEP)
    cases = (("diagonal + rank 4", t._diag_plus_low_rank, 20_000),
             ("prior + 4 informed", t._prior_plus_informed, 8_000))  # fmt: skip
    try:
        low_rank.WHITENED_MAX_STEP = 1.0  # the steps below as given
        with jax.enable_x64(True):
            for name, make, num_steps in cases:
                for diagonal in ("learned", "unit"):
                    sigma, _, rng = make()
                    root = t._learn(sigma, rng, 8, num_steps, diagonal)[0].sqrt_precond
                    dense = np.asarray(square_roots.dense(root))
                    error = t._relative_frobenius(dense @ dense.T, sigma)
                    print(f"{name:20s} {diagonal:9s}                   error {error:.3f}")
                for step in steps:
                    for delay in delays:
                        low_rank.WHITENED_STEP, low_rank.WHITENED_DELAY_CYCLES = step, delay
                        sigma, _, rng = make()
                        root = t._learn(sigma, rng, 8, num_steps, "whitened")[0].sqrt_precond
                        dense = np.asarray(square_roots.dense(root))
                        error = t._relative_frobenius(dense @ dense.T, sigma)
                        print(f"{name:20s} whitened  step {step:4.2f} delay {delay}  "
                              f"error {error:.3f}", flush=True)  # fmt: skip
    finally:
        low_rank.WHITENED_STEP, low_rank.WHITENED_DELAY_CYCLES = default[:2]
        low_rank.WHITENED_MAX_STEP = default[2]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--diagonals", default=",".join(DIAGONALS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rank", type=int, default=8, help="k (cells of k != 8 kept apart)")
    parser.add_argument("--set", nargs="*", default=(), metavar="NAME=VALUE",
                        help="fisher_mala.low_rank constants for these cells (not cached)")
    parser.add_argument("--synthetic", action="store_true")
    args = parser.parse_args(argv)
    if args.synthetic:
        synthetic()
        return
    if not args.render:
        with jax.enable_x64(True):
            for target in args.targets.split(","):
                for diagonal in args.diagonals.split(","):
                    overrides = dict(item.split("=", 1) for item in args.set)
                    run_cell(target, diagonal, args.seed, args.rank, overrides)
        if args.set:
            return
    print(render())


if __name__ == "__main__":
    main()
