"""Fisher NUTS against nutpie's low-rank metric on held-out posteriordb posteriors.

    python -m benchmarks.held_out                          # every cell, cached
    python -m benchmarks.held_out --targets nes1972-nes    # some of them
    python -m benchmarks.held_out --render                 # the table only
    python -m benchmarks.held_out --later                  # the posteriors added later

The protocol of ``benchmarks.nutpie_race`` (its lengths, starts, float64, reference
check) on posteriors of ``nutpie_race.HELD_OUT``: kept aside from the start, bundled
nowhere and tuned on by nobody, to check Fisher NUTS's defaults on afterwards. They are
read from a posteriordb mirror at run time (data and reference draws) and registered
under their posteriordb names (:func:`register_held_out`); nothing of them ships with the
library. Get the mirror with the session tool ``fetch github:stan-dev/posteriordb``
(``/work/.mirror/stan-dev+posteriordb/repo``, the default of ``--posteriordb``) or
``git clone --bare https://github.com/stan-dev/posteriordb``.

Built: the regressions ``mesquite-logmesquite_logvash``, ``earnings-logearn_interaction``,
``nes1972-nes`` (the model of the bundled ``nes1996``, other data), ``sblrc-blr`` (the
model of the bundled ``sblri``, other data) and the time series ``arma-arma11`` and
``garch-garch11``. Each is the Stan model on Stan's unconstrained space (``log`` of a
positive parameter, ``logit`` of one in an interval, Jacobians included; flat where Stan
has no prior), with ``constrain`` (the reference's parameter order) and a PyMC twin
declaring the parameters in the same order, so that nutpie's unconstrained draws are the
same coordinates.

Cells cached in ``benchmarks/results/nutpie_race_held_out/<posterior>/<sampler>.json``;
the table in ``benchmarks/results/nutpie_race_held_out.md``.
"""

import argparse
import io
import json
import subprocess
import zipfile
from pathlib import Path

import numpy as np

from benchmarks import nutpie_race

__all__ = ["BUILT", "POSTERIORDB_MIRROR", "RESULTS", "main", "register_held_out", "render"]

RESULTS = nutpie_race.RESULTS.parent / "nutpie_race_held_out"
#: The race's cells of its second seed (``nutpie_race --seed 1 --root ...``).
SEED1_RESULTS = nutpie_race.RESULTS.parent / "nutpie_race_seed1"
POSTERIORDB_MIRROR = Path("/work/.mirror/stan-dev+posteriordb/repo")
#: The posteriors of ``nutpie_race.HELD_OUT`` built here, in the table's order.
BUILT = ("mesquite-logmesquite_logvash", "earnings-logearn_interaction", "nes1972-nes",
         "sblrc-blr", "arma-arma11", "garch-garch11", "gp_pois_regr-gp_pois_regr",
         "low_dim_gauss_mix-low_dim_gauss_mix", "hmm_example-hmm_example")  # fmt: skip

#: posteriordb posteriors with reference draws added after the defaults were set and never
#: bundled or tuned on (``--later``): a latent-GP model with a heteroscedastic noise GP, the
#: bundled ``hmm_drive_0``'s HMM with normal emissions, and regressions on other data or
#: predictors of the race's kinds. ``mcycle_gp-accel_gp``, run first, showed the divergences
#: that :data:`fisher_mala.whitened_warmup_looks.RETUNE_DIVERGENT_SHARE` now answers; the
#: others were run once, after that change.
LATER = ("mcycle_gp-accel_gp", "bball_drive_event_1-hmm_drive_1", "nes2000-nes",
         "kidiq-kidscore_momhsiq", "earnings-logearn_interaction_z",
         "mesquite-logmesquite_logvolume")  # fmt: skip
LATER_RESULTS = nutpie_race.RESULTS.parent / "nutpie_race_later"


def _git_json(repo: Path, path: str):
    """The JSON at ``path`` of the mirror's HEAD (unzipped if it is a ``.zip``)."""
    cmd = ["git", "--git-dir", str(repo), "show", f"HEAD:posterior_database/{path}"]
    blob = subprocess.run(cmd, check=True, capture_output=True).stdout
    if path.endswith(".zip"):
        archive = zipfile.ZipFile(io.BytesIO(blob))
        blob = archive.read(archive.namelist()[0])
    return json.loads(blob)


