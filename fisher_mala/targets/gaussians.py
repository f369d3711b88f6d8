"""The Gaussian targets of Section 5.2 (mean vector of ones, start from N(0, I))."""

import jax
import jax.numpy as jnp
import numpy as np

from fisher_mala.targets.base import Target, register

__all__ = ["gaussian", "correlated_2d", "gp_gaussian", "inhomogeneous_gaussian"]


def gaussian(name: str, mean: np.ndarray, covariance: np.ndarray, paper_dim=None) -> Target:
    """``N(mean, covariance)`` with a Cholesky-based log density (no explicit inverse).

    A diagonal ``covariance`` gets the ``O(d)`` log density (standardized coordinates)
    rather than a triangular solve with a diagonal matrix, which costs ``O(d^2)``: the
    same model a user (or a PyMC model with independent normals) would write.
    """
    mean = np.asarray(mean, np.float64)
    covariance = np.asarray(covariance, np.float64)
    chol = np.linalg.cholesky(covariance)
    diagonal = np.count_nonzero(covariance - np.diag(np.diag(covariance))) == 0

    def logdensity(x):
        centred = x - jnp.asarray(mean, x.dtype)
        if diagonal:
            z = centred / jnp.asarray(np.diag(chol), x.dtype)
        else:
            lower = jnp.asarray(chol, x.dtype)
            z = jax.scipy.linalg.solve_triangular(lower, centred, lower=True)
        return -0.5 * jnp.dot(z, z)

    return Target(
        name=name,
        dim=mean.shape[0],
        logdensity_fn=logdensity,
        paper_dim=paper_dim,
        mean=mean,
        covariance=covariance,
        inverse_fisher=covariance,  # for a Gaussian I^{-1} = Sigma (Section 3)
    )


@register("gaussian_2d")
def correlated_2d() -> Target:
    """2-d Gaussian with covariance [[1, 0.995], [0.995, 1]] (Figure 1a)."""
    cov = np.array([[1.0, 0.995], [0.995, 1.0]])
    return gaussian("gaussian_2d", np.ones(2), cov, paper_dim=2)


@register("gp")
def gp_gaussian() -> Target:
    """100-d GP target: Sigma_ij = s_i s_j exp(-(s_i - s_j)^2 / (2 * 0.09)) + 0.001 delta_ij.

    ``s_i`` is a regular grid of 100 points on [1, 2] (product of a linear and a squared
    exponential kernel plus white noise, Section 5.2).
    """
    s = np.linspace(1.0, 2.0, 100)
    cov = np.outer(s, s) * np.exp(-0.5 * (s[:, None] - s[None, :]) ** 2 / 0.09)
    cov += 0.001 * np.eye(100)
    return gaussian("gp", np.ones(100), cov, paper_dim=100)


@register("inhomogeneous")
def inhomogeneous_gaussian() -> Target:
    """100-d diagonal Gaussian with standard deviations 0.01, 0.02, ..., 1.00."""
    sd = np.arange(1, 101) / 100.0
    return gaussian("inhomogeneous", np.ones(100), np.diag(sd**2), paper_dim=100)
