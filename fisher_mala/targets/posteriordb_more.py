"""Eight more posteriordb posteriors, for the matched-length race against nutpie.

Bundled like those of :mod:`fisher_mala.targets.posteriordb` (data and reference moments,
``scripts/build_posteriordb.py``) and registered with them. They are of the kinds on which
Fisher NUTS has been measured behind nutpie's low-rank metric per gradient: regressions
with collinear or badly scaled predictors, a Gaussian-process regression, a hidden Markov
model. None of them is one of the nine posteriors that ``benchmarks/nutpie_race.py`` keeps
aside to check the defaults on (its ``HELD_OUT``).

==================================  ==  ====================================================
name                                d   what makes it hard
==================================  ==  ====================================================
``kidiq_interaction``               5   interaction of an uncentred IQ (~100) with a 0/1
                                        covariate: coefficients correlated near -1
``earn_height``                     3   earnings in dollars on height in inches, flat priors:
                                        scales from 1 to 10^4, intercept-slope correlation
                                        -0.999
``logearn_logheight_male``          4   log earnings on log height (~4.2): the same ridge
``mesquite``                        8   seven collinear predictors of biomass, 46 plants
``nes1996``                         10  party identification on nine survey predictors
``sblri``                           6   Bayesian linear regression, correlated design
``gp_regr``                         3   Gaussian-process regression of 11 points: the
                                        length scale, amplitude and noise (a curved ridge)
``hmm_drive_0``                     6   two-state hidden Markov model of basketball drives
                                        (forward algorithm), ordered emission rates
==================================  ==  ====================================================

Flat priors of the Stan models are flat here; positive parameters are sampled on the log
scale (with the Jacobian), simplexes of two by the logit of their first entry, ordered
positive pairs by ``log a`` and ``log (b - a)``.
"""

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["POSTERIORS", "BUILDERS"]

#: Registry name -> posteriordb posterior name.
POSTERIORS = {
    "kidiq_interaction": "kidiq-kidscore_interaction",
    "earn_height": "earnings-earn_height",
    "logearn_logheight_male": "earnings-logearn_logheight_male",
    "mesquite": "mesquite-mesquite",
    "nes1996": "nes1996-nes",
    "sblri": "sblri-blr",
    "gp_regr": "gp_pois_regr-gp_regr",
    "hmm_drive_0": "bball_drive_event_0-hmm_drive_0",
}


def _normal(x, loc, scale):
    return jnp.sum(-0.5 * ((x - loc) / scale) ** 2 - jnp.log(scale))


def _regression(design: np.ndarray, y: np.ndarray, beta_scale=None, sigma_prior=None):
    """``y ~ normal(design @ beta, sigma)``: ``theta = (beta, log sigma)``.

    ``beta_scale``: ``beta ~ normal(0, beta_scale)`` (``None``: flat). ``sigma_prior``:
    ``("cauchy", s)`` or ``("normal", s)``, half of it on ``sigma > 0`` (``None``: flat).
    """
    num_beta = design.shape[1]

    def logdensity(theta):
        beta, log_sigma = theta[:num_beta], theta[num_beta]
        sigma = jnp.exp(log_sigma)
        mean = jnp.asarray(design, theta.dtype) @ beta
        out = _normal(jnp.asarray(y, theta.dtype), mean, sigma) + log_sigma
        if beta_scale is not None:
            out = out + _normal(beta, 0.0, beta_scale)
        if sigma_prior is not None:
            kind, scale = sigma_prior
            if kind == "cauchy":
                out = out - jnp.log1p((sigma / scale) ** 2)
            else:
                out = out - 0.5 * (sigma / scale) ** 2
        return out

    def constrain(theta):
        return np.concatenate([theta[..., :num_beta], np.exp(theta[..., num_beta:])], -1)

    def pymc_model():
        import pymc as pm

        with pm.Model() as model:
            if beta_scale is None:
                beta = pm.Flat("beta", shape=num_beta)
            else:
                beta = pm.Normal("beta", 0.0, beta_scale, shape=num_beta)
            if sigma_prior is None:
                sigma = pm.HalfFlat("sigma")
            elif sigma_prior[0] == "cauchy":
                sigma = pm.HalfCauchy("sigma", sigma_prior[1])
            else:
                sigma = pm.HalfNormal("sigma", sigma_prior[1])
            pm.Normal("y", pm.math.dot(design, beta), sigma, observed=y)
        return model

    return num_beta + 1, logdensity, constrain, pymc_model, ("beta", "sigma")


