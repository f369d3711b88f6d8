"""fm.sample, the warm-up, the step-size search, progress bars and devices."""

import os
import subprocess
import sys
import textwrap
import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisher_mala as fm
from fisher_mala.adaptations.step_size_search import find_reasonable_step_size
from fisher_mala.progress import ProgressBar
from fisher_mala.schedule import extend_info
from fisher_mala.warmups import fisher_mala_warmup, pooled_fisher_mala_warmup

MEAN = np.array([1.0, -1.0, 0.5, 2.0])
SD = np.array([0.1, 1.0, 3.0, 0.5])
CORR = np.array(
    [[1.0, 0.8, 0.0, 0.0], [0.8, 1.0, 0.3, 0.0], [0.0, 0.3, 1.0, -0.5], [0.0, 0.0, -0.5, 1.0]]
)
COV = CORR * np.outer(SD, SD)
TARGET = fm.targets.gaussian("test4", MEAN, COV)


def _run(sampler="fisher_mala", num_chains=3, **kwargs):
    kwargs.setdefault("num_warmup", 4000)
    kwargs.setdefault("num_samples", 2000)
    positions = TARGET.initial_positions(jax.random.key(1), num_chains)
    return fm.sample(jax.random.key(0), sampler, TARGET.logdensity_fn, positions, **kwargs)


@pytest.fixture(scope="module")
def fisher_result():
    return _run()


def test_result_shapes_and_bookkeeping(fisher_result):
    r = fisher_result
    assert r.samples.shape == (3, 2000, 4)
    for key in ("logdensity", "acceptance_rate", "is_accepted", "proposal_is_finite"):
        assert r.sample_stats[key].shape == (3, 2000)
    assert r.parameters.sqrt_precond.shape == (3, 4, 4)
    assert r.parameters.step_size.shape == (3,)
    assert r.warmup_info.acceptance_rate.shape == (3, 4000)
    # one gradient per iteration, plus the initial one and the step-size search
    search = np.asarray(r.warmup_info.num_grad_evals) - 1 - 4000
    assert np.all(search > 0)
    np.testing.assert_array_equal(r.num_grad_evals, 1 + search + 4000 + 2000)
    assert r.compile_seconds > 0 and r.warmup_seconds > 0 and r.sampling_seconds > 0
    # the frozen phase keeps the tuned parameters
    np.testing.assert_array_equal(r.final_state.sqrt_precond, r.parameters.sqrt_precond)


def test_samples_have_the_target_moments(fisher_result):
    """MCSE z-scores of the means, with the paper's ESS per chain summed over chains."""
    x = np.asarray(fisher_result.samples)
    ess = fm.ess(fisher_result, method="paper", per_chain=False)
    mean = x.mean(axis=(0, 1))
    z = (mean - MEAN) / (x.std(axis=(0, 1)) / np.sqrt(ess))
    assert np.all(np.abs(z) < 4.0), z
    rate = float(np.mean(fisher_result.sample_stats["acceptance_rate"]))
    assert abs(rate - 0.574) < 0.1


def test_thinning_and_pytree_positions():
    def logdensity(p):
        return TARGET.logdensity_fn(jnp.concatenate([p["a"], p["b"]]))

    positions = {"a": jnp.zeros((2, 1)), "b": jnp.ones((2, 3))}
    r = fm.sample(
        jax.random.key(0),
        "mala",
        logdensity,
        positions,
        num_warmup=200,
        num_samples=300,
        thinning=3,
    )
    assert r.samples["a"].shape == (2, 100, 1) and r.samples["b"].shape == (2, 100, 3)
    assert r.sample_stats["logdensity"].shape == (2, 100)
    idata = fm.to_arviz(r)
    assert set(idata["posterior"].data_vars) == {"a", "b"}


def test_warmup_trace_at_an_interval():
    warmup = fm.fisher_mala_warmup(
        TARGET.logdensity_fn, num_mala_steps=100, trace_every=200, record_precond=True
    )
    (state, params), info = warmup.run(jax.random.key(0), jnp.zeros(4), 1100)
    assert info.trace.iteration.tolist() == [300, 500, 700, 900, 1100]
    assert info.trace.normalized_precond.shape == (5, 4, 4)
    np.testing.assert_allclose(
        jnp.trace(info.trace.normalized_precond, axis1=1, axis2=2), 4.0, rtol=1e-5
    )
    assert int(state.count) == 1000 and info.acceptance_rate.shape == (1100,)
    assert float(params.step_size) == float(state.step_size)


