"""One XLA:CPU device, every core: the chains' groups run from threads, or one program.

    python -m benchmarks.chain_threads           # writes results/chain_threads.{json,md}
    python -m benchmarks.chain_threads --render  # the table only
    python -m benchmarks.chain_threads --large   # results/chain_threads_large.{json,md}

``fm.sample`` on one XLA:CPU device runs the independent chains in groups, one per core,
each group's program started from its own thread (:mod:`fisher_mala.chain_threads`).
Each cell runs the same call both ways in one process, twice, interleaved (``one
program``: ``chain_groups`` held at 1, as before the groups), 4 chains, the race's starts:
Fisher NUTS (float64, 5000 warm-up iterations, 5000 draws, ``chain_method="auto"``) on
posteriors of the Fisher NUTS race, and the quickstart's FisherMALA and MALA (the GP target,
float32, 20 000 + 20 000) and FisherMALA on mnist56 (d = 785, float32, 2000 + 2000), grouped
here whatever ``fisher_mala.sampling.GROUPS_MAX_DIM`` says (the default groups the chains
up to that dimension only). Score: min bulk ESS per second of warm-up plus sampling
(compilation apart), and the seconds of each; the last column compares the draws of the
two ways (bit-identical, or their largest difference).

``--large`` (``results/chain_threads_large.{json,md}``) does the same for chains run one
after the other above ``GROUPS_MAX_DIM``, which ``fm.sample`` groups at every dimension:
Fisher NUTS (float64, 2000 warm-up iterations, 1000 draws, ``chain_method="auto"``, which
runs them sequentially there) on the low-rank race's targets (:mod:`benchmarks.low_rank_race`,
its starts), with the dense ``R`` at d = 1000 and ``rank=8`` at d = 10 000, once each way;
and FisherMALA on mnist56 with ``chain_method="sequential"`` (37 MB of data, a dense ``R``:
the case where one chain's products are largest).
"""

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks import templating

OUT = Path(__file__).resolve().parent / "results" / "chain_threads.json"
TABLE = OUT.with_suffix(".md")
OUT_LARGE = OUT.with_name("chain_threads_large.json")
TABLE_LARGE = OUT_LARGE.with_suffix(".md")
#: (target, sampler, float64, warm-up, draws)
CELLS = (
    ("german", "fisher_nuts", True, 5000, 5000),
    ("arK", "fisher_nuts", True, 5000, 5000),
    ("kilpisjarvi", "fisher_nuts", True, 5000, 5000),
    ("inhomogeneous", "fisher_nuts", True, 5000, 5000),
    ("gp", "fisher_nuts", True, 5000, 5000),
    ("caravan", "fisher_nuts", True, 5000, 5000),
    ("gp", "fisher_mala", False, 20_000, 20_000),
    ("gp", "mala", False, 20_000, 20_000),
    ("mnist56", "fisher_mala", False, 2000, 2000),
)
REPEATS = 2
#: ``--large``: (target, sampler, rank or None, chain_method, warm-up, draws); the race's
#: targets by name, else the library's (float32 there, as the table above).
LARGE_CELLS = (
    ("gaussian_lowrank", "fisher_nuts", None, "auto", 2000, 1000),
    ("gaussian_lowrank_10k", "fisher_nuts", 8, "auto", 2000, 1000),
    ("hierarchical_logistic_10k", "fisher_nuts", 8, "auto", 2000, 1000),
    ("mnist56", "fisher_mala", None, "sequential", 2000, 2000),
)


def _sample(target, x0, sampler, grouped: bool, num_warmup, num_samples, **options):
    """One ``fm.sample`` call, grouped whatever the dimension or held to one program."""
    import jax

    import fisher_mala as fm
    from fisher_mala import sampling

    original = sampling.chain_groups, sampling.GROUPS_MAX_DIM
    if grouped:  # whatever the dimension (the default groups up to GROUPS_MAX_DIM)
        sampling.GROUPS_MAX_DIM = float("inf")
    else:
        sampling.chain_groups = lambda num_chains: 1
    try:
        r = fm.sample(jax.random.key(1), sampler, target.logdensity_fn, x0,
                      num_warmup=num_warmup, num_samples=num_samples, diagnose=False,
                      **options)  # fmt: skip
    finally:
        sampling.chain_groups, sampling.GROUPS_MAX_DIM = original
    draws = np.asarray(r.samples)
    ess = float(np.nanmin(fm.ess(draws, method="bulk")))
    seconds = r.warmup_seconds + r.sampling_seconds
    row = {"warmup": r.warmup_seconds, "sampling": r.sampling_seconds,
           "bulk_min": ess, "bulk_min_per_second": ess / seconds}  # fmt: skip
    return row, draws


