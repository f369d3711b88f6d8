"""Shared types and the one accept/select helper of every kernel.

* :class:`SamplingAlgorithm` and :class:`AdaptationAlgorithm`: the pairs BlackJAX users
  expect (``init``/``step``; ``run``).
* :class:`SamplingAPI`: a top-level constructor that also exposes ``init`` and
  ``build_kernel`` (the three layers of a BlackJAX algorithm).
* :func:`is_finite` and :func:`accept`: the non-finite guard and the Metropolis-Hastings
  selection, written once for all kernels. A proposal that is not finite is rejected and
  never enters the state.
"""

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

__all__ = [
    "SamplingAlgorithm",
    "AdaptationAlgorithm",
    "SamplingAPI",
    "select",
    "is_finite",
    "accept",
    "sampling_algorithm",
]

ArrayTree = Any


class SamplingAlgorithm(NamedTuple):
    """A pair of pure functions, as in BlackJAX.

    Attributes
    ----------
    init
        ``(position, rng_key=None) -> state``; the key is accepted for BlackJAX's
        ``run_inference_algorithm`` and ignored by deterministic initializations.
    step
        ``(rng_key, state) -> (state, info)``, jit-compiled.
    """

    init: Callable
    step: Callable


class AdaptationAlgorithm(NamedTuple):
    """A warm-up in the shape of ``blackjax.window_adaptation``.

    Attributes
    ----------
    run
        ``(rng_key, position, num_steps) -> ((state, parameters), info)``.
    """

    run: Callable


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


def sampling_algorithm(init_fn: Callable, step_fn: Callable) -> SamplingAlgorithm:
    """The top-level pair of a kernel: ``init(position, rng_key=None)`` and a jitted step.

    ``init_fn(position)`` is deterministic: the key is accepted (and ignored) so that
    BlackJAX's ``run_inference_algorithm`` can call it. ``step_fn(rng_key, state)`` should
    close over callables and scalars only (arrays closed over become compile-time
    constants).
    """

    def init(position, rng_key=None):
        del rng_key
        return init_fn(position)

    return SamplingAlgorithm(init, jax.jit(step_fn))


def select(condition, on_true: ArrayTree, on_false: ArrayTree) -> ArrayTree:
    """Leaf-wise ``jnp.where(condition, on_true, on_false)`` over matching pytrees.

    ``condition`` may carry leading batch axes (one outcome per chain): it is broadcast
    against each leaf from the left.
    """
    condition = jnp.asarray(condition)

    def where(a, b):
        a = jnp.asarray(a)
        cond = condition.reshape(condition.shape + (1,) * (a.ndim - condition.ndim))
        return jnp.where(cond, a, b)

    return jax.tree.map(where, on_true, on_false)


def is_finite(*trees: ArrayTree) -> Array:
    """True when every element of every leaf of ``trees`` is finite (the non-finite guard)."""
    leaves = [leaf for tree in trees for leaf in jax.tree.leaves(tree)]
    return functools.reduce(
        jnp.logical_and, (jnp.all(jnp.isfinite(leaf)) for leaf in leaves), jnp.array(True)
    )


def accept(is_accepted: Array, state: NamedTuple, **proposed) -> NamedTuple:
    """``state`` with the named fields replaced by ``proposed`` where ``is_accepted``.

    Only the fields that move are selected, so large fields that the proposal does not
    change (a ``d x d`` square root) are never copied. Fields are pytrees (positions in
    the user's structure).
    """
    current = {name: getattr(state, name) for name in proposed}
    return state._replace(**select(is_accepted, proposed, current))
