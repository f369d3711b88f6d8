"""Preconditioned MALA with a fixed preconditioner (layer 3).

The proposal is the normalized one of Eq. (7)::

    y ~ N(x + (s/2) A grad log pi(x), s A),   s = sigma^2 / (tr(A) / d),  A = R R^T,

plain MALA when ``sqrt_precond`` is ``None`` (``A = I``, ``s = sigma^2``). Proposal and
acceptance come from :mod:`fisher_mala.proposals`, shared with FisherMALA.

``R`` is a *call argument* of the kernel, as BlackJAX's tuning parameters are, so an
external adaptation may change it between any two steps. The state therefore caches
nothing derived from ``R``: it holds the position, the log density and its gradient, as
``blackjax.mala`` does, and a step makes three passes over ``R`` (``g_x^T R``, ``R w``,
``g_y^T R``). FisherMALA, whose ``R`` lives in its state, caches ``R^T g`` and needs two.
``tr(A)`` is computed once, when the top-level algorithm is built.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.flatten_util import ravel_pytree

from fisher_mala import validation
from fisher_mala.base import ArrayTree, SamplingAlgorithm, SamplingAPI, accept
from fisher_mala.proposals import langevin_transition, normalized_step_size
from fisher_mala.pytree import flat_logdensity_and_grad, ravel

__all__ = ["MALAState", "MALAInfo", "init", "build_kernel", "as_top_level_api", "mala"]


class MALAState(NamedTuple):
    """State of (preconditioned) MALA, as ``blackjax.mala``'s.

    Attributes
    ----------
    position
        The current position (any pytree of arrays).
    logdensity
        ``log pi(position)``.
    logdensity_grad
        Its gradient, in the position's structure.
    """

    position: ArrayTree
    logdensity: Array
    logdensity_grad: ArrayTree


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


def init(position: ArrayTree, logdensity_fn: Callable) -> MALAState:
    """Create the initial :class:`MALAState` (validates the inputs first)."""
    validation.check_position(position)
    validation.check_logdensity(logdensity_fn, position)
    logdensity, grad = jax.value_and_grad(logdensity_fn)(position)
    return MALAState(position, logdensity, grad)


def build_kernel() -> Callable:
    """Build the MALA kernel.

    Returns
    -------
    kernel
        ``kernel(rng_key, state, logdensity_fn, step_size, sqrt_precond=None,
        trace_precond=None) -> (state, info)``. ``step_size`` is the un-normalized
        ``sigma^2``; ``sqrt_precond`` a ``(d, d)`` square root ``R``;
        ``trace_precond = tr(R R^T)`` is recomputed (one extra pass) when not given.
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
            validation.check_sqrt_precond_shape(sqrt_precond, dim)
            if trace_precond is None:
                trace_precond = jnp.sum(sqrt_precond * sqrt_precond)
            step = normalized_step_size(step, trace_precond, dim)
        color, whiten = _preconditioner_maps(sqrt_precond)
        proposal = langevin_transition(
            rng_key,
            position,
            state.logdensity,
            whiten(ravel(state.logdensity_grad)),
            step,
            flat_logdensity_and_grad(logdensity_fn, unravel),
            color,
            whiten,
        )
        new_state = accept(
            proposal.is_accepted,
            state,
            position=unravel(proposal.position),
            logdensity=proposal.logdensity,
            logdensity_grad=unravel(proposal.logdensity_grad),
        )
        info = MALAInfo(proposal.acceptance_rate, proposal.is_accepted, proposal.is_finite)
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
        ``init(position, rng_key=None)`` and a jit-compiled ``step(rng_key, state)``.

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
        validation.check_sqrt_precond_shape(sqrt_precond, None)
        trace_precond = jnp.sum(sqrt_precond * sqrt_precond)
        validation.check_positive("tr(sqrt_precond @ sqrt_precond.T)", trace_precond)
    kernel = build_kernel()

    def init_fn(position, rng_key=None):
        del rng_key  # deterministic; accepted for BlackJAX's run_inference_algorithm
        if sqrt_precond is not None:
            validation.check_sqrt_precond(sqrt_precond, ravel(position).shape[0])
        return init(position, logdensity_fn)

    @jax.jit
    def _step(rng_key, state, sqrt_precond, trace_precond):
        return kernel(rng_key, state, logdensity_fn, step_size, sqrt_precond, trace_precond)

    def step_fn(rng_key, state):
        return _step(rng_key, state, sqrt_precond, trace_precond)

    return SamplingAlgorithm(init_fn, step_fn)


mala = SamplingAPI(as_top_level_api, init, build_kernel)
