"""Preconditioned MALA with a fixed preconditioner (layer 3).

The proposal is the normalized one of Eq. (7)::

    y ~ N(x + (s/2) A grad log pi(x), s A),   s = sigma^2 / (tr(A) / d),  A = R R^T,

plain MALA when ``sqrt_precond`` is ``None`` (``A = I``, ``s = sigma^2``). Proposal and
acceptance come from :mod:`fisher_mala.proposals`, shared with FisherMALA.

Cost per step: one log density and gradient evaluation and, with a preconditioner,
two passes over ``R`` (``R w`` for the proposal, ``g_y^T R`` for the whitened gradient,
which is cached in the state for the next step). ``tr(A)`` is computed once, when the
algorithm is built.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.flatten_util import ravel_pytree

from fisher_mala import validation
from fisher_mala.base import ArrayTree, SamplingAlgorithm, SamplingAPI, select
from fisher_mala.proposals import langevin_transition, normalized_step_size
from fisher_mala.pytree import flat_logdensity_and_grad, ravel

__all__ = ["MALAState", "MALAInfo", "init", "build_kernel", "as_top_level_api", "mala"]


class MALAState(NamedTuple):
    """State of (preconditioned) MALA.

    Attributes
    ----------
    position
        The current position (any pytree of arrays).
    logdensity
        ``log pi(position)``.
    logdensity_grad
        Its gradient, in the position's structure.
    whitened_grad
        The flat ``R^T grad`` (the flat gradient itself for plain MALA), cached so that
        a step makes two passes over ``R`` rather than three.
    """

    position: ArrayTree
    logdensity: Array
    logdensity_grad: ArrayTree
    whitened_grad: Array


class MALAInfo(NamedTuple):
    """Diagnostics of one MALA transition.

    Attributes
    ----------
    acceptance_rate
        The M-H probability ``alpha = min(1, a_n)``.
    is_accepted
        Whether the proposal was accepted.
    proposal_is_finite
        False when the proposal's log density or gradient was NaN or inf (it is then
        rejected).
    """

    acceptance_rate: Array
    is_accepted: Array
    proposal_is_finite: Array


def _preconditioner_maps(sqrt_precond):
    if sqrt_precond is None:
        return (lambda w: w), (lambda g: g)
    return (lambda w: sqrt_precond @ w), (lambda g: g @ sqrt_precond)


def init(position: ArrayTree, logdensity_fn: Callable, sqrt_precond: Array | None = None):
    """Create the initial :class:`MALAState` (validates the inputs first)."""
    validation.check_position(position)
    validation.check_logdensity(logdensity_fn, position)
    flat, _ = ravel_pytree(position)
    if sqrt_precond is not None:
        validation.check_sqrt_precond(sqrt_precond, flat.shape[0])
        sqrt_precond = jnp.asarray(sqrt_precond, flat.dtype)
    logdensity, grad = jax.value_and_grad(logdensity_fn)(position)
    _, whiten = _preconditioner_maps(sqrt_precond)
    return MALAState(position, logdensity, grad, whiten(ravel(grad)))


def build_kernel() -> Callable:
    """Build the MALA kernel.

    Returns
    -------
    kernel
        ``kernel(rng_key, state, logdensity_fn, step_size, sqrt_precond=None,
        trace_precond=None) -> (state, info)``. ``step_size`` is the un-normalized
        ``sigma^2``; ``trace_precond = tr(R R^T)`` is recomputed (one extra pass) when
        not given.
    """

    def kernel(
        rng_key,
        state: MALAState,
        logdensity_fn: Callable,
        step_size,
        sqrt_precond: Array | None = None,
        trace_precond=None,
    ) -> tuple[MALAState, MALAInfo]:
        position, unravel = ravel_pytree(state.position)
        dim = position.shape[0]
        step = jnp.asarray(step_size, position.dtype)
        if sqrt_precond is not None:
            if trace_precond is None:
                trace_precond = jnp.sum(sqrt_precond * sqrt_precond)
            step = normalized_step_size(step, trace_precond, dim)
        color, whiten = _preconditioner_maps(sqrt_precond)
        proposal = langevin_transition(
            rng_key,
            position,
            state.logdensity,
            state.whitened_grad,
            step,
            flat_logdensity_and_grad(logdensity_fn, unravel),
            color,
            whiten,
        )
        accepted = proposal.is_accepted
        new_state = MALAState(
            unravel(jnp.where(accepted, proposal.position, position)),
            jnp.where(accepted, proposal.logdensity, state.logdensity),
            select(accepted, unravel(proposal.logdensity_grad), state.logdensity_grad),
            jnp.where(accepted, proposal.whitened_grad, state.whitened_grad),
        )
        info = MALAInfo(proposal.acceptance_rate, accepted, proposal.is_finite)
        return new_state, info

    return kernel


def as_top_level_api(
    logdensity_fn: Callable, step_size, sqrt_precond: Array | None = None
) -> SamplingAlgorithm:
    """Preconditioned MALA with a fixed step size and preconditioner.

    Parameters
    ----------
    logdensity_fn
        ``position -> log pi(position)`` written with ``jax.numpy``.
    step_size
        ``sigma^2`` of Eq. (7) (un-normalized).
    sqrt_precond
        A ``(d, d)`` square root ``R`` of the preconditioner ``A = R R^T`` (``d`` the
        number of elements of the position); ``None`` for plain MALA.

    Returns
    -------
    SamplingAlgorithm
        ``init(position)`` and a jit-compiled ``step(rng_key, state)``.

    Examples
    --------
    >>> import jax, jax.numpy as jnp, fisher_mala as fm
    >>> alg = fm.mala(lambda x: -0.5 * jnp.sum(x**2), step_size=0.5)
    >>> state = alg.init(jnp.zeros(3))
    >>> state, info = alg.step(jax.random.key(0), state)
    """
    validation.check_positive("step_size", step_size, "It is sigma^2 of Eq. (7).")
    trace_precond = None
    if sqrt_precond is not None:
        sqrt_precond = jnp.asarray(sqrt_precond)
        if sqrt_precond.ndim != 2 or sqrt_precond.shape[0] != sqrt_precond.shape[1]:
            raise ValueError(
                f"`sqrt_precond` must be a square (d, d) matrix, got {sqrt_precond.shape}."
            )
        trace_precond = jnp.sum(sqrt_precond * sqrt_precond)
        validation.check_positive("tr(sqrt_precond @ sqrt_precond.T)", trace_precond)
    kernel = build_kernel()

    def init_fn(position):
        return init(position, logdensity_fn, sqrt_precond)

    @jax.jit
    def _step(rng_key, state, sqrt_precond, trace_precond):
        return kernel(rng_key, state, logdensity_fn, step_size, sqrt_precond, trace_precond)

    def step_fn(rng_key, state):
        return _step(rng_key, state, sqrt_precond, trace_precond)

    return SamplingAlgorithm(init_fn, step_fn)


mala = SamplingAPI(as_top_level_api, init, build_kernel)
