"""Fisher NUTS with the chains batched (``vmap``) or one after the other (``lax.map``).

    python -m benchmarks.chain_method        # writes results/chain_method.json
    python -m benchmarks.chain_method --targets arK --devices 2   # redo those rows only
    python -m benchmarks.chain_method --large   # d >= 1000: results/chain_method_large.md

A batch of NUTS trees waits for its longest tree, while a sequential loop cannot use the
batched matrix products: which wins depends on the target. Two repetitions of each, same
protocol as the race (4 chains, 5000 warm-up iterations, 5000 draws, min bulk ESS per
second of warm-up plus sampling), on one XLA:CPU device and on two (``fm.sample`` splits
the chains over them, each device on its own core; one process per device count).

``--large``: the low-rank race's targets of ``d >= 1000`` (``benchmarks.low_rank_race``),
Fisher NUTS with ``rank=8``, float64, 4 chains on one device, 1500 warm-up iterations
(no stopping rule) and 500 draws, each method once: the sampling phase's time per
gradient, the warm-up's seconds, and which method ``chain_method="auto"`` picks from the
bytes of data the chains share (``fisher_mala.sampling.SHARED_BYTES_FOR_BATCH`` and
``SHARED_WORDS_PER_COORDINATE_FOR_BATCH``). Cells
cached in ``results/chain_method_large/``; the table in ``results/chain_method_large.md``.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results" / "chain_method.json"
CELLS = (
    ("inhomogeneous", False),
    ("gp", False),
    ("caravan", False),
    ("german", False),
    ("kilpisjarvi", True),
    ("arK", True),
)
DEVICES = (1, 2)


def rows_for_this_process(targets) -> list[dict]:
    import jax
    import jax.numpy as jnp

    import fisher_mala as fm

    rows = []
    for name, x64 in CELLS:
        if name not in targets:
            continue
        with jax.enable_x64(x64):
            target = fm.targets.get(name)
            dtype = jnp.float64 if x64 else jnp.float32
            x0 = target.initial_positions(jax.random.key(0), 4, dtype)
            for method in ("vectorized", "sequential") * 2:
                r = fm.sample(
                    jax.random.key(1),
                    "fisher_nuts",
                    target.logdensity_fn,
                    x0,
                    num_warmup=5000,
                    num_samples=5000,
                    chain_method=method,
                    diagnose=False,
                )
                ess = float(fm.ess(r.samples, method="bulk", per_chain=False).min())
                seconds = r.warmup_seconds + r.sampling_seconds
                rows.append(
                    {
                        "target": name,
                        "chain_method": method,
                        "devices": jax.device_count(),
                        "bulk_min": ess,
                        "seconds": seconds,
                        "bulk_min_per_second": ess / seconds,
                    }
                )
                print(rows[-1], flush=True)
    return rows


LARGE = OUT.parent / "chain_method_large"
LARGE_TARGETS = ("gaussian_lowrank", "hierarchical_logistic", "latent_gp_poisson",
                 "gaussian_lowrank_10k", "hierarchical_logistic_10k")  # fmt: skip


def large_cell(name: str, method: str) -> dict:
    """One ``--large`` cell (cached)."""
    path = LARGE / f"{name}_{method}.json"
    if path.exists():
        return json.loads(path.read_text())
    import jax
    import jax.numpy as jnp
    import numpy as np

    import fisher_mala as fm
    from benchmarks import low_rank_race
    from fisher_mala import sampling

    with jax.enable_x64(True):
        target = low_rank_race.TARGETS[name]()
        x0 = jax.random.normal(jax.random.key(0), (4, target.dim), jnp.float64) * 0.1
        shared = sampling._shared_bytes(target.logdensity_fn, x0)
        r = fm.sample(jax.random.key(1), "fisher_nuts", target.logdensity_fn, x0,
                      num_warmup=1500, num_samples=500, rank=8, stopping_rule=False,
                      chain_method=method, diagnose=False)  # fmt: skip
        grads = int(np.sum(r.sample_stats["num_grad_evals"]))
        ess = float(np.nanmin(fm.ess(np.asarray(r.samples, np.float64), method="bulk")))
        cell = {
            "target": name, "dim": target.dim, "chain_method": method,
            "shared_mb": shared / 2**20,
            "auto": sampling._auto_chain_method(True, x0, None, lambda: shared),
            "sampling_us_per_gradient": r.sampling_seconds / grads * 1e6,
            "warmup_seconds": r.warmup_seconds, "compile_seconds": r.compile_seconds,
            "bulk_min": ess, "bulk_min_per_second": ess / (r.warmup_seconds + r.sampling_seconds),
        }  # fmt: skip
    LARGE.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cell, indent=1))
    print(cell, flush=True)
    return cell


def run_large() -> str:
    """Every ``--large`` cell, then the table (markdown)."""
    from benchmarks import templating

    rows = []
    for name in LARGE_TARGETS:
        cells = {m: large_cell(name, m) for m in ("vectorized", "sequential")}
        vec, seq = cells["vectorized"], cells["sequential"]
        rows.append([
            name, vec["dim"], f"{vec['shared_mb']:.2f}",
            f"{vec['sampling_us_per_gradient']:.0f} / {seq['sampling_us_per_gradient']:.0f}",
            f"{vec['sampling_us_per_gradient'] / seq['sampling_us_per_gradient']:.2f}",
            f"{vec['warmup_seconds']:.1f} / {seq['warmup_seconds']:.1f}",
            f"{vec['bulk_min_per_second']:.1f} / {seq['bulk_min_per_second']:.1f}", vec["auto"],
        ])  # fmt: skip
    text = templating.table(
        ["target", "d", "shared data (MB)", "µs per gradient, vectorized / sequential",
         "vectorized over sequential", "warm-up s (same order)", "min ESS/s (same order)",
         "`auto` picks"], rows)  # fmt: skip
    (OUT.parent / "chain_method_large.md").write_text(text + "\n")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(name for name, _ in CELLS))
    parser.add_argument("--devices", default=",".join(map(str, DEVICES)))
    parser.add_argument("--part", type=Path, help=argparse.SUPPRESS)  # a child's output
    parser.add_argument("--large", action="store_true", help="the d >= 1000 cells")
    args = parser.parse_args()
    if args.large:
        print(run_large())
        return
    targets = args.targets.split(",")
    if args.part is not None:  # a child: one device count
        args.part.write_text(json.dumps(rows_for_this_process(targets)))
        return
    counts = [int(c) for c in args.devices.split(",")]
    old = json.loads(OUT.read_text())["rows"] if OUT.exists() else []
    rows = [r for r in old if not (r["target"] in targets and r.get("devices", 1) in counts)]
    for count in counts:
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={count}")
        part = OUT.with_suffix(f".{count}.part")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.chain_method",
                "--targets",
                args.targets,
                "--part",
                str(part),
            ],
            env=env,
            check=True,
        )
        rows += json.loads(part.read_text())
        part.unlink()
    order = {name: i for i, (name, _) in enumerate(CELLS)}
    rows.sort(key=lambda r: (r.get("devices", 1), order[r["target"]]))
    OUT.write_text(json.dumps({"device": "cpu", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
