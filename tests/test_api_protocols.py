"""Every sampler on BlackJAX's contract (as BlackJAX's own ``tests/test_api_protocols.py``).

For each sampler: the three layers exist, ``init(position, rng_key)`` works, the state is a
pytree of arrays, the jitted step does not retrace, it vmaps over chains and scans, and
``blackjax.util.run_inference_algorithm`` runs it from an initial position.
"""

import importlib
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisher_mala as fm

# The modules themselves (``fm.mala`` is the top-level constructor, as ``blackjax.mala``).
adamala, fisher, hmc, mala, mmala, pooled, whitened_hmc = (
    importlib.import_module(f"fisher_mala.{name}")
    for name in ("adamala", "fisher", "hmc", "mala", "mmala", "pooled", "whitened_hmc")
)

blackjax = pytest.importorskip("blackjax")

DIM = 3
R = jnp.asarray([[1.0, 0.0, 0.0], [0.3, 0.8, 0.0], [0.1, -0.2, 0.5]])
TRACES = []


def logdensity(x):
    TRACES.append(1)  # counts traces: the body runs once per (re)trace
    return -0.5 * jnp.sum((x / jnp.arange(1.0, DIM + 1)) ** 2)


SAMPLERS = {
    "mala": (mala, lambda: fm.mala(logdensity, 0.3)),
    "preconditioned_mala": (mala, lambda: fm.mala(logdensity, 0.3, sqrt_precond=R)),
    "fisher_mala": (fisher, lambda: fm.fisher_mala(logdensity, 0.3)),
    "fisher_mala_frozen": (fisher, lambda: fm.fisher_mala(logdensity, 0.3, adapt=False)),
    "adamala": (adamala, lambda: adamala.as_top_level_api(logdensity, 0.3)),
    "mmala": (mmala, lambda: mmala.as_top_level_api(logdensity, 0.8)),
    "hmc": (hmc, lambda: hmc.as_top_level_api(logdensity, 0.3, 5)),
    "pooled": (pooled, lambda: pooled.as_top_level_api(logdensity, 0.3)),
    "fisher_nuts": (whitened_hmc, lambda: fm.fisher_nuts(logdensity, 0.5, R)),
    "fisher_hmc": (whitened_hmc, lambda: fm.fisher_hmc(logdensity, 0.5, R)),
}
# The pooled kernel moves C chains at once: its position has a leading chain axis.
BATCHED = {"pooled"}


def _position(name):
    return jnp.ones((4, DIM)) if name in BATCHED else jnp.ones(DIM)


@pytest.mark.parametrize("name", SAMPLERS)
def test_three_layers_and_init_signature(name):
    module, make = SAMPLERS[name]
    for layer in ("init", "build_kernel", "as_top_level_api"):
        assert callable(getattr(module, layer)), (name, layer)
    alg = make()
    assert isinstance(alg, fm.SamplingAlgorithm)
    params = list(inspect.signature(alg.init).parameters)
    assert params[:2] == ["position", "rng_key"] or params[:2] == ["positions", "rng_key"]
    assert list(inspect.signature(alg.step).parameters)[:2] == ["rng_key", "state"]
    state = alg.init(_position(name), jax.random.key(0))
    leaves = jax.tree.leaves(state)
    assert leaves and all(isinstance(leaf, jax.Array) for leaf in leaves), name


@pytest.mark.parametrize("name", SAMPLERS)
def test_step_jits_once_vmaps_and_scans(name):
    _, make = SAMPLERS[name]
    alg = make()
    state = alg.init(_position(name))
    state, _ = alg.step(jax.random.key(1), state)
    traces = len(TRACES)
    state, info = alg.step(jax.random.key(2), state)
    assert len(TRACES) == traces, f"{name} retraced its step"
    assert np.isfinite(np.asarray(jax.tree.leaves(info)[0], float)).all()

    keys = jax.random.split(jax.random.key(3), 20)
    final, _ = jax.lax.scan(lambda s, k: alg.step(k, s), state, keys)
    assert jax.tree.structure(final) == jax.tree.structure(state)
    if name not in BATCHED:
        states = jax.vmap(alg.init)(jnp.ones((5, DIM)) * jnp.arange(1.0, 6.0)[:, None])
        moved, _ = jax.vmap(alg.step)(jax.random.split(jax.random.key(4), 5), states)
        assert jnp.shape(moved.position) == (5, DIM)


