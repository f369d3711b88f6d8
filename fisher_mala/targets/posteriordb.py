"""Posteriors from posteriordb that nobody on this project wrote, with reference moments.

posteriordb (github.com/stan-dev/posteriordb, BSD-3) pairs Stan models and data with
reference draws (10 chains x 1000 draws of Stan's NUTS, thinned). The data and the
per-parameter reference means and standard deviations are bundled
(``scripts/build_posteriordb.py``); the log densities below are the Stan models translated
to JAX on the unconstrained space (``log`` of the positive parameters, with the Jacobian),
up to an additive constant.

==========================================  ==  ===============================================
name                                        d   what makes it hard
==========================================  ==  ===============================================
``diamonds``                                26  linear regression, 24 strongly correlated
                                                coefficients (condition number ~1e5 after
                                                centring)
``eight_schools_noncentered``               10  hierarchical, heavy-tailed scale (Cauchy prior)
``eight_schools_centered``                  10  the same posterior, centred: a funnel between
                                                ``tau`` and the ``theta`` (posteriordb's
                                                reference is the non-centred one's)
``kilpisjarvi``                             3   uncentred years (~2000) as covariate:
                                                intercept and slope correlated at -0.99999
``arK``                                     7   AR(5) time series, correlated lags
==========================================  ==  ===============================================

Eight more are in :mod:`fisher_mala.targets.posteriordb_more`, registered here with these.
Each :class:`~fisher_mala.targets.Target` carries in ``extras``: ``reference`` (names,
means and standard deviations of the constrained parameters), ``constrain`` (flat
unconstrained draws -> constrained values in the reference's order) and ``pymc_model``
(a function building the same model in PyMC, for nutpie; needs ``pymc``).
"""

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from fisher_mala.targets import posteriordb_more as _more
from fisher_mala.targets.base import Target, register

__all__ = ["POSTERIORS", "posteriordb_target", "reference"]

_DATA = Path(__file__).resolve().parent / "data" / "posteriordb"
#: Registry name -> posteriordb posterior name.
POSTERIORS = {
    "diamonds": "diamonds-diamonds",
    "eight_schools_noncentered": "eight_schools-eight_schools_noncentered",
    "eight_schools_centered": "eight_schools-eight_schools_centered",
    "kilpisjarvi": "kilpisjarvi_mod-kilpisjarvi",
    "arK": "arK-arK",
}


# posteriordb gives the centred eight schools the non-centred model's data and reference
# posterior (its ``reference_posterior_name``): the two are one posterior of (theta, mu, tau).
_FILES = {**POSTERIORS, "eight_schools_centered": POSTERIORS["eight_schools_noncentered"]}


def reference(name: str) -> dict:
    """The bundled reference moments of posterior ``name`` (registry name)."""
    return json.loads((_DATA / f"{_FILES[name]}.json").read_text())


def _data(name: str) -> dict:
    with np.load(_DATA / f"{_FILES[name]}.npz") as f:
        return {k: f[k] for k in f.files}


def _student_t(x, nu, loc, scale):
    return -0.5 * (nu + 1.0) * jnp.log1p(((x - loc) / scale) ** 2 / nu)


def _normal(x, loc, scale):
    return jnp.sum(-0.5 * ((x - loc) / scale) ** 2 - jnp.log(scale))


def _diamonds(data):
    x = data["X"][:, 1:]
    means = x.mean(0)
    xc, y = x - means, data["Y"]
    kc = xc.shape[1]

    def logdensity(theta):
        b, intercept, log_sigma = theta[:kc], theta[kc], theta[kc + 1]
        sigma = jnp.exp(log_sigma)
        mu = intercept + jnp.asarray(xc, theta.dtype) @ b
        return (
            _normal(b, 0.0, 1.0)
            + _student_t(intercept, 3.0, 8.0, 10.0)
            + _student_t(sigma, 3.0, 0.0, 10.0)
            + _normal(jnp.asarray(y, theta.dtype), mu, sigma)
            + log_sigma
        )

    def constrain(theta):
        return np.concatenate([theta[..., : kc + 1], np.exp(theta[..., kc + 1 :])], -1)

    def pymc_model():
        import pymc as pm

        with pm.Model() as model:
            b = pm.Normal("b", 0.0, 1.0, shape=kc)
            intercept = pm.StudentT("Intercept", nu=3, mu=8, sigma=10)
            sigma = pm.HalfStudentT("sigma", nu=3, sigma=10)
            pm.Normal("Y", intercept + pm.math.dot(xc, b), sigma, observed=y)
        return model

    return kc + 2, logdensity, constrain, pymc_model, ("b", "Intercept", "sigma")


def _eight_schools(data):
    y, sd = data["y"], data["sigma"]
    j = y.shape[0]

    def logdensity(theta):
        trans, mu, log_tau = theta[:j], theta[j], theta[j + 1]
        tau = jnp.exp(log_tau)
        return (
            _normal(trans, 0.0, 1.0)
            + _normal(jnp.asarray(y, theta.dtype), mu + tau * trans, jnp.asarray(sd, theta.dtype))
            + _normal(mu, 0.0, 5.0)
            - jnp.log1p((tau / 5.0) ** 2)
            + log_tau
        )

    def constrain(theta):
        tau = np.exp(theta[..., j + 1 :])
        mu = theta[..., j : j + 1]
        return np.concatenate([theta[..., :j] * tau + mu, mu, tau], -1)

    def pymc_model():
        import pymc as pm

        with pm.Model() as model:
            trans = pm.Normal("theta_trans", 0.0, 1.0, shape=j)
            mu = pm.Normal("mu", 0.0, 5.0)
            tau = pm.HalfCauchy("tau", 5.0)
            pm.Normal("y", mu + tau * trans, sd, observed=y)
        return model

    return j + 2, logdensity, constrain, pymc_model, ("theta_trans", "mu", "tau")


