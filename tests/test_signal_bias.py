"""The bias of the score-difference signal (the paper's Section 7, first open question).

What FisherMALA's recursion converges to is the ``A`` with ``A^{-1}`` proportional to
``S(A) = E[alpha d d^T]``, ``d = g(y) - g(x)``, ``x ~ pi``, ``y ~ q_A(x, .)``
(docs/signal_bias.md). These tests check, by simulation against formulas with Monte Carlo
z-scores, the four facts the answer rests on:

1. stationarity: ``S(A) = 2 (I - Gamma_1)``, ``Gamma_1`` the lag-one autocovariance of
   the score, for any target (the Rao-Blackwellized and the increment signal alike);
2. the closed form on a Gaussian ``N(0, P^{-1})`` without the accept step:
   ``E[d d^T] = sigma^2 P A P + sigma^4 / 4 P A P A P``, whose fixed point is
   ``A`` proportional to ``P^{-1} = I^{-1}``;
3. on a Gaussian, with the accept step, ``A = c P^{-1}`` gives ``S(A)`` proportional to
   ``P`` exactly (the library's whitened signal has covariance proportional to ``I``), and
   another ``A`` does not;
4. the small-step limit on a target of varying curvature: ``S(A) / sigma^2 -> E[H A H]``,
   which on independent coordinates puts ``A_jj`` proportional to ``E[h_j^2]^{-1/2}``,
   not ``1 / E[-h_j] = I^{-1}_jj``; and FisherMALA's warm-up learns the fixed point of
   ``A^{-1} ~ S(A)`` at its step (between the two at high acceptance), not ``I^{-1}``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fisher_mala.adaptations.fisher import whitened_signal
from fisher_mala.mala import build_kernel, state_from
from fisher_mala.warmups import fisher_mala_warmup

#: Largest |z| accepted for one entry (several entries per test: about 4 sigma overall).
Z_MAX = 4.5
N = 200_000


def _z(samples, expected):
    """z-scores of the mean of ``samples`` (rows) against ``expected``."""
    mean = samples.mean(0)
    se = samples.std(0) / np.sqrt(samples.shape[0])
    return (mean - expected) / np.maximum(se, 1e-300)


def _gaussian(dim=3):
    rng = np.random.default_rng(0)
    m = rng.standard_normal((dim, dim))
    cov = m @ m.T + dim * np.eye(dim)
    return cov, np.linalg.inv(cov), np.linalg.cholesky(cov)


def _one_step(logdensity, x, keys, sqrt_precond, sigma2):
    """One library MALA step from each row of ``x``: ``(info, new position)``."""
    kernel = build_kernel()

    def step(key, x):
        state = state_from(x, *jax.value_and_grad(logdensity)(x), sqrt_precond)
        new, info = kernel(key, state, logdensity, sigma2)
        return info, new.position

    return jax.vmap(step)(keys, x)


def test_the_signal_measures_the_score_minus_its_lag_one_autocovariance():
    """Fact 1 on log-gamma coordinates (skewed; ``I = diag(k)`` exactly)."""
    with jax.enable_x64(True):
        k = jnp.array([1.0, 3.0])

        def logdensity(x):
            return jnp.sum(k * x - jnp.exp(x))

        key_x, key_step = jax.random.split(jax.random.key(0))
        x = jnp.log(jax.random.gamma(key_x, k, (N, 2)))
        info, x_next = _one_step(logdensity, x, jax.random.split(key_step, N), None, 0.5)
        g, g_next = jax.vmap(jax.grad(logdensity))(x), jax.vmap(jax.grad(logdensity))(x_next)
        phi = whitened_signal("rao_blackwell", info.whitened_grad, info.proposal_whitened_grad,
                              info.acceptance_rate, info.is_accepted, info.proposal_is_finite)
        # S - 2 I + 2 Gamma_1, one term per draw (Gamma_1 symmetrized: the chain is reversible)
        cross = g[:, :, None] * g_next[:, None, :]
        terms = phi[:, :, None] * phi[:, None, :] + cross + jnp.swapaxes(cross, 1, 2)
        z = _z(np.asarray(terms).reshape(N, -1), 2 * np.diag(np.asarray(k)).ravel())
        assert np.max(np.abs(z)) < Z_MAX, z
        assert 0.3 < float(info.acceptance_rate.mean()) < 0.95  # a real accept step


def test_the_closed_form_of_the_signal_on_a_gaussian_without_the_accept_step():
    """Fact 2: ``E[d d^T] = sigma^2 P A P + sigma^4/4 P A P A P`` for a frozen ``A``."""
    with jax.enable_x64(True):
        cov, prec, chol = _gaussian()
        a = np.diag([0.5, 1.0, 3.0]) + 0.2
        sigma2 = 0.7
        kx, kn = jax.random.split(jax.random.key(1))
        x = jax.random.normal(kx, (N, 3)) @ chol.T
        y = x + 0.5 * sigma2 * (-x @ prec) @ a + np.sqrt(sigma2) * jax.random.normal(
            kn, (N, 3)
        ) @ np.linalg.cholesky(a).T
        d = -(y - x) @ prec
        outer = np.asarray(d[:, :, None] * d[:, None, :]).reshape(N, -1)
        pap = prec @ a @ prec
        expected = sigma2 * pap + sigma2**2 / 4 * pap @ a @ prec
        z = _z(outer, expected.ravel())
        assert np.max(np.abs(z)) < Z_MAX, z
        # its fixed point: A^{-1} = c (sigma^2 P A P + ...) holds for A proportional to P^{-1}
        fixed = cov * 2.0
        lhs = np.linalg.inv(fixed)
        rhs = sigma2 * prec @ fixed @ prec + sigma2**2 / 4 * prec @ fixed @ prec @ fixed @ prec
        ratio = rhs / lhs
        np.testing.assert_allclose(ratio, ratio[0, 0], rtol=1e-10)


@pytest.mark.parametrize("proportional", [True, False])
def test_on_a_gaussian_the_whitened_signal_is_isotropic_exactly_when_a_is_the_covariance(
    proportional,
):
    """Fact 3, with the library's kernel and signal (accept step included)."""
    with jax.enable_x64(True):
        cov, prec, chol = _gaussian()

        def logdensity(x):
            return -0.5 * x @ (prec @ x)

        a = 1.7 * cov if proportional else np.diag(np.diag(cov))
        r = jnp.asarray(np.linalg.cholesky(a))
        kx, ks = jax.random.split(jax.random.key(2))
        x = jax.random.normal(kx, (N, 3)) @ chol.T
        info, _ = _one_step(logdensity, x, jax.random.split(ks, N), r, 0.9)
        phi = whitened_signal("rao_blackwell", info.whitened_grad, info.proposal_whitened_grad,
                              info.acceptance_rate, info.is_accepted, info.proposal_is_finite)
        outer = np.asarray(phi[:, :, None] * phi[:, None, :]).reshape(N, 3, 3)
        scale = np.trace(outer.mean(0)) / 3
        z = _z(outer.reshape(N, -1), (scale * np.eye(3)).ravel())
        if proportional:
            assert np.max(np.abs(z)) < Z_MAX, z
        else:  # the recursion would move A: the test has the power to see it
            assert np.max(np.abs(z)) > 10, z


