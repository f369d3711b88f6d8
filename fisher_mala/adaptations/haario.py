"""Haario et al.'s covariance recursion, Eq. (17), as an ``(init, update, final)`` triple.

The running mean and covariance of the chain's states (AdaMALA, Section 5.1 (ii))::

    mu_n    = (n - 1)/n mu_{n-1} + x_n / n
    Sigma_n = (n - 2)/(n - 1) Sigma_{n-1} + (1/n) (x_n - mu_{n-1})(x_n - mu_{n-1})^T

started at ``mu_1 = x_1`` and ``Sigma_2 = 1/2 (x_2 - mu_1)(x_2 - mu_1)^T + lambda I``
(``lambda = 10``, as for FisherMALA). The state keeps the upper Cholesky factor ``U`` of
``Sigma_n`` (``Sigma = U^T U``, square root ``R = U^T``) and updates it by one rank-one
Cholesky update in O(d^2) (:func:`fisher_mala.sqrt_precond.cholesky_rank_one_update`)
instead of a fresh O(d^3) factorization; ``tr(Sigma_n)`` follows in O(d) (a sum of
positive terms, so no cancellation).
"""

from typing import NamedTuple

import jax.numpy as jnp
from jax import Array

from fisher_mala.adaptations.base import Adaptation
from fisher_mala.sqrt_precond import cholesky_rank_one_update
from fisher_mala.square_roots import CholeskySqrt

__all__ = ["HaarioCovariance", "haario_init", "haario_update", "haario_covariance"]


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


def haario_covariance(damping=10.0) -> Adaptation:
    """Eq. (17) as an adaptation.

    Returns
    -------
    Adaptation
        ``init(dim, dtype) -> HaarioCovariance``; ``update(state, x) -> state`` absorbs
        one (flat) state of the chain; ``final(state) -> CholeskySqrt``, the square root
        ``R = U^T`` of ``Sigma_n`` for the preconditioned kernel.
    """

    def init(dim: int, dtype) -> HaarioCovariance:
        return haario_init(dim, damping, dtype)

    def final(state: HaarioCovariance) -> CholeskySqrt:
        return CholeskySqrt(state.chol_upper)

    return Adaptation(init, haario_update, final)
