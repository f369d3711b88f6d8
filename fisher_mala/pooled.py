"""Pooled FisherMALA: C chains adapting **one** shared preconditioner (beyond the paper).

The paper's conclusion leaves adaptation with several interacting chains to future work.
Here ``C`` chains run FisherMALA side by side and, every iteration, their ``C``
Rao-Blackwellized signals update one square root ``R`` together by the rank-C update of
:func:`fisher_mala.sqrt_precond.rank_block_update`, so that after ``n`` iterations

    R R^T = (sum over chains and iterations of s s^T + lambda I)^{-1},

the Prop. 4 estimator fed ``C`` times as many signals. Each chain keeps its own position
and M-H test; the step size ``sigma^2`` is shared and adapted with the chains' mean
acceptance probability.

Cost per iteration for all ``C`` chains: the proposals are one ``(C x d) (d x d)``
product, the whitened gradients another, the signal product ``R Phi^T`` a third, and the
rank-C update one read-modify-write: the traffic of about one chain's step instead of
``C`` (a ``d x d`` matrix per chain is also ``C`` times the memory). With the
preconditioner frozen (``adapt=False``) it is ordinary preconditioned MALA per chain,
with the proposals still batched into matrix-matrix products.

When to use it: many chains on one machine, ``d`` in the hundreds or thousands, and a
burn-in budget to save. Pooling needs the chains to sample the same posterior mode; a
multimodal target would mix curvature from different modes.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.flatten_util import ravel_pytree

from fisher_mala import mala, validation
from fisher_mala.adaptations.base import Adaptation
from fisher_mala.adaptations.fisher import (
    FisherPreconditionerState,
    carry_whitened,
    fisher_preconditioner,
    refresh_trace,
    whitened_signal,
)
from fisher_mala.adaptations.step_size import (
    MALA_TARGET_ACCEPTANCE,
    STEP_SIZE_LEARNING_RATE,
    RobbinsMonroState,
    robbins_monro,
)
from fisher_mala.base import ArrayTree, SamplingAlgorithm, sampling_algorithm
from fisher_mala.mala import MALAState, kernel_view, take_move
from fisher_mala.sqrt_precond import initial_sqrt_precond

__all__ = [
    "PooledFisherState",
    "init",
    "state_from",
    "build_kernel",
    "adaptive_step",
    "refresh_trace",
    "as_top_level_api",
]


class PooledFisherState(NamedTuple):
    """State of ``C`` chains sharing one preconditioner.

    Attributes
    ----------
    position, logdensity, logdensity_grad
        Per chain: every leaf has a leading chain axis of size ``C``.
    sqrt_precond
        The shared ``R``, ``(d, d)``.
    step_size
        The shared ``sigma^2``.
    trace_precond
        ``tr(R R^T)``.
    whitened_grad
        ``(C, d)``: each chain's ``R^T grad``.
    count
        Number of (block) adaptation updates.
    """

    position: ArrayTree
    logdensity: Array
    logdensity_grad: ArrayTree
    sqrt_precond: Array
    step_size: Array
    trace_precond: Array
    whitened_grad: Array
    count: Array


def _flatten_batch(tree):
    """``(C, d)`` flat rows, the batch unravel and the one-chain unravel."""
    flat = jax.vmap(lambda t: ravel_pytree(t)[0])(tree)
    unravel = ravel_pytree(jax.tree.map(lambda x: x[0], tree))[1]
    return flat, jax.vmap(unravel), unravel


def state_from(positions, logdensity, logdensity_grad, step_size, damping, sqrt_precond=None):
    """Build the state from evaluated chains (no evaluation); ``R_0 = I / sqrt(lambda)``."""
    flat_grad = _flatten_batch(logdensity_grad)[0]
    dim, dtype = flat_grad.shape[1], flat_grad.dtype
    if sqrt_precond is None:
        sqrt_precond, trace = initial_sqrt_precond(dim, damping, dtype)
    else:
        trace = jnp.einsum("ij,ij->", sqrt_precond, sqrt_precond)
    return PooledFisherState(
        positions,
        logdensity,
        logdensity_grad,
        sqrt_precond,
        jnp.asarray(step_size, dtype),
        trace,
        flat_grad @ sqrt_precond,
        jnp.zeros((), jnp.int32),
    )


def init(positions: ArrayTree, logdensity_fn: Callable, step_size, damping=10.0):
    """Evaluate every chain (leading axis of ``positions``) and start with ``R_0``."""
    logdensity, grad = jax.vmap(jax.value_and_grad(logdensity_fn))(positions)
    return state_from(positions, logdensity, grad, step_size, damping)


#: The preconditioned MALA kernel over the chains: their own keys, positions and M-H
#: tests; ``R``, its trace and ``sigma^2`` shared (not batched).
_CHAIN_AXES = (0, MALAState(0, 0, 0, None, None, 0), None)


def _move_chains(rng_key, state: PooledFisherState, logdensity_fn: Callable):
    num_chains = state.whitened_grad.shape[0]
    keys = jax.random.split(rng_key, num_chains)
    kernel = mala.build_kernel()
    moved, info = jax.vmap(
        lambda key, chain, step_size: kernel(key, chain, logdensity_fn, step_size),
        in_axes=_CHAIN_AXES,
    )(keys, kernel_view(state), state.step_size)
    return take_move(state, moved), info


def build_kernel() -> Callable:
    """The frozen pooled kernel ``(rng_key, state, logdensity_fn) -> (state, info)``:
    every chain a preconditioned MALA step with the shared ``R`` and ``sigma^2``;
    ``info`` is a :class:`~fisher_mala.mala.MALAInfo` with a chain axis."""
    return _move_chains


def adaptive_step(preconditioner: Adaptation, step_size_rule: Adaptation) -> Callable:
    """Every chain's preconditioned MALA step, then one update of the shared adaptations.

    The ``C`` Rao-Blackwellized signals (Eq. (16), one row per chain) are absorbed at
    once by the rank-C form of Proposition 4 (``preconditioner.update`` with a ``(C, d)``
    block), and ``sigma^2`` follows the chains' mean acceptance probability.

    Returns
    -------
    step
        ``step(rng_key, state, logdensity_fn) -> (state, info)`` on a
        :class:`PooledFisherState`.
    """

    def step(rng_key, state: PooledFisherState, logdensity_fn: Callable):
        moved, info = _move_chains(rng_key, state, logdensity_fn)
        phis = whitened_signal(
            "rao_blackwell",
            info.whitened_grad,
            info.proposal_whitened_grad,
            info.acceptance_rate,
            info.is_accepted,
            info.proposal_is_finite,
        )
        r = state.sqrt_precond
        precond = FisherPreconditionerState(
            r, state.trace_precond, jnp.zeros((), r.dtype), state.count
        )
        precond, update = preconditioner.update(precond, phis)
        step_size = step_size_rule.update(
            RobbinsMonroState(state.step_size), jnp.mean(info.acceptance_rate)
        )
        new_state = moved._replace(
            sqrt_precond=precond.sqrt_precond,
            trace_precond=precond.trace_precond,
            whitened_grad=carry_whitened(update, moved.whitened_grad),
            step_size=step_size_rule.final(step_size),
            count=precond.count,
        )
        return new_state, info

    return step


def as_top_level_api(
    logdensity_fn: Callable,
    step_size,
    damping=10.0,
    target_acceptance_rate=MALA_TARGET_ACCEPTANCE,
    step_size_learning_rate=STEP_SIZE_LEARNING_RATE,
    adapt: bool = True,
) -> SamplingAlgorithm:
    """Pooled FisherMALA: ``init(positions)`` takes all chains (leading axis) at once.

    Returns
    -------
    SamplingAlgorithm
        ``init(positions, rng_key=None)`` and a jit-compiled ``step(rng_key, state)``
        that moves every chain.
    """
    validation.check_positive("step_size", step_size, "It is sigma^2 of Algorithm 1.")
    validation.check_positive("damping", damping, "Algorithm 1 uses lambda = 10.")
    if adapt:
        kernel = adaptive_step(
            fisher_preconditioner(),  # the damping only enters through the state
            robbins_monro(target_acceptance_rate, step_size_learning_rate),
        )
    else:
        kernel = build_kernel()

    def init_fn(positions):
        validation.check_position(positions)
        validation.check_logdensity(logdensity_fn, jax.tree.map(lambda x: x[0], positions))
        return init(positions, logdensity_fn, step_size, damping)

    def step_fn(rng_key, state):
        return kernel(rng_key, state, logdensity_fn)

    return sampling_algorithm(init_fn, step_fn)