@pytest.mark.parametrize("pooled", [False, True])
def test_a_warmup_stopped_and_resumed_is_the_same_chain(pooled):
    """``run(..., stop_after=k)`` then ``resume`` by blocks equals one ``run``."""
    options = dict(num_mala_steps=20, trace_every=100, record_precond=True)
    key = jax.random.key(0)
    if pooled:
        warmup = pooled_fisher_mala_warmup(TARGET.logdensity_fn, **options)
        x0 = jnp.zeros((3, 4))
        run, resume = warmup.run, warmup.resume
    else:
        warmup = fisher_mala_warmup(TARGET.logdensity_fn, **options)
        x0 = jnp.zeros(4)
        run, resume = warmup.run, warmup.resume
    whole = run(key, x0, 420)
    carry, info = run(key, x0, 420, stop_after=220)
    assert info.acceptance_rate.shape[-1] == 220
    assert info.trace.iteration.tolist() == [120, 220]
    for num_more in (100, 100):  # one block at a time, the info of each appended
        carry, more = resume(key, carry, 420, None, num_more)
        assert more.acceptance_rate.shape[-1] == num_more
        info = extend_info(info, more)
    chex.assert_trees_all_equal((carry, info), whole)


def test_step_size_search_brackets_the_target():
    target = fm.targets.inhomogeneous_gaussian()
    x0 = jnp.zeros(100)
    for guess in (1e-7, 1.0, 1e3):
        found = find_reasonable_step_size(jax.random.key(0), target.logdensity_fn, x0, guess)
        step = float(found.step_size)
        assert 1e-6 < step < 1e-3, (guess, step)


@pytest.mark.slow  # 50 s; the search itself is checked above on the same target
@pytest.mark.parametrize("guess", [1e-6, 100.0])
def test_initial_guess_does_not_matter(guess):
    """On the inhomogeneous target (smallest scale 0.01) the learned step is the same."""
    target = fm.targets.inhomogeneous_gaussian()
    positions = target.initial_positions(jax.random.key(3), 2)
    kwargs = dict(num_warmup=3000, num_samples=3000, initial_step_size=guess)
    r = fm.sample(jax.random.key(0), "fisher_mala", target.logdensity_fn, positions, **kwargs)
    ref = fm.sample(
        jax.random.key(0),
        "fisher_mala",
        target.logdensity_fn,
        positions,
        num_warmup=3000,
        num_samples=3000,
    )

    def paper_min(result):
        return fm.ess(result, method="paper", per_chain=True).min(axis=1).mean()

    ratio = paper_min(r) / paper_min(ref)
    assert 0.5 < ratio < 2.0, ratio
    # without the search the MALA phase is wasted and the chain is far worse
    if guess == 100.0:
        bad = fm.sample(
            jax.random.key(0),
            "fisher_mala",
            target.logdensity_fn,
            positions,
            find_step_size=False,
            **kwargs,
        )
        assert paper_min(bad) < 0.5 * paper_min(ref)


def test_custom_sampling_algorithm_is_accepted():
    alg = fm.mala(TARGET.logdensity_fn, step_size=0.01)
    r = fm.sample(
        jax.random.key(0),
        alg,
        TARGET.logdensity_fn,
        jnp.zeros((2, 4)),
        num_warmup=100,
        num_samples=100,
    )
    assert r.samples.shape == (2, 100, 4) and r.sampler == "custom"


def test_progress_bar_runs_and_updates_idempotently(capsys):
    bar = ProgressBar(100, "x", every=10)
    bar.update_to(50)
    bar.update_to(50)
    bar.update_to(30)
    assert bar._bar.n == 50
    bar.close()
    r = _run("mala", num_chains=2, num_warmup=300, num_samples=300, progress_bar=True)
    assert r.samples.shape == (2, 300, 4)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(sampler="nuts"), "sampler"),
        (dict(num_samples=0), "num_samples"),
        (dict(num_warmup=-1), "num_warmup"),
        (dict(thinning=0), "thinning"),
        (dict(thinning=5000), "thinning"),
        (dict(initial_positions=jnp.zeros((2, 3))), "logdensity_fn"),
        (dict(initial_positions=jnp.asarray(0.0)), "chain axis"),
        (dict(initial_positions={"a": jnp.zeros((2, 2)), "b": jnp.zeros((3, 2))}), "chains"),
        (dict(initial_positions=jnp.array([[0.0] * 4, [jnp.nan] * 4])), "position"),
        (dict(damping=-1.0), "damping"),
        (dict(signal="nope"), "signal"),
        (dict(bogus_option=1), "bogus_option"),
    ],
)
def test_sample_rejects_bad_input(kwargs, match):
    args = dict(sampler="fisher_mala", initial_positions=jnp.zeros((2, 4)), num_samples=100)
    args.update(kwargs)
    sampler = args.pop("sampler")
    positions = args.pop("initial_positions")
    with pytest.raises((ValueError, TypeError), match=match):
        fm.sample(jax.random.key(0), sampler, TARGET.logdensity_fn, positions, **args)


