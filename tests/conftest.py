"""Shared fixtures: float64 where exactness is checked, Gaussian targets with known moments.

The session shares one JAX compilation cache (a temporary directory, removed at the end)
between its tests, the xdist workers and the examples' subprocesses: many tests run the
same programs (a checkpointed run and the run it resumes, one target under several
samplers' options), and XLA:CPU's compilation is most of their time. A cached executable
is the one XLA would compile again, so the draws are the same (``test_golden_draws.py``
passes with it). A ``JAX_COMPILATION_CACHE_DIR`` set by the user is kept.
"""

import os
import shutil
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

_CACHE_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
#: Programs compiled faster than this are not cached (reading one back costs about as much).
_CACHE_MIN_COMPILE_SECONDS = "0.5"


def pytest_configure(config):
    """Point this process (and, through the environment, the workers and subprocesses it
    starts) at one compilation cache for the session."""
    if os.environ.get(_CACHE_VARIABLE):  # the user's, or the controller's (a worker)
        directory = os.environ[_CACHE_VARIABLE]
    else:
        directory = tempfile.mkdtemp(prefix="fisher_mala_tests_jax_cache_")
        os.environ[_CACHE_VARIABLE] = directory
        config._fisher_mala_cache = directory  # removed by this process at the end
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", _CACHE_MIN_COMPILE_SECONDS)
    # jax read its flags when conftest imported it: set them here too.
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update(
        "jax_persistent_cache_min_compile_time_secs",
        float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
    )


def pytest_unconfigure(config):
    directory = getattr(config, "_fisher_mala_cache", None)
    if directory:
        shutil.rmtree(directory, ignore_errors=True)


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
