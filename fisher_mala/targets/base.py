"""The ``Target`` record and the registry every benchmark and example uses."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

__all__ = ["Target", "register", "get", "names"]


@dataclass(frozen=True)
class Target:
    """A ready-made log density with what is known about it.

    Attributes
    ----------
    name
        Registry name.
    dim
        Number of parameters ``d``.
    logdensity_fn
        ``x -> log pi(x)`` for a flat ``x`` of shape ``(d,)``; computes in ``x``'s dtype.
    paper_dim
        The dimension the paper reports (``None`` where the paper has no such target).
    mean, covariance, inverse_fisher
        Known moments (``None`` when unknown); for a Gaussian ``inverse_fisher`` is the
        covariance.
    extras
        Anything else (data arrays, notes).
    """

    name: str
    dim: int
    logdensity_fn: Callable
    paper_dim: int | None = None
    mean: np.ndarray | None = None
    covariance: np.ndarray | None = None
    inverse_fisher: np.ndarray | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def initial_positions(self, rng_key, num_chains: int, dtype=None):
        """Starting points ``N(0, I)``, as in the paper, shape ``(num_chains, d)``."""
        return jax.random.normal(rng_key, (num_chains, self.dim), dtype)


_REGISTRY: dict[str, Callable[[], Target]] = {}


def register(name: str):
    """Decorator registering a zero-argument target factory under ``name``."""

    def wrap(factory):
        _REGISTRY[name] = factory
        return factory

    return wrap


def get(name: str) -> Target:
    """Build the registered target ``name``."""
    if name not in _REGISTRY:
        raise ValueError(f"Unknown target {name!r}; choose one of {', '.join(names())}.")
    return _REGISTRY[name]()


def names() -> tuple[str, ...]:
    """Names of all registered targets."""
    return tuple(_REGISTRY)
