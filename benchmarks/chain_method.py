"""Fisher NUTS with the chains batched (``vmap``) or one after the other (``lax.map``).

    python -m benchmarks.chain_method        # writes results/chain_method.json

A batch of NUTS trees waits for its longest tree, while a sequential loop cannot use the
batched matrix products: which wins depends on the target. Two repetitions of each, same
protocol as the race (4 chains, 5000 warm-up iterations, 5000 draws, min bulk ESS per
second of warm-up plus sampling).
"""

import json
from pathlib import Path

import jax
import jax.numpy as jnp

import fisher_mala as fm

OUT = Path(__file__).resolve().parent / "results" / "chain_method.json"
CELLS = (("inhomogeneous", False), ("german", False), ("kilpisjarvi", True))


def main() -> None:
    rows = []
    for name, x64 in CELLS:
        with jax.enable_x64(x64):
            target = fm.targets.get(name)
            dtype = jnp.float64 if x64 else jnp.float32
            x0 = target.initial_positions(jax.random.key(0), 4, dtype)
            for method in ("vectorized", "sequential") * 2:
                r = fm.sample(jax.random.key(1), "fisher_nuts", target.logdensity_fn, x0,
                              num_warmup=5000, num_samples=5000, chain_method=method)
                ess = float(fm.ess(r.samples, method="bulk", per_chain=False).min())
                seconds = r.warmup_seconds + r.sampling_seconds
                rows.append({"target": name, "chain_method": method, "bulk_min": ess,
                             "seconds": seconds, "bulk_min_per_second": ess / seconds})
                print(rows[-1], flush=True)
    OUT.write_text(json.dumps({"device": str(jax.devices()[0]), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
