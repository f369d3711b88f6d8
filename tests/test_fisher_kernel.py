"""FisherMALA and MALA kernels: invariance, adaptation, recursions in the kernel, plumbing."""

import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import gaussian_logdensity, normalized_frobenius, random_covariance

import fisher_mala as fm
from fisher_mala.mala import MALAInfo, MALAState

# --- invariance: exact draws stay exact draws (MCSE z-scores across independent chains) ---

MEAN3 = np.array([1.0, -2.0, 0.5])
COV3 = np.array([[1.0, 0.9, 0.2], [0.9, 1.5, 0.3], [0.2, 0.3, 0.25]])
NUM_CHAINS, NUM_STEPS, Z_MAX = 4000, 15, 4.5


def _exact_draws(key, num):
    chol = np.linalg.cholesky(COV3)
    return jnp.asarray(MEAN3 + jax.random.normal(key, (num, 3)) @ chol.T, jnp.float32)


def _z_scores(samples):
    """z-scores of the sample mean and variance of iid draws against the truth."""
    samples = np.asarray(samples, np.float64)
    n = samples.shape[0]
    mean_z = (samples.mean(0) - MEAN3) / (samples.std(0) / np.sqrt(n))
    sq = (samples - MEAN3) ** 2
    var_z = (sq.mean(0) - np.diag(COV3)) / (sq.std(0) / np.sqrt(n))
    return np.concatenate([mean_z, var_z])


def _run_chains(alg, key):
    positions = _exact_draws(jax.random.fold_in(key, 0), NUM_CHAINS)
    states = jax.vmap(alg.init)(positions)

    def one_step(states, k):
        keys = jax.random.split(k, NUM_CHAINS)
        states, info = jax.vmap(alg.step)(keys, states)
        return states, info.acceptance_rate

    states, rates = jax.lax.scan(one_step, states, jax.random.split(key, NUM_STEPS))
    return states.position, float(rates.mean())


BAD_R = np.array([[1.0, 0.0, 0.0], [0.8, 0.3, 0.0], [-0.5, 0.4, 2.0]])


def _frozen_fisher(logdensity):
    alg = fm.fisher_mala(logdensity, step_size=0.3, adapt=False)
    return alg._replace(
        init=lambda x: alg.init(x, sqrt_precond=jnp.asarray(BAD_R, x.dtype))  # non-optimal R
    )


@pytest.mark.parametrize(
    "make",
    [
        _frozen_fisher,
        lambda ld: fm.mala(ld, step_size=0.5),
        lambda ld: fm.mala(ld, step_size=0.4, sqrt_precond=BAD_R),
    ],
    ids=["fisher-frozen", "mala", "mala-preconditioned"],
)
def test_frozen_kernels_leave_gaussian_invariant(make):
    logdensity = gaussian_logdensity(jnp.asarray(MEAN3), jnp.asarray(COV3))
    positions, rate = _run_chains(make(logdensity), jax.random.key(42))
    assert 0.2 < rate < 0.9, rate  # the M-H test is exercised
    z = _z_scores(positions)
    assert np.all(np.abs(z) < Z_MAX), z


def test_invariance_check_detects_a_wrong_kernel():
    """The z-score test can fail: MALA without its M-H correction is biased."""
    logdensity = gaussian_logdensity(jnp.asarray(MEAN3), jnp.asarray(COV3))
    grad = jax.grad(logdensity)

    x0 = jnp.zeros(3)

    def ula_step(key, x):
        return x + 0.5 * 0.4 * grad(x) + jnp.sqrt(0.4) * jax.random.normal(key, x.shape)

    class Alg:
        init = staticmethod(lambda x: MALAState(x, 0.0, x))

        @staticmethod
        def step(key, state):
            new = ula_step(key, state.position)
            return state._replace(position=new), MALAInfo(1.0, True, True, 0.4, x0, x0, x0)

    positions, _ = _run_chains(Alg, jax.random.key(42))
    assert np.max(np.abs(_z_scores(positions))) > Z_MAX


# --- adaptation: the trace-normalized A approaches the trace-normalized covariance ---


