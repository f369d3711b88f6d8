"""The posteriordb targets: log densities against scipy, and Fisher NUTS against the
posteriors' reference draws (MCSE z-scores)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import fisher_mala as fm
from fisher_mala.targets import posteriordb


def _scipy_logdensity(name, theta):
    """The Stan model's log density with scipy, plus the log-Jacobian of exp."""
    data = posteriordb._data(name)
    if name == "diamonds":
        x = data["X"][:, 1:]
        xc = x - x.mean(0)
        b, intercept, sigma = theta[:24], theta[24], np.exp(theta[25])
        return (stats.norm.logpdf(b).sum() + stats.t.logpdf(intercept, 3, 8, 10)
                + stats.t.logpdf(sigma, 3, 0, 10)
                + stats.norm.logpdf(data["Y"], intercept + xc @ b, sigma).sum() + theta[25])
    if name == "eight_schools_noncentered":
        trans, mu, tau = theta[:8], theta[8], np.exp(theta[9])
        return (stats.norm.logpdf(trans).sum()
                + stats.norm.logpdf(data["y"], mu + tau * trans, data["sigma"]).sum()
                + stats.norm.logpdf(mu, 0, 5) + stats.cauchy.logpdf(tau, 0, 5) + theta[9])
    if name == "eight_schools_centered":
        school, mu, tau = theta[:8], theta[8], np.exp(theta[9])
        return (stats.norm.logpdf(school, mu, tau).sum()
                + stats.norm.logpdf(data["y"], school, data["sigma"]).sum()
                + stats.norm.logpdf(mu, 0, 5) + stats.cauchy.logpdf(tau, 0, 5) + theta[9])
    if name == "kilpisjarvi":
        alpha, beta, sigma = theta[0], theta[1], np.exp(theta[2])
        return (stats.norm.logpdf(alpha, data["pmualpha"], data["psalpha"])
                + stats.norm.logpdf(beta, data["pmubeta"], data["psbeta"])
                + stats.norm.logpdf(data["y"], alpha + beta * data["x"], sigma).sum() + theta[2])
    y, k = data["y"], int(data["K"])
    alpha, beta, sigma = theta[0], theta[1:6], np.exp(theta[6])
    mu = [alpha + sum(beta[i] * y[t - i - 1] for i in range(k)) for t in range(k, len(y))]
    return (stats.norm.logpdf(alpha, 0, 10) + stats.norm.logpdf(beta, 0, 10).sum()
            + stats.cauchy.logpdf(sigma, 0, 2.5) + stats.norm.logpdf(y[k:], mu, sigma).sum()
            + theta[6])


@pytest.mark.parametrize("name", list(posteriordb.POSTERIORS))
def test_log_density_matches_the_stan_model_up_to_a_constant(x64, name):
    target = fm.targets.get(name)
    rng = np.random.default_rng(0)
    points = rng.normal(size=(3, target.dim)) * 0.3
    ours = [float(target.logdensity_fn(jnp.asarray(p))) for p in points]
    theirs = [_scipy_logdensity(name, p) for p in points]
    np.testing.assert_allclose(np.diff(ours), np.diff(theirs), rtol=1e-9, atol=1e-8)
    ref = target.extras["reference"]
    assert len(ref["names"]) == len(ref["mean"]) == target.extras["constrain"](points).shape[-1]


def _assert_matches_reference(target, samples, sd_tolerance=0.15):
    """Means by MCSE z-scores (ArviZ's multi-chain ESS), standard deviations within 15%."""
    draws = target.extras["constrain"](np.asarray(samples, np.float64))
    ref = target.extras["reference"]
    ref_mean, ref_sd = np.asarray(ref["mean"]), np.asarray(ref["sd"])
    flat = draws.reshape(-1, draws.shape[-1])
    ess = fm.ess(draws, method="mean")
    mcse = flat.std(0) / np.sqrt(ess)
    ref_mcse = ref_sd / np.sqrt(ref["num_draws"])  # the reference draws are near independent
    z = (flat.mean(0) - ref_mean) / np.sqrt(mcse**2 + ref_mcse**2)
    assert np.all(np.abs(z) < 4.5), dict(zip(ref["names"], z.round(2), strict=True))
    ratio = flat.std(0) / ref_sd
    assert np.all(np.abs(ratio - 1) < sd_tolerance), dict(
        zip(ref["names"], ratio.round(3), strict=True)
    )


def _run(name, sampler, num, **options):
    target = fm.targets.get(name)
    with jax.enable_x64(True):
        x0 = target.initial_positions(jax.random.key(0), 4, jnp.float64)
        result = fm.sample(jax.random.key(1), sampler, target.logdensity_fn, x0,
                           num_warmup=num, num_samples=num, **options)
    return target, result


@pytest.mark.parametrize(
    "name",
    # eight schools: also checked in CI through fm.FisherNUTSKernel (test_numpyro_kernel.py)
    ["kilpisjarvi", pytest.param("eight_schools_noncentered", marks=pytest.mark.slow)],
)
def test_fisher_nuts_matches_the_reference_draws(name):
    target, result = _run(name, "fisher_nuts", 3000)
    _assert_matches_reference(target, result.samples)


@pytest.mark.parametrize(
    "name,sampler,options",
    [
        ("arK", "fisher_mala", {}),
        ("eight_schools_noncentered", "fisher_mala", {"pooled": True}),
        ("arK", "fisher_hmc", {}),
        ("arK", "adamala", {}),
        ("arK", "mmala", {}),
    ],
    ids=["arK-fisher_mala", "eight_schools_noncentered-pooled", "arK-fisher_hmc",
         "arK-adamala", "arK-mmala"],
)
def test_other_samplers_match_the_reference_draws(name, sampler, options):
    """The CI subset; the race (benchmarks/versus_blackjax.py) checks every sampler on every
    posterior against the same reference (``reference_max_abs_z`` in each result)."""
    target, result = _run(name, sampler, 5000, **options)
    _assert_matches_reference(target, result.samples)
