"""Hamiltonian Monte Carlo with an identity mass matrix, Section 5.1 (iv).

``num_integration_steps`` (default 10, as in the paper) leapfrog steps of size
``epsilon``, momentum ``p ~ N(0, I)``, M-H on the energy ``-log pi(x) + |p|^2 / 2``. The
gradient at the end of a trajectory is cached in the state, so an iteration costs exactly
``num_integration_steps`` gradient evaluations. A transition whose energy error exceeds
``divergence_threshold`` (default 1000, as BlackJAX) or is not finite is *divergent*
(reported in the info, and rejected when not finite).
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.flatten_util import ravel_pytree

from fisher_mala import validation
from fisher_mala.base import ArrayTree, SamplingAlgorithm, accept, sampling_algorithm
from fisher_mala.proposals import guarded_metropolis_hastings
from fisher_mala.pytree import flat_logdensity_and_grad, ravel

__all__ = [
    "HMCState",
    "HMCInfo",
    "init",
    "build_kernel",
    "as_top_level_api",
    "NUM_INTEGRATION_STEPS",
]

#: The paper's fixed number of leapfrog steps.
NUM_INTEGRATION_STEPS = 10
#: Energy error above which a transition is reported divergent.
DIVERGENCE_THRESHOLD = 1000.0


class HMCState(NamedTuple):
    """Position, log density and its gradient (cached from the last trajectory)."""

    position: ArrayTree
    logdensity: Array
    logdensity_grad: ArrayTree


class HMCInfo(NamedTuple):
    """Diagnostics of one HMC transition."""

    acceptance_rate: Array
    is_accepted: Array
    proposal_is_finite: Array
    is_divergent: Array
    energy_error: Array


def init(position: ArrayTree, logdensity_fn: Callable) -> HMCState:
    """Evaluate the log density and gradient at ``position`` (validates the inputs)."""
    validation.check_position(position)
    validation.check_logdensity(logdensity_fn, position)
    logdensity, grad = jax.value_and_grad(logdensity_fn)(position)
    return HMCState(position, logdensity, grad)


def build_kernel(
    num_integration_steps: int = NUM_INTEGRATION_STEPS,
    divergence_threshold: float = DIVERGENCE_THRESHOLD,
) -> Callable:
    """HMC kernel ``(rng_key, state, logdensity_fn, step_size) -> (state, info)``."""

    def kernel(rng_key, state: HMCState, logdensity_fn: Callable, step_size):
        x, unravel = ravel_pytree(state.position)
        eps = jnp.asarray(step_size, x.dtype)
        value_and_grad = flat_logdensity_and_grad(logdensity_fn, unravel)
        key_momentum, key_accept = jax.random.split(rng_key)
        p0 = jax.random.normal(key_momentum, x.shape, x.dtype)

        def leapfrog(carry, _):
            z, p, _, g = carry
            p = p + 0.5 * eps * g
            z = z + eps * p
            logdensity, g = value_and_grad(z)
            return (z, p + 0.5 * eps * g, logdensity, g), None

        start = (x, p0, state.logdensity, ravel(state.logdensity_grad))
        (y, p1, logdensity_y, grad_y), _ = jax.lax.scan(
            leapfrog, start, None, length=num_integration_steps
        )
        log_ratio = (logdensity_y - 0.5 * jnp.dot(p1, p1)) - (
            state.logdensity - 0.5 * jnp.dot(p0, p0)
        )
        accepted, rate, finite = guarded_metropolis_hastings(
            key_accept, log_ratio, log_ratio, grad_y, y
        )
        divergent = ~finite | (jnp.abs(log_ratio) > divergence_threshold)
        new_state = accept(
            accepted,
            state,
            position=unravel(y),
            logdensity=logdensity_y,
            logdensity_grad=unravel(grad_y),
        )
        return new_state, HMCInfo(rate, accepted, finite, divergent, -log_ratio)

    return kernel


def as_top_level_api(
    logdensity_fn: Callable,
    step_size,
    num_integration_steps: int = NUM_INTEGRATION_STEPS,
    divergence_threshold: float = DIVERGENCE_THRESHOLD,
) -> SamplingAlgorithm:
    """HMC with an identity mass matrix and a fixed leapfrog step ``step_size``.

    Returns
    -------
    SamplingAlgorithm
        ``init(position, rng_key=None)`` and a jit-compiled ``step(rng_key, state)``.
    """
    validation.check_positive("step_size", step_size, "It is the leapfrog step size.")
    if int(num_integration_steps) < 1:
        raise ValueError(f"`num_integration_steps` must be >= 1, got {num_integration_steps}.")
    kernel = build_kernel(int(num_integration_steps), divergence_threshold)

    return sampling_algorithm(
        lambda position: init(position, logdensity_fn),
        lambda rng_key, state: kernel(rng_key, state, logdensity_fn, step_size),
    )
