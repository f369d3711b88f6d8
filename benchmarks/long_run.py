"""Long-run numerics of the Prop. 4 recursion: float32 against float64 on the same signals.

    python -m benchmarks.long_run --updates 1000000 --dim 50

Signals are Rao-Blackwellized-like increments ``sqrt(alpha) L z`` (``z ~ N(0, I)``,
``alpha ~ U(0, 1)``, ``L L^T`` a Fisher matrix with eigenvalues from 1e-2 to 1e2), drawn
in float64 and fed to both precisions. Reports the relative Frobenius error of
``R R^T`` in float32 against float64, the smallest eigenvalue of ``R R^T`` (float32), and
the relative error of the O(d)-tracked trace against ``sum(R * R)`` without and with the
re-anchoring every 1000 updates that the warm-up driver does.
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from fisher_mala.sqrt_precond import initial_sqrt_precond, rank_one_update


def long_run(num_updates: int, dim: int, refresh_every: int = 1000, seed: int = 0) -> dict:
    """Run both precisions; return the error figures (see the module docstring)."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(seed)
        q, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
        chol = q * np.sqrt(np.geomspace(1e-2, 1e2, dim))
        chol64 = jnp.asarray(chol)
        r64, t64 = initial_sqrt_precond(dim, 10.0, jnp.float64)
        r32, t32 = initial_sqrt_precond(dim, 10.0, jnp.float32)
        carry = (r64, t64, r32, t32, t32)  # last: float32 trace without re-anchoring

        def update(carry, key):
            r64, t64, r32, t32, t32_raw = carry
            kz, ka = jax.random.split(key)
            s = jnp.sqrt(jax.random.uniform(ka, dtype=jnp.float64)) * (
                chol64 @ jax.random.normal(kz, (dim,), jnp.float64)
            )
            u64 = rank_one_update(r64, t64, s @ r64)
            s32 = s.astype(jnp.float32)
            # the O(d) trace update, whose drift this measures (the kernels sum it from R)
            u32 = rank_one_update(r32, t32, s32 @ r32, exact_trace=False)
            raw = rank_one_update(r32, t32_raw, s32 @ r32, exact_trace=False).trace_precond
            return (
                u64.sqrt_precond,
                u64.trace_precond,
                u32.sqrt_precond,
                u32.trace_precond,
                raw,
            ), None

        @jax.jit
        def block(carry, key):
            carry, _ = jax.lax.scan(update, carry, jax.random.split(key, refresh_every))
            r64, t64, r32, t32, raw = carry
            tracked = t32
            t32 = jnp.einsum("ij,ij->", r32, r32)  # re-anchor, as the warm-up does
            return (r64, t64, r32, t32, raw), (tracked - t32) / t32

        start = time.perf_counter()
        worst_anchored = 0.0
        keys = jax.random.split(jax.random.key(seed), num_updates // refresh_every)
        for key in keys:
            carry, rel = block(carry, key)
            worst_anchored = max(worst_anchored, abs(float(rel)))
        r64, _, r32, t32, raw = carry
        a64 = np.asarray(r64) @ np.asarray(r64).T
        r32 = np.asarray(r32, np.float64)
        a32 = r32 @ r32.T
        exact32 = float(np.sum(r32 * r32))
        return {
            "updates": int(len(keys) * refresh_every),
            "dim": dim,
            "finite": bool(np.all(np.isfinite(r32))),
            "relative_error_A": float(np.linalg.norm(a32 - a64) / np.linalg.norm(a64)),
            "min_eigenvalue_over_max": float(
                np.linalg.eigvalsh(a32)[0] / np.linalg.eigvalsh(a32)[-1]
            ),
            "symmetry_error": float(np.abs(a32 - a32.T).max() / np.abs(a32).max()),
            "trace_error_unanchored": float(abs(float(raw) - exact32) / exact32),
            "trace_error_anchored_worst": worst_anchored,
            "seconds": time.perf_counter() - start,
        }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=50)
    args = parser.parse_args(argv)
    print(json.dumps(long_run(args.updates, args.dim), indent=1))


if __name__ == "__main__":
    main()
