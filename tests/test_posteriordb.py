"""The posteriordb targets: log densities against scipy, and Fisher NUTS against the
posteriors' reference draws (MCSE z-scores)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from scipy.special import logsumexp

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
    if name in _MORE:
        return _MORE[name](data, theta)
    y, k = data["y"], int(data["K"])
    alpha, beta, sigma = theta[0], theta[1:6], np.exp(theta[6])
    mu = [alpha + sum(beta[i] * y[t - i - 1] for i in range(k)) for t in range(k, len(y))]
    return (stats.norm.logpdf(alpha, 0, 10) + stats.norm.logpdf(beta, 0, 10).sum()
            + stats.cauchy.logpdf(sigma, 0, 2.5) + stats.norm.logpdf(y[k:], mu, sigma).sum()
            + theta[6])


def _scipy_regression(y, columns, theta, beta_prior=None, sigma_prior=None):
    """``y ~ normal(X beta, sigma)`` with ``theta = (beta, log sigma)``, flat priors unless
    given (scipy distributions on beta and on sigma, halved)."""
    design = np.stack(columns, -1).astype(np.float64)
    beta, sigma = theta[:-1], np.exp(theta[-1])
    out = stats.norm.logpdf(y, design @ beta, sigma).sum() + theta[-1]
    if beta_prior is not None:
        out += beta_prior.logpdf(beta).sum()
    if sigma_prior is not None:
        out += sigma_prior.logpdf(sigma)
    return out


def _scipy_hmm(data, theta):
    p = 1 / (1 + np.exp(-theta[:2]))
    transition = np.array([[p[0], 1 - p[0]], [p[1], 1 - p[1]]])
    phi = np.array([np.exp(theta[2]), np.exp(theta[2]) + np.exp(theta[3])])
    lam = np.array([np.exp(theta[4]), np.exp(theta[4]) + np.exp(theta[5])])
    prior = sum(stats.dirichlet.logpdf(transition[k], data["alpha"][k]) for k in range(2))
    prior += stats.norm.logpdf(phi, [0, 3], 1).sum() + stats.norm.logpdf(lam, [0, 3], 1).sum()
    emit = (stats.expon.logpdf(data["u"][:, None], scale=1 / phi)
            + stats.expon.logpdf(data["v"][:, None], scale=1 / lam))
    gamma = emit[0]
    for t in range(1, len(emit)):
        gamma = np.array([logsumexp(gamma + np.log(transition[:, k])) + emit[t, k]
                          for k in range(2)])
    jacobian = np.sum(np.log(p) + np.log1p(-p)) + theta[2:].sum()
    return logsumexp(gamma) + prior + jacobian


def _scipy_gp(data, theta):
    rho, alpha, sigma = np.exp(theta)
    x = data["x"]
    cov = alpha**2 * np.exp(-((x[:, None] - x[None]) ** 2) / (2 * rho**2)) + sigma * np.eye(len(x))
    return (stats.multivariate_normal.logpdf(data["y"], np.zeros(len(x)), cov)
            + stats.gamma.logpdf(rho, 25, scale=1 / 4) + stats.halfnorm.logpdf(alpha, 0, 2)
            + stats.halfnorm.logpdf(sigma, 0, 1) + theta.sum())


def _ones(d):
    return np.ones(len(d["y"] if "y" in d else d["earn"]))


_MORE = {  # the Stan models of fisher_mala.targets.posteriordb_more, with scipy
    "kidiq_interaction": lambda d, t: _scipy_regression(
        d["kid_score"], [np.ones(len(d["mom_hs"])), d["mom_hs"], d["mom_iq"],
                         d["mom_hs"] * d["mom_iq"]], t, sigma_prior=stats.halfcauchy(0, 2.5)),
    "earn_height": lambda d, t: _scipy_regression(d["earn"], [_ones(d), d["height"]], t),
    "logearn_logheight_male": lambda d, t: _scipy_regression(
        np.log(d["earn"]), [_ones(d), np.log(d["height"]), d["male"]], t),
    "mesquite": lambda d, t: _scipy_regression(
        d["weight"], [np.ones(len(d["weight"])), d["diam1"], d["diam2"], d["canopy_height"],
                      d["total_height"], d["density"], d["group"]], t),
    "nes1996": lambda d, t: _scipy_regression(
        d["partyid7"], [np.ones(len(d["partyid7"])), d["real_ideo"], d["race_adj"],
                        d["age_discrete"] == 2, d["age_discrete"] == 3, d["age_discrete"] == 4,
                        d["educ1"], d["gender"], d["income"]], t),
    "sblri": lambda d, t: _scipy_regression(
        d["y"], list(d["X"].T), t, beta_prior=stats.norm(0, 10),
        sigma_prior=stats.halfnorm(0, 10)),
    "gp_regr": _scipy_gp,
    "hmm_drive_0": _scipy_hmm,
}


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


def pymc_logdensity(model, points):
    """The PyMC model's log density at unconstrained ``points`` ``(n, d)``, read as its
    value variables in declaration order, flattened (the order of nutpie's unconstrained
    draws, which the race reads as the target's coordinates)."""
    start = model.initial_point()
    names = [v.name for v in model.value_vars]
    sizes = [int(np.size(start[n])) for n in names]
    assert sum(sizes) == points.shape[-1], dict(zip(names, sizes, strict=True))
    logp = model.compile_logp(jacobian=True)
    out = []
    for p in points:
        parts = np.split(p, np.cumsum(sizes)[:-1])
        out.append(float(logp({n: v.reshape(np.shape(start[n]))
                               for n, v in zip(names, parts, strict=True)})))  # fmt: skip
    return np.asarray(out)


@pytest.mark.parametrize("name", list(posteriordb.POSTERIORS))
def test_the_pymc_twin_has_the_same_density_in_the_same_coordinates(x64, name):
    pytest.importorskip("pymc")
    target = fm.targets.get(name)
    rng = np.random.default_rng(1)
    points = rng.normal(size=(3, target.dim)) * 0.3
    ours = [float(target.logdensity_fn(jnp.asarray(p))) for p in points]
    theirs = pymc_logdensity(target.extras["pymc_model"](), points)
    np.testing.assert_allclose(np.diff(ours), np.diff(theirs), rtol=1e-9, atol=1e-8)


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
