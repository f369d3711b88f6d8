"""AdaMALA: preconditioned MALA with the Haario et al. covariance (Section 5.1 (ii)).

The proposal is Eq. (7) with ``A = Sigma_n``, the empirical covariance of the chain's
states by the recursion of Eq. (17)::

    mu_n    = (n - 1)/n mu_{n-1} + x_n / n
    Sigma_n = (n - 2)/(n - 1) Sigma_{n-1} + (1/n) (x_n - mu_{n-1})(x_n - mu_{n-1})^T

started at ``mu_1 = x_1`` and ``Sigma_2 = 1/2 (x_2 - mu_1)(x_2 - mu_1)^T + lambda I``
(``lambda = 10``, as for FisherMALA).

Cost per adaptive step, O(d^2): the state keeps the upper Cholesky factor ``U`` of
``Sigma_n`` (``Sigma = U^T U``, square root ``R = U^T``) and updates it by one rank-one
Cholesky update (:func:`fisher_mala.sqrt_precond.cholesky_rank_one_update`, ``d``
sequential row rotations) instead of a fresh ``O(d^3)`` Cholesky; ``tr(Sigma_n)`` follows
in O(d) (a sum of positive terms, so no cancellation). Passes over the ``d x d`` matrix:
``R w`` (proposal), ``R^T g_y``, the Cholesky update, and ``R'^T g`` for the cached
whitened gradient of the new state (the Cholesky update has no O(d) formula for it).
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.flatten_util import ravel_pytree

from fisher_mala import validation
from fisher_mala.base import ArrayTree, SamplingAlgorithm, accept, sampling_algorithm
from fisher_mala.mala import MALAInfo
from fisher_mala.proposals import langevin_transition, normalized_step_size
from fisher_mala.pytree import flat_logdensity_and_grad, ravel
from fisher_mala.sqrt_precond import cholesky_rank_one_update
from fisher_mala.step_size import LEARNING_RATE, MALA_TARGET_ACCEPTANCE, adapt_step_size

__all__ = [
    "HaarioCovariance",
    "AdaMALAState",
    "haario_init",
    "haario_update",
    "init",
    "build_kernel",
    "as_top_level_api",
]


class HaarioCovariance(NamedTuple):
    """The running mean and the Cholesky factor of Eq. (17)'s covariance.

    Attributes
    ----------
    mean
        ``mu_n`` (flat).
    chol_upper
        ``U`` with ``U^T U = Sigma_n`` (``sqrt(lambda) I`` until two states are seen).
    trace
        ``tr(Sigma_n)``.
    count
        ``n``, the number of states absorbed.
    """

    mean: Array
    chol_upper: Array
    trace: Array
    count: Array


class AdaMALAState(NamedTuple):
    """State of adaptive AdaMALA: a MALA state plus the covariance and ``sigma^2``."""

    position: ArrayTree
    logdensity: Array
    logdensity_grad: ArrayTree
    covariance: HaarioCovariance
    step_size: Array
    whitened_grad: Array


def haario_init(dim: int, damping, dtype) -> HaarioCovariance:
    """Empty recursion: ``U = sqrt(lambda) I`` so that ``Sigma_2`` gets its ``lambda I``."""
    damping = jnp.asarray(damping, dtype)
    return HaarioCovariance(
        mean=jnp.zeros(dim, dtype),
        chol_upper=jnp.sqrt(damping) * jnp.eye(dim, dtype=dtype),
        trace=dim * damping,
        count=jnp.zeros((), jnp.int32),
    )


def haario_update(cov: HaarioCovariance, x: Array) -> HaarioCovariance:
    """Absorb the state ``x_n`` into Eq. (17) (mean and Cholesky factor), in O(d^2)."""
    dtype = x.dtype
    n = cov.count + 1
    nf = n.astype(dtype)
    diff = x - cov.mean
    # Sigma_n = a Sigma_{n-1} + b diff diff^T; for n = 2 "a Sigma_1" is the lambda I term.
    a = jnp.where(n <= 2, 1.0, (nf - 2.0) / jnp.maximum(nf - 1.0, 1.0)).astype(dtype)
    b = (1.0 / nf).astype(dtype)
    upper = cholesky_rank_one_update(jnp.sqrt(a) * cov.chol_upper, jnp.sqrt(b) * diff)
    first = n == 1  # mu_1 = x_1, no covariance yet
    return HaarioCovariance(
        mean=jnp.where(first, x, cov.mean + diff / nf),
        chol_upper=jnp.where(first, cov.chol_upper, upper),
        trace=jnp.where(first, cov.trace, a * cov.trace + b * jnp.dot(diff, diff)),
        count=n,
    )


def init(
    position: ArrayTree,
    logdensity: Array,
    logdensity_grad: ArrayTree,
    covariance: HaarioCovariance,
    step_size,
) -> AdaMALAState:
    """Start the adaptive phase from an evaluated position and a covariance recursion."""
    flat_grad = ravel(logdensity_grad)
    return AdaMALAState(
        position,
        logdensity,
        logdensity_grad,
        covariance,
        jnp.asarray(step_size, flat_grad.dtype),
        covariance.chol_upper @ flat_grad,
    )


def build_kernel(
    target_acceptance_rate=MALA_TARGET_ACCEPTANCE, step_size_learning_rate=LEARNING_RATE
) -> Callable:
    """Adaptive AdaMALA kernel ``(rng_key, state, logdensity_fn) -> (state, info)``."""

    def kernel(rng_key, state: AdaMALAState, logdensity_fn: Callable):
        position, unravel = ravel_pytree(state.position)
        upper = state.covariance.chol_upper
        step = normalized_step_size(state.step_size, state.covariance.trace, position.shape[0])
        proposal = langevin_transition(
            rng_key,
            position,
            state.logdensity,
            state.whitened_grad,
            step,
            flat_logdensity_and_grad(logdensity_fn, unravel),
            lambda w: w @ upper,  # R w = U^T w
            lambda g: upper @ g,  # R^T g = U g
        )
        accepted = proposal.is_accepted
        moved = accept(
            accepted,
            state,
            position=unravel(proposal.position),
            logdensity=proposal.logdensity,
            logdensity_grad=unravel(proposal.logdensity_grad),
        )
        covariance = haario_update(state.covariance, ravel(moved.position))
        new_state = moved._replace(
            covariance=covariance,
            step_size=adapt_step_size(
                state.step_size,
                proposal.acceptance_rate,
                target_acceptance_rate,
                step_size_learning_rate,
            ),
            whitened_grad=covariance.chol_upper @ ravel(moved.logdensity_grad),
        )
        return new_state, MALAInfo(proposal.acceptance_rate, accepted, proposal.is_finite)

    return kernel


def as_top_level_api(
    logdensity_fn: Callable,
    step_size,
    damping=10.0,
    target_acceptance_rate=MALA_TARGET_ACCEPTANCE,
    step_size_learning_rate=LEARNING_RATE,
) -> SamplingAlgorithm:
    """Adaptive AdaMALA from the first step (``Sigma`` and ``sigma^2`` adapted every step).

    ``fm.sample(..., "adamala")`` runs the paper's full protocol (MALA phases first).

    Returns
    -------
    SamplingAlgorithm
        ``init(position, rng_key=None)`` and a jit-compiled ``step(rng_key, state)``.
    """
    validation.check_positive("step_size", step_size, "It is sigma^2 of Eq. (7).")
    validation.check_positive("damping", damping, "The paper uses lambda = 10.")
    kernel = build_kernel(target_acceptance_rate, step_size_learning_rate)

    def init_fn(position):
        validation.check_position(position)
        validation.check_logdensity(logdensity_fn, position)
        flat = ravel(position)
        logdensity, grad = jax.value_and_grad(logdensity_fn)(position)
        covariance = haario_update(haario_init(flat.shape[0], damping, flat.dtype), flat)
        return init(position, logdensity, grad, covariance, step_size)

    return sampling_algorithm(init_fn, lambda rng_key, state: kernel(rng_key, state, logdensity_fn))
