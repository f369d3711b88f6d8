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

from fisher_mala import mala, square_roots, validation
from fisher_mala.adaptations.base import Adaptation
from fisher_mala.adaptations.haario import (
    HaarioCovariance,
    haario_covariance,
    haario_init,
    haario_update,
)
from fisher_mala.adaptations.step_size import (
    MALA_TARGET_ACCEPTANCE,
    STEP_SIZE_LEARNING_RATE,
    RobbinsMonroState,
    robbins_monro,
)
from fisher_mala.base import ArrayTree, SamplingAlgorithm, sampling_algorithm
from fisher_mala.mala import MALAState, take_move
from fisher_mala.pytree import ravel
from fisher_mala.square_roots import CholeskySqrt

__all__ = [
    "AdaMALAState",
    "init",
    "mala_state",
    "build_kernel",
    "adaptive_step",
    "as_top_level_api",
]


class AdaMALAState(NamedTuple):
    """State of adaptive AdaMALA: a MALA state plus the covariance and ``sigma^2``."""

    position: ArrayTree
    logdensity: Array
    logdensity_grad: ArrayTree
    covariance: HaarioCovariance
    step_size: Array
    whitened_grad: Array


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


def mala_state(state: AdaMALAState) -> MALAState:
    """The preconditioned MALA kernel's view: ``R = U^T`` of the covariance's factor."""
    cov = state.covariance
    return MALAState(
        state.position,
        state.logdensity,
        state.logdensity_grad,
        CholeskySqrt(cov.chol_upper),
        cov.trace,
        state.whitened_grad,
    )


def build_kernel() -> Callable:
    """The frozen AdaMALA kernel ``(rng_key, state, logdensity_fn) -> (state, info)``:
    preconditioned MALA with ``R = chol(Sigma_n)`` and ``sigma^2`` of the state."""
    mala_kernel = mala.build_kernel()

    def kernel(rng_key, state: AdaMALAState, logdensity_fn: Callable):
        moved, info = mala_kernel(rng_key, mala_state(state), logdensity_fn, state.step_size)
        return take_move(state, moved), info

    return kernel


def adaptive_step(covariance: Adaptation, step_size_rule: Adaptation) -> Callable:
    """AdaMALA's step: the preconditioned MALA kernel, then Eq. (17) and the step-size rule.

    ``covariance`` is :func:`~fisher_mala.adaptations.haario.haario_covariance`, fed the
    chain's new state; the whitened gradient of the new state needs one more pass over
    the new factor (the Cholesky update has no O(d) formula for it).

    Returns
    -------
    step
        ``step(rng_key, state, logdensity_fn) -> (state, info)`` on an
        :class:`AdaMALAState`.
    """
    mala_kernel = mala.build_kernel()

    def step(rng_key, state: AdaMALAState, logdensity_fn: Callable):
        moved, info = mala_kernel(rng_key, mala_state(state), logdensity_fn, state.step_size)
        cov = covariance.update(state.covariance, ravel(moved.position))
        step_size = step_size_rule.update(RobbinsMonroState(state.step_size), info.acceptance_rate)
        new_state = AdaMALAState(
            moved.position,
            moved.logdensity,
            moved.logdensity_grad,
            cov,
            step_size_rule.final(step_size),
            square_roots.whiten(covariance.final(cov), ravel(moved.logdensity_grad)),
        )
        return new_state, info

    return step


def as_top_level_api(
    logdensity_fn: Callable,
    step_size,
    damping=10.0,
    target_acceptance_rate=MALA_TARGET_ACCEPTANCE,
    step_size_learning_rate=STEP_SIZE_LEARNING_RATE,
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
    kernel = adaptive_step(
        haario_covariance(damping), robbins_monro(target_acceptance_rate, step_size_learning_rate)
    )

    def init_fn(position):
        validation.check_position(position)
        validation.check_logdensity(logdensity_fn, position)
        flat = ravel(position)
        logdensity, grad = jax.value_and_grad(logdensity_fn)(position)
        covariance = haario_update(haario_init(flat.shape[0], damping, flat.dtype), flat)
        return init(position, logdensity, grad, covariance, step_size)

    return sampling_algorithm(init_fn, lambda rng_key, state: kernel(rng_key, state, logdensity_fn))
