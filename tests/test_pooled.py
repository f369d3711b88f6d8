"""Pooled FisherMALA: the rank-C square-root update and one R shared by all chains."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import normalized_frobenius

import fisher_mala as fm
from fisher_mala import pooled
from fisher_mala.sqrt_precond import (
    block_whitened_product,
    initial_sqrt_precond,
    rank_block_update,
    rank_one_update,
)


@pytest.mark.parametrize("d,c,n", [(5, 1, 10), (12, 4, 30), (40, 16, 20)])
def test_block_update_matches_dense_inverse_and_sequential_updates(x64, d, c, n):
    rng = np.random.default_rng(d * c)
    damping = 10.0
    r_block, tr_block = initial_sqrt_precond(d, damping, jnp.float64)
    r_seq, tr_seq = r_block, tr_block
    probe = rng.normal(size=d)
    whitened = probe @ np.asarray(r_block)
    signals = rng.normal(size=(n, c, d)) * rng.lognormal(size=(n, c, 1))
    for block in signals:
        update = rank_block_update(r_block, tr_block, jnp.asarray(block) @ r_block)
        whitened = block_whitened_product(update, whitened[None])[0]
        r_block, tr_block = update.sqrt_precond, update.trace_precond
        for s in block:
            u = rank_one_update(r_seq, tr_seq, jnp.asarray(s) @ r_seq)
            r_seq, tr_seq = u.sqrt_precond, u.trace_precond
    flat = signals.reshape(-1, d)
    dense = np.linalg.inv(flat.T @ flat + damping * np.eye(d))
    a_block = np.asarray(r_block) @ np.asarray(r_block).T
    a_seq = np.asarray(r_seq) @ np.asarray(r_seq).T
    assert np.linalg.norm(a_block - dense) / np.linalg.norm(dense) < 1e-10
    assert np.linalg.norm(a_block - a_seq) / np.linalg.norm(dense) < 1e-10
    assert float(tr_block) == pytest.approx(np.trace(a_block), rel=1e-9)
    np.testing.assert_allclose(whitened, probe @ np.asarray(r_block), rtol=1e-8, atol=1e-12)


MEAN = np.array([1.0, -2.0, 0.5])
COV = np.array([[1.0, 0.9, 0.2], [0.9, 1.5, 0.3], [0.2, 0.3, 0.25]])


def test_frozen_pooled_kernel_leaves_the_target_invariant():
    target = fm.targets.gaussian("g3", MEAN, COV)
    num = 4000
    chol = np.linalg.cholesky(COV)
    x0 = jnp.asarray(MEAN + jax.random.normal(jax.random.key(0), (num, 3)) @ chol.T, jnp.float32)
    r = jnp.asarray([[1.0, 0.0, 0.0], [0.8, 0.3, 0.0], [-0.5, 0.4, 2.0]], jnp.float32)
    state = pooled.init(x0, target.logdensity_fn, 0.3)
    state = pooled.state_from(state.position, state.logdensity, state.logdensity_grad, 0.3,
                              10.0, sqrt_precond=r)
    kernel = jax.jit(lambda k, s: pooled.build_kernel()(k, s, target.logdensity_fn))
    rates = []
    for key in jax.random.split(jax.random.key(1), 15):
        state, info = kernel(key, state)
        rates.append(float(info.acceptance_rate.mean()))
    assert 0.2 < np.mean(rates) < 0.9
    x = np.asarray(state.position, np.float64)
    z_mean = (x.mean(0) - MEAN) / (x.std(0) / np.sqrt(num))
    sq = (x - MEAN) ** 2
    z_var = (sq.mean(0) - np.diag(COV)) / (sq.std(0) / np.sqrt(num))
    assert np.all(np.abs(np.concatenate([z_mean, z_var])) < 4.5)
    np.testing.assert_array_equal(state.sqrt_precond, r)


@pytest.mark.slow  # 40 s; measured by benchmarks/pooled.py (docs: performance, section 2)
def test_pooled_sampling_learns_faster_than_one_chain():
    target = fm.targets.gp_gaussian()
    x0 = target.initial_positions(jax.random.key(1), 8)
    kwargs = dict(num_warmup=3000, num_samples=500)
    shared = fm.sample(jax.random.key(0), "fisher_mala", target.logdensity_fn, x0, pooled=True,
                       **kwargs)
    alone = fm.sample(jax.random.key(0), "fisher_mala", target.logdensity_fn, x0, **kwargs)
    assert shared.parameters.sqrt_precond.shape == (100, 100)
    assert shared.samples.shape == alone.samples.shape == (8, 500, 100)
    assert shared.sample_stats["acceptance_rate"].shape == (8, 500)
    r = np.asarray(shared.parameters.sqrt_precond, np.float64)
    d_shared = normalized_frobenius(r @ r.T, target.covariance)
    r1 = np.asarray(alone.parameters.sqrt_precond[0], np.float64)
    d_alone = normalized_frobenius(r1 @ r1.T, target.covariance)
    assert d_shared < 0.5 * d_alone, (d_shared, d_alone)
    assert fm.to_arviz(shared) is not None


def test_pooled_is_only_for_fisher_mala():
    with pytest.raises(ValueError, match="pooled"):
        fm.sample(jax.random.key(0), "mala", lambda x: -jnp.sum(x**2), jnp.zeros((2, 2)),
                  pooled=True)


def test_zero_signal_rows_leave_the_block_update_to_the_others(x64):
    """Rows of Phi that are zero (rejected or non-finite chains) contribute nothing."""
    rng = np.random.default_rng(3)
    d = 7
    r = jnp.asarray(np.linalg.cholesky(np.eye(d) + 0.3 * np.ones((d, d))))
    trace = jnp.sum(r * r)
    phis = jnp.asarray(rng.normal(size=(3, d)))
    padded = jnp.zeros((5, d)).at[jnp.array([0, 2, 4])].set(phis)
    full, only = rank_block_update(r, trace, padded), rank_block_update(r, trace, phis)
    np.testing.assert_allclose(full.sqrt_precond, only.sqrt_precond, rtol=1e-12, atol=1e-14)
    assert float(full.trace_precond) == pytest.approx(float(only.trace_precond), rel=1e-12)
    none = rank_block_update(r, trace, jnp.zeros((4, d)))
    np.testing.assert_array_equal(none.sqrt_precond, r)
    assert float(none.trace_precond) == pytest.approx(float(trace), rel=1e-14)


def _logdensity_3d(x):
    return -0.5 * jnp.sum(jnp.arange(1.0, 4.0) * (x - 1.0) ** 2) - 0.1 * jnp.sum(x**4)


def _grad_3d(x):
    return -np.arange(1.0, 4.0) * (x - 1.0) - 0.4 * x**3


def test_pooled_kernel_signals_match_dense_algebra(x64):
    """Every chain's Eq. (16) signal sqrt(alpha) (g_y - g_x), recomputed from the proposals
    with dense gradients, enters one rank-C Prop. 4 update: R R^T is the dense inverse of
    the sum of all chains' outer products plus lambda I. Kills: alpha for sqrt(alpha);
    no weight; the increment signal instead."""
    seen = []

    def logdensity(x):
        jax.debug.callback(lambda v: seen.append(np.asarray(v)), x)
        return _logdensity_3d(x)

    damping, chains, num_steps = 2.0, 3, 60
    alg = fm.pooled.as_top_level_api(logdensity, step_size=0.6, damping=damping)
    state = alg.init(0.3 * jax.random.normal(jax.random.key(0), (chains, 3)))
    step = jax.jit(alg.step)
    signals, weights = [], []
    for key in jax.random.split(jax.random.key(1), num_steps):
        x = np.asarray(state.position)
        jax.effects_barrier()
        seen.clear()
        state, info = step(key, state)
        jax.effects_barrier()
        y = np.concatenate([np.reshape(v, (-1, 3)) for v in seen])
        assert y.shape == (chains, 3)  # one evaluation per chain and step
        alpha = np.asarray(info.acceptance_rate)
        weights.append(alpha)
        signals.append(np.sqrt(alpha)[:, None] * (_grad_3d(y) - _grad_3d(x)))
    signals = np.concatenate(signals)
    assert 0.05 < np.mean(weights) < 0.95 and np.std(weights) > 0.1  # the weights matter
    expected = np.linalg.inv(signals.T @ signals + damping * np.eye(3))
    r = np.asarray(state.sqrt_precond)
    np.testing.assert_allclose(r @ r.T, expected, rtol=1e-8, atol=1e-14)
