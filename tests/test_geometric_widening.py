"""The widening of the Fisher metric after its step-size phase's first half
(``fisher_mala/geometric_widening.py``): exact identities against dense float64 linear
algebra, bit-identity where nothing is widened, and the effect on a skewed target."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import digamma, polygamma

import fisher_mala as fm
from fisher_mala import geometric_widening as gw
from fisher_mala import square_roots
from fisher_mala.square_roots import DiagonalSqrt, LowRankSqrt
from fisher_mala.whitened_hmc import FisherHMCState


def _summed(positions, whitened_grads, sqrt_precond):
    """The moments of draws ``(n, d)`` with their whitened gradients, as the phase sums
    them (from the first draw's position)."""
    first = FisherHMCState(positions[0], 0.0, whitened_grads[0], sqrt_precond)
    moments = gw.moments_init(first)
    for x, g in zip(positions, whitened_grads, strict=True):
        moments = gw.moments_update(moments, first._replace(position=x, whitened_grad=g))
    return moments


def test_the_geometric_mean_solves_its_equation_and_is_the_covariance_of_a_gaussian():
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        d, n = 5, 12
        loadings = rng.normal(size=(d, d))
        covariance = loadings @ loadings.T + 0.5 * np.eye(d)
        precision = np.linalg.inv(covariance)
        # any n > d distinct points (not even Gaussian): the gradient is linear in them
        z = rng.standard_t(2, size=(n, d)) * 3.0 + 1.0
        g = -(z - 0.3) @ precision
        cov_z, cov_g = np.cov(z.T, bias=True), np.cov(g.T, bias=True)
        mean = np.asarray(gw.geometric_mean(jnp.asarray(cov_z), jnp.asarray(cov_g)))
        np.testing.assert_allclose(mean @ cov_g @ mean, cov_z, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(mean, covariance, rtol=1e-8)


def test_the_geometric_mean_of_rows_is_that_of_their_covariances():
    """The low-rank widening's ``M`` from the centred rows' singular values equals
    :func:`geometric_mean` of their covariances (float64, a badly conditioned pair)."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(2)
        m, p = 60, 6
        x = rng.normal(size=(m, p)) * np.array([30.0, 5.0, 1.0, 1.0, 0.2, 0.01])
        g = rng.normal(size=(m, p)) @ rng.normal(size=(p, p))
        x, g = x - x.mean(0), g - g.mean(0)
        by_rows = np.asarray(gw._geometric_mean_of_rows(jnp.asarray(x), jnp.asarray(g)))
        by_products = np.asarray(gw.geometric_mean(jnp.asarray(x.T @ x), jnp.asarray(g.T @ g)))
        np.testing.assert_allclose(by_rows, by_products, rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(by_rows @ (g.T @ g) @ by_rows, x.T @ x, rtol=1e-8)


def test_the_kept_rows_whitened_again_are_those_of_the_new_root():
    """``_rewhitened``: rows ``z = R^-1 y`` and ``psi = R^T h`` of one low-rank root become
    ``R'^-1 y`` and ``R'^T h`` of another (dense linear algebra, float64)."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(3)
        d, k, m = 30, 3, 7

        def root():
            return LowRankSqrt(np.exp(rng.normal(size=d)), np.linalg.qr(rng.normal(size=(d, k)))[0],
                               rng.uniform(-0.8, 3.0, size=k))  # fmt: skip

        old, new = root(), root()

        def dense(r):
            return r.scale[:, None] * (np.eye(d) + (r.basis * r.factors) @ r.basis.T)

        y, h = rng.normal(size=(m, d)), rng.normal(size=(m, d))
        z, psi = np.linalg.solve(dense(old), y.T).T, h @ dense(old)
        z_new, psi_new = gw._rewhitened(jax.tree.map(jnp.asarray, old),
                                        jax.tree.map(jnp.asarray, new), z, psi)  # fmt: skip
        np.testing.assert_allclose(z_new, np.linalg.solve(dense(new), y.T).T, rtol=1e-9)
        np.testing.assert_allclose(psi_new, h @ dense(new), rtol=1e-9)


def test_widen_equals_dense_linear_algebra_and_widens_only_past_the_threshold():
    with jax.enable_x64(True):
        rng = np.random.default_rng(1)
        d, n = 4, 40
        r = np.linalg.qr(rng.normal(size=(d, d)))[0] @ np.diag([0.5, 1.0, 1.5, 2.0])
        # the target's covariance in R's whitened coordinates: one direction 9 times wider
        # than the others, so that the ratio to the Fisher scale is past the threshold
        u = np.linalg.qr(rng.normal(size=(d, d)))[0]
        spectrum = np.array([9.0, 1.0, 1.0, 1.0])
        whitened_cov = (u * spectrum) @ u.T
        z = rng.normal(size=(n, d)) @ np.linalg.cholesky(whitened_cov).T
        gz = -z @ np.linalg.inv(whitened_cov)  # R^T g for the Gaussian
        x = z @ r.T + 2.0
        moments = _summed(jnp.asarray(x), jnp.asarray(gz), jnp.asarray(r))
        state = FisherHMCState(jnp.asarray(x[-1]), 0.0, jnp.asarray(gz[-1]), jnp.asarray(r))
        widened, factor = gw.widen(state, moments, n)
        # by hand: M = whitened_cov exactly; the Fisher scale d / mean |R^T g|^2
        scale = d / np.mean(np.sum(gz**2, axis=1))
        ratio = spectrum / scale
        assert ratio[0] > gw.WIDENING_THRESHOLD > ratio[1:].max()
        expected = r @ (np.eye(d) + (np.sqrt(ratio[0]) - 1) * np.outer(u[:, 0], u[:, 0]))
        np.testing.assert_allclose(np.asarray(widened.sqrt_precond), expected, atol=1e-9)
        np.testing.assert_allclose(
            np.asarray(widened.whitened_grad), expected.T @ np.linalg.solve(r.T, gz[-1]),
            atol=1e-9,
        )  # fmt: skip
        assert float(factor) == pytest.approx(ratio[0], rel=1e-9)


def test_nothing_past_the_threshold_leaves_the_state_bit_for_bit():
    with jax.enable_x64(True):
        rng = np.random.default_rng(2)
        d, n = 6, 60
        z = rng.normal(size=(n, d))
        r = jnp.asarray(np.tril(rng.normal(size=(d, d))) + 3 * np.eye(d))
        moments = _summed(jnp.asarray(z @ np.asarray(r).T), jnp.asarray(-z), r)
        state = FisherHMCState(jnp.asarray(z[-1]), 0.0, jnp.asarray(-z[-1]), r)
        widened, factor = gw.widen(state, moments, n)
        assert float(factor) == 1.0
        assert np.array_equal(np.asarray(widened.sqrt_precond), np.asarray(r))
        assert np.array_equal(np.asarray(widened.whitened_grad), -z[-1])


def test_the_diagonal_metric_is_widened_coordinate_by_coordinate():
    with jax.enable_x64(True):
        rng = np.random.default_rng(3)
        n = 80
        scale = np.array([1.0, 2.0, 0.5])
        sd = np.array([4.0, 2.0, 0.5])  # the first coordinate 4 times wider than its metric
        x = rng.normal(size=(n, 3)) * sd
        g = -x / sd**2
        sqrt = DiagonalSqrt(jnp.asarray(scale))
        moments = _summed(jnp.asarray(x), jnp.asarray(g * scale), sqrt)
        state = FisherHMCState(jnp.asarray(x[-1]), 0.0, jnp.asarray(g[-1] * scale), sqrt)
        widened, factor = gw.widen(state, moments, n)
        fisher_scale = 3 / np.mean(np.sum((g * scale) ** 2, axis=1))
        ratio = (sd / scale) ** 2 / fisher_scale  # the 1-d geometric means, exact here
        expected = scale * np.where(ratio > gw.WIDENING_THRESHOLD, np.sqrt(ratio), 1.0)
        np.testing.assert_allclose(np.asarray(widened.sqrt_precond.scale), expected, rtol=1e-9)
        assert ratio[0] > gw.WIDENING_THRESHOLD and float(factor) == pytest.approx(ratio[0])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("diagonal", [False, True])
def test_the_host_widening_equals_the_compiled_one_under_jit_and_vmap(dtype, diagonal):
    with jax.enable_x64(dtype == "float64"):
        rng = np.random.default_rng(4)
        d, n, chains = 4, 40, 3
        u = np.linalg.qr(rng.normal(size=(d, d)))[0]
        whitened_cov = (u * np.array([9.0, 1.0, 1.0, 1.0])) @ u.T  # one direction past
        r = np.linalg.qr(rng.normal(size=(d, d)))[0] @ np.diag([0.5, 1.0, 1.5, 2.0])
        sqrt = DiagonalSqrt(jnp.asarray(np.diag(r) ** 2 + 0.5, dtype)) if diagonal else None
        states, all_moments = [], []
        for c in range(chains):  # chains with different draws (one not widened: c = 2)
            cov = whitened_cov if c < 2 else np.eye(d)
            z = rng.normal(size=(n, d)) @ np.linalg.cholesky(cov).T
            gz = -z @ np.linalg.inv(cov)
            root = sqrt if diagonal else jnp.asarray(r, dtype)
            x = (z * np.asarray(sqrt.scale) if diagonal else z @ r.T) + 2.0
            cast = lambda a: jnp.asarray(a, dtype)  # noqa: E731
            all_moments.append(_summed(cast(x), cast(gz), root))
            states.append(FisherHMCState(cast(x[-1]), cast(0.0), cast(gz[-1]), root))
        for state, moments in zip(states, all_moments, strict=True):
            on_device, factor = gw.widen(state, moments, n)
            on_host, host_factor = jax.jit(gw.widen_on_host)(state, moments, n)
            tolerance = 1e-10 if dtype == "float64" else 2e-4
            for a, b in zip(jax.tree.leaves((on_device, factor)),
                            jax.tree.leaves((on_host, host_factor)), strict=True):  # fmt: skip
                assert a.dtype == b.dtype
                np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=tolerance,
                                           atol=tolerance)  # fmt: skip
        # chains of a vmapped run: one host call per chain, each its own widening
        batched = jax.tree.map(lambda *a: jnp.stack(a), *states)
        batched_moments = jax.tree.map(lambda *a: jnp.stack(a), *all_moments)
        widened, factors = jax.jit(jax.vmap(gw.widen_on_host, in_axes=(0, 0, None)))(
            batched, batched_moments, n
        )
        for c in range(chains):
            expected, factor = gw.widen(states[c], all_moments[c], n)
            assert float(factors[c]) == pytest.approx(float(factor), rel=1e-4)
            np.testing.assert_allclose(
                np.asarray(jax.tree.leaves(widened.sqrt_precond)[0][c]),
                np.asarray(jax.tree.leaves(expected.sqrt_precond)[0]), rtol=2e-4, atol=2e-4,
            )  # fmt: skip
        assert float(factors[2]) == 1.0 < float(factors[0])


def test_the_host_widening_keeps_float64_on_a_thread_without_x64():
    """NumPyro's loop runs the callback on another thread, where ``with
    jax.enable_x64(True)`` does not hold: the widening must still be computed in float64."""
    import threading

    with jax.enable_x64(True):
        rng = np.random.default_rng(5)
        d, n = 3, 30
        z = rng.normal(size=(n, d)) * np.array([4.0, 1.0, 1.0])
        g = -z / np.array([16.0, 1.0, 1.0])
        moments = _summed(jnp.asarray(z), jnp.asarray(g), jnp.eye(d))
        state = FisherHMCState(jnp.asarray(z[-1]), jnp.asarray(0.0), jnp.asarray(g[-1]),
                               jnp.eye(d))  # fmt: skip
        count = jnp.asarray(n)
        compiled = jax.jit(gw.widen_on_host).lower(state, moments, count).compile()
        expected, factor = gw.widen(state, moments, n)
    out = []
    worker = threading.Thread(target=lambda: out.append(compiled(state, moments, count)))
    worker.start()
    worker.join()
    widened, host_factor = out[0]
    assert widened.sqrt_precond.dtype == jnp.float64 and float(factor) > 2.0
    np.testing.assert_allclose(float(host_factor), float(factor), rtol=1e-13)
    np.testing.assert_allclose(
        np.asarray(widened.sqrt_precond), np.asarray(expected.sqrt_precond), rtol=1e-12,
        atol=1e-14,
    )  # fmt: skip


def test_the_gradient_kurtosis_ratio_equals_its_formula_and_holds_back_a_funnel():
    with jax.enable_x64(True):
        rng = np.random.default_rng(5)
        d, n = 5, 400
        gz = rng.normal(size=(n, d)) * np.array([1.0, 2.0, 0.5, 1.0, 3.0])
        z = -gz  # a Gaussian, whitened by a metric 9 times too narrow along one axis
        z[:, 4] *= 9.0
        gz[:, 4] /= 9.0
        r = jnp.eye(d)
        moments = _summed(jnp.asarray(z), jnp.asarray(gz), r)
        second = gz.T @ gz / n
        q = np.sum(gz**2, axis=1)
        expected = (
            np.mean(q**2) / np.mean(q) ** 2 / (1 + 2 * np.sum(second**2) / np.trace(second) ** 2)
        )
        ratio = float(gw.gradient_kurtosis_ratio(moments, n))
        assert ratio == pytest.approx(expected, rel=1e-12)
        assert abs(ratio - 1.0) < 0.2  # Gaussian gradients
        state = FisherHMCState(jnp.asarray(z[-1]), 0.0, jnp.asarray(gz[-1]), r)
        assert float(gw.widen(state, moments, n)[1]) > 1.0
        # the same draws with the gradient's size spread over orders of magnitude (a
        # funnel's neck and mouth): no widening
        size = np.exp(rng.normal(size=(n, 1)) * 1.5)
        funnel = _summed(jnp.asarray(z), jnp.asarray(gz * size), r)
        assert float(gw.gradient_kurtosis_ratio(funnel, n)) > gw.WIDENING_MAX_KURTOSIS_RATIO
        state = state._replace(whitened_grad=jnp.asarray(gz[-1] * size[-1]))
        widened, factor = gw.widen(state, funnel, n)
        assert float(factor) == 1.0
        assert np.array_equal(np.asarray(widened.sqrt_precond), np.asarray(r))


def test_widening_point_needs_more_draws_than_dimensions():
    r = jnp.eye(3)
    assert gw.widening_point(100, 3, r) == 50
    assert gw.widening_point(2 * (3 + gw.WIDENING_MIN_EXTRA_DRAWS) - 1, 3, r) is None
    assert gw.widening_point(100, 3, r, pooled=True) is None
    assert gw.widening_point(10**6, gw.WIDENING_MAX_DIM + 1, r) is None


def test_the_phase_widens_at_its_half_as_two_halves_and_a_widening_between_would():
    from fisher_mala import leapfrog_tuning as lt
    from fisher_mala.whitened_warmup import FisherHMCWarmup

    def ld(x):  # N(0, I): the metric below is 3 times too narrow along the first axis
        return -0.5 * jnp.sum(x**2)

    with jax.enable_x64(True):
        tuning = FisherHMCWarmup(ld).tuning
        r = jnp.diag(jnp.array([1 / 3, 1.0, 1.0, 1.0]))
        x = jnp.full((4,), 0.3)
        state = FisherHMCState(x, ld(x), -x @ r, r)
        key, step, num, half, offset = jax.random.key(0), jnp.asarray(0.5), 80, 40, 7
        out = lt.tune_step_size(tuning, key, state, step, num, offset, None, widen_at=half)
        da = tuning.dual_averaging[0](step)
        first = lt._dual_averaging(tuning, key, state, da, half, offset, None, None, offset + half)
        middle, da, _ = lt.widen_and_restart(tuning, first[0], first[1], first[3], first[4])
        assert not np.array_equal(np.asarray(middle.sqrt_precond), np.asarray(r))  # widened
        second = lt._dual_averaging(tuning, key, middle, da, num - half, offset + half, None, None)
        close = {"rtol": 1e-7, "atol": 1e-8}
        np.testing.assert_allclose(out[0].position, second[0].position, **close)
        np.testing.assert_allclose(out[0].sqrt_precond, second[0].sqrt_precond, **close)
        np.testing.assert_allclose(out[1], tuning.dual_averaging[2](second[1]), **close)
        np.testing.assert_allclose(out[3], second[3][0] / second[3][1], **close)
        # equal to rounding (the two programs are compiled differently); the metric now sees
        # the first axis about as wide as the others
        widened = np.diag(np.asarray(out[0].sqrt_precond))
        assert widened[0] / np.mean(widened[1:]) > 0.6


#: A log-gamma coordinate (``x = log G``, ``G ~ Gamma(a)``, skewed with a long left tail:
#: its variance, the trigamma of ``a``, is 5.3 times what its Fisher information says at
#: ``a = 0.2``) and three standard normal coordinates.
SHAPE = 0.2


def _skewed(x):
    return SHAPE * x[0] - jnp.exp(x[0]) - 0.5 * jnp.sum(x[1:] ** 2)


def test_fisher_nuts_on_a_skewed_target_matches_its_moments_and_a_checkpointed_run(
    tmp_path, monkeypatch
):
    def run(**options):
        with jax.enable_x64(True):
            positions = jnp.asarray(np.random.default_rng(4).normal(size=(4, 4)) * 0.1)
            return fm.sample(jax.random.key(9), "fisher_nuts", _skewed, positions,
                             num_warmup=1500, num_samples=1500, diagnose=False,
                             **options)  # fmt: skip

    result = run()
    draws = np.asarray(result.samples)
    ess = np.asarray(fm.ess(draws, method="mean", per_chain=False))
    means = np.array([digamma(SHAPE), 0.0, 0.0, 0.0])
    variances = np.array([polygamma(1, SHAPE), 1.0, 1.0, 1.0])
    z = (draws.reshape(-1, 4).mean(0) - means) / np.sqrt(variances / ess)
    assert np.max(np.abs(z)) < 4.0, z
    # the run in saved parts (the widening inside one of them) is the same chain
    parts = run(checkpoint=tmp_path / "run", checkpoint_every=100)
    np.testing.assert_array_equal(np.asarray(parts.samples), draws)
    # with each chain's own R (the Fisher phase never settles here, and the chains' shared
    # shape is widened nowhere), two of the four chains are widened, which changes the draws
    monkeypatch.setattr(
        fm.whitened_warmup.FisherHMCWarmup, "shares_unsettled", lambda self, unsettled: False
    )
    draws = np.asarray(run().samples)
    gw.WIDENING_THRESHOLD, threshold = np.inf, gw.WIDENING_THRESHOLD
    try:
        unwidened = run()
    finally:
        gw.WIDENING_THRESHOLD = threshold
    assert not np.array_equal(np.asarray(unwidened.samples), draws)


# The low-rank widening: kept draws, not d x d sums (``gw.LowRankMoments``).


def _low_rank_root(rng, dim, rank, active):
    """A :class:`LowRankSqrt` with ``active`` of its ``rank`` factors away from 0."""
    basis = np.linalg.qr(rng.normal(size=(dim, rank)))[0]
    factors = np.zeros(rank)
    factors[:active] = rng.uniform(-0.6, 1.5, active)
    return LowRankSqrt(jnp.asarray(np.exp(rng.uniform(-1, 1, dim))), jnp.asarray(basis),
                       jnp.asarray(factors))  # fmt: skip


def _kept_draws(x, whitened_grads, root):
    first = FisherHMCState(jnp.zeros(x.shape[1]), 0.0, whitened_grads[0], root)
    moments = gw.moments_init(first, len(x) + gw.WIDENING_MIN_EXTRA_DRAWS)
    assert moments.draws.shape[0] == len(x)
    for xi, gi in zip(x, whitened_grads, strict=True):
        moments = gw.moments_update(moments, first._replace(position=xi, whitened_grad=gi))
    return first, moments


@pytest.mark.parametrize("loose", [True, False])
def test_low_rank_widening_finds_loose_directions_and_leaves_a_fitting_metric(loose):
    """``LOW_RANK_MAX_DRAWS`` independent draws of a Gaussian in d = 300 seen through R = I
    (a rank-8 root with zero factors): four directions 100, 50, 30 and 20 times looser
    are widened to within 30% of their variance, ordinary directions stay within 10% of 1;
    on a standard Gaussian nothing is widened (factor 1)."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(6)
        dim, m = 300, gw.LOW_RANK_MAX_DRAWS
        loadings = np.linalg.qr(rng.normal(size=(dim, 4)))[0]
        spectrum = np.array([100.0, 50.0, 30.0, 20.0]) if loose else np.ones(4)
        sigma = np.eye(dim) + loadings @ np.diag(spectrum - 1) @ loadings.T
        x = rng.normal(size=(m, dim)) @ np.linalg.cholesky(sigma).T
        grads = -np.linalg.solve(sigma, x.T).T
        root = LowRankSqrt(jnp.ones(dim), jnp.asarray(np.linalg.qr(rng.normal(size=(dim, 8)))[0]),
                           jnp.zeros(8))  # fmt: skip
        state, moments = _kept_draws(jnp.asarray(x), jnp.asarray(grads), root)
        widened, factor = gw.widen(state, moments, m)
        if not loose:
            assert float(factor) == 1.0
            return
        # the host twin (NumPyro's) widens the same way; its eigenvectors within a cluster
        # of equal eigenvalues may differ from XLA's, and so may the directions it measures
        host, host_factor = gw.widen_on_host(state, moments, m)
        others = rng.normal(size=(dim, 20))
        others = np.linalg.qr(others - loadings @ (loadings.T @ others))[0]
        for out in (widened, host):
            a = np.asarray(square_roots.dense(out.sqrt_precond))
            a = a @ a.T
            along = np.einsum("di,de,ei->i", loadings, a, loadings)
            assert np.all((along > 0.7 * spectrum) & (along < 1.4 * spectrum)), along
            ordinary = np.einsum("di,de,ei->i", others, a, others)
            assert np.all(np.abs(ordinary - 1.0) < 0.1), ordinary
        assert float(host_factor) > 10.0 and float(factor) > 10.0


def test_low_rank_widening_gives_an_under_travelled_loose_direction_its_full_variance():
    """Kept draws of a chain that has not yet travelled far along the loose directions
    (their spread along each a third of the posterior's standard deviation; the gradients
    the Gaussian's, -Sigma^{-1} x, at those draws), d = 100, four directions 100, 50, 30
    and 20 times looser: the widening's second measure, the k x k geometric mean in the
    widened root's span, which the gradients make exact along a Gaussian's
    eigendirections, gives each within 30% of its variance (0.96 of it), where the draws'
    variance alone (the halves' measure, all the widening did before) gave 0.11 to 0.16."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(9)
        dim, m = 100, gw.LOW_RANK_MAX_DRAWS
        loadings = np.linalg.qr(rng.normal(size=(dim, 4)))[0]
        spectrum = np.array([100.0, 50.0, 30.0, 20.0])
        sigma = np.eye(dim) + loadings @ np.diag(spectrum - 1) @ loadings.T
        x = rng.normal(size=(m, dim))  # ordinary directions: their full spread
        x += (rng.normal(size=(m, 4)) * np.sqrt(spectrum) / 3.0) @ loadings.T
        grads = -np.linalg.solve(sigma, x.T).T
        root = LowRankSqrt(jnp.ones(dim), jnp.asarray(np.linalg.qr(rng.normal(size=(dim, 8)))[0]),
                           jnp.zeros(8))  # fmt: skip
        state, moments = _kept_draws(jnp.asarray(x), jnp.asarray(grads), root)
        for out in (gw.widen(state, moments, m)[0], gw.widen_on_host(state, moments, m)[0]):
            a = np.asarray(square_roots.dense(out.sqrt_precond))
            along = np.einsum("di,de,ei->i", loadings, a @ a.T, loadings)
            assert np.all((along > 0.7 * spectrum) & (along < 1.3 * spectrum)), along


def test_low_rank_widening_point_and_kept_draws():
    root = LowRankSqrt(jnp.ones(5), jnp.eye(5)[:, :2], jnp.zeros(2))
    needed = gw.LOW_RANK_MIN_DRAWS + gw.WIDENING_MIN_EXTRA_DRAWS
    assert gw.widening_point(2 * needed, 10**6, root) == needed
    assert gw.widening_point(2 * needed - 2, 10**6, root) is None
    assert gw.widening_point(10**4, 10**6, root, pooled=True) is None
    assert gw.low_rank_draws(2) == gw.LOW_RANK_DRAWS_PER_RANK * 2
    assert gw.low_rank_draws(100) == gw.LOW_RANK_MAX_DRAWS
    assert gw.low_rank_draws(8, 100) == 100 - gw.WIDENING_MIN_EXTRA_DRAWS


@pytest.mark.parametrize("dim, bound", [(20_000, 5.0), (300_000, 1.7)])
def test_low_rank_widening_holds_the_kept_rows_and_little_more(dim, bound):
    """The compiled low-rank widening forms the kept rows' residuals (one m x d array),
    products of rows (m x m) and the span it measures in (d x 4k), never a d x m basis:
    XLA's memory analysis of its program (arguments, outputs, temporaries) is within 1.7
    times the kept rows' bytes (2 m d numbers; the residuals add 0.5) at k = 8, m = 256,
    d = 300 000 in float32 (1.6 measured; 4.0 times when it formed a d x m basis), where
    the rows take more than ``LOW_RANK_WIDENING_PASSES_MAX_BYTES`` and one pass runs; at
    d = 20 000 the passes hold the rows whitened again (4.6 measured)."""
    from fisher_mala import low_rank

    rank = 8

    def arguments():
        root = low_rank.init(jax.random.key(0), dim, jnp.float32, rank).sqrt_precond
        x = jnp.zeros((dim,), jnp.float32)
        state = FisherHMCState(x, jnp.zeros((), jnp.float32), x, root)
        return state, gw.moments_init(state, 100_000)

    state, moments = jax.eval_shape(arguments)  # shapes only
    rows = moments.draws.shape[0]
    assert rows == gw.LOW_RANK_MAX_DRAWS
    passes = gw.low_rank_widening_passes(moments.draws)
    assert passes == (gw.LOW_RANK_WIDENING_PASSES if dim == 20_000 else 1)
    compiled = jax.jit(lambda s, m: gw.widen(s, m, rows)).lower(state, moments).compile()
    memory = compiled.memory_analysis()
    if memory is None:
        pytest.skip("no memory analysis on this backend")
    program = (
        memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
    )
    kept = 4 * 2 * rows * dim
    assert program < bound * kept, program / kept


def _remeasured(r, whitened_grad, along_x, along_g, level, xp):
    """``gw._measured_in`` the span of ``R``'s own directions ``Q`` (``along_x``,
    ``along_g`` ``(m, k)``: the coordinates along ``Q``)."""
    span = xp.linalg.qr(r.basis)[0]
    turn = span.T @ r.basis  # Q = V (V^T Q): the coordinates along V from those along Q
    return gw._measured_in(r, span, along_x @ turn.T, along_g @ turn.T, level, whitened_grad,
                           xp)  # fmt: skip


def _in_span(root, a):
    """``Q^T D^{-1/2} A D^{-1/2} Q``: ``A`` in the span of ``root``'s directions, ``D``-scaled."""
    scaled = np.asarray(root.basis) / np.asarray(root.scale)[:, None]
    return scaled.T @ a @ scaled


def test_low_rank_remeasure_takes_the_covariance_measured_in_the_span_of_q():
    """R measured again on the kept draws in the span of its own directions
    (``gw._measured_in`` the span of ``Q``): on a Gaussian in d = 200 whose covariance in
    that span is R's turned and stretched (variances 4 and 0.25 times R's along two mixtures of R's
    directions), from ``LOW_RANK_MAX_DRAWS`` independent draws, R' R'^T holds the span's
    covariance to within 20% (relative Frobenius) and equals R R^T outside it; R'^T g equals
    dense float64 linear algebra; the host's NumPy twin agrees; where R fits, nothing
    changes (the same arrays)."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(11)
        dim, m = 200, gw.LOW_RANK_MAX_DRAWS
        root = _low_rank_root(rng, dim, 8, active=5)
        r = np.asarray(square_roots.dense(root))
        q = np.asarray(root.basis)
        turn = np.eye(8)
        turn[np.ix_([1, 6], [1, 6])] = np.array([[1.0, 1.0], [1.0, -1.0]]) / np.sqrt(2.0)
        for off in (True, False):
            spread = np.diag([1.0, 4.0, 1.0, 1.0, 1.0, 1.0, 0.25, 1.0]) if off else np.eye(8)
            inner = turn @ spread @ turn.T  # the whitened covariance in the span, Q's axes
            # the posterior R (I + Q (inner - I) Q^T) R^T
            sigma = r @ (np.eye(dim) + q @ (inner - np.eye(8)) @ q.T) @ r.T
            x = rng.normal(size=(m, dim)) @ np.linalg.cholesky(sigma).T
            grads = -np.linalg.solve(sigma, x.T).T
            _, moments = _kept_draws(jnp.asarray(x), jnp.asarray(grads @ r), root)
            g = jnp.asarray(grads[-1] @ r)
            along_x, along_g = moments.draws @ root.basis, moments.grads @ root.basis
            scale = dim * m / moments.sum_q
            new, g_new, factor = _remeasured(root, g, along_x, along_g, scale, jnp)
            if not off:
                assert float(factor) == 1.0
                for a, b in zip(jax.tree.leaves((new, g_new)), jax.tree.leaves((root, g)),
                                strict=True):  # fmt: skip
                    assert np.array_equal(np.asarray(a), np.asarray(b))
                continue
            assert 3.0 < float(factor) < 5.5, factor
            r_new = np.asarray(square_roots.dense(new))
            old_span, new_span = _in_span(root, r @ r.T), _in_span(root, r_new @ r_new.T)
            root_span = np.diag(np.sqrt(np.diag(old_span)))  # old_span is diagonal
            wanted = root_span @ inner @ root_span
            assert np.linalg.norm(new_span - wanted) < 0.2 * np.linalg.norm(wanted)
            outside = rng.normal(size=(dim, 5))
            outside -= q @ (q.T @ outside)  # D-scaled, outside Q's span
            outside = outside * np.asarray(root.scale)[:, None]  # D^{1/2} v, v outside Q
            np.testing.assert_allclose(r_new @ r_new.T @ np.linalg.solve(r @ r.T, outside),
                                       outside, rtol=1e-9, atol=1e-9)  # fmt: skip
            np.testing.assert_allclose(g_new, r_new.T @ grads[-1], rtol=1e-10, atol=1e-12)
            host = _remeasured(jax.tree.map(np.asarray, root), np.asarray(g), np.asarray(along_x),
                               np.asarray(along_g), float(scale), np)  # fmt: skip
            r_host = np.asarray(square_roots.dense(jax.tree.map(jnp.asarray, host[0])))
            np.testing.assert_allclose(r_host @ r_host.T, r_new @ r_new.T, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(host[1], g_new, rtol=1e-9, atol=1e-12)


def test_low_rank_remeasure_ignores_a_direction_the_draws_did_not_move_along():
    """Kept draws that did not move along one of R's directions (a chain stuck there) leave
    R's variance there alone instead of shrinking R to zero along it, and so does a
    ratio past ``LOW_RANK_REMEASURE_BOUNDS``; a measured one is taken."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(12)
        dim, m = 50, 64
        root = _low_rank_root(rng, dim, 4, active=2)
        along_x = rng.normal(size=(m, 4))
        along_g = rng.normal(size=(m, 4))
        along_x[:, 0] = 0.7  # no movement along q_0
        along_x[:, 1] *= 1e5  # a variance 1e10 times R's along q_1: a ratio of 1e5
        g = jnp.asarray(rng.normal(size=dim))
        along_x[:, 2] *= 3.0  # a variance 9 times R's along q_2: a ratio of 3, measured
        new, _, factor = _remeasured(root, g, jnp.asarray(along_x), jnp.asarray(along_g),
                                     1.0, jnp)  # fmt: skip
        r, r_new = np.asarray(square_roots.dense(root)), np.asarray(square_roots.dense(new))
        ratio = np.diag(_in_span(root, r_new @ r_new.T)) / np.diag(_in_span(root, r @ r.T))
        np.testing.assert_allclose(ratio[:2], 1.0, rtol=0.05)
        assert 2.0 < ratio[2] < 5.0 and 2.0 < float(factor) < 5.0, (ratio, factor)
        assert np.all(np.isfinite(np.asarray(new.factors))) and np.all(np.asarray(new.factors) > -1)


def test_the_coordinate_ratios_read_a_diagonal_gaussian_from_a_few_draws():
    """``sqrt(Var z_i / Var psi_i)`` over its median: for a Gaussian whose precision is
    diagonal the gradient is ``-z / v_i`` coordinate by coordinate, and five draws give
    each ``v_i`` to rounding; a coordinate the chain did not move along is no measurement
    (ratio 1)."""
    rng = np.random.default_rng(3)
    variances = np.exp(rng.uniform(-3, 3, 50))
    z = rng.normal(size=(5, 50)) * np.sqrt(variances)
    z[:, 7] = 0.25  # never moved
    psi = -z / variances
    psi[:, 7] = rng.normal(size=5)
    ratio, measured, median = gw._coordinate_ratios(z, psi, np)
    assert not measured[7] and ratio[7] == 1.0
    keep = np.arange(50) != 7
    np.testing.assert_allclose(ratio[keep] * median, variances[keep], rtol=1e-12)
    np.testing.assert_allclose(median, np.median(variances[keep]), rtol=1e-12)


def test_the_residual_directions_span_exactly_where_the_metric_is_wrong():
    """For a Gaussian whose whitened precision is ``B = I - U L U^T`` (rank 6, loose and
    stiff), ``z + psi = U L U^T z``: the 6 principal directions of the residuals span
    ``U`` to rounding, from 40 draws in d = 3000 (the draws' own 6 principal directions
    hold 0.81, 0.64 and 0.48 of the three loose columns)."""
    rng = np.random.default_rng(4)
    dim, m = 3000, 40
    u = np.linalg.qr(rng.normal(size=(dim, 6)))[0]
    spectrum = np.array([100.0, 50.0, 30.0, 0.1, 0.05, 0.02])  # covariance along U
    z = rng.normal(size=(m, dim))
    z += (z @ u) * (np.sqrt(spectrum) - 1.0) @ u.T
    psi = -(z + (z @ u) * (1.0 / spectrum - 1.0) @ u.T)  # -B z, B the precision
    found = gw._residual_directions(z, psi, np.ones(dim), 6, np)
    np.testing.assert_allclose(found.T @ found, np.eye(6), atol=1e-10)
    np.testing.assert_allclose(np.linalg.norm(found.T @ u, axis=0), 1.0, atol=1e-10)


def test_the_measure_in_a_span_equals_dense_linear_algebra():
    """``gw._measured_in``: ``R' R'^T = R (I + V W diag(t^2 - 1) W^T V^T) R^T`` (``W, mu``
    the eigenpairs of the geometric mean of the draws' and gradients' covariances along
    ``V`` over the level, ``t^2 = mu`` past the threshold either way, 1 elsewhere) where
    that has at most ``k`` directions away from the rest; ``R'^T g`` the new root's; and
    the factor the largest ``max(t, 1 / t)^2``. Float64, d = 40, k = 4 (two factors away
    from 0), a span of 10 columns holding ``Q``."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(5)
        dim, k, p, m, level = 40, 4, 10, 200, 0.7
        root = _low_rank_root(rng, dim, k, active=2)
        span = np.linalg.qr(np.concatenate([root.basis, rng.normal(size=(dim, p - k))], 1))[0]
        # the draws' covariance along the span: the level except along two mixtures
        target = np.eye(p) * level
        mix = np.linalg.qr(rng.normal(size=(p, 2)))[0]
        target += mix @ np.diag([5.0 * level, -0.6 * level]) @ mix.T
        along_x = rng.normal(size=(m, p)) @ np.linalg.cholesky(target).T
        along_g = -np.linalg.solve(target, along_x.T).T  # a Gaussian's: -C^-1 x
        g = rng.normal(size=dim)
        for xp in (jnp, np):
            new, g_new, factor = gw._measured_in(
                jax.tree.map(xp.asarray, root), xp.asarray(span), xp.asarray(along_x),
                xp.asarray(along_g), level, xp.asarray(g), xp)  # fmt: skip
            cx, cg = np.cov(along_x.T), np.cov(along_g.T)
            mu, w = np.linalg.eigh(np.asarray(gw.geometric_mean(cx, cg, np)) / level)
            off = (mu > gw.LOW_RANK_REMEASURE_THRESHOLD) | (
                mu * gw.LOW_RANK_REMEASURE_THRESHOLD < 1.0
            )
            assert off.sum() == 2
            t2 = np.where(off, mu, 1.0)
            r = np.asarray(square_roots.dense(root))
            change = np.eye(dim) + span @ w @ np.diag(t2 - 1.0) @ w.T @ span.T
            r_new = np.asarray(square_roots.dense(new))
            np.testing.assert_allclose(r_new @ r_new.T, r @ change @ r.T, atol=1e-9)
            np.testing.assert_allclose(np.asarray(g_new), r_new.T @ np.linalg.solve(r.T, g),
                                       atol=1e-9)  # fmt: skip
            np.testing.assert_allclose(float(factor), np.max(np.maximum(t2, 1.0 / t2)))


def _large_gaussian_widening_problem():
    """d = 20 000, ``m = 256`` independent draws seen through a rank-8 root with zero
    factors whose ``D`` is off by 25% per coordinate (log-normal), as a short Fisher
    phase leaves it at large ``d``; the posterior ``D_t^(1/2) (I + U diag(S - 1) U^T)
    D_t^(1/2)`` with four loose directions (100 to 20 times the rest) and two stiff ones:
    ``(root, moments, condition)``, ``condition(r)`` the condition number of the whitened
    covariance ``R^-1 Sigma R^-T``."""
    from scipy.sparse.linalg import LinearOperator, eigsh

    rng = np.random.default_rng(8)
    dim, m = 20_000, gw.LOW_RANK_MAX_DRAWS
    diagonal = np.exp(rng.uniform(-2, 2, dim))
    u = np.linalg.qr(rng.normal(size=(dim, 6)))[0]
    spectrum = np.array([100.0, 50.0, 30.0, 20.0, 0.1, 0.05])
    eps = rng.normal(size=(m, dim))
    x = np.sqrt(diagonal) * (eps + (eps @ u) * (np.sqrt(spectrum) - 1.0) @ u.T)
    y = x / np.sqrt(diagonal)
    grads = -(y + (y @ u) * (1.0 / spectrum - 1.0) @ u.T) / np.sqrt(diagonal)  # -Sigma^-1 x
    scale = np.sqrt(diagonal) * np.exp(0.25 * rng.normal(size=dim))
    root = LowRankSqrt(scale, np.linalg.qr(rng.normal(size=(dim, 8)))[0], np.zeros(8))
    z, psi = x / scale, grads * scale  # R^-1 x and R^T g with zero factors
    q = np.sum(psi**2, axis=1)
    moments = gw.LowRankMoments(np.zeros(dim), z, psi, np.sum(q), np.sum(q**2), np.asarray(m))

    def condition(r):
        r = jax.tree.map(lambda a: np.asarray(a, np.float64), r)
        inverse = 1.0 / (1.0 + r.factors) - 1.0

        def whitened(v):
            v = np.ravel(v)
            w = (v + r.basis @ (inverse * (r.basis.T @ v))) / r.scale
            w = np.sqrt(diagonal) * w
            w = np.sqrt(diagonal) * (w + u @ ((spectrum - 1.0) * (u.T @ w)))
            w = w / r.scale
            return w + r.basis @ (inverse * (r.basis.T @ w))

        op = LinearOperator((dim, dim), whitened, dtype=np.float64)
        top = eigsh(op, k=1, which="LA", return_eigenvectors=False)[0]
        bottom = eigsh(op, k=1, which="SA", return_eigenvectors=False)[0]
        return top / bottom

    return root, moments, condition


def test_low_rank_widening_whitens_a_large_gaussian_the_draws_alone_do_not(monkeypatch):
    """After the widening the whitened covariance of :func:`_large_gaussian_widening_problem`
    has a condition number under 1.6 (2607 before; 1.46 after three passes, 1.75 after
    one, which the test checks too: the passes must gain). NumPy's twin, on the host."""
    root, moments, condition = _large_gaussian_widening_problem()
    m = moments.draws.shape[0]
    assert gw.low_rank_widening_passes(moments.draws) == gw.LOW_RANK_WIDENING_PASSES > 1
    assert condition(root) > 500
    widened, _, factor = gw.widened_root(root, moments.grads[-1], moments, m, np)
    assert condition(widened) < 1.6, condition(widened)
    assert factor > 10.0
    monkeypatch.setattr(gw, "LOW_RANK_WIDENING_PASSES", 1)
    once, _, _ = gw.widened_root(root, moments.grads[-1], moments, m, np)
    assert condition(once) > 1.7, condition(once)


def test_low_rank_widening_held_back_by_the_kurtosis_changes_nothing(monkeypatch):
    """Where the gradients' kurtosis forbids the widening (a funnel), the low-rank root and
    the whitened gradient come back unchanged, bit for bit, factor 1, however many passes."""
    root, moments, _ = _large_gaussian_widening_problem()
    monkeypatch.setattr(gw, "WIDENING_MAX_KURTOSIS_RATIO", 0.0)
    g = moments.grads[-1]
    held, g_held, factor = gw.widened_root(root, g, moments, moments.draws.shape[0], np)
    assert float(factor) == 1.0
    for a, b in zip(jax.tree.leaves((held, g_held)), jax.tree.leaves((root, g)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_low_rank_widening_passes_hold_in_float32():
    """The compiled widening in float32 reaches what NumPy's reaches on the same rows: the
    passes after the first measure small corrections in a span whose directions many rows
    share, where the geometric mean from the covariances' products made up variances of 2
    to 11 (condition number 31 after three passes, 281 after four); from the rows'
    singular values, 1.46."""
    root, moments, condition = _large_gaussian_widening_problem()
    m = moments.draws.shape[0]
    single = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), (root, moments))
    widened, _, _ = jax.jit(lambda r, mo: gw.widened_root(r, mo.grads[-1], mo, m))(*single)
    assert condition(widened) < 1.6, condition(widened)
