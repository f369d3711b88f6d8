"""What summing tr(R R^T) from R costs the adaptive FisherMALA step.

    python -m benchmarks.trace_cost [--dims 100,785,2000] [--steps 200]

The adaptive step sums the trace from the updated ``R`` (exact whatever the target's
scale). The O(d) subtraction of Proposition 4 costs nothing but drifts (see
``fisher_mala.sqrt_precond``, *Trace bookkeeping*). This times, in one process and
alternating, the adaptive step on a standard Gaussian (one chain, float32, jitted
``lax.scan`` of ``--steps`` steps, best of 5) with the exact trace and with the O(d)
update, and writes ``results/trace_cost.json``.
"""

import argparse
import functools
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fisher_mala import fisher, sqrt_precond
from fisher_mala.adaptations import fisher as preconditioner
from fisher_mala.adaptations import robbins_monro

RESULTS = Path(__file__).resolve().parent / "results" / "trace_cost.json"


def _kernel(exact: bool):
    """The adaptive kernel, built with the O(d) trace update when ``exact`` is False."""
    original = preconditioner.rank_one_update
    if not exact:
        preconditioner.rank_one_update = functools.partial(
            sqrt_precond.rank_one_update, exact_trace=False
        )
    try:
        return fisher.adaptive_step(
            preconditioner.fisher_preconditioner(fisher.DAMPING), robbins_monro(), "rao_blackwell"
        )
    finally:
        preconditioner.rank_one_update = original


def measure(dim: int, steps: int) -> dict:
    def logdensity(x):
        return -0.5 * jnp.sum(x**2)

    state = fisher.init(jnp.full(dim, 0.1, jnp.float32), logdensity, 0.1)
    keys = jax.random.split(jax.random.key(0), steps)
    runs = {}
    for exact in (True, False):
        kernel = _kernel(exact)
        runs[exact] = jax.jit(
            lambda s, kernel=kernel: jax.lax.scan(lambda c, k: kernel(k, c, logdensity), s, keys)
        )
        jax.block_until_ready(runs[exact](state))
    best = {True: np.inf, False: np.inf}
    for _ in range(5):
        for exact in (True, False):
            start = time.perf_counter()
            jax.block_until_ready(runs[exact](state))
            best[exact] = min(best[exact], time.perf_counter() - start)
    exact_us, tracked_us = (1e6 * best[e] / steps for e in (True, False))
    return {
        "dim": dim,
        "exact_us": exact_us,
        "tracked_us": tracked_us,
        "ratio": exact_us / tracked_us,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", default="100,785,2000")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows = []
    for dim in (int(d) for d in args.dims.split(",")):
        rows.append(measure(dim, args.steps))
        r = rows[-1]
        print(
            f"d = {dim:5d}: adaptive step {r['exact_us']:9.1f} us with the exact trace, "
            f"{r['tracked_us']:9.1f} us with the O(d) update: x {r['ratio']:.2f}",
            flush=True,
        )
    args.out.write_text(
        json.dumps(
            {"command": "python -m benchmarks.trace_cost", "jax": jax.__version__, "rows": rows},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
