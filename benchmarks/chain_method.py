"""Fisher NUTS with the chains batched (``vmap``) or one after the other (``lax.map``).

    python -m benchmarks.chain_method        # writes results/chain_method.json
    python -m benchmarks.chain_method --targets arK --devices 2   # redo those rows only

A batch of NUTS trees waits for its longest tree, while a sequential loop cannot use the
batched matrix products: which wins depends on the target. Two repetitions of each, same
protocol as the race (4 chains, 5000 warm-up iterations, 5000 draws, min bulk ESS per
second of warm-up plus sampling), on one XLA:CPU device and on two (``fm.sample`` splits
the chains over them, each device on its own core; one process per device count).
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(name for name, _ in CELLS))
    parser.add_argument("--devices", default=",".join(map(str, DEVICES)))
    parser.add_argument("--part", type=Path, help=argparse.SUPPRESS)  # a child's output
    args = parser.parse_args()
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
