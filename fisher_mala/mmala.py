"""Simplified manifold MALA (Girolami and Calderhead, 2011), Section 5.1 (iii).

Position-dependent metric ``G(x)``, by default the negative Hessian of the log density
from autodiff (for a Gaussian exactly ``Sigma^{-1}``; for logistic regression what the
paper uses), or a user ``metric_fn``. The proposal, without the Christoffel terms::

    y ~ N(mu(x), sigma^2 G(x)^{-1}),      mu(x) = x + (sigma^2 / 2) G(x)^{-1} grad log pi(x)

and the Metropolis-Hastings ratio includes both log-determinants:
``log q(x|y) - log q(y|x) = 1/2 log|G(y)| - |L_y^T (x - mu(y))|^2 / (2 sigma^2)
- 1/2 log|G(x)| + |eta|^2 / 2`` with ``G = L L^T``.

Cost per step (``O(d^3)``, inherent): one log density and gradient, **one** Hessian (at
the proposal; the current point's is cached in the state), **one** Cholesky, reused for
the solve ``G^{-1} g``, the log-determinant and the noise ``L^{-T} eta``. With autodiff
the Hessian is ``jax.hessian`` (forward over reverse): about ``d`` gradient evaluations,
which is how ``fm.sample`` counts it.

Regularization. Where ``G(x)`` is not positive definite (non-log-concave targets), the
Cholesky is retried on ``G + tau I`` with ``tau = 1e-3 mean|diag G|`` doubled until it
succeeds (Nocedal and Wright, *Numerical Optimization*, Alg. 3.3): still a deterministic
function of ``x``, so the chain stays exact. Positive definite metrics cost one Cholesky;
``info.metric_shift`` reports ``tau``.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.flatten_util import ravel_pytree
from jax.scipy.linalg import cho_solve, solve_triangular

from fisher_mala import validation
from fisher_mala.base import ArrayTree, SamplingAlgorithm, accept, sampling_algorithm
from fisher_mala.proposals import guarded_metropolis_hastings
from fisher_mala.pytree import ravel

__all__ = [
    "MMALAState",
    "MMALAInfo",
    "regularized_cholesky",
    "init",
    "build_kernel",
    "as_top_level_api",
]


class MMALAState(NamedTuple):
    """State of mMALA: the position and what its metric gives, cached for the reverse move.

    Attributes
    ----------
    position, logdensity, logdensity_grad
        As in MALA.
    metric_chol
        Lower Cholesky factor ``L`` of ``G(x)`` (regularized if needed).
    natural_grad
        ``G(x)^{-1} grad log pi(x)`` (flat).
    metric_logdet
        ``log |G(x)|``.
    """

    position: ArrayTree
    logdensity: Array
    logdensity_grad: ArrayTree
    metric_chol: Array
    natural_grad: Array
    metric_logdet: Array


class MMALAInfo(NamedTuple):
    """Diagnostics of one mMALA transition (``metric_shift``: the regularization ``tau``)."""

    acceptance_rate: Array
    is_accepted: Array
    proposal_is_finite: Array
    metric_shift: Array


def regularized_cholesky(metric: Array) -> tuple[Array, Array]:
    """Cholesky of ``G + tau I`` with the smallest ``tau`` in ``{0, beta 2^k}`` that works."""
    metric = 0.5 * (metric + metric.T)
    dim = metric.shape[0]
    beta = 1e-3 * jnp.mean(jnp.abs(jnp.diag(metric)))
    beta = jnp.where(beta > 0, beta, 1e-3)
    eye = jnp.eye(dim, dtype=metric.dtype)

    def failed(carry):
        chol, _, i = carry
        return ~jnp.all(jnp.isfinite(chol)) & (i < 200)

    def retry(carry):
        _, tau, i = carry
        tau = jnp.where(tau > 0, 2.0 * tau, beta)
        return jnp.linalg.cholesky(metric + tau * eye), tau, i + 1

    zero = jnp.zeros((), metric.dtype)
    chol, tau, _ = jax.lax.while_loop(
        failed, retry, (jnp.linalg.cholesky(metric), zero, jnp.zeros((), jnp.int32))
    )
    return chol, tau


def _default_metric(flat_logdensity: Callable) -> Callable:
    hessian = jax.hessian(flat_logdensity)
    return lambda z: -hessian(z)


def _geometry(flat_position, grad, metric_fn):
    chol, tau = regularized_cholesky(metric_fn(flat_position))
    natural = cho_solve((chol, True), grad)
    logdet = 2.0 * jnp.sum(jnp.log(jnp.diag(chol)))
    return chol, natural, logdet, tau


def _metric_fn(logdensity_fn, unravel, metric_fn):
    if metric_fn is None:
        return _default_metric(lambda z: logdensity_fn(unravel(z)))
    return lambda z: metric_fn(unravel(z))


def init(position: ArrayTree, logdensity_fn: Callable, metric_fn: Callable | None = None):
    """Evaluate the log density, gradient and metric at ``position``.

    ``metric_fn(position) -> (d, d)`` is optional (default: the negative Hessian).
    """
    validation.check_position(position)
    validation.check_logdensity(logdensity_fn, position)
    flat, unravel = ravel_pytree(position)
    logdensity, grad = jax.value_and_grad(logdensity_fn)(position)
    chol, natural, logdet, _ = _geometry(
        flat, ravel(grad), _metric_fn(logdensity_fn, unravel, metric_fn)
    )
    return MMALAState(position, logdensity, grad, chol, natural, logdet)


def build_kernel(metric_fn: Callable | None = None) -> Callable:
    """mMALA kernel ``(rng_key, state, logdensity_fn, step_size) -> (state, info)``."""

    def kernel(rng_key, state: MMALAState, logdensity_fn: Callable, step_size):
        x, unravel = ravel_pytree(state.position)
        step = jnp.asarray(step_size, x.dtype)
        metric = _metric_fn(logdensity_fn, unravel, metric_fn)
        # Same key use and noise as fisher_mala.proposals.langevin_transition, so that a
        # constant metric reproduces preconditioned MALA draw for draw.
        key_noise, key_accept = jax.random.split(rng_key)
        eta = jax.random.normal(key_noise, x.shape, x.dtype)
        mean_x = x + 0.5 * step * state.natural_grad
        y = mean_x + jnp.sqrt(step) * solve_triangular(state.metric_chol.T, eta, lower=False)
        logdensity_y, grad_y = jax.value_and_grad(lambda z: logdensity_fn(unravel(z)))(y)
        chol_y, natural_y, logdet_y, tau = _geometry(y, grad_y, metric)
        mean_y = y + 0.5 * step * natural_y
        back = chol_y.T @ (x - mean_y)
        log_q_back = 0.5 * logdet_y - 0.5 * jnp.dot(back, back) / step
        log_q_forward = 0.5 * state.metric_logdet - 0.5 * jnp.dot(eta, eta)
        log_ratio = logdensity_y - state.logdensity + log_q_back - log_q_forward
        accepted, rate, finite = guarded_metropolis_hastings(
            key_accept, log_ratio, logdensity_y, grad_y, natural_y, logdet_y
        )
        new_state = accept(
            accepted,
            state,
            position=unravel(y),
            logdensity=logdensity_y,
            logdensity_grad=unravel(grad_y),
            metric_chol=chol_y,
            natural_grad=natural_y,
            metric_logdet=logdet_y,
        )
        return new_state, MMALAInfo(rate, accepted, finite, tau)

    return kernel


def as_top_level_api(
    logdensity_fn: Callable, step_size, metric_fn: Callable | None = None
) -> SamplingAlgorithm:
    """Simplified manifold MALA with a fixed ``sigma^2`` (the module docstring).

    Returns
    -------
    SamplingAlgorithm
        ``init(position, rng_key=None)`` and a jit-compiled ``step(rng_key, state)``.
    """
    validation.check_positive("step_size", step_size, "It is sigma^2 of the proposal.")
    kernel = build_kernel(metric_fn)

    return sampling_algorithm(
        lambda position: init(position, logdensity_fn, metric_fn),
        lambda rng_key, state: kernel(rng_key, state, logdensity_fn, step_size),
    )