@pytest.mark.parametrize("name", SAMPLERS)
def test_run_inference_algorithm(name):
    _, make = SAMPLERS[name]
    _, history = blackjax.util.run_inference_algorithm(
        jax.random.key(5), make(), 50, initial_position=_position(name)
    )
    states, _ = history
    assert np.all(np.isfinite(np.asarray(states.position)))
    assert np.asarray(states.position).shape[0] == 50


@pytest.mark.parametrize(
    "make",
    [
        lambda r: fm.mala(logdensity, 0.3, sqrt_precond=r),
        lambda r: fm.fisher_nuts(logdensity, 0.3, r),
    ],
)
def test_a_vector_sqrt_precond_is_refused(make):
    with pytest.raises(ValueError, match="sqrt_precond"):
        make(jnp.ones(DIM))
    with pytest.raises(ValueError, match="sqrt_precond"):  # the kernel's state carries R
        mala.init(jnp.ones(DIM), logdensity, sqrt_precond=jnp.ones(DIM))


def test_fm_sample_accepts_blackjax_algorithms():
    x0 = jnp.ones((2, DIM))
    result = fm.sample(jax.random.key(0), blackjax.mala(logdensity, 0.3), logdensity, x0,
                       num_warmup=50, num_samples=100)
    assert np.asarray(result.samples).shape == (2, 100, DIM)
    assert np.all(result.num_grad_evals == 150)  # one gradient per MALA step
    nuts = blackjax.nuts(logdensity, 0.5, jnp.ones(DIM))
    result = fm.sample(jax.random.key(0), nuts, logdensity, x0, num_warmup=20, num_samples=50)
    # NUTS reports its leapfrog steps: they are the gradient count (about pi * 3 / 0.5 per
    # trajectory on this target's widest scale, far more than one per step)
    assert np.all(result.num_grad_evals > 3 * 70)
    with pytest.raises(TypeError, match="init"):
        fm.sample(jax.random.key(0), object(), logdensity, x0)


def test_changing_r_between_mala_steps_keeps_the_target():
    """An external adaptation may change the state's R at every step, through
    ``with_sqrt_precond`` (which recomputes the cached R^T grad and tr(A)).

    (A state that kept R^T grad from the previous R gave variance 1.22 on N(0, 1).)
    """
    from fisher_mala.mala import with_sqrt_precond

    kernel = mala.build_kernel()
    num = 20000
    x = jax.random.normal(jax.random.key(0), (num, 1))
    ld0 = lambda z: -0.5 * jnp.sum(z**2)  # noqa: E731
    states = jax.vmap(lambda p: with_sqrt_precond(mala.init(p, ld0), jnp.eye(1)))(x)
    ld = lambda z: -0.5 * jnp.sum(z**2)  # noqa: E731

    def one(states, key_and_r):
        key, r = key_and_r
        step = jax.vmap(lambda k, s: kernel(k, with_sqrt_precond(s, r), ld, 1.0))
        return step(jax.random.split(key, num), states)[0], None

    rs = jnp.tile(jnp.asarray([[[0.3]], [[3.0]]]), (10, 1, 1))  # alternate R every step
    keys = jax.random.split(jax.random.key(1), rs.shape[0])
    states, _ = jax.lax.scan(one, states, (keys, rs))
    y = np.asarray(states.position[:, 0], np.float64)
    z_mean = y.mean() / (y.std() / np.sqrt(num))
    z_var = (np.mean(y**2) - 1.0) / (np.std(y**2) / np.sqrt(num))
    assert abs(z_mean) < 4.5 and abs(z_var) < 4.5, (z_mean, z_var)
