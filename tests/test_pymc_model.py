"""fm.sample_pymc: a PyMC model in, named constrained draws with the model's dimensions
out, checked against NumPyro NUTS on the same model written in NumPyro (z-scores)."""

import jax
import numpy as np
import pytest

import fisher_mala as fm

pm = pytest.importorskip("pymc")
pytest.importorskip("numpyro")
from test_numpyro_kernel import (  # noqa: E402
    NUTS,
    SIGMA,
    Y,
    _assert_same_posterior,
    _Grouped,
    _run,
    eight_schools,
    logistic,
)


def pymc_eight_schools():
    with pm.Model(coords={"school": [f"s{j}" for j in range(8)]}) as model:
        mu = pm.Normal("mu", 0.0, 5.0)
        tau = pm.HalfCauchy("tau", 5.0)
        theta_raw = pm.Normal("theta_raw", 0.0, 1.0, dims="school")
        theta = pm.Deterministic("theta", mu + tau * theta_raw, dims="school")
        pm.Normal("obs", theta, SIGMA, observed=Y, dims="school")
    return model


def test_eight_schools_named_constrained_dims_match_numpyro_nuts():
    x64 = jax.config.jax_enable_x64
    result = fm.sample_pymc(jax.random.key(0), pymc_eight_schools(), num_chains=2,
                            num_warmup=1500, num_samples=1500)
    assert jax.config.jax_enable_x64 == x64  # PyTensor's import sets it; it is restored
    assert result.samples["mu"].dtype == np.float64  # the model's precision
    assert set(result.samples) == {"mu", "tau", "theta_raw", "theta"}  # not tau_log__
    assert result.samples["theta"].shape == (2, 1500, 8)
    assert np.all(result.samples["tau"] > 0)  # constrained to its support
    nuts = _run(NUTS(eight_schools), SIGMA, y=Y, num=1000)
    _assert_same_posterior(_Grouped(result.samples), nuts, ["mu", "tau", "theta"])
    posterior = fm.to_arviz(result).posterior
    assert set(posterior.data_vars) == {"mu", "tau", "theta_raw", "theta"}
    assert posterior["theta"].dims == ("chain", "draw", "school")
    assert list(posterior["school"].values) == [f"s{j}" for j in range(8)]
    # the checks name the model's variables (tau, theta[...]), not tau_log__ / theta_raw only
    names = result.diagnosis.names
    assert "tau" in names and not any("log__" in n for n in names)
    # the pointwise log-likelihood (az.loo): each school's normal log density at each draw
    import arviz as az
    from scipy.stats import norm

    assert result.log_likelihood["obs"].shape == (2, 1500, 8)
    theta = result.samples["theta"][1, :5]
    np.testing.assert_allclose(result.log_likelihood["obs"][1, :5],
                               norm.logpdf(Y, theta, SIGMA), rtol=1e-9)  # fmt: skip
    assert np.isfinite(az.loo(fm.to_arviz(result)).elpd)


def test_warnings_name_the_models_variables():
    """A run too short to pass the checks warns about ``tau``, never ``tau_log__``."""
    with pytest.warns(fm.SamplingWarning) as caught:
        fm.sample_pymc(jax.random.key(1), pymc_eight_schools(), num_chains=2, num_warmup=60,
                       num_samples=60)  # fmt: skip
    text = " ".join(str(w.message) for w in caught)
    assert "log__" not in text


def test_logistic_regression_matches_numpyro_nuts():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)) * np.array([1.0, 3.0, 0.3, 1.0])
    y = (rng.random(200) < 1 / (1 + np.exp(-(x @ np.array([1.0, -0.5, 2.0, 0.0]) + 0.3))))
    with pm.Model() as model:
        w = pm.Normal("w", 0.0, 1.0, shape=4)
        b = pm.Normal("b", 0.0, 5.0)
        pm.Bernoulli("obs", logit_p=x @ w + b, observed=y.astype(int))
    result = fm.sample_pymc(jax.random.key(2), model, "mala", num_chains=2, num_warmup=1500,
                            num_samples=1500)  # any sampler of fm.sample
    nuts = _run(NUTS(logistic), x, y=y.astype(float), num=1000)
    _assert_same_posterior(_Grouped(result.samples), nuts, ["w", "b"])