def _adapt(cov, num_steps, seed, dtype=jnp.float64, signal="rao_blackwell"):
    d = cov.shape[0]
    mean = jnp.ones(d, dtype)
    logdensity = gaussian_logdensity(mean, jnp.asarray(cov, dtype))
    alg = fm.fisher_mala(logdensity, step_size=0.1, signal=signal)
    key = jax.random.key(seed)
    state = alg.init(
        mean
        + jnp.linalg.cholesky(jnp.asarray(cov, dtype))
        @ jax.random.normal(jax.random.fold_in(key, 1), (d,), dtype)
    )
    state, _ = jax.lax.scan(lambda s, k: alg.step(k, s), state, jax.random.split(key, num_steps))
    return state


@pytest.mark.parametrize(
    "cov,num_steps,bound",
    [
        (np.array([[1.0, 0.995], [0.995, 1.0]]), 2000, 0.03),  # measured ~0.002-0.008
        (random_covariance(20, seed=0), 5000, 0.3),  # measured ~0.18-0.20
    ],
    ids=["2d-rho0.995", "20d-dense"],
)
def test_adaptation_learns_the_covariance(x64, cov, num_steps, bound):
    start = normalized_frobenius(jnp.eye(cov.shape[0]), jnp.asarray(cov))
    for seed in range(2):
        state = _adapt(cov, num_steps, seed)
        r = state.sqrt_precond
        dist = normalized_frobenius(r @ r.T, jnp.asarray(cov))
        assert dist < bound < start, (dist, start)
        # the O(d) caches agree with recomputed values
        assert float(state.trace_precond) == pytest.approx(float(jnp.sum(r * r)), rel=1e-9)
        np.testing.assert_allclose(state.whitened_grad, state.logdensity_grad @ r, rtol=1e-8)


# --- the recursions inside the kernel, against dense inverses (float64) ---


def _record_scores(alg, x0, num_steps):
    state = alg.init(x0)
    scores = []
    for key in jax.random.split(jax.random.key(3), num_steps):
        scores.append(np.asarray(state.logdensity_grad))
        state, _ = alg.step(key, state)
    return state, np.asarray(scores)


def _logdensity_4d(x):
    return -0.5 * jnp.sum(jnp.arange(1.0, 5.0) * (x - 1.0) ** 2) - 0.1 * jnp.sum(x**4)


def appendix_b_information(scores, learning_rate, damping):
    """Appendix B's I_n, dense, with the two guards of fm.fisher_preconditioner: gamma_n
    capped at max(1/n, 1/d), and rho_n = lambda (n gamma_n - 1) / (n (n - 1)) added along
    the coordinate axis (n - 2) mod d (weight rho_n d), which keeps the damping lambda / n."""
    d = scores.shape[1]
    fisher = np.outer(scores[0], scores[0]) + damping * np.eye(d)
    for n in range(2, len(scores) + 1):
        g = min(float(learning_rate(n)), max(1.0 / n, 1.0 / d))
        rho = max(0.0, damping * (n * g - 1.0) / (n * (n - 1.0)))
        axis = np.eye(d)[(n - 2) % d]
        fisher = (
            (1 - g) * fisher
            + g * np.outer(scores[n - 1], scores[n - 1])
            + rho * d * np.outer(axis, axis)
        )
    return fisher


@pytest.mark.parametrize("learning_rate", [None, lambda n: 1.0 / n**0.6, lambda n: 0.3])
def test_score_signal_in_kernel_matches_proposition4_and_appendix_b(x64, learning_rate):
    damping = 3.0
    alg = fm.fisher_mala(
        _logdensity_4d,
        step_size=0.3,
        damping=damping,
        signal="score",
        learning_rate=learning_rate,
    )
    state, scores = _record_scores(alg, jnp.zeros(4), 120)
    r = np.asarray(state.sqrt_precond)
    if learning_rate is None:
        fisher = scores.T @ scores + damping * np.eye(4)
    else:
        fisher = appendix_b_information(scores, learning_rate, damping)
    np.testing.assert_allclose(r @ r.T, np.linalg.inv(fisher), rtol=1e-9, atol=1e-14)
    assert int(state.count) == 120


