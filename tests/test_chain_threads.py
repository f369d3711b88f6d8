"""Groups of chains run from threads on one XLA:CPU device (fisher_mala.chain_threads)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisher_mala as fm
from fisher_mala import chain_threads, sampling


@pytest.mark.parametrize(
    "chains, cores, groups", [(4, 2, 2), (3, 2, 1), (6, 4, 3), (1, 8, 1), (8, 16, 8), (5, 1, 1)]
)
def test_groups_are_the_largest_divisor_of_the_chains_up_to_the_cores(chains, cores, groups):
    assert chain_threads.chain_groups(chains, cores) == groups


def test_a_grouped_program_gives_every_chain_what_one_program_gives():
    def fn(keys, x, scale):  # per chain: its key's draw, its own value, a shared argument
        return jax.vmap(lambda k, v: v * scale + jax.random.normal(k, v.shape))(keys, x), x.sum(-1)

    keys = jax.random.split(jax.random.key(0), 6)
    x = jnp.arange(18.0).reshape(6, 3)
    whole = jax.jit(fn)(keys, x, 2.0)
    for groups in (2, 3, 6):
        grouped = chain_threads.GroupedExecutable(fn, (keys, x, 2.0), groups, mapped=2)
        out = grouped(keys, x, 2.0)
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(whole), strict=True):
            assert a.shape == b.shape
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _sample(monkeypatch, groups, sampler, dtype, **options):
    monkeypatch.setattr(sampling, "chain_groups", lambda num_chains: groups)
    scales = jnp.asarray([0.5, 1.0, 2.0], dtype)

    def logdensity(x):
        return -0.5 * jnp.sum((x / scales) ** 2)

    x0 = jnp.asarray(np.linspace(-1.0, 1.0, 12).reshape(4, 3), dtype)
    return fm.sample(jax.random.key(3), sampler, logdensity, x0, num_warmup=300,
                     num_samples=50, diagnose=False, **options)  # fmt: skip


@pytest.mark.parametrize("sampler", ["fisher_mala", "fisher_nuts"])
def test_two_groups_of_chains_draw_what_one_batch_draws(monkeypatch, sampler):
    """One chain after the other (NUTS at this d) computes each chain alike whatever the
    group: the draws are bit-identical. A batch of two chains may round a product
    differently from a batch of four (XLA's code follows the shapes): equal to rounding.
    Float64 under ``jax.enable_x64``, whose thread-local setting the groups' threads take
    from the caller."""
    with jax.enable_x64(True):
        one = _sample(monkeypatch, 1, sampler, jnp.float64)
        two = _sample(monkeypatch, 2, sampler, jnp.float64)
    assert np.asarray(two.samples).dtype == np.float64
    if sampler == "fisher_nuts":
        np.testing.assert_array_equal(np.asarray(two.samples), np.asarray(one.samples))
    else:
        np.testing.assert_allclose(np.asarray(two.samples), np.asarray(one.samples), rtol=1e-9)
    np.testing.assert_array_equal(np.asarray(two.num_grad_evals), np.asarray(one.num_grad_evals))


def _grouped_builds(monkeypatch) -> list[int]:
    """The groups of every grouped program built from now on, in a list that fills."""
    built = []
    original = chain_threads.GroupedExecutable.__init__

    def counted(self, fn, args, groups, mapped):
        built.append(groups)
        original(self, fn, args, groups, mapped)

    monkeypatch.setattr(chain_threads.GroupedExecutable, "__init__", counted)
    return built


def test_pooled_chains_run_as_one_program(monkeypatch):
    """Chains that share one ``R`` exchange their signals at every iteration: never split."""
    built = _grouped_builds(monkeypatch)
    result = _sample(monkeypatch, 2, "fisher_mala", jnp.float32, pooled=True)
    assert built == [] and np.all(np.isfinite(np.asarray(result.samples)))


def test_batched_chains_are_grouped_up_to_groups_max_dim_sequential_ones_always(monkeypatch):
    """Above GROUPS_MAX_DIM XLA spreads a batch's products over the cores itself; one
    chain's matrix-vector products stay on one core, so sequential chains are grouped at
    every dimension. Never with a mesh (the chains are placed on devices)."""
    monkeypatch.setattr(sampling, "chain_groups", lambda num_chains: 2)
    small = jnp.zeros((4, sampling.GROUPS_MAX_DIM))
    large = {"a": jnp.zeros((4, sampling.GROUPS_MAX_DIM)), "b": jnp.zeros((4, 1))}
    assert sampling._groups(4, small, None) == 2
    assert sampling._groups(4, large, None) == 1
    assert sampling._groups(4, large, None, "vectorized") == 1
    assert sampling._groups(4, large, None, "sequential") == 2
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("chain",))
    assert sampling._groups(4, small, mesh) == 1
    assert sampling._groups(4, large, mesh, "sequential") == 1


def test_sequential_chains_above_groups_max_dim_run_in_groups_and_draw_the_same(monkeypatch):
    """Fisher NUTS with ``rank=8`` above GROUPS_MAX_DIM runs its chains one after the other
    (``chain_method="auto"`` on a CPU), now in two groups from threads: every compiled
    stage is a grouped program, and the draws are bit-identical to one program's."""
    dim = sampling.GROUPS_MAX_DIM + 16
    scales = jnp.linspace(0.5, 2.0, dim)

    def run(groups):
        monkeypatch.setattr(sampling, "chain_groups", lambda num_chains: groups)
        x0 = jax.random.normal(jax.random.key(1), (4, dim)) * 0.1
        return fm.sample(jax.random.key(2), "fisher_nuts",
                         lambda x: -0.5 * jnp.sum((x / scales) ** 2), x0, num_warmup=200,
                         num_samples=40, rank=8, diagnose=False)  # fmt: skip

    built = _grouped_builds(monkeypatch)
    one = run(1)
    assert built == []
    two = run(2)
    assert built and set(built) == {2}
    np.testing.assert_array_equal(np.asarray(two.samples), np.asarray(one.samples))
    np.testing.assert_array_equal(np.asarray(two.num_grad_evals), np.asarray(one.num_grad_evals))


def test_a_forked_child_starts_its_own_pool():
    """After a fork (``os.register_at_fork``) the pool is forgotten and made anew."""

    def fn(x):
        return x * 2.0

    x = jnp.arange(4.0)
    grouped = chain_threads.GroupedExecutable(fn, (x,), 2, mapped=1)
    np.testing.assert_array_equal(np.asarray(grouped(x)), np.asarray(x) * 2.0)
    chain_threads._forget_pool()  # what the child runs after a fork
    assert chain_threads._POOL is None
    np.testing.assert_array_equal(np.asarray(grouped(x)), np.asarray(x) * 2.0)
    assert chain_threads._POOL is not None
