"""Preconditioned Langevin proposals and Metropolis-Hastings acceptance (layer 2).

Shared by every MALA-type kernel of the library (plain MALA, preconditioned MALA,
FisherMALA). Everything is written with the square root ``R`` only; ``A^{-1}`` never
appears (Proposition 1).

Notation: ``g = grad log pi``, ``u = R^T g`` (the *whitened* gradient, cached in the
states), ``s`` the normalized step size ``sigma_R^2 = sigma^2 / (tr(A) / d)`` of Eq. (7).
A proposal is ``y = x + R w`` with the whitened increment

    w = (s / 2) u_x + sqrt(s) eta,     eta ~ N(0, I),

so ``y ~ N(x + (s/2) A g_x, s A)``: one product of ``R`` with a vector. The
Metropolis-Hastings log ratio of Proposition 1 needs only dot products of ``w``,
``u_x`` and ``u_y``:

    h(x, y) = 1/2 ((x - y)^T g_y - (s/4) g_y^T A g_y) = 1/2 (-w^T u_y - (s/4) |u_y|^2)
    h(y, x) = 1/2 ((y - x)^T g_x - (s/4) g_x^T A g_x) = 1/2 ( w^T u_x - (s/4) |u_x|^2)

A proposal whose log density or gradient is not finite is rejected: its log
acceptance ratio is set to ``-inf`` and nothing of it enters the state.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from fisher_mala.base import is_finite

__all__ = [
    "LangevinTransition",
    "h_function",
    "normalized_step_size",
    "whitened_increment",
    "log_proposal_ratio",
    "metropolis_hastings",
    "guarded_metropolis_hastings",
    "langevin_transition",
]


class LangevinTransition(NamedTuple):
    """Everything one preconditioned Langevin proposal and its M-H test produce.

    Attributes
    ----------
    position
        The flat proposal ``y``.
    logdensity
        ``log pi(y)``.
    logdensity_grad
        The flat gradient ``g_y``.
    whitened_grad
        ``u_y = R^T g_y``.
    whitened_increment
        ``w`` with ``y - x = R w``.
    log_acceptance_ratio
        ``log a_n`` of Eq. (1); ``-inf`` for a non-finite proposal.
    acceptance_rate
        ``alpha = min(1, a_n)``.
    is_accepted
        The outcome of the M-H test.
    is_finite
        Whether ``log pi(y)`` and ``g_y`` are all finite.
    """

    position: Array
    logdensity: Array
    logdensity_grad: Array
    whitened_grad: Array
    whitened_increment: Array
    log_acceptance_ratio: Array
    acceptance_rate: Array
    is_accepted: Array
    is_finite: Array


def h_function(diff_dot_grad: Array, grad_precond_grad: Array, step_size: Array) -> Array:
    """The ``h(z, v)`` of Proposition 1 from its two scalar ingredients.

    Parameters
    ----------
    diff_dot_grad
        ``(z - v)^T grad log pi(v)``.
    grad_precond_grad
        ``grad log pi(v)^T A grad log pi(v)``.
    step_size
        The step ``s`` multiplying ``A`` in the proposal covariance.
    """
    return 0.5 * (diff_dot_grad - 0.25 * step_size * grad_precond_grad)


def normalized_step_size(step_size: Array, trace_precond: Array, dim: int) -> Array:
    """``sigma_R^2 = sigma^2 / (tr(A) / d)``, the step of the normalized proposal Eq. (7)."""
    return step_size * (dim / trace_precond)


def whitened_increment(rng_key, whitened_grad: Array, step_size: Array) -> Array:
    """``w = (s/2) u + sqrt(s) eta`` with ``eta ~ N(0, I)``; the proposal is ``x + R w``."""
    eta = jax.random.normal(rng_key, whitened_grad.shape, whitened_grad.dtype)
    return 0.5 * step_size * whitened_grad + jnp.sqrt(step_size) * eta


def log_proposal_ratio(
    increment: Array, whitened_grad_x: Array, whitened_grad_y: Array, step_size: Array
) -> Array:
    """``log q(x|y) - log q(y|x) = h(x, y) - h(y, x)`` (Proposition 1) in O(d)."""
    h_xy = h_function(
        -jnp.dot(increment, whitened_grad_y),
        jnp.dot(whitened_grad_y, whitened_grad_y),
        step_size,
    )
    h_yx = h_function(
        jnp.dot(increment, whitened_grad_x),
        jnp.dot(whitened_grad_x, whitened_grad_x),
        step_size,
    )
    return h_xy - h_yx


def metropolis_hastings(rng_key, log_acceptance_ratio: Array) -> tuple[Array, Array]:
    """Accept with probability ``min(1, exp(log_ratio))``; NaN counts as ``-inf``.

    Returns
    -------
    is_accepted, acceptance_rate
    """
    log_ratio = jnp.where(jnp.isnan(log_acceptance_ratio), -jnp.inf, log_acceptance_ratio)
    acceptance_rate = jnp.exp(jnp.minimum(log_ratio, 0.0))
    uniform = jax.random.uniform(rng_key, (), dtype=acceptance_rate.dtype)
    return uniform < acceptance_rate, acceptance_rate


def guarded_metropolis_hastings(
    rng_key, log_acceptance_ratio: Array, *proposal
) -> tuple[Array, Array, Array]:
    """The non-finite guard and the M-H test of every kernel of the library.

    ``proposal``: the arrays (pytrees) of the proposed state that must all be finite
    (log density, gradient, ...); if one is not, the log ratio is ``-inf`` and the
    proposal is rejected.

    Returns
    -------
    is_accepted, acceptance_rate, is_finite
    """
    finite = is_finite(*proposal)
    log_ratio = jnp.where(finite, log_acceptance_ratio, -jnp.inf)
    is_accepted, acceptance_rate = metropolis_hastings(rng_key, log_ratio)
    return is_accepted, acceptance_rate, finite


def langevin_transition(
    rng_key,
    position: Array,
    logdensity: Array,
    whitened_grad: Array,
    step_size: Array,
    logdensity_and_grad_fn: Callable[[Array], tuple[Array, Array]],
    color: Callable[[Array], Array],
    whiten: Callable[[Array], Array],
) -> LangevinTransition:
    """One preconditioned Langevin proposal with its Metropolis-Hastings test.

    Parameters
    ----------
    rng_key
        Key for the Gaussian noise and the uniform of the M-H test.
    position, logdensity, whitened_grad
        Flat ``x``, ``log pi(x)`` and the cached ``u_x = R^T g_x``.
    step_size
        The normalized step ``s`` (already divided by ``tr(A)/d``).
    logdensity_and_grad_fn
        Flat ``y -> (log pi(y), g_y)``; called exactly once.
    color, whiten
        ``w -> R w`` and ``g -> R^T g`` (identities for plain MALA). Each is one pass
        over ``R``.
    """
    key_noise, key_accept = jax.random.split(rng_key)
    increment = whitened_increment(key_noise, whitened_grad, step_size)
    new_position = position + color(increment)
    new_logdensity, new_grad = logdensity_and_grad_fn(new_position)
    new_whitened = whiten(new_grad)
    log_ratio = (
        new_logdensity
        - logdensity
        + log_proposal_ratio(increment, whitened_grad, new_whitened, step_size)
    )
    is_accepted, acceptance_rate, finite = guarded_metropolis_hastings(
        key_accept, log_ratio, new_logdensity, new_grad, new_whitened
    )
    log_ratio = jnp.where(finite, log_ratio, -jnp.inf)
    return LangevinTransition(
        position=new_position,
        logdensity=new_logdensity,
        logdensity_grad=new_grad,
        whitened_grad=new_whitened,
        whitened_increment=increment,
        log_acceptance_ratio=log_ratio,
        acceptance_rate=acceptance_rate,
        is_accepted=is_accepted,
        is_finite=finite,
    )