def test_centered_signal_in_kernel_matches_appendix_c(x64):
    damping = 2.0
    alg = fm.fisher_mala(_logdensity_4d, step_size=0.3, damping=damping, signal="centered")
    state, scores = _record_scores(alg, jnp.zeros(4), 90)
    n = len(scores)
    centred = scores - scores.mean(0)
    expected = np.linalg.inv((centred.T @ centred + damping * np.eye(4)) / (n - 1))
    r = np.asarray(state.sqrt_precond)
    np.testing.assert_allclose(r @ r.T, expected, rtol=1e-9)
    np.testing.assert_allclose(state.whitened_mean_score, scores.mean(0) @ r, rtol=1e-9)
    assert float(state.trace_precond) == pytest.approx(np.trace(r @ r.T), rel=1e-9)


# --- plumbing: jit once, vmap, scan, pytrees, dtypes, one evaluation per step ---


def test_repeated_steps_do_not_retrace():
    def logdensity(x):
        return -0.5 * jnp.sum(x**2)

    state = fm.fisher_mala(logdensity, step_size=0.5).init(jnp.zeros(3))
    chex.clear_trace_counter()
    counted = chex.assert_max_traces(logdensity, n=1)
    alg = fm.fisher_mala(counted, step_size=0.5)
    for i in range(5):  # a retrace would call `counted` a second time and raise
        state, _ = alg.step(jax.random.key(i), state)
    chex.clear_trace_counter()
    frozen = fm.fisher_mala(counted, step_size=0.5, adapt=False)
    for i in range(5):
        state, _ = frozen.step(jax.random.key(i), state)


def test_one_logdensity_evaluation_per_step():
    calls = []

    def logdensity(x):
        calls.append(1)
        return -0.5 * jnp.sum(x**2)

    for alg in (fm.fisher_mala(logdensity, step_size=0.5), fm.mala(logdensity, step_size=0.5)):
        state = alg.init(jnp.zeros(3))
        calls.clear()
        jax.make_jaxpr(alg.step)(jax.random.key(0), state)
        assert len(calls) == 1


def test_vmap_scan_and_pytree_positions_agree_with_flat(x64):
    def flat_logdensity(x):
        return -0.5 * jnp.sum((x - jnp.arange(5.0)) ** 2 * jnp.arange(1.0, 6.0))

    def tree_logdensity(p):
        return flat_logdensity(jnp.concatenate([p["a"], p["b"].ravel()]))

    x0 = jnp.linspace(-1.0, 1.0, 5)
    tree0 = {"a": x0[:1], "b": x0[1:].reshape(2, 2)}
    keys = jax.random.split(jax.random.key(0), 50)
    flat = fm.fisher_mala(flat_logdensity, step_size=0.3)
    tree = fm.fisher_mala(tree_logdensity, step_size=0.3)
    run = lambda alg, x: jax.lax.scan(lambda s, k: alg.step(k, s), alg.init(x), keys)[0]  # noqa: E731
    s_flat, s_tree = run(flat, x0), run(tree, tree0)
    got = jnp.concatenate([s_tree.position["a"], s_tree.position["b"].ravel()])
    np.testing.assert_allclose(got, s_flat.position, rtol=1e-12)
    np.testing.assert_allclose(s_tree.sqrt_precond, s_flat.sqrt_precond, rtol=1e-12)
    # vmap over chains equals chain-by-chain
    batch = jnp.stack([x0, -x0, 2 * x0])
    vm = jax.vmap(lambda x: run(flat, x))(batch)
    for i in range(3):
        np.testing.assert_allclose(vm.position[i], run(flat, batch[i]).position, rtol=1e-12)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_float32_and_float64(dtype):
    with jax.enable_x64(dtype == jnp.float64):
        cov = jnp.asarray(random_covariance(10, seed=1), dtype)
        state = _adapt(cov, 1500, 0, dtype=dtype)
        leaves = jax.tree.leaves(state)
        assert all(jnp.all(jnp.isfinite(leaf)) for leaf in leaves)
        assert state.sqrt_precond.dtype == dtype and state.position.dtype == dtype
        r = state.sqrt_precond
        assert normalized_frobenius(r @ r.T, cov) < 0.5 * normalized_frobenius(jnp.eye(10), cov)


def test_import_does_not_enable_x64():
    code = "import jax, fisher_mala; assert not jax.config.jax_enable_x64; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


# --- faults: non-finite proposals are rejected and never enter the state ---


