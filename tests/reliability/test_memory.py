"""Bounded memory: kept functions of the position, draws streamed to files in blocks, and a
clear error before the warm-up when the draws cannot fit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisher_mala as fm
from fisher_mala import sinks


def logdensity(x):
    return -0.5 * jnp.sum(x**2 / jnp.arange(1.0, 5.0))


def _run(**kwargs):
    return fm.sample(jax.random.key(3), "fisher_mala", logdensity, jnp.zeros((2, 4)),
                     num_warmup=600, num_samples=300, diagnose=False, **kwargs)


@pytest.fixture(scope="module")
def whole():
    return _run()


def test_blocks_streamed_to_files_are_the_same_draws(whole, tmp_path, monkeypatch):
    """Blocks of 30 draws (the largest divisor of 300 within 32 draws) written to
    memory-mapped files: bit for bit the draws of one block in memory."""
    monkeypatch.setattr(fm.sampling, "BLOCK_BYTES", 32 * 2 * (16 + fm.sampling.STAT_BYTES_PER_DRAW))
    streamed = _run(output=tmp_path / "run")
    assert isinstance(streamed.samples, np.memmap)
    np.testing.assert_array_equal(streamed.samples, whole.samples)
    for name, value in whole.sample_stats.items():
        np.testing.assert_array_equal(streamed.sample_stats[name], value, err_msg=name)
    samples, _, done = sinks.read_output(tmp_path / "run")
    assert done == 300 and samples["x"].shape == (2, 300, 4)
    tree = sinks.read_output(tmp_path / "run", as_arviz=True)
    assert tree.posterior["x"].shape[:2] == (2, 300)
    assert fm.diagnose(streamed).ess_bulk.shape == (4,)


def test_keep_a_function_of_the_position(whole):
    kept = _run(keep=lambda x: {"first": x[:2], "norm": jnp.sum(x**2)})
    np.testing.assert_array_equal(kept.samples["first"], np.asarray(whole.samples)[..., :2])
    np.testing.assert_allclose(
        kept.samples["norm"], np.sum(np.asarray(whole.samples) ** 2, axis=-1), rtol=1e-6
    )
    assert fm.diagnose(kept).names == ["first[0]", "first[1]", "norm"]


def test_draws_that_cannot_fit_stop_before_the_warm_up(monkeypatch):
    def no_compile(*args, **kwargs):
        raise AssertionError("compiled before the memory check")

    monkeypatch.setattr(fm.sampling, "_compile_and_run", no_compile)
    monkeypatch.setattr(sinks, "available_bytes", lambda: (10_000_000, None))
    with pytest.raises(MemoryError, match=r"thinning.*keep=.*output="):
        fm.sample(jax.random.key(0), "fisher_mala", logdensity, jnp.zeros((4, 4)),
                  num_warmup=100, num_samples=1_000_000)
    with pytest.raises(TypeError, match="keep"):
        fm.sample(jax.random.key(0), "mala", logdensity, jnp.zeros((2, 4)), keep=3)
