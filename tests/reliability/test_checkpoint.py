"""Checkpoint and resume: the same draws as an uninterrupted run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisher_mala as fm


def test_save_and_resume_mid_run_gives_the_same_draws(tmp_path):
    target = fm.targets.get("heart")
    alg = fm.fisher_mala(target.logdensity_fn, step_size=1e-4)
    key = jax.random.key(0)

    def run(state, start, stop):
        def body(s, i):
            s, _ = alg.step(jax.random.fold_in(key, i), s)
            return s, s.position

        return jax.lax.scan(body, state, jnp.arange(start, stop))

    state0 = alg.init(jnp.zeros(target.dim))
    full_state, full_draws = run(state0, 0, 600)
    half_state, first = run(state0, 0, 300)
    path = fm.save_state(tmp_path / "checkpoint.npz", half_state)
    resumed = fm.load_state(path, like=state0)
    end_state, second = run(resumed, 300, 600)
    np.testing.assert_array_equal(np.concatenate([first, second]), full_draws)
    for a, b in zip(jax.tree.leaves(end_state), jax.tree.leaves(full_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_loading_into_the_wrong_structure_fails_clearly(tmp_path):
    state = fm.fisher_mala(lambda x: -jnp.sum(x**2), 0.1).init(jnp.zeros(2))
    path = fm.save_state(tmp_path / "s.npz", state)
    other = fm.mala(lambda x: -jnp.sum(x**2), 0.1).init(jnp.zeros(2))
    with pytest.raises(ValueError, match="structure"):
        fm.load_state(path, like=other)