@pytest.mark.parametrize("signal", ["rao_blackwell", "increment", "score", "centered"])
def test_nonfinite_proposals_are_rejected(signal):
    @jax.custom_jvp
    def nan_gradient(t):  # value 0, gradient NaN for t > 0.5
        return jnp.zeros_like(t)

    @nan_gradient.defjvp
    def _nan_gradient_jvp(primals, tangents):
        (t,), (dt,) = primals, tangents
        return nan_gradient(t), jnp.where(t > 0.5, jnp.nan, 0.0) * dt

    def logdensity(x):  # a hard wall at x0 > 0.5 (-inf); NaN gradient where x1 > 0.5
        base = -0.5 * jnp.sum(x**2) + nan_gradient(x[1])
        return jnp.where(x[0] > 0.5, -jnp.inf, base)

    alg = fm.fisher_mala(logdensity, step_size=4.0, signal=signal)
    state = alg.init(jnp.zeros(3))
    state, info = jax.lax.scan(
        lambda s, k: alg.step(k, s), state, jax.random.split(jax.random.key(0), 300)
    )
    assert int((~info.proposal_is_finite).sum()) > 10  # the faults happened
    assert not bool(jnp.any(info.is_accepted & ~info.proposal_is_finite))
    assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(state))
    assert float(state.position[0]) <= 0.5 and float(state.position[1]) <= 0.5
    eig = jnp.linalg.eigvalsh(state.sqrt_precond @ state.sqrt_precond.T)
    assert float(eig.min()) > 0


# --- bad input: clear errors before compilation ---


def _ld(x):
    return -0.5 * jnp.sum(x**2)