def _ones(n):
    return np.ones(n)


def _kidiq_interaction(data):
    hs, iq = data["mom_hs"], data["mom_iq"]
    design = np.stack([_ones(len(hs)), hs, iq, hs * iq], -1)
    return _regression(design, data["kid_score"], sigma_prior=("cauchy", 2.5))


def _earn_height(data):
    design = np.stack([_ones(len(data["earn"])), data["height"]], -1)
    return _regression(design, data["earn"])


def _logearn_logheight_male(data):
    design = np.stack([_ones(len(data["earn"])), np.log(data["height"]), data["male"]], -1)
    return _regression(design, np.log(data["earn"]))


def _mesquite(data):
    names = ("diam1", "diam2", "canopy_height", "total_height", "density", "group")
    design = np.stack([_ones(len(data["weight"]))] + [data[n] for n in names], -1)
    return _regression(design, data["weight"])


def _nes(data):
    age = data["age_discrete"]
    columns = [data["real_ideo"], data["race_adj"], age == 2, age == 3, age == 4,
               data["educ1"], data["gender"], data["income"]]  # fmt: skip
    design = np.stack([_ones(len(age))] + [np.asarray(c, np.float64) for c in columns], -1)
    return _regression(design, data["partyid7"])


def _sblri(data):
    return _regression(data["X"], data["y"], beta_scale=10.0, sigma_prior=("normal", 10.0))


def _gp_regr(data):
    x, y = data["x"], data["y"]
    sq_dist = (x[:, None] - x[None, :]) ** 2

    def covariance(rho, alpha, sigma, dist, xp):
        # Stan's gp_exp_quad_cov plus sigma (not sigma^2) on the diagonal, as the model has
        return alpha**2 * xp.exp(-dist / (2.0 * rho**2)) + sigma * xp.eye(len(x))

    def logdensity(theta):
        rho, alpha, sigma = jnp.exp(theta[0]), jnp.exp(theta[1]), jnp.exp(theta[2])
        cov = covariance(rho, alpha, sigma, jnp.asarray(sq_dist, theta.dtype), jnp)
        chol = jnp.linalg.cholesky(cov)
        z = jax.scipy.linalg.solve_triangular(chol, jnp.asarray(y, theta.dtype), lower=True)
        likelihood = -0.5 * jnp.sum(z**2) - jnp.sum(jnp.log(jnp.diagonal(chol)))
        prior = 24.0 * jnp.log(rho) - 4.0 * rho - 0.5 * (alpha / 2.0) ** 2 - 0.5 * sigma**2
        return likelihood + prior + jnp.sum(theta)  # gamma(25, 4), half-normals; Jacobian

    def constrain(theta):
        return np.exp(theta)

    def pymc_model():
        import pymc as pm

        with pm.Model() as model:
            rho = pm.Gamma("rho", 25.0, 4.0)
            alpha = pm.HalfNormal("alpha", 2.0)
            sigma = pm.HalfNormal("sigma", 1.0)
            cov = covariance(rho, alpha, sigma, sq_dist, pm.math)
            pm.MvNormal("y", np.zeros(len(x)), cov=cov, observed=y)
        return model

    return 3, logdensity, constrain, pymc_model, ("rho", "alpha", "sigma")


def _ordered_positive(a, b, xp):
    """``(exp a, exp a + exp b)`` and the log-Jacobian ``a + b``."""
    first = xp.exp(a)
    return first, first + xp.exp(b), a + b


