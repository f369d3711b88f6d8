"""Flattening at the linear-algebra boundary: positions may be any pytree of arrays."""

from collections.abc import Callable

import jax
from jax.flatten_util import ravel_pytree

__all__ = ["ravel", "flat_logdensity_and_grad"]


def ravel(tree):
    """Flatten a pytree of arrays into one vector (a reshape for a single array)."""
    return ravel_pytree(tree)[0]


def flat_logdensity_and_grad(logdensity_fn: Callable, unravel: Callable) -> Callable:
    """Return ``z -> (log pi(unravel(z)), flat gradient)``, one autodiff pass."""
    return jax.value_and_grad(lambda z: logdensity_fn(unravel(z)))
