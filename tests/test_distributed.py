"""Scale-out (fm.sample's ``mesh`` and ``data``; several processes), on simulated CPU devices.

Each test starts fresh processes: the device count of a JAX process is fixed when its
backend starts (``--xla_force_host_platform_device_count``).
"""

import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import fisher_mala as fm

WORKER = Path(__file__).with_name("distributed_worker.py")


def _run(tmp_path, devices, num_processes=1, samplers="fisher_mala"):
    with socket.socket() as s:  # a free port for the coordinator
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    out = tmp_path / "out.npz"
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(devices), str(i), str(num_processes), str(port),
             str(out), samplers],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(num_processes)
    ]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-3000:]
    return dict(np.load(out))


@pytest.fixture(scope="module")
def eight_devices(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("eight"), 8)


def test_data_parallel_draws_equal_one_device(eight_devices):
    # mesh (chain=2, data=4): two chains per slice, each slice's rows over 4 devices
    assert eight_devices["data_fisher_mala_devices"] == 8
    np.testing.assert_array_less(np.abs(eight_devices["data_fisher_mala"]), 1e-8)


@pytest.mark.slow
def test_data_parallel_fisher_nuts_draws_equal_one_device(tmp_path):
    out = _run(tmp_path, 8, samplers="fisher_nuts")
    np.testing.assert_array_less(np.abs(out["data_fisher_nuts"]), 1e-8)


def test_data_parallel_gradient_moves_sums_not_data(eight_devices):
    # one all-reduce of the chains' (log density, gradient), nothing of the 4000 x 5 rows
    ops = list(eight_devices["data_collectives"])
    assert ops and all(op.startswith("all-reduce") for op in ops), ops
    assert not any("4000" in op or "1000" in op for op in ops), ops


def test_sharded_preconditioner_draws_equal_one_device(eight_devices):
    np.testing.assert_array_less(np.abs(eight_devices["precond_fisher_mala"]), 1e-8)
    assert "precond" in list(eight_devices["precond_fisher_mala_spec"])


@pytest.mark.slow
def test_sharded_pooled_preconditioner_draws_equal_one_device(tmp_path):
    # chains on 2 slices share one R (XLA gathers their signals), R's rows over 4 devices
    out = _run(tmp_path, 8, samplers="fisher_mala,fisher_mala_pooled")
    np.testing.assert_array_less(np.abs(out["precond_fisher_mala_pooled"]), 1e-8)
    assert "precond" in list(out["precond_fisher_mala_pooled_spec"])


@pytest.mark.slow
def test_two_processes_draw_what_one_process_draws(tmp_path):
    out = _run(tmp_path, 4, num_processes=2)
    assert out["devices"] == 8
    with jax.enable_x64(True):
        target = fm.targets.synthetic_logistic_regression(2000, 5, seed=1)
        x0 = target.initial_positions(jax.random.key(0), 8, np.float64)
        single = fm.sample(jax.random.key(1), "fisher_mala", target.logdensity_fn, x0,
                           num_warmup=300, num_samples=100, diagnose=False)
        on_one = fm.sample(jax.random.key(1), "fisher_mala", target.logdensity_fn, x0[:4],
                           num_warmup=300, num_samples=100, diagnose=False)
    np.testing.assert_array_less(np.abs(out["fisher_mala"] - np.asarray(single.samples)), 1e-8)
    # data rows over a "data" axis whose devices belong to both processes
    np.testing.assert_array_less(np.abs(out["data_fisher_mala"] - np.asarray(on_one.samples)),
                                 1e-8)


def test_mesh_without_a_chain_axis_is_a_clear_error():
    mesh = jax.make_mesh((1,), ("data",))
    with pytest.raises(ValueError, match="'chain' axis"):
        fm.sample(jax.random.key(0), "mala", lambda x: -0.5 * x @ x, np.zeros((2, 3)),
                  num_warmup=10, num_samples=10, mesh=mesh)


def test_data_is_an_argument_of_the_log_density():
    target = fm.targets.synthetic_logistic_regression(500, 3, seed=2)
    fn, data = target.extras["logdensity_with_data"], target.extras["data"]
    x = np.asarray([0.3, -0.2, 0.1], np.float32)
    np.testing.assert_allclose(fn(x, data), target.logdensity_fn(x), rtol=1e-5)
    result = fm.sample(jax.random.key(0), "fisher_mala", fn, np.zeros((2, 3), np.float32),
                       num_warmup=200, num_samples=100, data=data, diagnose=False)
    reference = fm.sample(jax.random.key(0), "fisher_mala", target.logdensity_fn,
                          np.zeros((2, 3), np.float32), num_warmup=200, num_samples=100,
                          diagnose=False)
    np.testing.assert_allclose(result.samples, reference.samples, atol=1e-4)
    with pytest.raises(ValueError, match="named sampler"):
        fm.sample(jax.random.key(0), fm.mala(lambda x: fn(x, data), 0.1), fn,
                  np.zeros((2, 3), np.float32), data=data)


def test_shard_rows_names_a_missing_axis():
    mesh = jax.make_mesh((1,), ("chain",))
    with pytest.raises(ValueError, match="no 'data' axis"):
        fm.sharding.shard_rows({"X": np.zeros((4, 2))}, mesh)
