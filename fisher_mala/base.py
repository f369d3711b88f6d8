"""Shared types: the ``SamplingAlgorithm`` pair and the BlackJAX-style API object."""

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["SamplingAlgorithm", "SamplingAPI", "select"]

ArrayTree = Any


class SamplingAlgorithm(NamedTuple):
    """A pair of pure functions, as in BlackJAX.

    Attributes
    ----------
    init
        ``position -> state``.
    step
        ``(rng_key, state) -> (state, info)``, jit-compiled.
    """

    init: Callable
    step: Callable


class SamplingAPI:
    """A callable top-level constructor that also exposes the lower layers.

    ``fm.fisher_mala(...)`` builds a :class:`SamplingAlgorithm`;
    ``fm.fisher_mala.init`` and ``fm.fisher_mala.build_kernel`` are the layers below it,
    for experts who write their own loop (as ``blackjax.mala`` does).
    """

    def __init__(self, top_level: Callable, init: Callable, build_kernel: Callable):
        functools.update_wrapper(self, top_level)
        self._top_level = top_level
        self.init = init
        self.build_kernel = build_kernel

    def __call__(self, *args, **kwargs) -> SamplingAlgorithm:
        return self._top_level(*args, **kwargs)


def select(condition, on_true: ArrayTree, on_false: ArrayTree) -> ArrayTree:
    """Leaf-wise ``jnp.where(condition, on_true, on_false)`` over matching pytrees."""
    return jax.tree.map(lambda a, b: jnp.where(condition, a, b), on_true, on_false)
