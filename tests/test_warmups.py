"""The Fisher phase's fast start and restart windows (``fisher_mala.warmups``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import gaussian_logdensity

import fisher_mala as fm
from fisher_mala import fisher, warmups

pytest.importorskip("blackjax")  # the fast start's dual averaging is BlackJAX's


def test_fast_start_learns_every_scale_from_a_far_start(x64):
    """On independent coordinates with scales from 1e-3 to 1e3, started 100 sds out in the
    widest, the scout phase (500 MALA steps) hands the Fisher phase R_0 = diag(sqrt(v /
    lambda)) with v the exact variances (dg = -P dx on a Gaussian, wherever the chain is),
    and a sigma^2 that MALA accepts."""
    sd = np.geomspace(1e-3, 1e3, 6)
    logdensity = gaussian_logdensity(jnp.zeros(6), jnp.diag(jnp.asarray(sd**2)))
    x0 = jnp.asarray(np.r_[np.ones(5) * 1e-3, 1e5])
    warm = warmups.fisher_mala_warmup(logdensity, damping=0.1, fast_start=True)
    (state, _), info = warm.run(jax.random.key(0), x0, 500)  # the scout, then R_0
    r0 = np.asarray(state.sqrt_precond)
    np.testing.assert_allclose(np.diag(r0) ** 2 * 0.1, sd**2, rtol=1e-8)
    assert np.count_nonzero(r0 - np.diag(np.diag(r0))) == 0
    assert 0.3 < np.mean(np.asarray(info.acceptance_rate)[250:]) < 0.9
    # the same start gives Algorithm 1's scout sigma^2 ~1e-6 and acceptance ~1 (stuck)
    (plain, _), _ = warmups.fisher_mala_warmup(logdensity, damping=0.1).run(
        jax.random.key(0), x0, 500
    )
    assert float(plain.step_size) < 1e-4


def test_restart_keeps_d_signals_worth_of_the_estimate_and_the_proposal(x64):
    """F_0' = w F_n / (w_0 + n), w = min(d, w_0 + n) with F = (R R^T)^{-1} and w_0 the
    signals' worth of the prior before; the normalized step, R^T g and the trace follow,
    the count restarts. An estimate worth fewer than d signals is kept whole."""
    rng = np.random.default_rng(1)
    d, n, prior = 4, 37, 3.0
    m = rng.normal(size=(d, d))
    r = np.linalg.cholesky(m @ m.T + np.eye(d))
    grad = rng.normal(size=d)
    state = fisher.state_from(jnp.zeros(d), 0.0, jnp.asarray(grad), 0.3, 0.1, jnp.asarray(r))
    state = state._replace(count=jnp.asarray(n, jnp.int32))
    new = warmups._restart(prior)(state)
    r_new = np.asarray(new.sqrt_precond)
    f, f_new = (np.linalg.inv(m @ m.T) for m in (r, r_new))
    np.testing.assert_allclose(f_new, d / (prior + n) * f, rtol=1e-10)
    np.testing.assert_allclose(float(new.trace_precond), np.trace(r_new @ r_new.T), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(new.whitened_grad), grad @ r_new, rtol=1e-12)
    normalized = [float(s.step_size) * d / float(s.trace_precond) for s in (state, new)]
    np.testing.assert_allclose(normalized[1], normalized[0], rtol=1e-12)
    assert int(new.count) == 0
    short = warmups._restart(0.1)(state._replace(count=jnp.asarray(2, jnp.int32)))
    np.testing.assert_allclose(np.asarray(short.sqrt_precond), r, rtol=1e-12)  # 2.1 < d
    assert warmups._kept_weights(0.1, (25, 50, 100, 200), 100) == [0.1, 25.1, 75.1, 100.0, 100.0]
    assert warmups._kept_weights(0.1, (25, 50), 3) == [0.1, 3.0, 3.0]


def test_restart_windows_reach_the_fixed_point_where_one_running_average_lags(x64):
    """A badly scaled, correlated Gaussian (sds 1e-3 to 1e3, a 0.999 correlation): with
    Algorithm 1's start and one running average, A is still far from the covariance after
    3000 adaptive iterations (whitened condition number about 1000: the recursion corrects
    a start that is off by m along some direction only after about m iterations); with the
    fast start and restart windows (Fisher NUTS's defaults) it is within sampling noise."""
    sd = np.array([1e-3, 1.0, 1e3, 1e3])
    corr = np.eye(4)
    corr[2, 3] = corr[3, 2] = 0.999
    cov = corr * np.outer(sd, sd)
    logdensity = gaussian_logdensity(jnp.zeros(4), jnp.asarray(cov))
    x0 = jnp.asarray(sd * 3.0)

    def whitened_condition_number(**options):  # 1 when A is proportional to cov
        warm = warmups.fisher_mala_warmup(logdensity, damping=0.1, **options)
        (_, params), _ = warm.run(jax.random.key(2), x0, 3500)
        w = np.linalg.solve(np.linalg.cholesky(cov), np.asarray(params.sqrt_precond))
        eig = np.linalg.eigvalsh(w @ w.T)
        return eig[-1] / eig[0]

    fast = fm.whitened_warmup
    assert whitened_condition_number() > 100.0
    assert whitened_condition_number(fast_start=True, restart_windows=fast.RESTART_WINDOWS,
                 step_size_learning_rate=fast.FISHER_STEP_SIZE_LEARNING_RATE) < 1.5  # fmt: skip


def test_a_start_evaluated_by_the_caller_is_the_same_chain_with_one_gradient_less(x64):
    """``evaluated`` (the log density and gradient at the start, as NumPyro's
    ``initialize_model`` finds them) gives the chain of a start that evaluates them
    itself, bit for bit, and a program with one evaluation of the log density and its
    gradient less (counted by the ``tanh`` of this target's log density)."""
    x0 = jnp.asarray([3.0, -2.0, 0.5])

    def target(x):
        return -0.5 * jnp.sum(x**2 / jnp.asarray([1.0, 4.0, 0.25])) + jnp.sum(jnp.tanh(x))

    warmup = warmups.fisher_mala_warmup(target, fast_start=True, restart_windows=(25, 50))
    key = jax.random.key(3)
    evaluated = jax.jit(jax.value_and_grad(target))(x0)
    per_site = str(jax.make_jaxpr(jax.value_and_grad(target))(x0)).count("tanh")

    def plain(k, x):
        return warmup.run(k, x, 300)

    def given(k, x, e):
        return warmup.run(k, x, 300, evaluated=e)

    solves = str(jax.make_jaxpr(plain)(key, x0)).count("tanh")
    assert str(jax.make_jaxpr(given)(key, x0, evaluated)).count("tanh") == (solves - per_site)
    out, out_given = jax.jit(plain)(key, x0), jax.jit(given)(key, x0, evaluated)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(out_given), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
