"""Baselines under one protocol: AdaMALA, manifold MALA, HMC (and MALA)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import gaussian_logdensity, random_covariance
from scipy import integrate

import fisher_mala as fm
from fisher_mala import hmc, mmala

# --- a non-Gaussian product target with a position-dependent Hessian metric -------------
# pi(x) ∝ prod_i exp(-x_i^4 / 4 - x_i^2 / 2): exact draws by rejection from N(0, 1).
SCALE = np.array([1.0, 0.5])


def quartic_logdensity(x):
    z = x / SCALE
    return -jnp.sum(z**4 / 4 + z**2 / 2)


def _quartic_second_moment():
    def density(t):
        return np.exp(-(t**4) / 4 - t**2 / 2)

    norm = integrate.quad(density, -np.inf, np.inf)[0]
    return integrate.quad(lambda t: t**2 * density(t), -np.inf, np.inf)[0] / norm


def _exact_quartic_draws(num, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < num:
        t = rng.normal(size=4 * num)
        keep = rng.uniform(size=t.size) < np.exp(-(t**4) / 4)
        out.extend(t[keep].tolist())
    draws = np.asarray(out[: 2 * num]).reshape(num, 2)
    return jnp.asarray(draws * SCALE, jnp.float32)


NUM_CHAINS, NUM_STEPS = 4000, 10


def _invariance_z_scores(init, step):
    positions = _exact_quartic_draws(NUM_CHAINS)
    states = jax.vmap(init)(positions)

    def one(states, key):
        states, info = jax.vmap(step)(jax.random.split(key, NUM_CHAINS), states)
        return states, info.acceptance_rate

    states, rates = jax.lax.scan(one, states, jax.random.split(jax.random.key(7), NUM_STEPS))
    x = np.asarray(states.position, np.float64)
    second = _quartic_second_moment() * SCALE**2
    z_mean = x.mean(0) / (x.std(0) / np.sqrt(NUM_CHAINS))
    sq = x**2
    z_var = (sq.mean(0) - second) / (sq.std(0) / np.sqrt(NUM_CHAINS))
    return np.concatenate([z_mean, z_var]), float(rates.mean())


@pytest.mark.parametrize("sampler", ["mmala", "hmc", "adamala-frozen"])
def test_frozen_kernels_leave_a_non_gaussian_target_invariant(sampler):
    if sampler == "mmala":
        kernel = mmala.build_kernel()

        def init(x):
            return mmala.init(x, quartic_logdensity)

        def step(k, s):
            return kernel(k, s, quartic_logdensity, 1.3)
    elif sampler == "hmc":
        kernel = hmc.build_kernel(10)

        def init(x):
            return hmc.init(x, quartic_logdensity)

        def step(k, s):
            return kernel(k, s, quartic_logdensity, 0.35)
    else:  # AdaMALA samples with frozen preconditioned MALA: a non-diagonal R
        r = jnp.asarray([[0.8, 0.0], [0.3, 0.4]])
        alg = fm.fisher_mala(quartic_logdensity, step_size=0.6, adapt=False)
        init = lambda x: alg.init(x, sqrt_precond=r)  # noqa: E731
        step = alg.step
    z, rate = _invariance_z_scores(init, step)
    assert 0.3 < rate < 0.95, rate
    assert np.all(np.abs(z) < 4.5), z


def test_mmala_invariance_check_detects_a_missing_log_determinant():
    """Dropping the log-determinants (wrong for a position-dependent metric) is caught."""
    kernel = mmala.build_kernel()

    def init(x):
        return mmala.init(x, quartic_logdensity)

    def step_without_logdet(k, s):
        # the current point's log|G(x)| is lost, so the ratio misses 1/2 log|G(x)|
        return kernel(k, s._replace(metric_logdet=jnp.asarray(0.0)), quartic_logdensity, 1.3)

    z, _ = _invariance_z_scores(init, step_without_logdet)
    assert np.max(np.abs(z)) > 4.5, z


# --- adaptation reaches its target acceptance rate on a 10-d anisotropic Gaussian -------

_SD = np.geomspace(0.1, 3.0, 10)
_C = random_covariance(10, seed=3, jitter=0.5)
ANISO_COV = _C / np.sqrt(np.outer(np.diag(_C), np.diag(_C))) * np.outer(_SD, _SD)
ANISO = fm.targets.gaussian("aniso10", np.ones(10), ANISO_COV)


@pytest.mark.parametrize(
    "sampler,target,tolerance",
    [
        ("mala", 0.574, 0.04),
        ("fisher_mala", 0.574, 0.04),
        ("adamala", 0.574, 0.04),
        ("mmala", 0.574, 0.04),
        ("hmc", 0.651, 0.04),
    ],
)
def test_adaptive_runs_reach_their_target_acceptance(sampler, target, tolerance):
    positions = ANISO.initial_positions(jax.random.key(0), 2)
    r = fm.sample(
        jax.random.key(1),
        sampler,
        ANISO.logdensity_fn,
        positions,
        num_warmup=8000,
        num_samples=1000,
    )
    late = float(np.mean(np.asarray(r.warmup_info.acceptance_rate)[:, -3000:]))
    assert abs(late - target) < tolerance, (sampler, late)


# --- exact identities --------------------------------------------------------------------


def test_mmala_on_a_gaussian_is_preconditioned_mala_with_sigma(x64):
    cov = jnp.asarray(random_covariance(5, seed=2))
    mean = jnp.arange(5.0)
    logdensity = gaussian_logdensity(mean, cov)
    sigma2 = 0.9
    # G = Sigma^{-1} = L L^T, so G^{-1} = L^{-T} L^{-1}: R = L^{-T}; Eq. (7) divides the
    # step by tr(A)/d, so MALA's sigma^2 is sigma2 * tr(Sigma) / d.
    chol_g = jnp.linalg.cholesky(jnp.linalg.inv(cov))
    r = jnp.linalg.inv(chol_g).T
    pmala = fm.mala(logdensity, step_size=sigma2 * float(jnp.trace(cov)) / 5, sqrt_precond=r)
    kernel = jax.jit(lambda k, s: mmala.build_kernel()(k, s, logdensity, sigma2))
    x0 = jnp.zeros(5)
    s_m, s_p = mmala.init(x0, logdensity), pmala.init(x0)
    accepted = 0
    for key in jax.random.split(jax.random.key(0), 200):
        s_m, info_m = kernel(key, s_m)
        s_p, info_p = pmala.step(key, s_p)
        assert bool(info_m.is_accepted) == bool(info_p.is_accepted)
        np.testing.assert_allclose(s_m.position, s_p.position, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(info_m.acceptance_rate, info_p.acceptance_rate, rtol=1e-8)
        accepted += int(info_m.is_accepted)
    assert 20 < accepted < 200


# --- honest gradient counts ----------------------------------------------------------------


@pytest.mark.parametrize("sampler,per_step", [("mala", 1), ("fisher_mala", 1), ("hmc", 10)])
def test_num_grad_evals_counts_every_evaluation(sampler, per_step):
    calls = []

    def counted(x):
        jax.debug.callback(lambda: calls.append(1), ordered=True)
        return ANISO.logdensity_fn(x)

    r = fm.sample(
        jax.random.key(0), sampler, counted, jnp.zeros((1, 10)), num_warmup=300, num_samples=200
    )
    reported = int(r.num_grad_evals[0])
    search = int(r.warmup_info.num_grad_evals[0]) - 1 - 300 * per_step
    assert reported == 1 + search + (300 + 200) * per_step
    # Host calls: the validation (every chain's value and gradient, one compiled call), the
    # initial one (which the search reuses), one per proposal of every search trial (8 a
    # trial, made one after another), then the steps.
    assert search % 8 == 0 and search >= 8
    assert len(calls) == 1 + 1 + search + (300 + 200) * per_step
