"""Preconditioned MALA: the one Langevin kernel of the library (layer 3).

The proposal is the normalized one of Eq. (7)::

    y ~ N(x + (s/2) A grad log pi(x), s A),   s = sigma^2 / (tr(A) / d),  A = R R^T,

plain MALA when the state's ``sqrt_precond`` is ``None`` (``A = I``, ``s = sigma^2``).
Proposal and acceptance come from :mod:`fisher_mala.proposals`.

The state carries ``R`` (any form of :mod:`fisher_mala.square_roots`), ``tr(A)`` and the
whitened gradient ``u = R^T g`` at the position, so a step makes **two** passes over
``R`` (``R w`` and ``g_y^T R``). ``sigma^2`` is a call argument. The kernel adapts
nothing: its info exposes what adaptations learn from (the acceptance probability, the
whitened gradients before and after the proposal), and FisherMALA, pooled FisherMALA and
AdaMALA are this kernel composed with adaptations (:mod:`fisher_mala.adaptive`). A state
whose ``R`` was changed by an adaptation must get its ``whitened_grad`` and
``trace_precond`` with it (:func:`with_sqrt_precond`, or the O(d) carries of the Fisher
recursion).
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.flatten_util import ravel_pytree

from fisher_mala import square_roots, validation
from fisher_mala.base import ArrayTree, SamplingAlgorithm, SamplingAPI, accept
from fisher_mala.proposals import langevin_transition, normalized_step_size
from fisher_mala.pytree import flat_logdensity_and_grad, ravel

__all__ = [
    "MALAState",
    "MALAInfo",
    "init",
    "state_from",
    "with_sqrt_precond",
    "kernel_view",
    "take_move",
    "build_kernel",
    "as_top_level_api",
    "mala",
]


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
    sqrt_precond
        ``R`` (a ``(d, d)`` array or another form of :mod:`fisher_mala.square_roots`), or
        ``None`` for plain MALA.
    trace_precond
        ``tr(R R^T)`` (``None`` for plain MALA).
    whitened_grad
        ``R^T grad`` at the position (flat), carried so that no extra pass is needed.
    """

    position: ArrayTree
    logdensity: Array
    logdensity_grad: ArrayTree
    sqrt_precond: Any = None
    trace_precond: Array | None = None
    whitened_grad: Array | None = None


class MALAInfo(NamedTuple):
    """Diagnostics of one MALA transition, and what adaptations learn from.

    Attributes
    ----------
    acceptance_rate
        The M-H probability ``alpha = min(1, a_n)``.
    is_accepted
        Whether the proposal was accepted.
    proposal_is_finite
        False when the proposal's log density or gradient was NaN or inf (it is then
        rejected).
    normalized_step_size
        ``sigma_R^2 = sigma^2 / (tr(A) / d)`` used by this proposal.
    whitened_grad
        ``u_x = R^T g_x`` at the position the step started from.
    proposal_whitened_grad
        ``u_y = R^T g_y`` at the proposal (whatever the M-H outcome).
    proposal
        The proposal ``y`` (flat), accepted or not (``fm.sample`` locates the region of
        non-finite proposals with it).
    """

    acceptance_rate: Array
    is_accepted: Array
    proposal_is_finite: Array
    normalized_step_size: Array
    whitened_grad: Array
    proposal_whitened_grad: Array
    proposal: Array


def state_from(
    position: ArrayTree, logdensity: Array, logdensity_grad: ArrayTree, sqrt_precond=None
) -> MALAState:
    """The state at an already evaluated position with square root ``sqrt_precond``
    (no evaluation, no validation; one pass over ``R`` for the whitened gradient)."""
    return with_sqrt_precond(MALAState(position, logdensity, logdensity_grad), sqrt_precond)


def with_sqrt_precond(state: MALAState, sqrt_precond) -> MALAState:
    """``state`` with a new ``R``: its trace and whitened gradient recomputed (two passes)."""
    trace = None if sqrt_precond is None else square_roots.trace(sqrt_precond)
    whitened = square_roots.whiten(sqrt_precond, ravel(state.logdensity_grad))
    return state._replace(sqrt_precond=sqrt_precond, trace_precond=trace, whitened_grad=whitened)


