"""Proposition 4 and Appendix B square-root recursions against dense inverses (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fisher_mala.sqrt_precond import (
    _rank_one_rows,
    cholesky_rank_one_update,
    fisher_coefficients,
    initial_sqrt_precond,
    rank_one_update,
    schedule_coefficients,
    whitened_product,
)

TOL = 1e-10


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _run(signals, damping, coefficients, exact_trace=False):
    d = signals.shape[1]
    r, tr = initial_sqrt_precond(d, damping, jnp.float64)
    probe = np.arange(1.0, d + 1.0)
    whitened_probe = probe @ r
    for n, s in enumerate(signals, start=1):
        phi = s @ r
        scale, weight = coefficients(n)
        update = rank_one_update(r, tr, phi, scale, weight, exact_trace)
        whitened_probe = whitened_product(update, whitened_probe)
        r, tr = update.sqrt_precond, update.trace_precond
    return np.asarray(r), float(tr), np.asarray(whitened_probe), probe


@pytest.mark.parametrize("d,n", [(1, 5), (7, 50), (50, 300)])
def test_proposition4_matches_dense_inverse(x64, d, n):
    rng = np.random.default_rng(d + n)
    signals = rng.normal(size=(n, d)) * rng.lognormal(size=(n, 1))
    damping = 10.0
    r, tr, whitened_probe, probe = _run(
        jnp.asarray(signals), damping, lambda n: fisher_coefficients(n, jnp.float64)
    )
    dense = np.linalg.inv(signals.T @ signals + damping * np.eye(d))
    assert _rel(r @ r.T, dense) < TOL
    # O(d) bookkeeping equals the recomputed quantities.
    assert abs(tr - np.trace(r @ r.T)) / np.trace(r @ r.T) < TOL
    np.testing.assert_allclose(whitened_probe, probe @ r, rtol=1e-9, atol=1e-12)


def test_first_update_is_equation_12(x64):
    rng = np.random.default_rng(1)
    d, damping = 6, 10.0
    s = rng.normal(size=d) * 3.0
    r0, tr0 = initial_sqrt_precond(d, damping, jnp.float64)
    r1 = np.asarray(rank_one_update(r0, tr0, jnp.asarray(s) @ r0).sqrt_precond)
    norm2 = s @ s
    r_coef = 1.0 / (1.0 + np.sqrt(damping / (damping + norm2)))
    expected = (np.eye(d) - r_coef * np.outer(s, s) / (damping + norm2)) / np.sqrt(damping)
    np.testing.assert_allclose(r1, expected, rtol=1e-13, atol=1e-15)


def test_update_is_equation_13(x64):
    rng = np.random.default_rng(2)
    d = 5
    r = rng.normal(size=(d, d))
    s = rng.normal(size=d)
    phi = r.T @ s
    q = phi @ phi
    r_coef = 1.0 / (1.0 + np.sqrt(1.0 / (1.0 + q)))
    expected = r - r_coef * np.outer(r @ phi, phi) / (1.0 + q)
    got = rank_one_update(jnp.asarray(r), jnp.sum(r * r), jnp.asarray(phi)).sqrt_precond
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("power", [1.0, 0.7, 0.55])
def test_appendix_b_matches_dense_fisher_recursion(x64, power):
    rng = np.random.default_rng(3)
    d, n, damping = 20, 200, 10.0
    signals = rng.normal(size=(n, d)) * rng.lognormal(size=(n, 1))

    def gamma(k):
        return 1.0 / k**power

    r, tr, _, _ = _run(
        jnp.asarray(signals),
        damping,
        lambda k: schedule_coefficients(k, gamma(k), jnp.float64),
        exact_trace=True,
    )
    fisher = np.outer(signals[0], signals[0]) + damping * np.eye(d)
    for k in range(2, n + 1):
        g = gamma(k)
        fisher = (1 - g) * fisher + g * np.outer(signals[k - 1], signals[k - 1])
    assert _rel(r @ r.T, np.linalg.inv(fisher)) < TOL
    assert abs(tr - np.trace(r @ r.T)) / np.trace(r @ r.T) < TOL


def test_gamma_one_over_n_is_a_rescaled_proposition4(x64):
    rng = np.random.default_rng(4)
    d, n = 8, 40
    signals = jnp.asarray(rng.normal(size=(n, d)))
    r_b, _, _, _ = _run(signals, 10.0, lambda k: schedule_coefficients(k, 1.0 / k, jnp.float64))
    r_4, _, _, _ = _run(signals, 10.0, lambda k: fisher_coefficients(k, jnp.float64))
    # I_n = (sum s s^T + lambda I) / n, so A_B = n A_4.
    assert _rel(r_b @ r_b.T, n * (r_4 @ r_4.T)) < TOL


def test_zero_signal_leaves_r_unchanged(x64):
    r = jnp.asarray(np.random.default_rng(5).normal(size=(4, 4)))
    update = rank_one_update(r, jnp.sum(r * r), jnp.zeros(4))
    np.testing.assert_array_equal(np.asarray(update.sqrt_precond), np.asarray(r))
    assert float(update.trace_precond) == pytest.approx(float(jnp.sum(r * r)), rel=1e-15)


@pytest.mark.parametrize("d", [1, 7, 60])
def test_cholesky_rank_one_update_matches_dense_factor(x64, d):
    """``U'^T U' = U^T U + v v^T`` for one factor, vmapped factors, and both batched paths."""
    rng = np.random.default_rng(d)
    uppers, vectors, expected = [], [], []
    for _ in range(3):
        a = rng.normal(size=(d, d))
        cov = a @ a.T / d + np.eye(d)
        v = rng.normal(size=d)
        uppers.append(np.linalg.cholesky(cov).T)
        vectors.append(v)
        expected.append(np.linalg.cholesky(cov + np.outer(v, v)).T)
    uppers, vectors, expected = map(np.stack, (uppers, vectors, expected))
    one = jax.jit(cholesky_rank_one_update)(uppers[0], vectors[0])
    assert _rel(one, expected[0]) < 1e-12
    batched = jax.jit(jax.vmap(cholesky_rank_one_update))(uppers, vectors)  # CPU: one by one
    assert _rel(batched, expected) < 1e-12
    all_at_once = jax.jit(jax.vmap(_rank_one_rows))(uppers, vectors)  # the GPU/TPU path
    assert _rel(all_at_once, expected) < 1e-12
    shared = jax.vmap(cholesky_rank_one_update, in_axes=(None, 0))(uppers[0], vectors)
    for c in range(3):
        dense = np.linalg.cholesky(uppers[0].T @ uppers[0] + np.outer(vectors[c], vectors[c])).T
        assert _rel(shared[c], dense) < 1e-12
