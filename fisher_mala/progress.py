"""A tqdm progress bar that works inside jit-compiled, vmapped ``lax.scan`` loops.

The scan body calls a host callback every ``every`` iterations with the *absolute*
iteration number; the bar moves to that number. Updates are idempotent, so the several
calls that ``vmap`` may make for one iteration (one per chain) move the bar once, and
the rate of host calls is bounded by ``every`` (about 50 updates per phase by default),
and so do the calls of groups of chains run at once from threads
(:mod:`fisher_mala.chain_threads`): a lock makes each move whole.
"""

import threading
from collections.abc import Callable

import jax
import jax.numpy as jnp

__all__ = ["ProgressBar", "scan_with_progress"]


class ProgressBar:
    """Host-side tqdm bar for ``total`` iterations, updated from compiled code."""

    def __init__(self, total: int, description: str = "", every: int | None = None):
        from tqdm.auto import tqdm  # imported lazily: only when a bar is asked for

        self.total = int(total)
        self.every = max(1, every or self.total // 50)
        self._bar = tqdm(total=self.total, desc=description, dynamic_ncols=True)
        self._lock = threading.Lock()

    def update_to(self, iteration) -> None:
        iteration = min(int(iteration), self.total)
        with self._lock:
            if iteration > self._bar.n:
                self._bar.update(iteration - self._bar.n)

    def close(self) -> None:
        self.update_to(self.total)
        self._bar.close()


def scan_with_progress(
    body: Callable, carry, num_steps: int, offset: int = 0, progress: ProgressBar | None = None
):
    """``lax.scan`` of ``body(carry, iteration) -> (carry, out)`` over ``num_steps`` steps.

    ``iteration`` runs from ``offset`` to ``offset + num_steps - 1`` (unbatched, so a
    ``lax.cond`` on it stays a real branch under ``vmap``).
    """
    iterations = offset + jnp.arange(num_steps)
    if progress is None:
        return jax.lax.scan(body, carry, iterations)

    def body_with_progress(carry, iteration):
        jax.lax.cond(
            (iteration + 1) % progress.every == 0,
            lambda: jax.debug.callback(progress.update_to, iteration + 1, ordered=False),
            lambda: None,
        )
        return body(carry, iteration)

    return jax.lax.scan(body_with_progress, carry, iterations)
