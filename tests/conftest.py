"""Shared fixtures: float64 where exactness is checked, Gaussian targets with known moments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest


@pytest.fixture
def x64():
    """Run the test body with 64-bit floats (restored afterwards)."""
    with jax.enable_x64(True):
        yield


def gaussian_logdensity(mean, cov):
    """Cholesky-based log density of N(mean, cov), up to a constant."""
    chol = jnp.linalg.cholesky(cov)

    def logdensity(x):
        z = jax.scipy.linalg.solve_triangular(chol, x - mean, lower=True)
        return -0.5 * jnp.dot(z, z)

    return logdensity


def random_covariance(dim, seed, jitter=0.1):
    """A dense, well-conditioned random covariance matrix (numpy float64)."""
    rng = np.random.default_rng(seed)
    b = rng.normal(size=(dim, dim))
    return b @ b.T / dim + jitter * np.eye(dim)


def normalized_frobenius(a, b):
    """``|| a / (tr a / d) - b / (tr b / d) ||_F``, the paper's distance (Section 5.2)."""
    d = a.shape[0]
    return float(jnp.linalg.norm(a / (jnp.trace(a) / d) - b / (jnp.trace(b) / d)))