@pytest.mark.parametrize(
    "build,match",
    [
        (lambda: fm.fisher_mala(_ld, step_size=-1.0), "step_size"),
        (lambda: fm.fisher_mala(_ld, step_size=0.0), "step_size"),
        (lambda: fm.fisher_mala(_ld, step_size=jnp.nan), "step_size"),
        (lambda: fm.fisher_mala(_ld, step_size=1.0, damping=0.0), "damping"),
        (
            lambda: fm.fisher_mala(_ld, step_size=1.0, target_acceptance_rate=1.2),
            "target_acceptance_rate",
        ),
        (
            lambda: fm.fisher_mala(_ld, step_size=1.0, step_size_learning_rate=-0.1),
            "step_size_learning_rate",
        ),
        (lambda: fm.fisher_mala(_ld, step_size=1.0, signal="raoblackwell"), "signal"),
        (lambda: fm.fisher_mala(_ld, step_size=1.0, learning_rate=1.5), "learning_rate"),
        (lambda: fm.fisher_mala(_ld, step_size=1.0, learning_rate=lambda n: 1.0), "learning_rate"),
        (
            lambda: fm.fisher_mala(_ld, step_size=1.0, signal="centered", learning_rate=0.1),
            "learning_rate",
        ),
        (lambda: fm.fisher_mala("not a function", step_size=1.0), "logdensity_fn"),
        (lambda: fm.mala(_ld, step_size=1.0, sqrt_precond=jnp.ones(3)), "sqrt_precond"),
    ],
)
def test_invalid_options_raise_clear_errors(build, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build()


@pytest.mark.parametrize(
    "logdensity,position,match",
    [
        (_ld, jnp.array([0.0, jnp.nan]), "position"),
        (_ld, jnp.array([1, 2]), "position"),
        (_ld, jnp.array([1 + 1j, 2]), "position"),
        (_ld, jnp.zeros(0), "position"),
        (lambda x: x**2, jnp.zeros(2), "scalar"),
        (lambda x: jnp.log(x[0] - 1.0), jnp.zeros(2), "finite"),
        (lambda x: jnp.sum(x.astype(jnp.int32)), jnp.zeros(2), "float"),
        (lambda x: x["missing"], jnp.zeros(2), "raised"),
        (lambda x: jnp.sqrt(x[0]) + 0.0 * x[1], jnp.zeros(2), "gradient"),
    ],
)
def test_bad_initial_inputs_raise_clear_errors(logdensity, position, match):
    for alg in (fm.fisher_mala(logdensity, step_size=1.0), fm.mala(logdensity, step_size=1.0)):
        with pytest.raises((ValueError, TypeError), match=match):
            alg.init(position)


def test_wrong_sqrt_precond_shape_is_rejected():
    alg = fm.fisher_mala(_ld, step_size=1.0)
    with pytest.raises(ValueError, match="sqrt_precond"):
        alg.init(jnp.zeros(3), sqrt_precond=jnp.eye(4))


def _grad_4d(x):
    return -np.arange(1.0, 5.0) * (x - 1.0) - 0.4 * x**3


def _record_transitions(alg, x0, num_steps, seed=5):
    """Run ``alg`` step by step; return the proposals it evaluated and the infos.

    The log density records every point it is evaluated at (one per step: the proposal),
    so the test can recompute each signal from dense gradients.
    """
    seen = []

    def logdensity(x):
        jax.debug.callback(lambda v: seen.append(np.asarray(v)), x)
        return _logdensity_4d(x)

    alg = alg(logdensity)
    state = alg.init(x0)
    seen.clear()
    positions, infos = [], []
    step = jax.jit(alg.step)
    for key in jax.random.split(jax.random.key(seed), num_steps):
        positions.append(np.asarray(state.position))
        state, info = step(key, state)
        infos.append(info)
    jax.effects_barrier()
    assert len(seen) == num_steps  # one evaluation per step, at the proposal
    infos = jax.tree.map(lambda *v: np.stack(v), *infos)
    return state, np.asarray(positions), np.asarray(seen), infos


@pytest.mark.parametrize("signal", ["rao_blackwell", "increment"])
def test_default_and_increment_signals_in_kernel_match_dense_algebra(x64, signal):
    """Eq. (16) (sqrt(alpha) (g_y - g_x), the default) and Eq. (15) (1[accepted] (g_y -
    g_x)) recomputed from the proposals with dense gradients, then Prop. 4 as a dense
    inverse. Kills: alpha for sqrt(alpha); no weight; the weight of the other signal."""
    damping = 2.0

    def build(logdensity):
        return fm.fisher_mala(logdensity, step_size=0.6, damping=damping, signal=signal)

    state, xs, ys, infos = _record_transitions(build, jnp.zeros(4), 150)
    alpha = infos.acceptance_rate
    assert 0.05 < alpha.mean() < 0.95 and alpha.std() > 0.1  # the weights matter
    difference = np.stack([_grad_4d(y) - _grad_4d(x) for x, y in zip(xs, ys, strict=True)])
    if signal == "rao_blackwell":
        signals = np.sqrt(alpha)[:, None] * difference
    else:
        signals = np.where(infos.is_accepted[:, None], difference, 0.0)
    expected = np.linalg.inv(signals.T @ signals + damping * np.eye(4))
    r = np.asarray(state.sqrt_precond)
    np.testing.assert_allclose(r @ r.T, expected, rtol=1e-8, atol=1e-14)
    np.testing.assert_allclose(
        state.logdensity_grad, _grad_4d(np.asarray(state.position)), rtol=1e-12
    )


@pytest.mark.slow  # 27 s; schedules are also checked by test_properties and the kernel tests
def test_the_issues_schedule_keeps_the_run_finite_and_warns_that_it_is_capped():
    """0.5 * optax.polynomial_schedule(1 -> 1/num^0.7) on the 100-d GP target printed
    ``nan`` (R overflowed float32 in the warm-up); now gamma_n is capped at max(1/n, 1/d),
    and fm.sample says so because the cap binds for most of the warm-up."""
    import warnings

    import optax

    num = 2000
    schedule = optax.polynomial_schedule(1.0, 1.0 / num**0.7, 1.0, num)
    target = fm.targets.gp_gaussian()
    x0 = target.initial_positions(jax.random.key(0), 2)
    with pytest.warns(RuntimeWarning, match="capped at max"):
        r = fm.sample(
            jax.random.key(1),
            "fisher_mala",
            target.logdensity_fn,
            x0,
            num_warmup=num,
            num_samples=500,
            learning_rate=lambda n: 0.5 * schedule(n),
            diagnose=False,
        )
    assert np.all(np.isfinite(np.asarray(r.parameters.sqrt_precond)))
    assert np.all(np.asarray(r.sample_stats["is_accepted"]).mean(-1) > 0.3)
    with warnings.catch_warnings():  # a window of d signals throughout: no warning
        warnings.simplefilter("error", RuntimeWarning)
        fm.sample(
            jax.random.key(1),
            "fisher_mala",
            target.logdensity_fn,
            x0,
            num_warmup=600,
            num_samples=10,
            learning_rate=1.0 / target.dim,
            diagnose=False,
        )