def test_the_small_step_limit_is_the_hessian_sandwich_not_the_inverse_fisher():
    """Fact 4, first half: ``E[alpha d_j^2] / sigma^2 -> a_j E[h_j^2] = a_j k_j (k_j + 1)``
    on log-gamma coordinates (``I_jj = k_j``), so the fixed point has ``A_jj`` proportional
    to ``(k_j (k_j + 1))^{-1/2}`` rather than ``1 / k_j``."""
    with jax.enable_x64(True):
        k = jnp.array([1.0, 20.0])

        def logdensity(x):
            return jnp.sum(k * x - jnp.exp(x))

        a = jnp.array([0.9, 0.06])
        sigma2 = 1e-4  # the O(sigma^2) correction is far below the Monte Carlo error
        kx, ks = jax.random.split(jax.random.key(3))
        x = jnp.log(jax.random.gamma(kx, k, (N, 2)))
        info, _ = _one_step(logdensity, x, jax.random.split(ks, N), jnp.diag(jnp.sqrt(a)),
                            sigma2)  # fmt: skip
        d = (info.proposal_whitened_grad - info.whitened_grad) / jnp.sqrt(a)  # R = diag(sqrt a)
        step = info.normalized_step_size[:, None]  # sigma^2 / (tr(A) / d), Algorithm 1
        terms = np.asarray(info.acceptance_rate[:, None] * d**2 / step)
        z = _z(terms, np.asarray(a * k * (k + 1)))
        assert np.max(np.abs(z)) < Z_MAX, z


@pytest.mark.parametrize("acceptance", [0.574, 0.95])
def test_fisher_malas_warmup_learns_the_fixed_point_not_the_inverse_fisher(acceptance):
    """Fact 4, second half, with the library's warm-up: on log-gamma coordinates with
    ``k = (1, 20)`` (``I^{-1}``: ``A_11 / A_22 = 20``), 16 chains learn the ratio of the
    fixed point ``A^{-1} ~ S(A)`` computed by ``benchmarks.signal_bias.fixed_point`` from
    exact draws: about 29 at Algorithm 1's acceptance 0.574, about 15.6 at 0.95 (towards
    the small-step limit ``sqrt(20 * 21 / 2) = 14.5``)."""
    from benchmarks.signal_bias import fixed_point

    with jax.enable_x64(True):
        k = jnp.array([1.0, 20.0])

        def logdensity(x):
            return jnp.sum(k * x - jnp.exp(x))

        kx, kn = jax.random.split(jax.random.key(1))
        x = jnp.log(jax.random.gamma(kx, k, (50_000, 2)))
        point, _, _ = fixed_point(logdensity, x, jax.random.normal(kn, x.shape), acceptance, 10)
        predicted = float(point[0, 0] / point[1, 1])
        warmup = fisher_mala_warmup(logdensity, target_acceptance_rate=acceptance)
        chains = 16
        x0 = jnp.log(k)[None].repeat(chains, 0)
        run = jax.jit(jax.vmap(lambda key, x: warmup.run(key, x, 40_000)[0][1].sqrt_precond))
        r = run(jax.random.split(jax.random.key(4), chains), x0)
        a = r @ jnp.swapaxes(r, 1, 2)
        ratio = np.asarray(a[:, 0, 0] / a[:, 1, 1])
        se = ratio.std(ddof=1) / np.sqrt(chains)
        # the fixed point's own Monte Carlo error (50 000 exact draws): about 1%
        assert abs(ratio.mean() - predicted) < Z_MAX * se + 0.02 * predicted, (ratio, predicted)
        assert abs(ratio.mean() - 20.0) > 10 * se + 0.1 * 20.0, ratio
