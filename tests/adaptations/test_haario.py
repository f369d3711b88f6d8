"""Eq. (17) as a triple: the Cholesky recursion against the dense Haario covariance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fisher_mala import square_roots
from fisher_mala.adaptations.haario import haario_covariance


def test_recursion_matches_the_dense_haario_covariance(x64):
    rng = np.random.default_rng(5)
    d, n, damping = 6, 80, 10.0
    xs = rng.normal(size=(n, d)) * rng.lognormal(size=d) + rng.normal(size=d)
    haario = haario_covariance(damping)
    cov = haario.init(d, jnp.float64)
    update = jax.jit(haario.update)
    mean, sigma = xs[0], None
    for i, x in enumerate(xs, start=1):
        cov = update(cov, jnp.asarray(x))
        if i == 2:
            diff = x - mean
            sigma = 0.5 * np.outer(diff, diff) + damping * np.eye(d)
        elif i > 2:
            diff = x - mean
            sigma = (i - 2) / (i - 1) * sigma + np.outer(diff, diff) / i
        if i > 1:
            mean = (i - 1) / i * mean + x / i
            u = np.asarray(cov.chol_upper)
            np.testing.assert_allclose(u.T @ u, sigma, rtol=1e-10, atol=1e-12)
            assert float(cov.trace) == pytest.approx(np.trace(sigma), rel=1e-12)
            np.testing.assert_allclose(cov.mean, mean, rtol=1e-12)
            assert np.allclose(np.tril(u, -1), 0.0)
    r = square_roots.dense(haario.final(cov))
    np.testing.assert_allclose(r @ r.T, sigma, rtol=1e-10, atol=1e-12)