def test_sample_rejects_a_chain_outside_the_support():
    def logdensity(x):
        return jnp.where(x[0] > 0, -jnp.inf, -0.5 * jnp.sum(x**2))

    with pytest.raises(ValueError, match="chains \\[1\\]"):
        fm.sample(
            jax.random.key(0),
            "mala",
            logdensity,
            jnp.array([[-1.0, 0.0], [1.0, 0.0]]),
            num_samples=10,
        )


def test_arviz_export_works_with_arviz_functions(fisher_result):
    import arviz as az

    idata = fm.to_arviz(fisher_result)
    table = az.summary(idata)
    assert len(table) == 4 and "ess_bulk" in table.columns
    bulk = np.asarray(az.ess(idata, method="bulk")["x"])
    # fm.ess is vectorized in float64 (fisher_mala.convergence); ArviZ on these float32 draws
    # agrees to rounding (tests/test_convergence.py: 1e-6 relative on float64 draws)
    np.testing.assert_allclose(bulk, fm.ess(fisher_result, "bulk", per_chain=False), rtol=1e-6)
    assert set(idata["sample_stats"].data_vars) >= {
        "lp",
        "acceptance_rate",
        "step_size",
        "diverging",
    }


@pytest.mark.slow  # 42 s; tests/test_distributed.py checks sharded runs against one device
def test_sharded_chains_match_a_single_device_run():
    code = textwrap.dedent(
        """
        import jax, numpy as np, fisher_mala as fm
        assert len(jax.devices()) == 4
        t = fm.targets.gp_gaussian()
        x0 = t.initial_positions(jax.random.key(1), 4)
        r = fm.sample(jax.random.key(0), "fisher_mala", t.logdensity_fn, x0,
                      num_warmup=600, num_samples=300)
        assert len(r.devices) == 4, r.devices
        np.save("{out}", np.asarray(r.samples))
        """
    )
    env_flags = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"sharded_{os.getpid()}.npy")
    proc = subprocess.run(
        [sys.executable, "-c", code.format(out=out)],
        capture_output=True,
        text=True,
        env={**os.environ, **env_flags},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    sharded = np.load(out)
    t = fm.targets.gp_gaussian()
    x0 = t.initial_positions(jax.random.key(1), 4)
    single = fm.sample(
        jax.random.key(0), "fisher_mala", t.logdensity_fn, x0, num_warmup=600, num_samples=300
    )
    np.testing.assert_allclose(sharded, np.asarray(single.samples), rtol=1e-3, atol=1e-3)


def test_sequential_chains_give_the_vectorized_draws(x64):
    """chain_method="sequential" runs the same per-chain keys one chain after the other."""
    target = fm.targets.get("gaussian_2d")
    x0 = target.initial_positions(jax.random.key(0), 3, jnp.float64)
    runs = [
        fm.sample(
            jax.random.key(1),
            "fisher_mala",
            target.logdensity_fn,
            x0,
            num_warmup=300,
            num_samples=50,
            chain_method=m,
        )
        for m in ("vectorized", "sequential")
    ]
    np.testing.assert_allclose(runs[0].samples, runs[1].samples, rtol=1e-6, atol=1e-8)
    with pytest.raises(ValueError, match="chain_method"):
        fm.sample(jax.random.key(1), "mala", target.logdensity_fn, x0, chain_method="parallel")


def test_auto_chain_method_follows_dimension_and_chains_per_device():
    from fisher_mala import sampling

    def method(name, dim, chains, devices=1, shared=0):
        mesh = None
        if devices > 1:  # only its "chain" axis size is read
            mesh = types.SimpleNamespace(shape={"chain": devices})
        trajectory = fm.registry.get(name).trajectory
        x0 = jnp.zeros((chains, dim))
        return sampling._auto_chain_method(trajectory, x0, mesh, lambda: shared)

    small, mid = sampling.SEQUENTIAL_MAX_DIM, sampling.SEQUENTIAL_MAX_DIM_SMALL_BATCH
    assert method("fisher_nuts", small, 4) == "sequential"
    assert method("fisher_nuts", small + 1, 4) == "vectorized"  # four chains on one device
    assert method("fisher_hmc", mid, 4, devices=2) == "sequential"  # two per device
    assert method("fisher_nuts", mid, 2) == "sequential"
    data = sampling.SHARED_BYTES_FOR_BATCH  # above `mid`, batched for shared data only
    assert method("fisher_nuts", mid + 1, 4, devices=2, shared=data) == "vectorized"
    assert method("fisher_nuts", mid + 1, 4, devices=2) == "sequential"
    assert method("fisher_mala", 3, 4) == "vectorized"  # one gradient per step: batch


def test_auto_chain_method_batches_large_dimensions_only_for_shared_data():
    """Above ``SEQUENTIAL_MAX_DIM_SMALL_BATCH``, NUTS and HMC on a CPU run one chain after
    the other unless the log density reads ``SHARED_BYTES_FOR_BATCH`` bytes of captured
    arrays or ``data`` (which a batch of chains reads once per step)."""
    from fisher_mala import sampling

    dim = sampling.SEQUENTIAL_MAX_DIM_SMALL_BATCH + 1
    x0 = jnp.zeros((4, dim))
    big = np.ones(sampling.SHARED_BYTES_FOR_BATCH // 4 + 1, np.float32)  # just over the bound
    small = np.ones(1000, np.float32)

    def with_constant(constant):
        return lambda x: -0.5 * jnp.sum(x**2) + 0.0 * jnp.sum(jnp.asarray(constant))

    def plain(x):
        return -0.5 * jnp.sum(x**2)

    def with_data(x, data):
        return -0.5 * jnp.sum(x**2) + 0.0 * jnp.sum(data)

    assert sampling._shared_bytes(plain, x0) == 0
    assert sampling._shared_bytes(with_constant(big), x0) == big.nbytes
    assert sampling._shared_bytes(with_data, x0, jnp.asarray(small)) == small.nbytes

    def method(logdensity, data=None, trajectory=True):
        shared = lambda: sampling._shared_bytes(logdensity, x0, data)  # noqa: E731
        return sampling._auto_chain_method(trajectory, x0, None, shared)

    assert method(plain) == "sequential"
    assert method(with_constant(small)) == "sequential"
    assert method(with_constant(big)) == "vectorized"
    assert method(with_data, jnp.asarray(big)) == "vectorized"
    assert method(plain, trajectory=False) == "vectorized"  # MALA: one gradient per step
    # at most the small-batch bound, the dimension alone decides (no trace of the density)
    assert sampling._auto_chain_method(True, x0[:, :-1], None, lambda: 1 / 0) == "vectorized"


def test_auto_chain_method_asks_large_dimensions_for_data_in_proportion():
    """The batch's selects copy every chain's carried vectors, so above about d = 4000 the
    shared data that makes a batch pay grows with ``d``: ``SHARED_WORDS_PER_COORDINATE_
    FOR_BATCH`` words of the position's dtype per coordinate."""
    from fisher_mala import sampling

    dim = 10_000
    for dtype in (np.float32, np.float64):
        x0 = np.zeros((4, dim), dtype)
        bound = sampling.SHARED_WORDS_PER_COORDINATE_FOR_BATCH * np.dtype(dtype).itemsize * dim
        assert bound > sampling.SHARED_BYTES_FOR_BATCH

        def method(shared, x0=x0):
            return sampling._auto_chain_method(True, x0, None, lambda: shared)

        assert method(bound - 1) == "sequential"
        assert method(bound) == "vectorized"
        assert method(sampling.SHARED_BYTES_FOR_BATCH) == "sequential"  # enough at d = 1000


def test_starts_checked_by_the_caller_skip_only_the_compiled_evaluation():
    """``fm.sample_numpyro`` hands ``fm.sample`` points NumPyro found with a finite value
    and gradient: inside ``_starts_checked`` they are not evaluated again; the shape
    checks still run, and outside it a non-finite start is refused as before."""
    from fisher_mala.sampling import _check_initial_positions, _starts_checked

    def logdensity(x):
        return jnp.sum(jnp.log(x))  # NaN for a negative coordinate

    starts = jnp.asarray([[1.0, -1.0], [2.0, 3.0]])
    with pytest.raises(ValueError, match="not finite at the initial positions of chains"):
        _check_initial_positions(logdensity, starts)
    with _starts_checked():
        assert _check_initial_positions(logdensity, starts) == 2
        with pytest.raises(ValueError, match="leading chain axis"):
            _check_initial_positions(logdensity, jnp.asarray(1.0))
    with pytest.raises(ValueError, match="not finite at the initial positions of chains"):
        _check_initial_positions(logdensity, starts)


@pytest.mark.parametrize("sampler, options", [("fisher_nuts", {"rank": 4}), ("fisher_mala", {})])
def test_float32_positions_whose_log_density_computes_in_float64(x64, sampler, options):
    """With x64 on, a log density holding NumPy float64 constants returns float64 for
    float32 positions: the run keeps the positions' dtype (its value is cast) instead of
    failing inside the warm-up's loops, whose states are float32."""
    scales = np.linspace(0.5, 2.0, 12)  # float64

    def logdensity(x):
        return -0.5 * jnp.sum((x / scales) ** 2)

    positions = jnp.zeros((2, 12), jnp.float32) + 0.1
    assert logdensity(positions[0]).dtype == jnp.float64
    result = fm.sample(jax.random.key(0), sampler, logdensity, positions, num_warmup=300,
                       num_samples=50, diagnose=False, **options)  # fmt: skip
    assert result.samples.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(result.samples)))