def _eight_schools_centered(data):
    y, sd = data["y"], data["sigma"]
    j = y.shape[0]

    def logdensity(theta):
        school, mu, log_tau = theta[:j], theta[j], theta[j + 1]
        tau = jnp.exp(log_tau)
        return (
            _normal(school, mu, tau)
            + _normal(jnp.asarray(y, theta.dtype), school, jnp.asarray(sd, theta.dtype))
            + _normal(mu, 0.0, 5.0)
            - jnp.log1p((tau / 5.0) ** 2)
            + log_tau
        )

    def constrain(theta):
        return np.concatenate([theta[..., : j + 1], np.exp(theta[..., j + 1 :])], -1)

    def pymc_model():
        # The schools' means come first in the target's coordinates but depend on mu and
        # tau, which PyMC must declare first: one flat vector in the target's order instead
        # (so that nutpie's unconstrained draws are the same coordinates), with the priors
        # and log tau's Jacobian as a Potential.
        import pymc as pm
        import pytensor.tensor as pt

        with pm.Model() as model:
            x = pm.Flat("x", shape=j + 2)
            school, mu, log_tau = x[:j], x[j], x[j + 1]
            tau = pt.exp(log_tau)
            prior = (
                pm.logp(pm.Normal.dist(mu, tau), school).sum()
                + pm.logp(pm.Normal.dist(0.0, 5.0), mu)
                + pm.logp(pm.HalfCauchy.dist(5.0), tau)
                + log_tau
            )
            pm.Potential("prior", prior)
            pm.Normal("y", school, sd, observed=y)
        return model

    return j + 2, logdensity, constrain, pymc_model, ("x",)


def _kilpisjarvi(data):
    x, y = data["x"], data["y"]
    prior = (float(data["pmualpha"]), float(data["psalpha"]))
    prior_beta = (float(data["pmubeta"]), float(data["psbeta"]))

    def logdensity(theta):
        alpha, beta, log_sigma = theta[0], theta[1], theta[2]
        sigma = jnp.exp(log_sigma)
        mu = alpha + beta * jnp.asarray(x, theta.dtype)
        return (
            _normal(alpha, *prior)
            + _normal(beta, *prior_beta)
            + _normal(jnp.asarray(y, theta.dtype), mu, sigma)
            + log_sigma  # sigma has no prior in the Stan model: flat on (0, inf)
        )

    def constrain(theta):
        return np.concatenate([theta[..., :2], np.exp(theta[..., 2:])], -1)

    def pymc_model():
        import pymc as pm

        with pm.Model() as model:
            alpha = pm.Normal("alpha", *prior)
            beta = pm.Normal("beta", *prior_beta)
            sigma = pm.HalfFlat("sigma")
            pm.Normal("y", alpha + beta * x, sigma, observed=y)
        return model

    return 3, logdensity, constrain, pymc_model, ("alpha", "beta", "sigma")


def _ark(data):
    k, y = int(data["K"]), data["y"]
    lags = np.stack([y[k - i - 1 : len(y) - i - 1] for i in range(k)], -1)  # y[t - 1 - i]
    target = y[k:]

    def logdensity(theta):
        alpha, beta, log_sigma = theta[0], theta[1 : k + 1], theta[k + 1]
        sigma = jnp.exp(log_sigma)
        mu = alpha + jnp.asarray(lags, theta.dtype) @ beta
        return (
            _normal(alpha, 0.0, 10.0)
            + _normal(beta, 0.0, 10.0)
            - jnp.log1p((sigma / 2.5) ** 2)
            + _normal(jnp.asarray(target, theta.dtype), mu, sigma)
            + log_sigma
        )

    def constrain(theta):
        return np.concatenate([theta[..., : k + 1], np.exp(theta[..., k + 1 :])], -1)

    def pymc_model():
        import pymc as pm

        with pm.Model() as model:
            alpha = pm.Normal("alpha", 0.0, 10.0)
            beta = pm.Normal("beta", 0.0, 10.0, shape=k)
            sigma = pm.HalfCauchy("sigma", 2.5)
            pm.Normal("y", alpha + pm.math.dot(lags, beta), sigma, observed=target)
        return model

    return k + 2, logdensity, constrain, pymc_model, ("alpha", "beta", "sigma")


_BUILDERS = {
    "diamonds": _diamonds,
    "eight_schools_noncentered": _eight_schools,
    "eight_schools_centered": _eight_schools_centered,
    "kilpisjarvi": _kilpisjarvi,
    "arK": _ark,
}


def posteriordb_target(name: str) -> Target:
    """The posteriordb posterior ``name`` (a key of :data:`POSTERIORS`) as a Target."""
    dim, logdensity, constrain, pymc_model, pymc_vars = _BUILDERS[name](_data(name))
    return Target(
        name=name,
        dim=dim,
        logdensity_fn=logdensity,
        extras={
            "reference": reference(name),
            "constrain": constrain,
            "pymc_model": pymc_model,
            "pymc_vars": pymc_vars,
            "source": f"posteriordb {POSTERIORS[name]}",
        },
    )


# The eight added for the matched-length race against nutpie (their own module).
POSTERIORS.update(_more.POSTERIORS)
_FILES.update(_more.POSTERIORS)
_BUILDERS.update(_more.BUILDERS)

for _name in POSTERIORS:
    register(_name)(lambda _n=_name: posteriordb_target(_n))