def _hmm_drive_0(data):
    u, v, alpha = data["u"], data["v"], data["alpha"]

    def logdensity(theta):
        dtype = theta.dtype
        p1, p2 = jax.nn.sigmoid(theta[0]), jax.nn.sigmoid(theta[1])  # theta1[1], theta2[1]
        log_sticks = jnp.stack([jax.nn.log_sigmoid(theta[:2]), jax.nn.log_sigmoid(-theta[:2])])
        jacobian = jnp.sum(log_sticks)  # d p / d z = p (1 - p)
        transition = jnp.stack([jnp.stack([p1, 1 - p1]), jnp.stack([p2, 1 - p2])])
        log_transition = jnp.log(transition)
        phi1, phi2, jac_phi = _ordered_positive(theta[2], theta[3], jnp)
        lam1, lam2, jac_lam = _ordered_positive(theta[4], theta[5], jnp)
        phi, lam = jnp.stack([phi1, phi2]), jnp.stack([lam1, lam2])
        prior = (
            jnp.sum((jnp.asarray(alpha, dtype) - 1.0) * log_transition)  # Dirichlet rows
            + _normal(phi1, 0.0, 1.0) + _normal(phi2, 3.0, 1.0)
            + _normal(lam1, 0.0, 1.0) + _normal(lam2, 3.0, 1.0)
        )  # fmt: skip
        uu, vv = jnp.asarray(u, dtype), jnp.asarray(v, dtype)
        emission = (jnp.log(phi) - phi * uu[:, None]) + (jnp.log(lam) - lam * vv[:, None])

        def forward(gamma, emit):  # gamma[t, k] = logsumexp_j gamma[t-1, j] + log T[j, k]
            gamma = jax.nn.logsumexp(gamma[:, None] + log_transition, axis=0) + emit
            return gamma, None

        gamma, _ = jax.lax.scan(forward, emission[0], emission[1:])
        return jax.nn.logsumexp(gamma) + prior + jacobian + jac_phi + jac_lam

    def constrain(theta):
        p = 1.0 / (1.0 + np.exp(-theta[..., :2]))
        phi1 = np.exp(theta[..., 2])
        lam1 = np.exp(theta[..., 4])
        return np.stack([p[..., 0], 1 - p[..., 0], p[..., 1], 1 - p[..., 1],
                         phi1, phi1 + np.exp(theta[..., 3]),
                         lam1, lam1 + np.exp(theta[..., 5])], -1)  # fmt: skip

    def pymc_model():  # the same coordinates: flat theta and this density as a potential
        import pymc as pm
        import pytensor
        import pytensor.tensor as pt

        with pm.Model() as model:
            theta = pm.Flat("theta", shape=6)
            p = pm.math.sigmoid(theta[:2])
            jacobian = pt.sum(pt.log(p) + pt.log1p(-p))
            log_t = pt.log(pt.stack([pt.stack([p[0], 1 - p[0]]), pt.stack([p[1], 1 - p[1]])]))
            phi1, phi2, jac_phi = _ordered_positive(theta[2], theta[3], pt)
            lam1, lam2, jac_lam = _ordered_positive(theta[4], theta[5], pt)
            phi, lam = pt.stack([phi1, phi2]), pt.stack([lam1, lam2])
            prior = pt.sum((alpha - 1.0) * log_t) - 0.5 * (
                phi1**2 + (phi2 - 3.0) ** 2 + lam1**2 + (lam2 - 3.0) ** 2
            )
            emission = (pt.log(phi) - phi * u[:, None]) + (pt.log(lam) - lam * v[:, None])
            gammas, _ = pytensor.scan(
                lambda emit, gamma, log_t: pt.logsumexp(gamma[:, None] + log_t, axis=0) + emit,
                sequences=emission[1:],
                outputs_info=emission[0],
                non_sequences=log_t,
            )
            pm.Potential("logdensity", pt.logsumexp(gammas[-1]) + prior + jacobian
                         + jac_phi + jac_lam)  # fmt: skip
        return model

    return 6, logdensity, constrain, pymc_model, ("theta",)


#: Registry name -> ``data -> (dim, logdensity, constrain, pymc_model, pymc_vars)``.
BUILDERS = {
    "kidiq_interaction": _kidiq_interaction,
    "earn_height": _earn_height,
    "logearn_logheight_male": _logearn_logheight_male,
    "mesquite": _mesquite,
    "nes1996": _nes,
    "sblri": _sblri,
    "gp_regr": _gp_regr,
    "hmm_drive_0": _hmm_drive_0,
}
