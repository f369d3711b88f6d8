"""The pooled adaptive step with the rank-C update's gain formed two ways, timed A/B.

    python -m benchmarks.block_update [--dims 100,785,2000] [--rounds 5]

``cholesky`` is the library's :func:`fisher_mala.sqrt_precond.rank_block_update` (Andrews'
square root: a C x C Cholesky factorization and C x C triangular solves); ``eigh`` is its
first form, which took the gain from a symmetric eigendecomposition of ``Phi Phi^T``
(kept here as the reference). Each is compiled into the pooled FisherMALA adaptive step
(16 chains, standard Gaussian, float32), run as a ``lax.scan`` of 50 steps, and the two
are timed in interleaved rounds (best of ``--rounds``). Results:
``benchmarks/results/block_update.json``.
"""

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fisher_mala import pooled, preconditioner, sqrt_precond

RESULTS = Path(__file__).resolve().parent / "results" / "block_update.json"
STEPS = 50
CHAINS = 16

__all__ = ["eigh_block_update", "measure"]


def eigh_block_update(r, trace, phis) -> sqrt_precond.BlockUpdate:
    """The first form: ``K = V diag(1 / (sqrt(1 + mu) (sqrt(1 + mu) + 1))) V^T``."""
    mu, vecs = jnp.linalg.eigh(phis @ phis.T)
    mu = jnp.maximum(mu, 0.0)
    root = jnp.sqrt(1.0 + mu)
    gain = (vecs * (1.0 / (root * (root + 1.0)))) @ vecs.T
    inv_one_plus = (vecs * (1.0 / (1.0 + mu))) @ vecs.T
    columns = jnp.einsum("ij,cj->ic", r, phis)
    new_r = r - (columns @ gain) @ phis
    new_trace = trace - jnp.sum(inv_one_plus * (columns.T @ columns))
    return sqrt_precond.BlockUpdate(new_r, new_trace, phis, gain)


def _compiled_steps(update, state, logdensity):
    """The pooled adaptive step with ``update`` as its rank-C update, compiled."""
    original = preconditioner.rank_block_update
    preconditioner.rank_block_update = update  # looked up when the kernel is traced
    try:
        kernel = pooled.build_kernel(adapt=True)

        def run(state, key):
            def body(s, i):
                return kernel(jax.random.fold_in(key, i), s, logdensity)[0], None

            return jax.lax.scan(body, state, jnp.arange(STEPS))[0]

        return jax.jit(run, donate_argnums=0).lower(state, jax.random.key(0)).compile()
    finally:
        preconditioner.rank_block_update = original


def measure(dim: int, rounds: int = 5) -> dict:
    """Microseconds per pooled adaptive step (16 chains) with each form of the update."""

    def logdensity(x):
        return -0.5 * jnp.sum(x**2)

    state = pooled.init(jnp.full((CHAINS, dim), 0.01, jnp.float32), logdensity, 0.1)
    forms = {"cholesky": sqrt_precond.rank_block_update, "eigh": eigh_block_update}
    runs = {name: _compiled_steps(f, state, logdensity) for name, f in forms.items()}
    states = {name: jax.block_until_ready(run(jax.tree.map(jnp.copy, state), jax.random.key(0)))
              for name, run in runs.items()}
    best = dict.fromkeys(runs, np.inf)
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            states[name] = jax.block_until_ready(run(states[name], jax.random.key(1)))
            best[name] = min(best[name], (time.perf_counter() - start) / STEPS * 1e6)
    return {"dim": dim, "chains": CHAINS, "us": best,
            "cholesky_over_eigh": best["cholesky"] / best["eigh"]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", default="100,785,2000")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    rows = []
    for dim in map(int, args.dims.split(",")):
        rows.append(measure(dim, args.rounds))
        print(json.dumps(rows[-1]), flush=True)
    RESULTS.write_text(json.dumps({"device": str(jax.devices()[0]), "jax": jax.__version__,
                                   "command": "python -m benchmarks.block_update",
                                   "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