def _run(cell, grouped: bool) -> tuple[dict, np.ndarray]:
    import jax
    import jax.numpy as jnp

    import fisher_mala as fm

    name, sampler, x64, num_warmup, num_samples = cell
    with jax.enable_x64(x64):
        target = fm.targets.get(name)
        x0 = target.initial_positions(jax.random.key(0), 4, jnp.float64 if x64 else jnp.float32)
        return _sample(target, x0, sampler, grouped, num_warmup, num_samples)


def _run_large(cell, grouped: bool) -> tuple[dict, np.ndarray]:
    import jax

    import fisher_mala as fm
    from benchmarks import low_rank_race

    name, sampler, rank, chain_method, num_warmup, num_samples = cell
    options = {"chain_method": chain_method} | ({} if rank is None else {"rank": rank})
    if name not in low_rank_race.TARGETS:
        target = fm.targets.get(name)
        x0 = target.initial_positions(jax.random.key(0), 4)
        return _sample(target, x0, sampler, grouped, num_warmup, num_samples, **options)
    with jax.enable_x64(True):  # the race's protocol: its starts, float64, no stopping rule
        target = low_rank_race.TARGETS[name]()
        x0, _ = low_rank_race.race_start(target)
        return _sample(target, x0, sampler, grouped, num_warmup, num_samples,
                       metric="dense", stopping_rule=False, **options)  # fmt: skip


def run(large: bool = False) -> dict:
    import jax

    from fisher_mala.chain_threads import chain_groups

    cells, run_one, repeats = (LARGE_CELLS, _run_large, 1) if large else (CELLS, _run, REPEATS)
    rows = []
    for cell in cells:
        runs = {"one_program": [], "threads": []}
        draws = {}
        for _ in range(repeats):
            for variant in runs:
                row, draws[variant] = run_one(cell, variant == "threads")
                runs[variant].append(row)
        rows.append({
            "target": cell[0], "sampler": cell[1] + (f" rank={cell[2]}" if large and cell[2]
                                                     else ""), **runs,
            "bit_identical": bool(np.array_equal(draws["one_program"], draws["threads"])),
            "max_abs_difference": float(np.max(np.abs(draws["one_program"] - draws["threads"]))),
        })  # fmt: skip
        print(rows[-1], flush=True)
    from fisher_mala.sampling import GROUPS_MAX_DIM

    out = {"device": str(jax.devices()[0]), "groups": chain_groups(4), "jax": jax.__version__,
           "groups_max_dim": GROUPS_MAX_DIM, "rows": rows}  # fmt: skip
    (OUT_LARGE if large else OUT).write_text(json.dumps(out, indent=1))
    return out


def _rate(value: float) -> str:
    """A min ESS per second, whole above 100, else three figures."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def render(out: dict) -> str:
    header = ["target", "sampler", "min ESS/s: one program", "min ESS/s: threads",
              "ratio (medians)", "warm-up + sampling s: one program",
              "warm-up + sampling s: threads", "same draws"]  # fmt: skip
    lines = []
    for r in out["rows"]:
        one = [x["bulk_min_per_second"] for x in r["one_program"]]
        two = [x["bulk_min_per_second"] for x in r["threads"]]

        def secs(runs):
            return ", ".join(f"{x['warmup']:.2f} + {x['sampling']:.2f}" for x in runs)

        lines.append([
            r["target"], r["sampler"], ", ".join(_rate(v) for v in one),
            ", ".join(_rate(v) for v in two), f"{np.median(two) / np.median(one):.2f}",
            secs(r["one_program"]), secs(r["threads"]),
            "bit-identical" if r["bit_identical"] else f"max diff {r['max_abs_difference']:.1e}",
        ])  # fmt: skip
    return templating.table(header, lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true")
    parser.add_argument(
        "--large",
        action="store_true",
        help="sequential chains above GROUPS_MAX_DIM (module docstring)",
    )
    args = parser.parse_args(argv)
    path, table = (OUT_LARGE, TABLE_LARGE) if args.large else (OUT, TABLE)
    out = json.loads(path.read_text()) if args.render else run(args.large)
    table.write_text(render(out))
    print(table.read_text())


if __name__ == "__main__":
    main()
