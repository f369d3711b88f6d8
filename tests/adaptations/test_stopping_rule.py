"""The host-side looks at the learned R: the stopping rule and the metric choice."""

import numpy as np
from conftest import random_covariance

from fisher_mala.adaptations.stopping_rule import (
    PLATEAU_NOISE_FACTOR,
    PLATEAU_SIGNALS_PER_DIM,
    block_condition_number,
    correlation_condition_number,
    diagonal_suffices,
    noise_condition_number,
    stopping_rule,
)


def test_correlation_condition_number_against_dense_linear_algebra(x64):
    covs = np.stack([random_covariance(5, seed=s) for s in (1, 2)])
    r = np.linalg.cholesky(covs) * 3.0  # the scale of A does not matter
    kappa = correlation_condition_number(r)
    for c, k in zip(covs, kappa, strict=True):
        corr = c / np.sqrt(np.outer(np.diag(c), np.diag(c)))
        np.testing.assert_allclose(k, np.linalg.cond(corr), rtol=1e-10)
    np.testing.assert_allclose(correlation_condition_number(np.diag([0.1, 5.0, 30.0])), 1.0)


def test_block_condition_number_is_that_of_the_block_signals_alone(x64):
    """``kappa(X^T X - I)``, ``X = R_now^{-1} R_prev``, is the condition number of the new
    signals whitened by the earlier R (Proposition 4's un-normalized F = (R R^T)^{-1})."""
    rng = np.random.default_rng(3)
    d, n = 6, 40
    r_prev = np.linalg.cholesky(random_covariance(d, seed=4)) / 5.0
    signals = rng.normal(size=(n, d)) @ np.diag(np.geomspace(0.5, 4.0, d))
    f_now = np.linalg.inv(r_prev @ r_prev.T) + signals.T @ signals
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))  # any square root of F_now^{-1} will do
    r_now = np.linalg.cholesky(np.linalg.inv(f_now)) @ q
    whitened = signals @ r_prev
    expected = np.linalg.cond(whitened.T @ whitened)
    np.testing.assert_allclose(block_condition_number(r_prev, r_now), expected, rtol=1e-8)


def test_noise_condition_number_is_that_of_independent_draws():
    """The Marchenko-Pastur edges predict the sample correlation of independent draws."""
    rng = np.random.default_rng(0)
    for dim, n in ((50, 2000), (100, 4000), (10, 4000)):
        x = rng.normal(size=(n, dim)) * np.geomspace(0.1, 10.0, dim)
        observed = np.linalg.cond(np.corrcoef(x.T))
        predicted = noise_condition_number(dim, n)
        assert 0.8 < observed / predicted < 1.1, (dim, n, observed, predicted)
    assert np.isinf(noise_condition_number(100, 399))


def _learn(r, signals):
    """A square root of Proposition 4's ``F^{-1}`` after absorbing ``signals`` (dense)."""
    fisher = np.linalg.inv(r @ r.T) + signals.T @ signals
    return np.linalg.cholesky(np.linalg.inv(fisher))


def test_the_rule_stops_when_new_signals_agree_with_the_earlier_r(x64):
    """Signals drawn from the Fisher matrix the earlier R already holds: settled. Signals
    with one direction 30 times stronger: not settled."""
    rng = np.random.default_rng(7)
    d, n = 5, 4000
    cov = random_covariance(d, seed=2)
    fisher = np.linalg.inv(cov)
    r_prev = np.linalg.cholesky(np.linalg.inv(n * fisher))  # R R^T = (n I_fisher)^{-1}
    rule = stopping_rule()
    look = rule.init(r_prev, n)
    agreeing = rng.multivariate_normal(np.zeros(d), fisher, size=n)
    r_now = _learn(r_prev, agreeing)
    assert rule.final(rule.update(look, (r_now, 2 * n)))
    skewed = agreeing.copy()
    skewed[:, 0] *= 30.0
    r_other = _learn(r_prev, skewed)
    assert not rule.final(rule.update(look, (r_other, 2 * n)))


def test_a_plateau_stops_only_with_enough_signals_and_within_its_factor(x64):
    """A block with one direction twice as strong as the earlier R says (kappa about 4.6
    times noise's): not settled, but a plateau once every chain has absorbed
    PLATEAU_SIGNALS_PER_DIM * d signals; one 30 times as strong is neither."""
    rng = np.random.default_rng(8)
    d, n = 5, 1000
    fisher = np.linalg.inv(random_covariance(d, seed=3))
    r_prev = np.linalg.cholesky(np.linalg.inv(n * fisher))
    block = rng.multivariate_normal(np.zeros(d), fisher, size=n)
    rule = stopping_rule()

    def look(scale, count_before):
        chol = np.linalg.cholesky(fisher)
        whitened = block @ np.linalg.inv(chol).T  # identity covariance ...
        signals = whitened * np.array([scale] + [1.0] * (d - 1)) @ chol.T  # ... but for one
        before = rule.init(r_prev, count_before)
        state = rule.update(before, (_learn(r_prev, signals), count_before + n))
        ratio = block_condition_number(r_prev, state.sqrt_precond) / noise_condition_number(d, n)
        return state, float(ratio)

    enough = PLATEAU_SIGNALS_PER_DIM * d
    state, ratio = look(2.0, enough - n)
    assert 2.0 < ratio < PLATEAU_NOISE_FACTOR
    assert not state.learned and state.plateau and not rule.final(state)
    state, _ = look(2.0, enough - n - 1)  # one signal short
    assert not state.learned and not state.plateau
    state, ratio = look(30.0, enough)
    assert ratio > PLATEAU_NOISE_FACTOR and not state.plateau


def test_too_few_signals_never_stop(x64):
    d = 8
    r = np.eye(d)
    rule = stopping_rule()
    assert not rule.final(rule.update(rule.init(r, 0), (r * 0.9, 4 * d - 1)))


def test_diagonal_suffices_for_independent_draws_only(x64):
    rng = np.random.default_rng(0)
    d, n = 6, 5000
    scales = np.geomspace(0.1, 10.0, d)
    independent = rng.normal(size=(n, d)) / scales  # scores of N(0, diag(scales^2))
    r = np.linalg.cholesky(np.linalg.inv(independent.T @ independent))
    assert diagonal_suffices(r, n)
    correlated = independent @ np.linalg.cholesky(random_covariance(d, seed=1)).T
    r = np.linalg.cholesky(np.linalg.inv(correlated.T @ correlated))
    assert not diagonal_suffices(r, n)
