"""fm.FisherMALAKernel and fm.FisherNUTSKernel inside numpyro.infer.MCMC, and
fm.sample_numpyro: named constrained sites (deterministic ones included), ArviZ, and the
draws against NumPyro NUTS on the same models (z-scores)."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisher_mala as fm

numpyro = pytest.importorskip("numpyro")
dist = pytest.importorskip("numpyro.distributions")
from numpyro.infer import MCMC, NUTS  # noqa: E402

Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def eight_schools(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("J", len(sigma)):
        theta_raw = numpyro.sample("theta_raw", dist.Normal(0.0, 1.0))
        theta = numpyro.deterministic("theta", mu + tau * theta_raw)
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


def logistic(x, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 5.0))
    numpyro.sample("obs", dist.Bernoulli(logits=x @ w + b), obs=y)


def _run(kernel, *args, num=1500, chains=2, **kwargs):
    mcmc = MCMC(kernel, num_warmup=num, num_samples=num, num_chains=chains,
                chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.key(0), *args, **kwargs)
    return mcmc


class _Grouped:
    """fm.sample_numpyro's draws with MCMC's ``get_samples(group_by_chain=True)``."""

    def __init__(self, samples):
        self.samples = samples

    def get_samples(self, group_by_chain=True):
        return self.samples


def _assert_same_posterior(ours, reference, sites):
    """Means by MCSE z-scores (ArviZ's multi-chain ESS on both), sds within 15%."""
    a = ours.get_samples(group_by_chain=True)
    b = reference.get_samples(group_by_chain=True)
    for site in sites:
        x, r = np.asarray(a[site], np.float64), np.asarray(b[site], np.float64)
        x = x.reshape(*x.shape[:2], -1)
        r = r.reshape(*r.shape[:2], -1)
        mcse_x = x.reshape(-1, x.shape[-1]).std(0) / np.sqrt(fm.ess(x, method="mean"))
        mcse_r = r.reshape(-1, r.shape[-1]).std(0) / np.sqrt(fm.ess(r, method="mean"))
        z = (x.mean((0, 1)) - r.mean((0, 1))) / np.sqrt(mcse_x**2 + mcse_r**2)
        assert np.all(np.abs(z) < 4.5), (site, z)
        ratio = x.std((0, 1)) / r.std((0, 1))
        assert np.all(np.abs(ratio - 1) < 0.15), (site, ratio)


def test_eight_schools_named_constrained_sites_match_nuts():
    mcmc = _run(fm.FisherMALAKernel(eight_schools), SIGMA, y=Y)
    samples = mcmc.get_samples()
    assert set(samples) == {"mu", "tau", "theta_raw", "theta"}  # deterministic site kept
    assert samples["theta"].shape == (3000, 8)
    assert np.all(samples["tau"] > 0)  # constrained to its support
    nuts = _run(NUTS(eight_schools), SIGMA, y=Y, num=1000)
    _assert_same_posterior(mcmc, nuts, ["mu", "tau", "theta"])

    # Fisher NUTS as an MCMCKernel: warm-up in init, the warm-up calls are no-ops (its
    # z-scores against NUTS: test_fisher_nuts_kernel_matches_nuts, -m slow)
    fisher_nuts = _run(fm.FisherNUTSKernel(eight_schools), SIGMA, y=Y, num=200)
    assert fisher_nuts.get_samples()["theta"].shape == (400, 8)
    assert np.all(fisher_nuts.get_samples()["tau"] > 0)
    extra = fisher_nuts.get_extra_fields()  # NUTS's default fields, and the energy
    assert {"diverging", "num_steps", "accept_prob", "energy"} <= set(extra)
    assert extra["diverging"].dtype == bool and np.all(extra["num_steps"] >= 1)

    # fm.sample on the same model: named, constrained sites in fm.to_arviz
    result = fm.sample_numpyro(jax.random.key(3), eight_schools, SIGMA, Y, num_chains=2,
                               num_warmup=1000, num_samples=1000)
    assert set(result.samples) == {"mu", "tau", "theta_raw", "theta"}
    assert result.samples["theta"].shape == (2, 1000, 8) and np.all(result.samples["tau"] > 0)
    _assert_same_posterior(_Grouped(result.samples), nuts, ["mu", "tau", "theta"])
    assert set(fm.to_arviz(result).posterior.data_vars) == {"mu", "tau", "theta_raw", "theta"}
    import arviz as az

    idata = az.from_numpyro(mcmc)
    assert set(idata.posterior.data_vars) == {"mu", "tau", "theta_raw", "theta"}
    assert idata.posterior["theta"].shape == (2, 1500, 8)
    mcmc.print_summary()


@pytest.mark.slow  # 35 s: the kernel's protocol is in CI above, on the same model
def test_fisher_nuts_kernel_matches_nuts():
    nuts = _run(NUTS(eight_schools), SIGMA, y=Y, num=1000)
    fisher_nuts = _run(fm.FisherNUTSKernel(eight_schools), SIGMA, y=Y, num=1000)
    _assert_same_posterior(fisher_nuts, nuts, ["mu", "tau", "theta"])


@pytest.mark.slow  # 35 s; the kernel is checked on eight schools in CI, the logistic
# regression through fm.sample_pymc
def test_logistic_regression_matches_nuts():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)) * np.array([1.0, 3.0, 0.3, 1.0])
    y = (rng.random(200) < 1 / (1 + np.exp(-(x @ np.array([1.0, -0.5, 2.0, 0.0]) + 0.3))))
    mcmc = _run(fm.FisherMALAKernel(logistic), x, y=y.astype(float))
    nuts = _run(NUTS(logistic), x, y=y.astype(float), num=1000)
    _assert_same_posterior(mcmc, nuts, ["w", "b"])


