"""Bad input: a clear error (naming the argument and the fix) before any compilation."""

import jax
import jax.numpy as jnp
import pytest

import fisher_mala as fm


def ld(x):
    return -0.5 * jnp.sum(x**2)


CASES = [
    # constructor options
    ("step_size negative", lambda: fm.fisher_mala(ld, step_size=-1.0), "step_size.*> 0"),
    ("step_size zero", lambda: fm.mala(ld, step_size=0.0), "step_size"),
    ("step_size inf", lambda: fm.fisher_mala(ld, step_size=jnp.inf), "step_size"),
    ("step_size complex", lambda: fm.fisher_mala(ld, step_size=1j), "step_size.*real"),
    ("damping zero", lambda: fm.fisher_mala(ld, 1.0, damping=0.0), "damping.*lambda = 10"),
    ("damping negative", lambda: fm.fisher_mala(ld, 1.0, damping=-3.0), "damping"),
    ("target acceptance 0", lambda: fm.fisher_mala(ld, 1.0, target_acceptance_rate=0.0),
     "target_acceptance_rate.*between 0 and 1"),
    ("target acceptance 1.5", lambda: fm.fisher_mala(ld, 1.0, target_acceptance_rate=1.5),
     "target_acceptance_rate"),
    ("rho too large", lambda: fm.fisher_mala(ld, 1.0, step_size_learning_rate=2.0),
     "step_size_learning_rate"),
    ("unknown signal", lambda: fm.fisher_mala(ld, 1.0, signal="rb"), "signal.*rao_blackwell"),
    ("gamma out of (0,1)", lambda: fm.fisher_mala(ld, 1.0, learning_rate=1.0), "learning_rate"),
    ("schedule hits 1", lambda: fm.fisher_mala(ld, 1.0, learning_rate=lambda n: 2.0 / n),
     "gamma_2"),
    ("logdensity not callable", lambda: fm.fisher_mala(3.0, 1.0), "logdensity_fn"),
    # initial positions and log densities
    ("integer position", lambda: fm.fisher_mala(ld, 1.0).init(jnp.arange(3)), "floating"),
    ("complex position", lambda: fm.mala(ld, 1.0).init(jnp.ones(2, jnp.complex64)), "complex"),
    ("NaN position", lambda: fm.fisher_mala(ld, 1.0).init(jnp.array([0.0, jnp.nan])),
     "NaN or inf"),
    ("empty position", lambda: fm.fisher_mala(ld, 1.0).init(jnp.zeros(0)), "no elements"),
    ("vector log density", lambda: fm.fisher_mala(lambda x: x, 1.0).init(jnp.zeros(2)),
     "scalar.*jnp.sum"),
    ("-inf log density", lambda: fm.fisher_mala(lambda x: jnp.log(x[0]), 1.0).init(
        jnp.array([-1.0, 0.0])), "finite"),
    ("raising log density", lambda: fm.fisher_mala(lambda x: x @ jnp.ones(5), 1.0).init(
        jnp.zeros(2)), "raised"),
    ("integer log density", lambda: fm.fisher_mala(lambda x: jnp.sum(x > 0), 1.0).init(
        jnp.zeros(2)), "integer operations are not differentiable"),
    ("overflowing gradient", lambda: fm.fisher_mala(lambda x: jnp.sum(jnp.exp(x**2)), 1.0).init(
        jnp.full(2, 30.0)), "gradient|finite"),
    ("wrong R shape", lambda: fm.fisher_mala(ld, 1.0).init(jnp.zeros(3), sqrt_precond=jnp.eye(2)),
     "sqrt_precond.*\\(3, 3\\)"),
    # the driver
    ("unknown sampler", lambda: fm.sample(jax.random.key(0), "nuts", ld, jnp.zeros((2, 3))),
     "sampler.*fisher_mala"),
    ("num_samples 0", lambda: fm.sample(jax.random.key(0), "mala", ld, jnp.zeros((2, 3)),
                                        num_samples=0), "num_samples"),
    ("num_warmup float", lambda: fm.sample(jax.random.key(0), "mala", ld, jnp.zeros((2, 3)),
                                           num_warmup=10.5), "num_warmup"),
    ("no chain axis", lambda: fm.sample(jax.random.key(0), "mala", ld, jnp.asarray(1.0)),
     "chain axis"),
    ("mismatched chain axes", lambda: fm.sample(
        jax.random.key(0), "mala", lambda p: ld(p["a"]) + ld(p["b"]),
        {"a": jnp.zeros((2, 3)), "b": jnp.zeros((4, 3))}), "disagree"),
    ("chain outside support", lambda: fm.sample(
        jax.random.key(0), "mala", lambda x: jnp.log(x[0]), jnp.array([[1.0], [-1.0]])),
     "chains \\[1\\]"),
    ("unknown option", lambda: fm.sample(jax.random.key(0), "fisher_mala", ld,
                                         jnp.zeros((2, 3)), dampening=3.0), "dampening"),
    ("bad metric_fn", lambda: fm.sample(jax.random.key(0), "mmala", ld, jnp.zeros((2, 3)),
                                        metric_fn=4), "metric_fn"),
    ("bad leapfrog count", lambda: fm.sample(jax.random.key(0), "hmc", ld, jnp.zeros((2, 3)),
                                             num_integration_steps=0), "num_integration_steps"),
    ("mesh as a string", lambda: fm.sample(jax.random.key(0), "mala", ld, jnp.zeros((2, 3)),
                                           mesh="chain"), "jax.sharding.Mesh"),
    ("schedule leaves (0, 1) late", lambda: fm.sample(
        jax.random.key(0), "fisher_mala", ld, jnp.zeros((2, 3)), num_warmup=2000,
        num_mala_steps=100, learning_rate=lambda n: jnp.where(n > 1500, 1.5, 0.01)),
     "gamma_1501"),
    ("a built-in name registered again", lambda: fm.register_sampler(
        "mala", fm.Sampler(fm.mala_warmup, lambda ld, **o: None)), "already registered"),
    ("fisher_adaptation with no steps", lambda: fm.fisher_adaptation(
        pytest.importorskip("blackjax").nuts, ld).run(jax.random.key(0), jnp.zeros(3), 0),
     "num_steps"),
    ("sample_numpyro without chains", lambda: fm.sample_numpyro(
        jax.random.key(0), lambda: None, num_chains=0), "num_chains"),
]


def test_at_least_twenty_cases():
    assert len(CASES) >= 20


@pytest.mark.parametrize("name,fn,match", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gives_a_clear_error_before_compilation(name, fn, match, monkeypatch):
    """Validation runs eagerly: the sampler is never lowered or compiled for bad input."""

    def no_compile(*args, **kwargs):
        raise AssertionError("the sampler was compiled before the input was validated")

    monkeypatch.setattr(fm.sampling, "_compile_and_run", no_compile)
    with pytest.raises((ValueError, TypeError), match=match):
        fn()


def test_sample_names_the_chains_whose_initial_gradient_is_not_finite():
    """Every chain's gradient is checked (in one compiled call), not only the first's."""

    def ld(x):  # finite everywhere; the gradient of |x0| is 0/0 at x0 = 0
        return -0.5 * jnp.sum(x**2) + 0.0 * jnp.sqrt(x[0] ** 2)

    positions = jnp.array([[1.0, 1.0], [0.0, 1.0], [2.0, 0.5]])
    with pytest.raises(ValueError, match=r"gradient .* chains \[1\]"):
        fm.sample(jax.random.key(0), "mala", ld, positions, num_warmup=10, num_samples=10)
