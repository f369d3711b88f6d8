"""The paper's targets: data, log densities against NumPy/SciPy, MAP, user models."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.special import log_expit

import fisher_mala as fm

# rows, features (raw), label counts (0, 1): from shared/data/PROVENANCE.md
EXPECTED = {
    "australian": (690, 14, (383, 307)),
    "heart": (270, 13, (150, 120)),
    "german": (1000, 24, (700, 300)),
    "pima": (532, 7, (355, 177)),
    "ripley": (250, 2, (125, 125)),
    "caravan": (5822, 85, (5474, 348)),
    "mnist56": (11339, 784, (5421, 5918)),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_datasets_load_with_expected_shapes_and_labels(name):
    rows, features, counts = EXPECTED[name]
    target = fm.targets.get(name)
    z, y = target.extras["X"], target.extras["y"]
    intercept = target.extras["intercept"]
    assert z.shape == (rows, features + intercept) == (rows, target.dim)
    assert (int((y == 0).sum()), int((y == 1).sum())) == counts
    if intercept:
        np.testing.assert_array_equal(z[:, 0], 1.0)
    if target.paper_dim is not None and name != "caravan":
        assert target.dim == target.paper_dim
    if name == "mnist56":
        assert z[:, 1:].max() == 1.0 and z[:, 1:].min() == 0.0  # pixels / 255
    if name == "caravan":
        assert target.paper_dim - target.dim == 1  # documented difference


def _reference_logdensity_and_grad(z, y, theta):
    logits = z @ theta
    value = np.sum(y * log_expit(logits) + (1 - y) * log_expit(-logits)) - 0.5 * theta @ theta
    prob = np.exp(log_expit(logits))
    return value, z.T @ (y - prob) - theta


@pytest.mark.parametrize("name", list(EXPECTED))
def test_logistic_logdensity_and_gradient_match_scipy(x64, name):
    target = fm.targets.get(name)
    z, y = target.extras["X"], target.extras["y"]
    rng = np.random.default_rng(0)
    value_and_grad = jax.jit(jax.value_and_grad(target.logdensity_fn))
    for scale in (0.01, 0.3):
        theta = rng.normal(size=target.dim) * scale
        value, grad = value_and_grad(jnp.asarray(theta))
        ref_value, ref_grad = _reference_logdensity_and_grad(z, y, theta)
        assert float(value) == pytest.approx(ref_value, rel=1e-10)
        np.testing.assert_allclose(np.asarray(grad), ref_grad, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("name", ["australian", "heart", "german", "pima", "ripley", "caravan"])
def test_map_by_lbfgs_has_zero_gradient(x64, name):
    """optax L-BFGS in diagonally rescaled coordinates (the inputs are not standardized,
    so the raw posterior is too ill-conditioned for plain L-BFGS in a few hundred steps)."""
    target = fm.targets.get(name)
    scale = jnp.sqrt(1.0 + 0.25 * np.sum(target.extras["X"] ** 2, axis=0))  # sqrt diag H(0)

    def loss(phi):
        return -target.logdensity_fn(phi / scale)

    solver = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)

    @jax.jit
    def run(phi):
        def body(carry, _):
            phi, state = carry
            value, grad = value_and_grad(phi, state=state)
            updates, state = solver.update(grad, state, phi, value=value, grad=grad,
                                           value_fn=loss)
            return (optax.apply_updates(phi, updates), state), None

        (phi, _), _ = jax.lax.scan(body, (phi, solver.init(phi)), length=1500)
        return phi

    theta = run(jnp.zeros(target.dim)) / scale
    grad = jax.grad(target.logdensity_fn)(theta)
    grad0 = jax.grad(target.logdensity_fn)(jnp.zeros(target.dim))
    # relative to the gradient at the prior mean (1e1 to 3e5), the MAP's is ~0
    assert float(jnp.linalg.norm(grad)) < 1e-8 * float(jnp.linalg.norm(grad0)), name


def test_gaussian_targets_know_their_moments():
    gp = fm.targets.gp_gaussian()
    s = np.linspace(1, 2, 100)
    assert gp.covariance[3, 7] == pytest.approx(
        s[3] * s[7] * np.exp(-((s[3] - s[7]) ** 2) / (2 * 0.09)))
    assert gp.covariance[5, 5] == pytest.approx(s[5] ** 2 + 0.001)
    inhom = fm.targets.inhomogeneous_gaussian()
    np.testing.assert_allclose(np.sqrt(np.diag(inhom.covariance)), np.arange(1, 101) / 100)
    two = fm.targets.correlated_2d()
    np.testing.assert_allclose(two.covariance, [[1, 0.995], [0.995, 1]])
    for t in (gp, inhom, two):
        np.testing.assert_array_equal(t.mean, 1.0)
        np.testing.assert_array_equal(t.inverse_fisher, t.covariance)
        # log density = Gaussian up to a constant: compare differences with the explicit form
        x, x2 = np.random.default_rng(0).normal(size=(2, t.dim))
        prec = np.linalg.inv(t.covariance)

        def ref(v, prec=prec, t=t):
            return -0.5 * (v - t.mean) @ prec @ (v - t.mean)

        with jax.enable_x64(True):
            diff = float(t.logdensity_fn(jnp.asarray(x)) - t.logdensity_fn(jnp.asarray(x2)))
        assert diff == pytest.approx(ref(x) - ref(x2), rel=1e-6)


def test_registry_lists_every_target():
    assert set(fm.targets.names()) == {
        "gaussian_2d", "gp", "inhomogeneous", "funnel", "synthetic_logistic", *EXPECTED,
        *fm.targets.POSTERIORS,
    }
    with pytest.raises(ValueError, match="Unknown target"):
        fm.targets.get("mnist")


def test_loading_a_dataset_imports_nothing_heavy():
    code = (
        "import sys, fisher_mala as fm; fm.targets.get('caravan'); "
        "heavy = [m for m in ('pandas', 'scipy', 'arviz', 'xarray', 'matplotlib') "
        "if m in sys.modules]; assert not heavy, heavy"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_plain_jax_and_numpyro_models_run_through_sample():
    """Posterior of mu in y_i ~ N(mu, 1), mu ~ N(0, 10^2): known in closed form."""
    numpyro = pytest.importorskip("numpyro")
    import numpyro.distributions as dist
    from numpyro.infer.util import initialize_model

    y = np.random.default_rng(0).normal(1.5, 1.0, size=50)
    post_var = 1.0 / (1.0 / 100.0 + len(y))
    post_mean = post_var * y.sum()

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)
        return sigma

    info = initialize_model(jax.random.key(0), model, model_args=(jnp.asarray(y),),
                            dynamic_args=False)

    def numpyro_logdensity(params):
        return -info.potential_fn(params)

    def jax_logdensity(mu):
        return -0.5 * jnp.sum((y - mu[0]) ** 2) - 0.5 * mu[0] ** 2 / 100.0

    positions = jax.tree.map(lambda v: jnp.stack([v, v + 0.5]), info.param_info.z)
    r_numpyro = fm.sample(jax.random.key(1), "fisher_mala", numpyro_logdensity, positions,
                          num_warmup=2000, num_samples=4000)
    r_jax = fm.sample(jax.random.key(1), "fisher_mala", jax_logdensity, jnp.zeros((2, 1)),
                      num_warmup=2000, num_samples=4000)
    for draws, result in ((r_numpyro.samples["mu"], r_numpyro), (r_jax.samples[..., 0], r_jax)):
        ess = fm.ess(draws[..., None], per_chain=False)[0]
        z = (float(draws.mean()) - post_mean) / np.sqrt(post_var / ess)
        assert abs(z) < 4.0, z
        assert fm.to_arviz(result) is not None


def test_neal_funnel_log_density_and_moments(x64):
    from scipy import stats

    t = fm.targets.neal_funnel(5)
    z = np.array([0.7, -1.0, 0.3, 2.0, -0.4])
    ref = stats.norm.logpdf(z[0], 0, 3) + stats.norm.logpdf(z[1:], 0, np.exp(z[0] / 2)).sum()
    z2 = np.array([-2.0, 0.1, -0.2, 0.05, 0.3])
    ref2 = stats.norm.logpdf(z2[0], 0, 3) + stats.norm.logpdf(z2[1:], 0, np.exp(z2[0] / 2)).sum()
    ours = float(t.logdensity_fn(jnp.asarray(z)) - t.logdensity_fn(jnp.asarray(z2)))
    assert ours == pytest.approx(ref - ref2, rel=1e-10)
    # sd(x_i)^2 = E[e^v] = e^{9/2} for v ~ N(0, 9)
    assert t.extras["sd"][1] ** 2 == pytest.approx(np.exp(4.5))
    with pytest.raises(ValueError, match="dim"):
        fm.targets.neal_funnel(1)