def test_potential_fn_and_bad_input():
    def potential(z):
        return 0.5 * ((z["a"] - 1.0) ** 2).sum()

    mcmc = MCMC(fm.FisherMALAKernel(potential_fn=potential), num_warmup=600, num_samples=500,
                progress_bar=False)
    mcmc.run(jax.random.key(1), init_params={"a": np.zeros(3, np.float32)})
    assert mcmc.get_samples()["a"].shape == (500, 3)
    with pytest.raises(ValueError, match="exactly one"):
        fm.FisherMALAKernel()
    with pytest.raises(ValueError, match="exactly one"):
        fm.FisherNUTSKernel()
    with pytest.raises(ValueError, match="algorithm"):
        fm.FisherNUTSKernel(eight_schools, algorithm="mala")
    with pytest.raises(ValueError, match="init_params"):
        MCMC(fm.FisherMALAKernel(potential_fn=potential), num_warmup=5, num_samples=5,
             progress_bar=False).run(jax.random.key(0))
    with pytest.raises(ValueError, match="parallel"):
        MCMC(fm.FisherMALAKernel(eight_schools), num_warmup=5, num_samples=5, num_chains=2,
             chain_method="vectorized", progress_bar=False).run(jax.random.key(0), SIGMA, y=Y)


def test_init_params_with_a_model_are_honoured_and_checked():
    """As NumPyro's NUTS: ``init_params`` (unconstrained) is where the chain starts; a NaN
    or a wrong site gives a clear error."""
    start = {"mu": np.float32(3.0), "tau": np.float32(0.5), "theta_raw": np.zeros(8, np.float32)}
    kernel = fm.FisherMALAKernel(eight_schools)
    state = kernel.init(jax.random.key(0), 10, start, (SIGMA,), {"y": Y})
    assert float(state.z["mu"]) == 3.0 and float(state.z["tau"]) == 0.5
    nan = dict(start, mu=np.float32(np.nan))
    with pytest.raises(ValueError, match="NaN"):
        fm.FisherMALAKernel(eight_schools).init(jax.random.key(0), 10, nan, (SIGMA,), {"y": Y})
    with pytest.raises(ValueError, match="every latent site"):
        fm.FisherMALAKernel(eight_schools).init(
            jax.random.key(0), 10, {"mu": np.float32(0.0)}, (SIGMA,), {"y": Y}
        )