def _reference(repo: Path, posterior: str) -> dict:
    """Per-parameter mean and sd of the reference draws, as ``posteriordb.reference``; from
    posteriordb's summary statistics (mean and mean square, the draws' count from their
    info) where the mirror lists the draws without holding them."""
    try:
        chains = _git_json(repo, f"reference_posteriors/draws/draws/{posterior}.json.zip")
    except subprocess.CalledProcessError:
        return _reference_from_summaries(repo, posterior)
    names = list(chains[0])
    flat = np.asarray([[c[n] for c in chains] for n in names]).reshape(len(names), -1)
    commit = subprocess.run(["git", "--git-dir", str(repo), "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    return {"posterior": posterior, "posteriordb_commit": commit, "names": names,
            "mean": flat.mean(1).tolist(), "sd": flat.std(1, ddof=1).tolist(),
            "num_draws": int(flat.shape[1])}  # fmt: skip


def _reference_from_summaries(repo: Path, posterior: str) -> dict:
    """:func:`_reference` from posteriordb's ``mean_value`` and ``mean_squared_value``."""
    stats = "reference_posteriors/summary_statistics"
    mean = _git_json(repo, f"{stats}/mean_value/mean_value/{posterior}.json")
    square = _git_json(repo, f"{stats}/mean_squared_value/mean_squared_value/{posterior}.json")
    info = _git_json(repo, f"reference_posteriors/draws/info/{posterior}.info.json")
    values = np.asarray(mean["mean_value"], np.float64)
    num = int(info["diagnostics"]["ndraws"])
    var = (np.asarray(square["mean_squared_value"], np.float64) - values**2) * num / (num - 1)
    commit = subprocess.run(["git", "--git-dir", str(repo), "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    return {"posterior": posterior, "posteriordb_commit": commit, "names": mean["names"],
            "mean": values.tolist(), "sd": np.sqrt(np.maximum(var, 0.0)).tolist(),
            "num_draws": num, "from": "summary statistics"}  # fmt: skip


def _logmesquite_logvash(data):
    from fisher_mala.targets.posteriordb_more import _regression

    d1, d2, height = data["diam1"], data["diam2"], data["canopy_height"]
    columns = [np.ones(len(d1)), np.log(d1 * d2 * height), np.log(d1 * d2), np.log(d1 / d2),
               np.log(data["total_height"]), data["group"]]  # fmt: skip
    return _regression(np.stack(columns, -1), np.log(data["weight"]))


def _logearn_interaction(data):
    from fisher_mala.targets.posteriordb_more import _regression

    height, male = data["height"], data["male"]
    design = np.stack([np.ones(len(height)), height, male, height * male], -1)
    return _regression(design, np.log(data["earn"]))


def _nes(data):
    from fisher_mala.targets.posteriordb_more import _nes as nes1996

    return nes1996(data)  # the model of the bundled nes1996


def _blr(data):
    from fisher_mala.targets.posteriordb_more import _sblri

    return _sblri(data)  # the model of the bundled sblri: normal(0, 10) on beta and sigma


def _arma11(data):
    """``err[t] = y[t] - mu - phi y[t-1] - theta err[t-1]`` (``y[0] = mu``, ``err[0] = 0``)
    ``~ normal(0, sigma)``; priors normal(0, 10), normal(0, 2) twice, half-cauchy(0, 2.5).
    ``theta = (mu, phi, theta, log sigma)``."""
    import jax
    import jax.numpy as jnp

    y = data["y"]

    def logdensity(x):
        mu, phi, theta, log_sigma = x[0], x[1], x[2], x[3]
        yy = jnp.asarray(y, x.dtype)

        def step(err, pair):
            err = pair[0] - mu - phi * pair[1] - theta * err
            return err, err

        first = yy[0] - mu - phi * mu
        _, rest = jax.lax.scan(step, first, (yy[1:], yy[:-1]))
        err = jnp.concatenate([first[None], rest])
        sigma = jnp.exp(log_sigma)
        prior = -0.5 * ((mu / 10.0) ** 2 + (phi / 2.0) ** 2 + (theta / 2.0) ** 2)
        prior = prior - jnp.log1p((sigma / 2.5) ** 2)
        return jnp.sum(-0.5 * (err / sigma) ** 2) - len(y) * log_sigma + prior + log_sigma

    def constrain(x):
        return np.concatenate([x[..., :3], np.exp(x[..., 3:])], -1)

    def pymc_model():
        import pymc as pm
        import pytensor
        import pytensor.tensor as pt

        with pm.Model() as model:
            mu = pm.Normal("mu", 0.0, 10.0)
            phi = pm.Normal("phi", 0.0, 2.0)
            theta = pm.Normal("theta", 0.0, 2.0)
            sigma = pm.HalfCauchy("sigma", 2.5)
            first = y[0] - mu - phi * mu
            rest, _ = pytensor.scan(
                lambda y_t, y_prev, err, mu, phi, theta: y_t - mu - phi * y_prev - theta * err,
                sequences=[pt.as_tensor(y[1:]), pt.as_tensor(y[:-1])],
                outputs_info=first,
                non_sequences=[mu, phi, theta],
            )
            err = pm.math.concatenate([first[None], rest])
            pm.Potential("err", pm.logp(pm.Normal.dist(0.0, sigma), err).sum())
        return model

    return 4, logdensity, constrain, pymc_model, ("mu", "phi", "theta", "sigma")


def _garch11(data):
    """``y[t] ~ normal(mu, sigma[t])``, ``sigma[t]^2 = alpha0 + alpha1 (y[t-1] - mu)^2 +
    beta1 sigma[t-1]^2``, ``sigma[1] = sigma1``; flat priors, ``alpha0 > 0``,
    ``0 < alpha1 < 1``, ``0 < beta1 < 1 - alpha1``. ``theta = (mu, log alpha0,
    logit alpha1, logit (beta1 / (1 - alpha1)))``."""
    import jax
    import jax.numpy as jnp

    y, sigma1 = data["y"], float(data["sigma1"])

    def logdensity(x):
        mu, log_alpha0 = x[0], x[1]
        alpha0, alpha1 = jnp.exp(log_alpha0), jax.nn.sigmoid(x[2])
        beta1 = (1.0 - alpha1) * jax.nn.sigmoid(x[3])
        yy = jnp.asarray(y, x.dtype)

        def step(var, y_prev):
            var = alpha0 + alpha1 * (y_prev - mu) ** 2 + beta1 * var
            return var, var

        _, rest = jax.lax.scan(step, jnp.asarray(sigma1**2, x.dtype), yy[:-1])
        var = jnp.concatenate([jnp.full((1,), sigma1**2, x.dtype), rest])
        likelihood = jnp.sum(-0.5 * (yy - mu) ** 2 / var - 0.5 * jnp.log(var))
        # log |d(alpha0, alpha1, beta1) / d x[1:]|: alpha0, a (1 - a), (1 - a) s (1 - s)
        log_sticks = jax.nn.log_sigmoid(x[2:]) + jax.nn.log_sigmoid(-x[2:])
        return likelihood + log_alpha0 + jnp.sum(log_sticks) + jax.nn.log_sigmoid(-x[2])

    def constrain(x):
        alpha1, stick = 1.0 / (1.0 + np.exp(-x[..., 2:3])), 1.0 / (1.0 + np.exp(-x[..., 3:4]))
        return np.concatenate([x[..., :1], np.exp(x[..., 1:2]), alpha1,
                               (1.0 - alpha1) * stick], -1)  # fmt: skip

    def pymc_model():
        import pymc as pm
        import pytensor
        import pytensor.tensor as pt

        with pm.Model() as model:
            mu = pm.Flat("mu")
            alpha0 = pm.HalfFlat("alpha0")
            alpha1 = pm.Uniform("alpha1", 0.0, 1.0)
            beta1 = pm.Uniform("beta1", 0.0, 1.0 - alpha1)  # the same logit coordinate
            pm.Potential("flat_beta1", pt.log1p(-alpha1))  # Stan: density 1, not 1 / (1 - a1)
            rest, _ = pytensor.scan(
                lambda y_prev, var, mu, alpha0, alpha1, beta1: (
                    alpha0 + alpha1 * (y_prev - mu) ** 2 + beta1 * var
                ),
                sequences=[pt.as_tensor(y[:-1])], outputs_info=pt.as_tensor(np.float64(sigma1**2)),
                non_sequences=[mu, alpha0, alpha1, beta1],
            )  # fmt: skip
            var = pt.concatenate([pt.as_tensor(np.full(1, sigma1**2)), rest])
            pm.Normal("y", mu, pt.sqrt(var), observed=y)
        return model

    return 4, logdensity, constrain, pymc_model, ("mu", "alpha0", "alpha1", "beta1")


def _flat_twin(dim, logdensity_pt):
    """A PyMC model whose one free variable is the unconstrained vector itself (``Flat``:
    no transform), with the log density (Jacobians included) as a ``Potential``: nutpie's
    unconstrained draws are then exactly the JAX target's coordinates."""

    def pymc_model():
        import pymc as pm

        with pm.Model() as model:
            x = pm.Flat("x", shape=dim)
            pm.Potential("logdensity", logdensity_pt(x))
        return model

    return pymc_model


def _gp_pois_regr(data):
    """``k ~ poisson_log(f)``, ``f = L f_tilde``, ``L L^T = alpha^2 exp(-(x_i - x_j)^2 / (2
    rho^2)) + 1e-10 I``; ``rho ~ gamma(25, 4)``, ``alpha ~ half-normal(0, 2)``,
    ``f_tilde ~ normal(0, 1)``. ``theta = (log rho, log alpha, f_tilde)``; the reference
    holds ``(rho, alpha, f)``."""
    import jax.numpy as jnp

    x, k = data["x"], data["k"]
    sq = (x[:, None] - x[None, :]) ** 2
    jitter = 1e-10 * np.eye(len(x))

    def logdensity(theta):
        log_rho, log_alpha, f_tilde = theta[0], theta[1], theta[2:]
        rho, alpha = jnp.exp(log_rho), jnp.exp(log_alpha)
        cov = alpha**2 * jnp.exp(-0.5 * jnp.asarray(sq, theta.dtype) / rho**2)
        f = jnp.linalg.cholesky(cov + jnp.asarray(jitter, theta.dtype)) @ f_tilde
        prior = 25.0 * log_rho - 4.0 * rho - 0.125 * alpha**2 + log_alpha  # Jacobians in
        return (
            prior
            - 0.5 * jnp.sum(f_tilde**2)
            + jnp.sum(jnp.asarray(k, theta.dtype) * f - jnp.exp(f))
        )

    def constrain(theta):
        rho, alpha = np.exp(theta[..., :1]), np.exp(theta[..., 1:2])
        cov = alpha[..., None] ** 2 * np.exp(-0.5 * sq / rho[..., None] ** 2) + jitter
        f = np.einsum("...ij,...j->...i", np.linalg.cholesky(cov), theta[..., 2:])
        return np.concatenate([rho, alpha, f], -1)

    def logdensity_pt(theta):
        import pytensor.tensor as pt

        log_rho, log_alpha, f_tilde = theta[0], theta[1], theta[2:]
        rho, alpha = pt.exp(log_rho), pt.exp(log_alpha)
        cov = alpha**2 * pt.exp(-0.5 * pt.as_tensor(sq) / rho**2) + pt.as_tensor(jitter)
        f = pt.dot(pt.linalg.cholesky(cov), f_tilde)
        prior = 25.0 * log_rho - 4.0 * rho - 0.125 * alpha**2 + log_alpha
        return prior - 0.5 * pt.sum(f_tilde**2) + pt.sum(pt.as_tensor(k) * f - pt.exp(f))

    dim = 2 + len(x)
    return dim, logdensity, constrain, _flat_twin(dim, logdensity_pt), ("x",)


def _normal_logpdf(y, mu, log_sigma, xp):
    return -0.5 * ((y - mu) / xp.exp(log_sigma)) ** 2 - log_sigma - 0.5 * np.log(2 * np.pi)


def _low_dim_gauss_mix(data):
    """``y[n] ~ theta normal(mu[1], sigma[1]) + (1 - theta) normal(mu[2], sigma[2])``,
    ``mu`` ordered; ``sigma ~ half-normal(0, 2)``, ``mu ~ normal(0, 2)``,
    ``theta ~ beta(5, 5)``. ``x = (mu[1], log(mu[2] - mu[1]), log sigma, logit theta)``
    (Stan's ordered, lower-bound and interval transforms)."""
    import jax
    import jax.numpy as jnp

    y = data["y"]

    def density(x, y, xp, logsumexp, log_sigmoid):
        mu = [x[0], x[0] + xp.exp(x[1])]
        log_sigma, logit_theta = [x[2], x[3]], x[4]
        log_theta, log_rest = log_sigmoid(logit_theta), log_sigmoid(-logit_theta)
        parts = [log_theta + _normal_logpdf(y, mu[0], log_sigma[0], xp),
                 log_rest + _normal_logpdf(y, mu[1], log_sigma[1], xp)]  # fmt: skip
        likelihood = xp.sum(logsumexp(parts))
        prior = -0.125 * (mu[0] ** 2 + mu[1] ** 2) - 0.125 * sum(xp.exp(2 * s) for s in log_sigma)
        prior = prior + 5.0 * (log_theta + log_rest)  # beta(5, 5) and the logit's Jacobian
        return likelihood + prior + x[1] + x[2] + x[3]  # the ordered's and the logs' Jacobians

    def logdensity(x):
        def lse(parts):
            return jax.nn.logsumexp(jnp.stack(parts), axis=0)

        return density(x, jnp.asarray(y, x.dtype), jnp, lse, jax.nn.log_sigmoid)

    def logdensity_pt(x):
        import pytensor.tensor as pt

        def lse(parts):
            return pt.logsumexp(pt.stack(parts), axis=0)

        return density(x, pt.as_tensor(y), pt, lse, lambda v: -pt.softplus(-v))

    def constrain(x):
        theta = 1.0 / (1.0 + np.exp(-x[..., 4:5]))
        return np.concatenate([x[..., :1], x[..., :1] + np.exp(x[..., 1:2]),
                               np.exp(x[..., 2:4]), theta], -1)  # fmt: skip

    return 5, logdensity, constrain, _flat_twin(5, logdensity_pt), ("x",)


def _log_rows(x, log_sigmoid):
    """The log transition matrix of a two-state HMM from ``x[0]``, ``x[1]``: the logits of
    each row's first entry (Stan's simplex transform for K = 2)."""
    return [[log_sigmoid(x[0]), log_sigmoid(-x[0])], [log_sigmoid(x[1]), log_sigmoid(-x[1])]]


def _forward_jax(log_rows, emissions):
    """The forward algorithm's log marginal likelihood (JAX): ``log_rows[j][k]`` from state
    ``j`` to ``k``, ``emissions[k]`` the ``(N,)`` log densities of the data in state ``k``."""
    import jax
    import jax.numpy as jnp

    trans = jnp.stack([jnp.stack(r) for r in log_rows])  # [j, k]: from j to k
    emit = jnp.stack(emissions, axis=1)  # (N, K)

    def step(gamma, e):
        return jax.nn.logsumexp(gamma[:, None] + trans, axis=0) + e, None

    gamma, _ = jax.lax.scan(step, emit[0], emit[1:])
    return jax.nn.logsumexp(gamma)


def _forward_pt(log_rows, emissions):
    """:func:`_forward_jax` in PyTensor, for the PyMC twins."""
    import pytensor
    import pytensor.tensor as pt

    trans = pt.stack([pt.stack(r) for r in log_rows])
    emit = pt.stack(emissions, axis=1)
    gamma, _ = pytensor.scan(
        lambda e, gamma, trans: pt.logsumexp(gamma[:, None] + trans, axis=0) + e,
        sequences=[emit[1:]], outputs_info=emit[0], non_sequences=[trans],
    )  # fmt: skip
    return pt.logsumexp(gamma[-1])


def _hmm_example(data):
    """A two-state Gaussian HMM (unit-variance emissions with means ``mu``, positive and
    ordered; ``mu[1] ~ normal(3, 1)``, ``mu[2] ~ normal(10, 1)``), rows of the transition
    matrix ``theta1``, ``theta2`` uniform on the simplex; the forward algorithm.
    ``x = (logit theta1[1], logit theta2[1], log mu[1], log(mu[2] - mu[1]))`` (Stan's
    simplex transform for K = 2 and its positive_ordered)."""
    import jax
    import jax.numpy as jnp

    y = data["y"]

    def parts(x, y, xp, log_sigmoid):
        log_rows = _log_rows(x, log_sigmoid)
        mu = [xp.exp(x[2]), xp.exp(x[2]) + xp.exp(x[3])]
        emissions = [_normal_logpdf(y, m, 0.0, xp) for m in mu]  # (N,) each
        prior = -0.5 * ((mu[0] - 3.0) ** 2 + (mu[1] - 10.0) ** 2)
        jacobian = sum(log_rows[j][0] + log_rows[j][1] for j in range(2)) + x[2] + x[3]
        return log_rows, emissions, prior + jacobian

    def logdensity(x):
        log_rows, emissions, rest = parts(x, jnp.asarray(y, x.dtype), jnp, jax.nn.log_sigmoid)
        return _forward_jax(log_rows, emissions) + rest

    def logdensity_pt(x):
        import pytensor.tensor as pt

        log_rows, emissions, rest = parts(x, pt.as_tensor(y), pt, lambda v: -pt.softplus(-v))
        return _forward_pt(log_rows, emissions) + rest

    def constrain(x):
        first = 1.0 / (1.0 + np.exp(-x[..., :2]))
        mu1 = np.exp(x[..., 2:3])
        return np.concatenate([first[..., :1], 1 - first[..., :1], first[..., 1:],
                               1 - first[..., 1:], mu1, mu1 + np.exp(x[..., 3:4])], -1)  # fmt: skip

    return 4, logdensity, constrain, _flat_twin(4, logdensity_pt), ("x",)


def _kidscore_momhsiq(data):
    """``kid_score ~ normal(beta . (1, mom_hs, mom_iq), sigma)``, ``sigma ~ half-cauchy(0,
    2.5)``, ``beta`` flat."""
    from fisher_mala.targets.posteriordb_more import _regression

    design = np.stack([np.ones(len(data["mom_hs"])), data["mom_hs"], data["mom_iq"]], -1)
    return _regression(design, data["kid_score"], sigma_prior=("cauchy", 2.5))


def _logearn_interaction_z(data):
    """``log earn ~ normal(beta . (1, z, male, z male), sigma)``, ``z`` the standardized
    height (Stan's ``sd``: ``ddof=1``); flat priors."""
    from fisher_mala.targets.posteriordb_more import _regression

    height, male = data["height"], data["male"]
    z = (height - height.mean()) / height.std(ddof=1)
    design = np.stack([np.ones(len(z)), z, male, z * male], -1)
    return _regression(design, np.log(data["earn"]))


def _logmesquite_logvolume(data):
    """``log weight ~ normal(beta . (1, log(diam1 diam2 canopy_height)), sigma)``; flat."""
    from fisher_mala.targets.posteriordb_more import _regression

    volume = np.log(data["diam1"] * data["diam2"] * data["canopy_height"])
    design = np.stack([np.ones(len(volume)), volume], -1)
    return _regression(design, np.log(data["weight"]))


def _hmm_drive_1(data):
    """The bundled ``hmm_drive_0``'s two-state HMM with normal emissions (sd ``tau`` for
    ``u``, ``rho`` for ``v``) and ordered (not positive) means: ``phi ~ normal((0, 3),
    1)``, ``lambda ~ normal((0, 3), 1)``, rows of the transition matrix
    ``dirichlet(alpha[k])``; the forward algorithm. ``x = (logit theta1[1], logit
    theta2[1], phi[1], log(phi[2] - phi[1]), lambda[1], log(lambda[2] - lambda[1]))``."""
    import jax
    import jax.numpy as jnp

    u, v, alpha = data["u"], data["v"], data["alpha"]
    tau, rho = float(data["tau"]), float(data["rho"])

    def parts(x, u, v, xp, log_sigmoid):
        log_rows = _log_rows(x, log_sigmoid)
        phi = [x[2], x[2] + xp.exp(x[3])]
        lam = [x[4], x[4] + xp.exp(x[5])]
        emissions = [_normal_logpdf(u, phi[k], np.log(tau), xp)
                     + _normal_logpdf(v, lam[k], np.log(rho), xp) for k in range(2)]  # fmt: skip
        prior = -0.5 * (phi[0] ** 2 + (phi[1] - 3.0) ** 2 + lam[0] ** 2 + (lam[1] - 3.0) ** 2)
        # dirichlet(alpha[k]) on row k, with the logit's Jacobian p (1 - p)
        prior = prior + sum(alpha[k, 0] * log_rows[k][0] + alpha[k, 1] * log_rows[k][1]
                            for k in range(2))  # fmt: skip
        return log_rows, emissions, prior + x[3] + x[5]

    def logdensity(x):
        u_, v_ = jnp.asarray(u, x.dtype), jnp.asarray(v, x.dtype)
        log_rows, emissions, rest = parts(x, u_, v_, jnp, jax.nn.log_sigmoid)
        return _forward_jax(log_rows, emissions) + rest

    def logdensity_pt(x):
        import pytensor.tensor as pt

        log_sigmoid = lambda a: -pt.softplus(-a)  # noqa: E731
        log_rows, emissions, rest = parts(x, pt.as_tensor(u), pt.as_tensor(v), pt, log_sigmoid)
        return _forward_pt(log_rows, emissions) + rest

    def constrain(x):
        first = 1.0 / (1.0 + np.exp(-x[..., :2]))
        phi1, lam1 = x[..., 2:3], x[..., 4:5]
        return np.concatenate([first[..., :1], 1 - first[..., :1], first[..., 1:],
                               1 - first[..., 1:], phi1, phi1 + np.exp(x[..., 3:4]), lam1,
                               lam1 + np.exp(x[..., 5:6])], -1)  # fmt: skip

    return 6, logdensity, constrain, _flat_twin(6, logdensity_pt), ("x",)


def _accel_gp(data):
    """brms's heteroscedastic approximate GP (Hilbert-space basis, 40 functions for the
    mean, 20 for ``log sigma``): ``Y ~ normal(mu, sigma)``, ``mu = Intercept + X (s z)``,
    ``log sigma = Intercept_sigma + X_sigma (s_sigma z_sigma)``, ``s`` the square root of
    the squared-exponential spectral density at each basis function's frequency
    (``sdgp^2 sqrt(2 pi) lscale exp(-lscale^2 lambda / 2)``, its root taken in closed
    form); ``z ~ normal(0, 1)``,
    student-t(3) priors on the intercepts and (half) on the ``sdgp``, inverse-gamma(1.125,
    0.0177) on the length scales. ``x = (Intercept, log sdgp, log lscale, z (40),
    Intercept_sigma, log sdgp_sigma, log lscale_sigma, z_sigma (20))``."""
    import jax.numpy as jnp

    y = data["Y"]
    basis, basis_sigma = data["Xgp_1"], data["Xgp_sigma_1"]
    freq, freq_sigma = data["slambda_1"][:, 0] ** 2, data["slambda_sigma_1"][:, 0] ** 2
    nb, nb_sigma = basis.shape[1], basis_sigma.shape[1]
    shape, rate = 1.124909, 0.0177  # the inverse-gamma prior of both length scales

    def density(x, xp, cast):
        def gp(offset, matrix, lam, n, intercept_loc, intercept_scale):
            intercept, log_sd, log_ls = x[offset], x[offset + 1], x[offset + 2]
            z = x[offset + 3 : offset + 3 + n]
            sd, ls = xp.exp(log_sd), xp.exp(log_ls)
            # sqrt(spd) in closed form: sqrt of an underflowed spd has no gradient
            root = sd * (2 * np.pi) ** 0.25 * xp.exp(0.5 * log_ls - 0.25 * ls**2 * cast(lam))
            value = intercept + xp.dot(cast(matrix), root * z)
            prior = (
                -2.0 * xp.log1p(((intercept - intercept_loc) / intercept_scale) ** 2 / 3.0)
                - 2.0 * xp.log1p((sd / 36.0) ** 2 / 3.0) + log_sd  # half-t(3, 0, 36), Jacobian
                - shape * log_ls - rate / ls  # inverse gamma with the log's Jacobian
                - 0.5 * xp.sum(z**2)
            )  # fmt: skip
            return value, prior

        mu, prior_mu = gp(0, basis, freq, nb, -13.0, 36.0)
        log_sigma, prior_sigma = gp(3 + nb, basis_sigma, freq_sigma, nb_sigma, 0.0, 10.0)
        likelihood = xp.sum(-0.5 * ((cast(y) - mu) / xp.exp(log_sigma)) ** 2 - log_sigma)
        return likelihood + prior_mu + prior_sigma

    def logdensity(x):
        return density(x, jnp, lambda a: jnp.asarray(a, x.dtype))

    def logdensity_pt(x):
        import pytensor.tensor as pt

        return density(x, pt, pt.as_tensor)

    def constrain(x):
        out = np.array(x, np.float64, copy=True)
        for offset in (0, 3 + nb):
            out[..., offset + 1 : offset + 3] = np.exp(out[..., offset + 1 : offset + 3])
        return out

    dim = 6 + nb + nb_sigma
    return dim, logdensity, constrain, _flat_twin(dim, logdensity_pt), ("x",)


#: posteriordb model name -> ``data -> (dim, logdensity, constrain, pymc_model, vars)``.
_BUILDERS = {
    "logmesquite_logvash": _logmesquite_logvash,
    "logearn_interaction": _logearn_interaction,
    "nes": _nes,
    "blr": _blr,
    "arma11": _arma11,
    "garch11": _garch11,
    "gp_pois_regr": _gp_pois_regr,
    "low_dim_gauss_mix": _low_dim_gauss_mix,
    "hmm_example": _hmm_example,
    "accel_gp": _accel_gp,
    "kidscore_momhsiq": _kidscore_momhsiq,
    "logearn_interaction_z": _logearn_interaction_z,
    "logmesquite_logvolume": _logmesquite_logvolume,
    "hmm_drive_1": _hmm_drive_1,
}


def register_held_out(repo: Path = POSTERIORDB_MIRROR, names=BUILT) -> tuple[str, ...]:
    """Register the held-out posteriors ``names`` from a posteriordb mirror.

    Parameters
    ----------
    repo
        A posteriordb git directory (a bare mirror or a clone's ``.git``).
    names
        posteriordb posterior names, of :data:`BUILT`.

    Returns
    -------
    tuple of str
        The registry names (the posterior names), for ``fisher_mala.targets.get``.
    """
    from fisher_mala.targets.base import Target, register

    for posterior in names:
        info = _git_json(repo, f"posteriors/{posterior}.json")
        raw = _git_json(repo, f"data/data/{info['data_name']}.json.zip")
        data = {k: np.asarray(v, np.float64) for k, v in raw.items()}
        built = _BUILDERS[info["model_name"]](data)
        ref = _reference(repo, posterior)

        def factory(posterior=posterior, built=built, ref=ref):
            dim, logdensity, constrain, pymc_model, pymc_vars = built
            extras = {
                "reference": ref,
                "constrain": constrain,
                "pymc_model": pymc_model,
                "pymc_vars": pymc_vars,
                "source": f"posteriordb {posterior} (held out)",
            }
            return Target(name=posterior, dim=dim, logdensity_fn=logdensity, extras=extras)

        register(posterior)(factory)
    return tuple(names)


def render(root: Path = RESULTS, targets=BUILT) -> str:
    """The table of :func:`benchmarks.nutpie_race.render` over the held-out cells, and the
    geometric mean over them and the race's posteriors of each seed, where both samplers'
    draws agree with the reference (the issue's goal is over all of them)."""
    text = nutpie_race.render(root, targets, "posterior (held out)")
    if targets == LATER:
        return text
    held = [r["per_grad"] for r in nutpie_race.rows(root, targets) if not r["failed"]]
    means = []
    for seed, race_root in enumerate((nutpie_race.RESULTS, SEED1_RESULTS)):
        race = [r["per_grad"] for r in nutpie_race.rows(race_root) if not r["failed"]]
        if race and held:
            both = race + held
            means.append(f"{np.exp(np.mean(np.log(both))):.2f} over {len(both)} (seed {seed})")
    if means:
        text += (
            "\n\nWith the race's posteriors, where both samplers' draws agree with the "
            f"reference: {'; '.join(means)}."
        )
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--posteriordb", type=Path, default=POSTERIORDB_MIRROR,
                        help="posteriordb git directory (default: %(default)s)")  # fmt: skip
    parser.add_argument("--targets", default="all", help="comma-separated posterior names")
    parser.add_argument("--samplers", default="all")
    parser.add_argument("--render", action="store_true", help="the table only")
    parser.add_argument("--root", type=Path)
    parser.add_argument(
        "--seed", type=int, default=0, help="other starts and keys (with another --root)"
    )
    parser.add_argument("--later", action="store_true", help="LATER's posteriors instead")
    args = parser.parse_args(argv)
    built = LATER if args.later else BUILT
    args.root = args.root or (LATER_RESULTS if args.later else RESULTS)
    targets = built if args.targets == "all" else tuple(args.targets.split(","))
    if not args.render:
        nutpie_race.use_cpu_devices()
        register_held_out(args.posteriordb, targets)
        samplers = nutpie_race.SAMPLERS if args.samplers == "all" else args.samplers.split(",")
        nutpie_race.run(targets, samplers, args.root, args.seed)
    text = render(args.root, built)  # every built posterior with cells, not only those run now
    (args.root.parent / f"{args.root.name}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