def kernel_view(state) -> MALAState:
    """The kernel's view of a larger state that has its six fields (FisherMALA's, pooled
    FisherMALA's), without copying anything."""
    return MALAState(*(getattr(state, name) for name in MALAState._fields))


def take_move(state, after: MALAState):
    """``state`` with what one kernel step moves (position, log density, gradient and
    whitened gradient) taken from ``after``, the kernel's new state."""
    return state._replace(
        position=after.position,
        logdensity=after.logdensity,
        logdensity_grad=after.logdensity_grad,
        whitened_grad=after.whitened_grad,
    )


def init(
    position: ArrayTree, logdensity_fn: Callable, sqrt_precond=None, evaluated=None
) -> MALAState:
    """Create the initial :class:`MALAState` (validates the inputs first).

    ``evaluated``: ``(log pi(position), its gradient)`` where the caller has them (NumPyro
    finds its initial point with both, checked finite); they are then not evaluated, nor
    compiled, again.
    """
    validation.check_position(position)
    validation.check_logdensity(logdensity_fn, position, evaluate=evaluated is None)
    if sqrt_precond is not None and not isinstance(sqrt_precond, square_roots.STRUCTURED):
        sqrt_precond = jnp.asarray(sqrt_precond)
        validation.check_sqrt_precond(sqrt_precond, ravel(position).shape[0])
    if evaluated is None:
        logdensity, grad = jax.value_and_grad(logdensity_fn)(position)
    else:
        logdensity, grad = evaluated
    return state_from(position, logdensity, grad, sqrt_precond)


def build_kernel() -> Callable:
    """Build the preconditioned MALA kernel.

    Returns
    -------
    kernel
        ``kernel(rng_key, state, logdensity_fn, step_size) -> (state, info)``;
        ``step_size`` is the un-normalized ``sigma^2`` of Eq. (7); ``R``, ``tr(A)`` and
        ``R^T g`` come from the state.
    """

    def kernel(
        rng_key, state: MALAState, logdensity_fn: Callable, step_size
    ) -> tuple[MALAState, MALAInfo]:
        position, unravel = ravel_pytree(state.position)
        sqrt_precond = state.sqrt_precond
        step = jnp.asarray(step_size, position.dtype)
        if state.trace_precond is not None:
            step = normalized_step_size(step, state.trace_precond, position.shape[0])
        proposal = langevin_transition(
            rng_key,
            position,
            state.logdensity,
            state.whitened_grad,
            step,
            flat_logdensity_and_grad(logdensity_fn, unravel),
            lambda w: square_roots.color(sqrt_precond, w),  # pass 1
            lambda g: square_roots.whiten(sqrt_precond, g),  # pass 2
        )
        new_state = accept(
            proposal.is_accepted,
            state,
            position=unravel(proposal.position),
            logdensity=proposal.logdensity,
            logdensity_grad=unravel(proposal.logdensity_grad),
            whitened_grad=proposal.whitened_grad,
        )
        info = MALAInfo(
            proposal.acceptance_rate,
            proposal.is_accepted,
            proposal.is_finite,
            step,
            state.whitened_grad,
            proposal.whitened_grad,
            proposal.position,
        )
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
        number of elements of the position), or another form of
        :mod:`fisher_mala.square_roots`; ``None`` for plain MALA.

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
    if sqrt_precond is not None and not isinstance(sqrt_precond, square_roots.STRUCTURED):
        sqrt_precond = jnp.asarray(sqrt_precond)
        validation.check_sqrt_precond_shape(sqrt_precond, None)
        validation.check_positive(
            "tr(sqrt_precond @ sqrt_precond.T)", square_roots.trace(sqrt_precond)
        )
    kernel = build_kernel()

    def init_fn(position, rng_key=None):
        del rng_key  # deterministic; accepted for BlackJAX's run_inference_algorithm
        return init(position, logdensity_fn, sqrt_precond)

    @jax.jit
    def step_fn(rng_key, state):
        return kernel(rng_key, state, logdensity_fn, step_size)

    return SamplingAlgorithm(init_fn, step_fn)


mala = SamplingAPI(as_top_level_api, init, build_kernel)