def test_sample_numpyro_takes_the_models_arguments_and_feeds_loo_and_compare():
    """``fm.sample_numpyro(key, model, *args, **kwargs)`` as NumPyro's ``MCMC.run``: a
    keyword the model names goes to it; the ArviZ export has a pointwise log-likelihood
    group (equal to NumPyro's own ``log_likelihood``), so ``az.loo`` and ``az.compare``
    run; NUTS runs carry ``energy`` and ``tree_depth`` (``az.bfmi``)."""
    import arviz as az
    from numpyro.infer import log_likelihood

    result = fm.sample_numpyro(jax.random.key(3), eight_schools, SIGMA, y=Y, num_chains=2,
                               num_warmup=500, num_samples=500, diagnose=False)  # fmt: skip
    assert result.log_likelihood["obs"].shape == (2, 500, 8)
    draws = {k: v[1] for k, v in result.samples.items()}
    expected = log_likelihood(eight_schools, draws, SIGMA, y=Y)["obs"]
    np.testing.assert_allclose(result.log_likelihood["obs"][1], expected, rtol=1e-6)
    data = fm.to_arviz(result)
    assert "log_likelihood" in data.children and "n_steps" in data.sample_stats
    loo = az.loo(data)
    assert np.isfinite(loo.elpd)
    nuts = fm.sample_numpyro(jax.random.key(4), eight_schools, SIGMA, model_kwargs={"y": Y},
                             sampler="fisher_nuts", num_chains=2, num_warmup=500,
                             num_samples=500, diagnose=False)  # fmt: skip
    nuts_data = fm.to_arviz(nuts)
    assert {"energy", "tree_depth", "diverging", "lp"} <= set(nuts_data.sample_stats.data_vars)
    assert np.all(np.isfinite(az.bfmi(nuts_data)["energy"].values))
    table = az.compare({"fisher_mala": data, "fisher_nuts": nuts_data})
    assert len(table) == 2
    with pytest.raises(ValueError, match="both"):
        fm.sample_numpyro(jax.random.key(3), eight_schools, SIGMA, y=Y, model_kwargs={"y": Y})


def test_fisher_nuts_kernel_compiles_its_warmup_once_for_all_chains(monkeypatch):
    """NumPyro calls ``init`` once per chain (``chain_method="sequential"``): the warm-up's
    Fisher phase is traced (and compiled) once for the four chains, not four times; the
    model is set up once (one compiled program finds every chain's initial point, and its
    trace gives the model's functions). A second run with the same
    data (other argument containers, as ``MCMC.run(*args, **kwargs)`` makes them) reuses
    both, as NumPyro's ``MCMC`` reuses its compiled loop; other data is set up anew."""
    from fisher_mala import numpyro_kernel
    from fisher_mala.whitened_warmup import FisherHMCWarmup

    traces, setups = [], []
    original, initialize = FisherHMCWarmup.staged_run, numpyro_kernel.initialize_model

    def counting(self, *args, **kwargs):
        traces.append(1)
        return original(self, *args, **kwargs)

    def counting_setups(*args, **kwargs):
        setups.append(1)
        return initialize(*args, **kwargs)

    monkeypatch.setattr(FisherHMCWarmup, "staged_run", counting)
    monkeypatch.setattr(numpyro_kernel, "initialize_model", counting_setups)
    mcmc = MCMC(fm.FisherNUTSKernel(eight_schools), num_warmup=200, num_samples=50,
                num_chains=4, chain_method="sequential", progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.key(0), SIGMA, y=Y)
    assert len(traces) == 1
    assert len(setups) == 1
    samples = mcmc.get_samples(group_by_chain=True)["mu"]
    assert samples.shape == (4, 50) and len({float(s[0]) for s in samples}) == 4
    mcmc.run(jax.random.key(1), SIGMA, y=Y)
    assert (len(traces), len(setups)) == (1, 1)
    mcmc.run(jax.random.key(1), SIGMA, y=Y + 1.0)
    assert (len(traces), len(setups)) == (2, 2)


