"""Proposition 1, the whitened proposal, and the M-H decision (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import multivariate_normal

import fisher_mala as fm
from fisher_mala.proposals import h_function, log_proposal_ratio, metropolis_hastings


def _textbook_log_ratio(x, y, gx, gy, precond, step):
    """log q(x|y) - log q(y|x) with Gaussian densities, i.e. with A^{-1}."""
    cov = step * precond
    forward = multivariate_normal(x + 0.5 * step * precond @ gx, cov).logpdf(y)
    backward = multivariate_normal(y + 0.5 * step * precond @ gy, cov).logpdf(x)
    return backward - forward


@pytest.mark.parametrize("seed", range(5))
def test_proposition1_h_function_equals_textbook_ratio(x64, seed):
    rng = np.random.default_rng(seed)
    d = 6
    b = rng.normal(size=(d, d))
    precond = b @ b.T + 0.1 * np.eye(d)
    x, y, gx, gy = (rng.normal(size=d) for _ in range(4))
    step = rng.uniform(0.05, 2.0)
    expected = _textbook_log_ratio(x, y, gx, gy, precond, step)
    # Proposition 1 in the original coordinates.
    h_xy = h_function((x - y) @ gy, gy @ precond @ gy, step)
    h_yx = h_function((y - x) @ gx, gx @ precond @ gx, step)
    assert float(h_xy - h_yx) == pytest.approx(expected, rel=1e-10, abs=1e-10)
    # The whitened form used by the kernels: y - x = R w, u = R^T g.
    r = np.linalg.cholesky(precond)
    w = np.linalg.solve(r, y - x)
    whitened = log_proposal_ratio(jnp.asarray(w), r.T @ gx, r.T @ gy, step)
    assert float(whitened) == pytest.approx(expected, rel=1e-10, abs=1e-10)


def test_metropolis_hastings_rejects_nan_and_accepts_sure_moves():
    key = jax.random.key(0)
    accepted, rate = metropolis_hastings(key, jnp.asarray(jnp.nan))
    assert not bool(accepted) and float(rate) == 0.0
    accepted, rate = metropolis_hastings(key, jnp.asarray(-jnp.inf))
    assert not bool(accepted) and float(rate) == 0.0
    accepted, rate = metropolis_hastings(key, jnp.asarray(3.0))
    assert bool(accepted) and float(rate) == 1.0


def test_normalized_proposal_is_invariant_to_scaling_r(x64):
    rng = np.random.default_rng(0)
    d = 5
    r = jnp.asarray(rng.normal(size=(d, d)) + 3 * np.eye(d))
    cov = jnp.asarray(rng.normal(size=(d, d)))
    cov = cov @ cov.T + jnp.eye(d)

    def logdensity(x):
        return -0.5 * x @ jnp.linalg.solve(cov, x)

    x0 = jnp.asarray(rng.normal(size=d))
    keys = jax.random.split(jax.random.key(1), 20)
    finals = []
    for c in (1.0, 3.7, 1e-3):
        alg = fm.fisher_mala(logdensity, step_size=0.8, adapt=False)
        state = alg.init(x0, sqrt_precond=c * r)
        positions = []
        for key in keys:
            state, _ = alg.step(key, state)
            positions.append(state.position)
        finals.append(np.asarray(positions))
    np.testing.assert_allclose(finals[1], finals[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(finals[2], finals[0], rtol=1e-10, atol=1e-12)
    # and the same holds for fm.mala with the same preconditioner.
    alg = fm.mala(logdensity, step_size=0.8, sqrt_precond=5.0 * r)
    state = alg.init(x0)
    for i, key in enumerate(keys):
        state, _ = alg.step(key, state)
        np.testing.assert_allclose(np.asarray(state.position), finals[0][i], rtol=1e-10)
