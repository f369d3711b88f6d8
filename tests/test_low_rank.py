"""The diagonal-plus-low-rank Fisher preconditioner (fisher_mala.low_rank): its square root
against dense linear algebra in float64, its learner on a Gaussian whose covariance is
diagonal plus rank 4 (relative Frobenius error against the truth, as the paper's
Figure 2), and fm.sample(..., rank=k) by MCSE z-scores."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisher_mala as fm
from fisher_mala import low_rank, square_roots
from fisher_mala.adaptations.step_size import robbins_monro
from fisher_mala.square_roots import LowRankSqrt


def _root(rng, dim=9, rank=3):
    basis = np.linalg.qr(rng.normal(size=(dim, rank)))[0]
    return LowRankSqrt(
        jnp.asarray(np.exp(rng.normal(size=dim))),
        jnp.asarray(basis),
        jnp.asarray(rng.uniform(-0.9, 3.0, size=rank)),
    )


def test_low_rank_square_root_products_equal_dense_linear_algebra():
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        root = _root(rng)
        scale, basis, c = (np.asarray(a) for a in root[:3])
        dense = np.diag(scale) @ (np.eye(9) + basis @ np.diag(c) @ basis.T)
        np.testing.assert_allclose(square_roots.dense(root), dense, rtol=1e-12)
        w, g = rng.normal(size=9), rng.normal(size=(4, 9))
        np.testing.assert_allclose(square_roots.color(root, jnp.asarray(w)), dense @ w, rtol=1e-12)
        np.testing.assert_allclose(square_roots.whiten(root, jnp.asarray(g)), g @ dense,
                                   rtol=1e-12)  # fmt: skip
        np.testing.assert_allclose(square_roots.trace(root), np.trace(dense @ dense.T),
                                   rtol=1e-12)  # fmt: skip
        # A = D^(1/2) (I + Q ((1 + c)^2 - 1) Q^T) D^(1/2), and R^(-1) in O(d k)
        a = np.diag(scale) @ (np.eye(9) + basis @ np.diag((1 + c) ** 2 - 1) @ basis.T)
        np.testing.assert_allclose(dense @ dense.T, a @ np.diag(scale), rtol=1e-12)
        inverse = low_rank._inverse_factors(root)
        undo = low_rank._apply(root.basis, inverse, jnp.asarray(dense @ w) / root.scale)
        np.testing.assert_allclose(undo, w, rtol=1e-10)
        # the same products read from Q^T stored (k, d), as the learner's blocks run them
        rows = root._replace(rows=jnp.asarray(basis.T.copy()))
        np.testing.assert_allclose(square_roots.color(rows, jnp.asarray(w)), dense @ w, rtol=1e-12)
        np.testing.assert_allclose(square_roots.whiten(rows, jnp.asarray(g)), g @ dense,
                                   rtol=1e-12)  # fmt: skip
        learner = low_rank.init(jax.random.key(0), 9, jnp.float64, 3)
        x = jnp.asarray(w)
        state = low_rank.fisher_state(x, -0.5 * x @ x, -x, 0.1, learner.sqrt_precond)
        for part in low_rank.start_block((state, learner)):
            np.testing.assert_array_equal(part.sqrt_precond.rows, part.sqrt_precond.basis.T)
        for part in low_rank.finish_block(3)(low_rank.start_block((state, learner))):
            assert part.sqrt_precond.rows is None  # the states between blocks have none


def _diag_plus_low_rank(dim=200, seed=0):
    """Sigma = D^(1/2) (I + U diag(S - 1) U^T) D^(1/2): two loose directions (variance 100
    and 30 times the diagonal's) and two stiff ones (0.05 and 0.01 times)."""
    rng = np.random.default_rng(seed)
    diagonal = np.exp(rng.uniform(-2, 2, dim))
    loadings = np.linalg.qr(rng.normal(size=(dim, 4)))[0]
    spectrum = np.array([100.0, 30.0, 0.05, 0.01])
    root = np.sqrt(diagonal)[:, None]
    sigma = root * (np.eye(dim) + loadings @ np.diag(spectrum - 1) @ loadings.T) * root.T
    return sigma, loadings, rng


def _relative_frobenius(a, b):
    a, b = a / np.trace(a), b / np.trace(b)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def _learn(sigma, rng, rank, num_steps, diagonal="learned", probes=True):
    dim = sigma.shape[0]
    precision = jnp.asarray(np.linalg.inv(sigma))

    def logdensity(x):
        return -0.5 * x @ precision @ x

    x0 = jnp.asarray(np.linalg.cholesky(sigma) @ rng.normal(size=dim))
    learner = low_rank.init(jax.random.key(0), dim, jnp.float64, rank)
    if not probes:  # every cycle judged against the trace's mean (the earlier rule)
        learner = learner._replace(probes=learner.probes[:, :0],
                                   probe_gram=learner.probe_gram[:0, :0])  # fmt: skip
    value, grad = jax.value_and_grad(logdensity)(x0)
    state = low_rank.fisher_state(x0, value, grad, 0.1, learner.sqrt_precond)
    run = jax.jit(
        lambda key, carry: low_rank.scan_adaptive(
            key, carry, logdensity, num_steps, rank, robbins_monro(0.574, 0.015),
            diagonal=diagonal,
        )
    )
    (state, learner), acceptance = run(jax.random.key(1), (state, learner))
    return state, np.asarray(acceptance)


def test_the_learned_preconditioner_finds_a_diagonal_plus_rank_4_covariance():
    """d = 200, k = 8, 20 000 adaptive FisherMALA iterations (100 d): the four directions
    found (cosines above 0.95) and the trace-normalized A within 15% of Sigma in relative
    Frobenius norm, where the best diagonal is more than 90% away."""
    with jax.enable_x64(True):
        sigma, loadings, rng = _diag_plus_low_rank()
        state, acceptance = _learn(sigma, rng, 8, 20_000)
        root = square_roots.dense(state.sqrt_precond)
        learned = np.asarray(root @ root.T)
        assert _relative_frobenius(learned, sigma) < 0.15
        assert _relative_frobenius(np.diag(np.diag(sigma)), sigma) > 0.9
        scaled = loadings  # U lives in the coordinates scaled by D^(1/2): rescale Q
        basis = np.asarray(state.sqrt_precond.basis)
        cosines = np.linalg.svd(scaled.T @ basis, compute_uv=False)
        assert cosines.min() > 0.95, cosines
        assert 0.45 < acceptance[-2000:].mean() < 0.7


def _prior_plus_informed(dim=200, seed=5):
    """A whitened latent model's posterior: prior N(0, I), data informing four directions,
    precision ``I + V diag(w) V^T`` with ``w`` from 3 to 3000 (a stiff direction carries
    almost the whole trace of the whitened signals' second moment at the start)."""
    rng = np.random.default_rng(seed)
    informed = np.linalg.qr(rng.normal(size=(dim, 4)))[0]
    precision = np.eye(dim) + informed @ np.diag([3000.0, 300.0, 30.0, 3.0]) @ informed.T
    return np.linalg.inv(precision), informed, rng


def test_early_cycles_judge_directions_against_the_probes_not_the_trace():
    """After two cycles (512 signals, k = 8, d = 200, D held at the identity): judged
    against the trace's mean, which the directions not yet found inflate, ordinary
    directions look loose and R is widened along six of them (factors c above 2, variance
    9 times the rest's); judged against the probes' median, none is widened that far and
    the stiffest direction is kept. (Both agree after 2048 signals here.)"""
    with jax.enable_x64(True):
        sigma, informed, rng = _prior_plus_informed()
        widened = _learn(sigma, rng, 8, 512, diagonal="unit", probes=False)[0].sqrt_precond
        assert np.max(np.asarray(widened.factors)) > 2.0
        sigma, informed, rng = _prior_plus_informed()
        state, _ = _learn(sigma, rng, 8, 512, diagonal="unit")
        root = state.sqrt_precond
        assert np.max(np.asarray(root.factors)) < 1.0
        cosine = np.linalg.norm(np.asarray(root.basis).T @ informed[:, 0])
        assert cosine > 0.9


def test_a_unit_diagonal_learns_the_prior_plus_informed_directions():
    """``diagonal="unit"`` on the posterior above (d = 200, k = 8, 8000 iterations): the
    four informed directions found (cosines above 0.95), the trace-normalized A within 15%
    of Sigma in relative Frobenius norm, D uniform."""
    with jax.enable_x64(True):
        sigma, informed, rng = _prior_plus_informed()
        state, _ = _learn(sigma, rng, 8, 8000, diagonal="unit")
        root = state.sqrt_precond
        scale = np.asarray(root.scale)
        assert np.ptp(scale) <= 1e-12 * scale.max()
        cosines = np.linalg.svd(informed.T @ np.asarray(root.basis), compute_uv=False)
        assert cosines.min() > 0.95, cosines
        dense = square_roots.dense(root)
        assert _relative_frobenius(np.asarray(dense @ dense.T), sigma) < 0.15


def test_the_whitened_correction_whitens_a_diagonal_gaussian_in_one_whole_step():
    """On a diagonal Gaussian (sd sigma) seen through R = diag(r): E[psi^2] = (r^2 /
    sigma^2)^2 (the signal's bias, B^2) and E[zeta^2] = sigma^2 / r^2 (B^(-1)); one whole
    step of the correction makes r proportional to sigma, a step s goes that fraction of
    the way on a log scale, and coordinates without a usable moment are left alone."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(3)
        r, sigma = np.exp(rng.normal(size=50)), np.exp(rng.normal(size=50))
        moments = jnp.asarray(np.stack([(r**2 / sigma**2) ** 2, sigma**2 / r**2]))
        whole = r * np.asarray(low_rank._whitened_correction(moments, 1.0))
        np.testing.assert_allclose(whole / sigma, np.full(50, whole[0] / sigma[0]), rtol=1e-12)
        quarter = np.log(np.asarray(low_rank._whitened_correction(moments, 0.25)))
        target = np.log(sigma / r)
        np.testing.assert_allclose(quarter, 0.25 * (target - target.mean()), atol=1e-12)
        moments = moments.at[0, 7].set(0.0).at[1, 9].set(jnp.nan)
        factor = np.asarray(low_rank._whitened_correction(moments, 1.0))
        assert np.isfinite(factor).all()
        # both untouched: a raw log factor of 0, then the shift that centres the others'
        raw = 0.25 * np.log(sigma**2 / r**2) - 0.125 * np.log((r**2 / sigma**2) ** 2)
        raw[[7, 9]] = 0.0
        np.testing.assert_allclose(np.log(factor), raw - raw.mean(), atol=1e-12)


def test_the_whitened_diagonal_reads_the_positions_spread_within_the_cycle_not_the_drift():
    """A chain that spent its first 2000 iterations with five coordinates 4 away from where
    it now samples N(0, I) (a start still drifting to the bulk): in the next cycle the
    whitened positions' second moment about the running mean is 6.5 to 7.3 times their
    variance on those five and would widen D there (factors 1.5, above the bound of 1.3, as
    the 10 000-group regression's D widened); their variance within the cycle leaves every
    factor within 10% of 1."""
    with jax.enable_x64(True):
        dim, rank, cycle = 20, 2, 2000
        rng = np.random.default_rng(0)
        state = low_rank.init(jax.random.key(0), dim, jnp.float64, rank)
        offset = np.zeros(dim)
        offset[:5] = 4.0
        step = jax.jit(lambda s, psi, x: low_rank.update(s, psi, x, rank))
        for n in range(2 * cycle):
            if n == cycle:  # a new cycle: its accumulators start again, as _refresh's do
                state = state._replace(
                    whitened_moments=jnp.zeros_like(state.whitened_moments),
                    cycle=jnp.zeros_like(state.cycle),
                )
            x = rng.normal(size=dim) + (offset if n < cycle else 0.0)
            state = step(state, jnp.asarray(rng.normal(size=dim)), jnp.asarray(x))
        moments = low_rank._cycle_moments(state)
        factor = np.asarray(low_rank._whitened_correction(moments, 1.0))
        assert np.all(np.abs(np.log(factor)) < np.log(1.1)), factor
        second = state.whitened_moments[:2] / state.cycle
        drifted = np.asarray(low_rank._whitened_correction(second, 1.0))
        assert np.all(drifted[:5] > 1.3), drifted


def test_the_whitened_diagonal_reads_the_moments_the_low_rank_update_leaves():
    """``_moments_after`` equals dense linear algebra in float64: for a cycle's whitened
    signals ``psi`` and positions ``zeta`` (d = 30, a basis of 3k = 12 columns that does
    not span the space) and any Ritz directions ``V = W vectors`` with factors ``beta``,
    the diagonals of ``M Psi M`` and of ``M^(-1) Z M^(-1)``, ``M = I + V diag(beta^(-1/2)
    - 1) V^T``, ``Psi`` the signals' second moment and ``Z`` the positions' covariance
    about the cycle's mean."""
    with jax.enable_x64(True):
        dim, rank, cycle = 30, 4, 64
        rng = np.random.default_rng(7)
        state = low_rank.init(jax.random.key(0), dim, jnp.float64, rank)
        basis = np.asarray(state.basis)
        psi = rng.normal(size=(cycle, dim)) @ rng.normal(size=(dim, dim)) / np.sqrt(dim)
        zeta = rng.normal(size=(cycle, dim)) * np.exp(rng.normal(size=dim)) + 0.3
        state = state._replace(
            gram=jnp.asarray((psi @ basis).T @ (psi @ basis)),
            products=jnp.asarray(psi.T @ (psi @ basis)),
            position_products=jnp.asarray(zeta.T @ (zeta @ basis)),
            whitened_moments=jnp.asarray(
                np.stack([np.sum(psi**2, 0), np.sum(zeta**2, 0), np.sum(zeta, 0)])
            ),
            cycle=jnp.asarray(cycle, jnp.int32),
        )
        vectors = np.linalg.qr(rng.normal(size=(basis.shape[1], rank)))[0]
        beta = np.exp(rng.normal(size=rank) * 2.0)
        after = low_rank._moments_after(
            state, low_rank._cycle_moments(state), jnp.asarray(vectors), jnp.asarray(beta)
        )
        directions = basis @ vectors
        update = np.eye(dim) + directions @ np.diag(beta**-0.5 - 1.0) @ directions.T
        centred = zeta - zeta.mean(0)
        expected_psi = np.diag(update @ (psi.T @ psi / cycle) @ update)
        inverse = np.linalg.inv(update)
        expected_zeta = np.diag(inverse @ (centred.T @ centred / cycle) @ inverse)
        np.testing.assert_allclose(np.asarray(after[0]), expected_psi, rtol=1e-10)
        np.testing.assert_allclose(np.asarray(after[1]), expected_zeta, rtol=1e-10)
        # and they differ from the moments before it (the test can fail)
        assert np.max(np.abs(np.asarray(after[0]) / np.diag(psi.T @ psi / cycle) - 1)) > 0.1


def test_the_whitened_diagonal_keeps_the_pace_of_rank_8_per_signal_whatever_the_rank():
    """``whitened_pace``: ``k = 8`` takes a quarter step per cycle after four cycles (960
    signals); ``k = 32`` (``rank="auto"``), whose cycles are four times longer, starts
    after one cycle, not four, with the step of four quarter steps capped at a half;
    ``k = 4`` takes smaller steps over its shorter cycles, the same pace per signal."""
    assert low_rank.whitened_pace(8) == (0.25, 960)
    assert low_rank.cycle_length(32) == 960 == low_rank.whitened_pace(32)[1]
    assert low_rank.whitened_pace(32)[0] == low_rank.WHITENED_MAX_STEP == 0.5
    step, delay = low_rank.whitened_pace(4)
    assert delay == 960 and delay // low_rank.cycle_length(4) == 8
    np.testing.assert_allclose((1 - step) ** 2, 0.75, rtol=1e-12)


def test_a_whitened_diagonal_learns_both_kinds_of_diagonal_plus_low_rank_covariance():
    """``diagonal="whitened"`` (d = 200, k = 8): on the diagonal spanning e^-2 .. e^2 plus
    rank 4 (20 000 iterations) the trace-normalized A within 8% of Sigma in relative
    Frobenius norm (5.2% measured; 8.3% with the moments read before the cycle's low-rank
    update), where ``"learned"``'s rule is 11% away; on the prior plus four informed
    directions (8000 iterations) within 8% (4.3%), where ``"learned"``'s is 70% away (it
    shrinks the informed coordinates) and ``"unit"``, which knows the prior, 4%."""
    with jax.enable_x64(True):
        for make, num_steps, bound in ((_diag_plus_low_rank, 20_000, 0.08),
                                       (_prior_plus_informed, 8000, 0.08)):  # fmt: skip
            sigma, _, rng = make()
            root = _learn(sigma, rng, 8, num_steps, diagonal="whitened")[0].sqrt_precond
            dense = np.asarray(square_roots.dense(root))
            assert _relative_frobenius(dense @ dense.T, sigma) < bound, make.__name__


def test_rank_at_least_d_is_a_full_square_root_of_the_fisher_fixed_point():
    """With 3 k >= d the search basis spans the space: A is the full fixed point of the
    whitened signals' second moment, estimated from the last cycle (the dense recursion
    averages every signal instead), so it approaches Sigma as the dense estimate does."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(3)
        dim = 6
        factor = rng.normal(size=(dim, dim))
        sigma = factor @ factor.T + 0.5 * np.eye(dim)
        state, _ = _learn(sigma, rng, dim, 6000)
        assert state.sqrt_precond.basis.shape == (dim, dim)
        root = square_roots.dense(state.sqrt_precond)
        assert _relative_frobenius(np.asarray(root @ root.T), sigma) < 0.15


def _assert_gaussian_moments(result, sigma):
    """Every mean and every variance within 4.5 Monte Carlo standard errors of the truth
    (0 and Sigma's diagonal): the variance as the mean of x^2 (the mean is known), its
    standard error from the ESS of x^2, so that the bound follows the draws' information
    (a fixed relative bound fails by chance on the least-informed of 200 coordinates)."""
    draws = np.asarray(result.samples, np.float64)
    variances = np.diag(sigma)
    mcse = np.sqrt(variances / fm.ess(draws, method="mean"))
    z_mean = draws.reshape(-1, sigma.shape[0]).mean(0) / mcse
    assert np.abs(z_mean).max() < 4.5, np.abs(z_mean).max()
    squares = draws**2
    flat = squares.reshape(-1, sigma.shape[0])
    z_var = (flat.mean(0) - variances) / np.sqrt(flat.var(0) / fm.ess(squares, method="mean"))
    assert np.abs(z_var).max() < 4.5, np.abs(z_var).max()


def test_fm_sample_with_rank_matches_the_gaussian_moments():
    """fm.sample(..., "fisher_mala", rank=8) at d = 200 (float32, 4 chains): every mean
    and every variance within 4.5 MCSE of the truth."""
    sigma, _, rng = _diag_plus_low_rank(seed=1)
    precision = jnp.asarray(np.linalg.inv(sigma), jnp.float32)
    x0 = jnp.asarray(rng.normal(size=(4, 200)), jnp.float32)
    result = fm.sample(jax.random.key(0), "fisher_mala", lambda x: -0.5 * x @ precision @ x,
                       x0, num_warmup=10_000, num_samples=4000, rank=8,
                       diagnose=False)  # fmt: skip
    root = result.final_state.sqrt_precond
    assert isinstance(root, LowRankSqrt) and root.basis.shape == (4, 200, 8)
    _assert_gaussian_moments(result, sigma)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"rank": 0}, "positive integer"),
        ({"rank": 2.5}, "positive integer"),
        ({"rank": 4, "signal": "score"}, "not available with `rank`"),
        ({"rank": 4, "learning_rate": 0.01}, "not available with `rank`"),
        ({"rank": 4, "pooled": True}, "not available with pooled=True"),
        ({"rank": 4, "trace_every": 100}, "not available with `rank`"),
        ({"rank": 4, "low_rank_diagonal": "prior"}, "must be one of"),
        ({"low_rank_diagonal": "unit"}, "needs `rank`"),
        ({"rank": 4, "pooled": True, "low_rank_diagonal": "unit"}, "pooled=True"),
    ],
)
def test_bad_rank_options_fail_before_compiling(options, match):
    with pytest.raises(ValueError, match=match):
        fm.sample(jax.random.key(0), "fisher_mala", lambda x: -0.5 * jnp.sum(x**2),
                  jnp.zeros((2, 3)), num_warmup=10, num_samples=10, **options)  # fmt: skip


@pytest.mark.parametrize("sampler", ["fisher_nuts", "fisher_hmc"])
def test_fisher_nuts_and_hmc_with_rank_match_the_gaussian_moments(sampler):
    """NUTS / HMC whitened by the low-rank R (d = 200, k = 8, float32, 4 chains): means
    and variances within 4.5 MCSE; the learned R is the LowRankSqrt."""
    pytest.importorskip("blackjax")
    sigma, _, rng = _diag_plus_low_rank(seed=2)
    precision = jnp.asarray(np.linalg.inv(sigma), jnp.float32)
    x0 = jnp.asarray(rng.normal(size=(4, 200)), jnp.float32)
    result = fm.sample(jax.random.key(1), sampler, lambda x: -0.5 * x @ precision @ x, x0,
                       num_warmup=6000, num_samples=1000, rank=8,
                       diagnose=False)  # fmt: skip
    assert isinstance(result.parameters.sqrt_precond, LowRankSqrt)
    _assert_gaussian_moments(result, sigma)
    with pytest.raises(ValueError, match="not available with `rank`"):
        fm.sample(jax.random.key(0), sampler, lambda x: -0.5 * jnp.sum(x**2),
                  jnp.zeros((2, 3)), num_warmup=10, num_samples=10, rank=2,
                  pooled=True)  # fmt: skip


@pytest.mark.parametrize(
    "diagonal, make, seed, key, num_warmup",
    [
        ("unit", _prior_plus_informed, 6, 2, 3000),  # the prior plus informed directions
        ("whitened", _diag_plus_low_rank, 3, 3, 6000),  # the diagonal plus rank 4
    ],
)
def test_fisher_nuts_with_a_diagonal_option_matches_the_gaussian_moments(
    diagonal, make, seed, key, num_warmup
):
    """``fm.sample(..., "fisher_nuts", rank=8, low_rank_diagonal=...)`` (d = 200, float32,
    4 chains): means and variances within 4.5 MCSE; with ``"unit"`` the learned D
    uniform."""
    pytest.importorskip("blackjax")
    sigma, _, rng = make(seed=seed)
    precision = jnp.asarray(np.linalg.inv(sigma), jnp.float32)
    x0 = jnp.asarray(rng.normal(size=(4, 200)), jnp.float32)
    result = fm.sample(jax.random.key(key), "fisher_nuts", lambda x: -0.5 * x @ precision @ x,
                       x0, num_warmup=num_warmup, num_samples=1000, rank=8,
                       low_rank_diagonal=diagonal, diagnose=False)  # fmt: skip
    if diagonal == "unit":
        scale = np.asarray(result.parameters.sqrt_precond.scale)
        assert np.all(np.ptp(scale, axis=1) <= 1e-5 * scale.max(axis=1))
    _assert_gaussian_moments(result, sigma)


def test_rank_auto_is_dense_in_small_dimension_and_low_rank_above():
    assert low_rank.resolve_rank("auto", low_rank.AUTO_DENSE_MAX_DIM) is None
    assert low_rank.resolve_rank("auto", low_rank.AUTO_DENSE_MAX_DIM + 1) == low_rank.AUTO_RANK
    assert low_rank.resolve_rank(None, 10**6) is None and low_rank.resolve_rank(4, 10) == 4
    with pytest.raises(ValueError, match="positive integer or 'auto'"):
        low_rank.resolve_rank("big", 10)
    result = fm.sample(jax.random.key(0), "fisher_mala", lambda x: -0.5 * jnp.sum(x**2),
                       jnp.zeros((2, 3)), num_warmup=600, num_samples=50, rank="auto",
                       diagnose=False)  # fmt: skip
    assert not isinstance(result.final_state.sqrt_precond, LowRankSqrt)
    assert np.shape(result.final_state.sqrt_precond) == (2, 3, 3)


@pytest.mark.slow
def test_d_20000_runs_in_o_dk_and_learns_the_scales():
    """d = 20 000 (a dense R would be 1.6 GB per chain in float32): two chains of
    FisherMALA with rank=8 on a Gaussian whose scales span e^-2 .. e^2; the learned
    diagonal follows the true variances and the draws' variances are right."""
    dim = 20_000
    rng = np.random.default_rng(4)
    variance = np.exp(rng.uniform(-2, 2, dim))
    inverse = jnp.asarray(1.0 / variance, jnp.float32)
    x0 = jnp.asarray(rng.normal(size=(2, dim)) * np.sqrt(variance), jnp.float32)
    result = fm.sample(jax.random.key(0), "fisher_mala", lambda x: -0.5 * jnp.sum(inverse * x**2),
                       x0, num_warmup=6000, num_samples=3000, rank=8,
                       diagnose=False)  # fmt: skip
    root = result.final_state.sqrt_precond
    assert isinstance(root, LowRankSqrt) and root.basis.shape == (2, dim, 8)
    learned = np.asarray(root.scale[0], np.float64) ** 2
    assert np.corrcoef(np.log(learned), np.log(variance))[0, 1] > 0.95
    draws = np.asarray(result.samples, np.float64).reshape(-1, dim)
    ratio = draws.var(0) / variance
    assert 0.7 < np.median(ratio) < 1.3


def _without_low_rank_widening(monkeypatch):
    """The low-rank widening turned off: ``R`` and the whitened gradient unchanged, factor 1
    (no restart of the step size)."""
    from fisher_mala import geometric_widening

    def unchanged(r, whitened_grad, moments, count, xp):
        return r, whitened_grad, xp.ones((), whitened_grad.dtype)

    monkeypatch.setattr(geometric_widening, "_widened_low_rank", unchanged)


def test_fisher_nuts_with_rank_widens_the_loose_directions_its_fisher_phase_missed(
    monkeypatch,
):
    """A short warm-up (1500 iterations at d = 200): MALA's Fisher phase has not yet moved
    along the two loose directions (100 and 30 times the diagonal), and the low-rank
    widening of the step-size phase (``geometric_widening.LowRankMoments``) brings ``A``'s
    variance along them, relative to ordinary directions, several times closer to
    Sigma's than without it."""

    sigma, loadings, rng = _diag_plus_low_rank(seed=2)
    root_d = np.sqrt(np.diag(sigma))[:, None]
    ordinary = rng.normal(size=(200, 20))
    ordinary = root_d * (ordinary - loadings @ (loadings.T @ ordinary))
    loose = root_d * loadings[:, :2]
    with jax.enable_x64(True):
        precision = jnp.asarray(np.linalg.inv(sigma))
        x0 = jnp.asarray(rng.normal(size=(4, 200)))

        def relative():  # A over Sigma along the loose directions, over the ordinary ones
            result = fm.sample(jax.random.key(0), "fisher_nuts", lambda x: -0.5 * x @ precision @ x,
                               x0, num_warmup=1500, num_samples=10, rank=8,
                               diagnose=False)  # fmt: skip
            out = []
            for c in range(4):
                root = jax.tree.map(lambda a, c=c: a[c], result.final_state.sqrt_precond)
                r = np.asarray(square_roots.dense(root))
                a = r @ r.T

                def ratio(v, a=a):
                    return np.einsum("di,de,ei->i", v, a, v) / np.einsum("di,de,ei->i", v, sigma, v)

                out.append(ratio(loose) / np.median(ratio(ordinary)))
            return np.array(out)

        widened = relative()
        _without_low_rank_widening(monkeypatch)
        unwidened = relative()
    # unwidened 0.02-0.10 (R far too narrow there); widened 0.25-1.09, every chain
    assert np.all(widened > 2.0 * unwidened), (widened, unwidened)
    gain = np.exp(np.mean(np.log(widened)) - np.mean(np.log(unwidened)))
    assert gain > 4.0, gain


def test_fisher_nuts_with_rank_in_checkpointed_parts_is_the_same_chain(tmp_path, monkeypatch):
    """The low-rank widening's kept draws go through a checkpointed run's parts (the
    widening inside one of them): the same draws as one call, which the widening
    changed."""

    sigma, _, rng = _diag_plus_low_rank(dim=50, seed=3)
    with jax.enable_x64(True):
        precision = jnp.asarray(np.linalg.inv(sigma))
        x0 = jnp.asarray(rng.normal(size=(2, 50)))

        def run(**options):
            return fm.sample(jax.random.key(1), "fisher_nuts", lambda x: -0.5 * x @ precision @ x,
                             x0, num_warmup=1500, num_samples=200, rank=4, diagnose=False,
                             **options)  # fmt: skip

        whole = run()
        parts = run(checkpoint=tmp_path / "run", checkpoint_every=40)
        np.testing.assert_array_equal(np.asarray(parts.samples), np.asarray(whole.samples))
        _without_low_rank_widening(monkeypatch)
        unwidened = run()
    assert not np.array_equal(np.asarray(unwidened.samples), np.asarray(whole.samples))