@pytest.mark.parametrize("expensive", [False, True])
def test_a_cheap_program_is_compiled_without_llvms_optimizations(monkeypatch, expensive):
    """The Fisher phase's program: compiled once per argument shapes, with the fast
    options when its loops' flops times its iterations are at most the bound (else as
    ``jax.jit``), the same values as ``jax.jit``'s; under ``vmap`` (NumPyro's vectorized
    or parallel chains) ``jax.jit`` itself."""
    from fisher_mala import numpyro_kernel

    if expensive:
        monkeypatch.setattr(numpyro_kernel, "FAST_COMPILE_MAX_FLOPS", 0.0)
    options, original = [], jax.stages.Lowered.compile

    def recording(self, compiler_options=None, **kwargs):
        options.append(compiler_options)
        return original(self, compiler_options, **kwargs)

    monkeypatch.setattr(jax.stages.Lowered, "compile", recording)

    def fn(x, scale=1.0):
        return jax.lax.fori_loop(0, 100, lambda i, v: jnp.sin(v) * scale + v, x)

    run = numpyro_kernel._CheaplyCompiled(fn, 100)
    x = jnp.linspace(0.0, 1.0, 5)
    expected = jax.jit(fn)(x, scale=0.5)
    np.testing.assert_allclose(run(x, scale=0.5), expected, rtol=1e-6)
    np.testing.assert_allclose(run(x + 0.0, scale=0.5), expected, rtol=1e-6)  # cached
    assert options == [None if expensive else numpyro_kernel.FAST_COMPILE_OPTIONS]
    run(jnp.ones(3), scale=0.5)  # other shapes: compiled again
    assert len(options) == 2
    batched = jax.vmap(lambda v: run(v, scale=0.5))(jnp.stack([x, x]))
    np.testing.assert_allclose(batched, jnp.stack([expected, expected]), rtol=1e-6)
    assert len(options) == 2


def test_a_model_whose_set_up_holds_a_traced_value_is_set_up_as_numpyro_does():
    """The model's functions come from the compiled finder's trace unless they hold one of
    its values (here a support bound computed in the model): then NumPyro's eager set-up
    gives them, and the run works with the same finder; a tracer anywhere is found."""
    from numpyro.infer.util import initialize_model

    from fisher_mala.numpyro_kernel import _holds_tracer, _initialize

    def bounded(x):
        numpyro.sample("a", dist.TruncatedNormal(0.0, 1.0, high=jnp.max(jnp.asarray(x))))

    x = np.array([0.5, 1.5, 2.0])
    kernel = fm.FisherNUTSKernel(bounded)
    found, _ = _initialize(kernel, jax.random.key(0), None, (x,), {})
    assert not _holds_tracer((kernel._potential_fn, kernel._postprocess_fn))
    constrained = kernel._postprocess_fn(x)(found)["a"]  # eagerly: no tracer of a dead trace
    assert float(constrained) < 2.0
    expected = initialize_model(jax.random.key(0), bounded, model_args=(x,)).param_info.z
    np.testing.assert_array_equal(np.asarray(found["a"]), np.asarray(expected["a"]))
    mcmc = MCMC(kernel, num_warmup=100, num_samples=20, num_chains=2,
                chain_method="sequential", progress_bar=False)  # fmt: skip
    with pytest.warns(fm.SamplingWarning):  # a warm-up too short to learn R
        mcmc.run(jax.random.key(1), x)
    assert np.all(np.asarray(mcmc.get_samples()["a"]) < 2.0)
    result = fm.sample_numpyro(jax.random.key(2), bounded, x, num_chains=2, num_warmup=200,
                               num_samples=50, diagnose=False)  # fmt: skip
    assert result.samples["a"].shape == (2, 50) and np.all(np.asarray(result.samples["a"]) < 2)
    held = []
    jax.jit(lambda v: held.append({"f": partial(max, [v])}) or v)(1.0)
    assert _holds_tracer(held) and not _holds_tracer([{"f": partial(max, [1.0])}])


def test_a_model_without_a_valid_start_says_so_before_sampling():
    """A log density that is nowhere finite: the compiled set-up raises as NumPyro's eager
    one does, naming the way out."""

    def nowhere(x):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        numpyro.factor("never", jnp.where(a > -jnp.inf, -jnp.inf, 0.0))

    kernel = fm.FisherNUTSKernel(nowhere)
    with pytest.raises(RuntimeError, match="init_params"):
        kernel.init(jax.random.key(0), 100, None, (1.0,), {})


