"""Same key, same draws: in one process, across processes, vmapped or chain by chain."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

import fisher_mala as fm

CODE = """
import jax, numpy as np, fisher_mala as fm
t = fm.targets.get("german")
x0 = t.initial_positions(jax.random.key(1), 3)
r = fm.sample(jax.random.key(0), "fisher_mala", t.logdensity_fn, x0, num_warmup=800,
              num_samples=200)
np.save("{path}", np.asarray(r.samples))
"""


def _run():
    t = fm.targets.get("german")
    x0 = t.initial_positions(jax.random.key(1), 3)
    return fm.sample(jax.random.key(0), "fisher_mala", t.logdensity_fn, x0, num_warmup=800,
                     num_samples=200)


def test_same_key_gives_bit_identical_results_in_process_and_across_runs(tmp_path):
    a, b = _run(), _run()
    np.testing.assert_array_equal(np.asarray(a.samples), np.asarray(b.samples))
    np.testing.assert_array_equal(a.parameters.sqrt_precond, b.parameters.sqrt_precond)
    path = tmp_path / "other.npy"
    proc = subprocess.run([sys.executable, "-c", CODE.format(path=path)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    np.testing.assert_array_equal(np.load(path), np.asarray(a.samples))


def test_vmapped_chains_equal_chains_run_one_by_one():
    t = fm.targets.gp_gaussian()
    alg = fm.fisher_mala(t.logdensity_fn, step_size=0.01)

    def run(key, x):
        state = alg.init(x)
        return jax.lax.scan(lambda s, i: alg.step(jax.random.fold_in(key, i), s), state,
                            jnp.arange(300))[0]

    keys = jax.random.split(jax.random.key(0), 3)
    xs = t.initial_positions(jax.random.key(1), 3)
    batched = jax.jit(jax.vmap(run))(keys, xs)
    for c in range(3):
        single = jax.jit(run)(keys[c], xs[c])
        for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(batched), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[c])


def test_chains_get_independent_keys():
    r = _run()
    x = np.asarray(r.samples)
    # different chains, different draws, and near-zero correlation between chains
    assert not np.array_equal(x[0], x[1])
    corr = np.corrcoef(x[0, :, 0], x[1, :, 0])[0, 1]
    assert abs(corr) < 0.5