def test_fisher_mala_kernel_compiles_its_start_once_for_all_chains(monkeypatch):
    """The step-size search and the initial state of ``FisherMALAKernel`` are traced once
    for the four chains of a run and a second run on the same data."""
    from fisher_mala import warmups

    traces = []
    original = warmups.find_reasonable_step_size

    def counting(*args, **kwargs):
        traces.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(warmups, "find_reasonable_step_size", counting)
    mcmc = MCMC(fm.FisherMALAKernel(eight_schools), num_warmup=100, num_samples=20,
                num_chains=4, chain_method="sequential", progress_bar=False)  # fmt: skip
    with pytest.warns(fm.SamplingWarning):  # a warm-up too short to learn R
        mcmc.run(jax.random.key(0), SIGMA, y=Y)
    mcmc.run(jax.random.key(1), SIGMA, y=Y)
    assert len(traces) == 1
    steps = mcmc.get_samples(group_by_chain=True)["mu"]
    assert steps.shape == (4, 20) and len({float(s[0]) for s in steps}) == 4


def test_a_warm_up_too_short_for_the_fisher_phase_warns_once_with_a_length_that_suffices():
    """Eight schools has d = 10: the Fisher phase needs 50 d = 500 iterations after the
    500 MALA ones (FisherMALAKernel), and a share of NUTS's warm-up (FisherNUTSKernel)."""
    import re
    import warnings

    from fisher_mala.numpyro_kernel import (
        MIN_FISHER_ITERATIONS_PER_DIM,
        _warn_short_fisher_phase,
        suggested_num_warmup,
    )

    kernel = fm.FisherMALAKernel(eight_schools)
    with pytest.warns(fm.SamplingWarning, match=r"num_warmup=1000 or more") as caught:
        kernel.init(jax.random.key(0), 900, None, (SIGMA,), {"y": Y})
        kernel.init(jax.random.key(1), 900, None, (SIGMA,), {"y": Y})  # once per kernel
    assert len([w for w in caught if issubclass(w.category, fm.SamplingWarning)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", fm.SamplingWarning)
        fm.FisherMALAKernel(eight_schools).init(jax.random.key(0), 1000, None, (SIGMA,), {"y": Y})

    nuts = fm.FisherNUTSKernel(eight_schools)
    nuts._num_warmup = 1000
    needed = MIN_FISHER_ITERATIONS_PER_DIM * 10
    with pytest.warns(fm.SamplingWarning, match="FisherNUTSKernel") as caught:
        _warn_short_fisher_phase(nuts, np.zeros(10))
    suggested = int(re.search(r"num_warmup=(\d+)", str(caught[0].message)).group(1))
    assert nuts._num_fisher(suggested) >= needed > nuts._num_fisher(suggested - 1)
    assert suggested_num_warmup(nuts, 10) == suggested
    assert suggested_num_warmup(kernel, 10) == 1000


def test_the_kernels_start_where_numpyro_would_with_one_key():
    """The batched and compiled set-ups find the points NumPyro's own one-key
    ``initialize_model`` finds (first chain eagerly, later chains by the kept program)."""
    from numpyro.infer.util import initialize_model

    from fisher_mala.numpyro_kernel import _initialize

    kernel = fm.FisherNUTSKernel(eight_schools)
    args, kwargs = (SIGMA,), {"y": Y}
    for seed in (0, 1, 2):
        key = jax.random.key(seed)
        found, (logdensity, grad) = _initialize(kernel, key, None, args, kwargs)
        expected = initialize_model(key, eight_schools, model_args=args, model_kwargs=kwargs)
        for site, value in expected.param_info.z.items():
            np.testing.assert_array_equal(np.asarray(found[site]), np.asarray(value))
            # the value and gradient the warm-up starts from, as NumPyro found them
            np.testing.assert_allclose(
                np.asarray(grad[site]), -np.asarray(expected.param_info.z_grad[site]),
                rtol=1e-5, atol=1e-6,
            )  # fmt: skip
        np.testing.assert_allclose(
            float(logdensity), -float(expected.param_info.potential_energy), rtol=1e-6
        )
    assert len(kernel._initializations) == 1


def test_the_step_size_phase_runs_in_numpyros_warm_up_calls():
    """The Fisher phase runs in ``init`` (its warm-up calls of ``sample`` are no-ops); the
    step-size phase runs in the last warm-up calls, one NUTS transition each (tuning the
    step, which the progress bar shows), and freezes the step at the last one; a run
    through ``mcmc.warmup()`` and then ``mcmc.run()`` draws what one ``mcmc.run()`` does."""
    kernel = fm.FisherNUTSKernel(eight_schools)
    fields = ("accept_prob", "num_steps")
    mcmc = MCMC(kernel, num_warmup=200, num_samples=30, progress_bar=False)
    mcmc.warmup(jax.random.key(4), SIGMA, y=Y, collect_warmup=True, extra_fields=fields)
    num_fisher, num_tune = kernel._split(200)[0]
    assert num_fisher + num_tune == 200 and num_tune >= 10
    warm = mcmc.get_extra_fields()
    accept, steps = np.asarray(warm["accept_prob"]), np.asarray(warm["num_steps"])
    assert np.all(accept[:num_fisher] == 0) and np.all(steps[:num_fisher] == 0)
    assert np.all(steps[num_fisher:] >= 1) and np.mean(accept[num_fisher:]) > 0.3
    frozen = float(mcmc.last_state.step_size)
    mcmc.run(mcmc.post_warmup_state.rng_key, SIGMA, y=Y)
    assert float(mcmc.last_state.step_size) == frozen  # the draws do not tune it
    split = np.asarray(mcmc.get_samples()["mu"])

    whole = MCMC(fm.FisherNUTSKernel(eight_schools), num_warmup=200, num_samples=30,
                 progress_bar=False)  # fmt: skip
    whole.run(jax.random.key(4), SIGMA, y=Y)
    np.testing.assert_array_equal(np.asarray(whole.get_samples()["mu"]), split)


def test_fisher_nuts_kernel_runs_chains_in_parallel_with_its_host_widening():
    """``chain_method="parallel"`` (``pmap``, one chain per device) runs the step-size
    phase's widening, a host callback, on every device's chain; under ``with
    jax.enable_x64(True)`` (float64 in, float64 out). Two host devices, in a fresh process."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        import jax, numpy as np, numpyro, numpyro.distributions as dist
        from numpyro.infer import MCMC
        import fisher_mala as fm
        from fisher_mala import geometric_widening

        host_calls, original = [], geometric_widening.widened_root

        def counting(*args):  # the host's NumPy widening, once per chain
            host_calls.append(args[-1] is np)
            return original(*args)

        geometric_widening.widened_root = counting

        def model(y=None):  # d = 3: the step-size phase widens after its first half
            scale = numpyro.sample("scale", dist.LogNormal(0.0, 1.0))
            mu = numpyro.sample("mu", dist.Normal(0.0, 3.0).expand([2]).to_event(1))
            numpyro.sample("y", dist.Normal(mu, scale).to_event(1), obs=y)

        with jax.enable_x64(True):
            mcmc = MCMC(fm.FisherNUTSKernel(model), num_warmup=1000, num_samples=200,
                        num_chains=2, chain_method="parallel", progress_bar=False)
            mcmc.run(jax.random.key(0), y=np.array([[0.5, -1.0], [1.5, 0.0]]))
            draws = mcmc.get_samples(group_by_chain=True)
        assert len(jax.devices()) == 2
        assert draws["mu"].shape == (2, 200, 2) and draws["mu"].dtype == np.float64
        assert all(np.isfinite(np.asarray(v)).all() for v in draws.values())
        assert host_calls == [True, True], host_calls
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_a_fisher_phase_that_never_settles_leaves_the_step_to_numpyros_loop(monkeypatch):
    """With the stopping rule on and its verdict held at "still learning" (the Fisher phase
    runs its length), ``fm.FisherNUTSKernel``'s warm-up skips ``fm.sample``'s divergence
    probe (its step-size phase runs inside NumPyro's loop, after ``init``) and samples."""
    monkeypatch.setattr(
        fm.whitened_warmup.FisherHMCWarmup, "look", lambda self, previous, state: ""
    )
    kernel = fm.FisherNUTSKernel(eight_schools, stopping_rule=True)
    mcmc = MCMC(kernel, num_warmup=1200, num_samples=20, progress_bar=False)
    mcmc.run(jax.random.key(0), SIGMA, y=Y)
    assert np.all(np.isfinite(np.asarray(mcmc.get_samples()["mu"])))
