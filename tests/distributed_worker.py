"""A process of the scale-out tests (``tests/test_distributed.py``), not a test module.

    python tests/distributed_worker.py DEVICES PROCESS_ID NUM_PROCESSES PORT OUT.npz [SAMPLERS]

Runs ``fm.sample`` on ``DEVICES`` simulated CPU devices (in each of ``NUM_PROCESSES``
processes joined by ``jax.distributed`` on ``localhost:PORT`` when there are several) and
saves the draws with what the test checks.
"""

import os
import re
import sys

devices, process_id, num_processes, port, out = sys.argv[1:6]
#: The samplers of the data-parallel runs (comma-separated); "fisher_mala" also runs the
#: sharded-R checks, "fisher_mala_pooled" adds the pooled R to them.
DATA_SAMPLERS = (sys.argv[6] if len(sys.argv) > 6 else "fisher_mala").split(",")
PRECOND_RUNS = [("fisher_mala", {})]
if "fisher_mala_pooled" in DATA_SAMPLERS:
    DATA_SAMPLERS.remove("fisher_mala_pooled")
    PRECOND_RUNS = [("fisher_mala_pooled", {"pooled": True})]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)  # draws compared to 1e-8: no float32 rounding
if int(num_processes) > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", int(num_processes), int(process_id))

import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec  # noqa: E402

import fisher_mala as fm  # noqa: E402
from fisher_mala.sampling import map_over_chains  # noqa: E402

RUN = {"num_warmup": 300, "num_samples": 100, "diagnose": False}


def draws(result):
    return np.asarray(result.samples)


def multi_process():
    """8 chains over every process's devices (one chain per device), then 4 chains with
    the data rows over 4 devices (2 in each process)."""
    target = fm.targets.synthetic_logistic_regression(2000, 5, seed=1)
    x0 = target.initial_positions(jax.random.key(0), 8, np.float64)
    result = fm.sample(jax.random.key(1), "fisher_mala", target.logdensity_fn, x0, **RUN)
    devices = np.asarray(jax.devices()).reshape(2, 4).T  # each "data" row spans 2 processes
    mesh = jax.sharding.Mesh(devices, ("chain", "data"))
    data = fm.sharding.shard_rows(target.extras["data"], mesh)
    sharded = fm.sample(jax.random.key(1), "fisher_mala", target.extras["logdensity_with_data"],
                        x0[:4], data=data, mesh=mesh, **RUN)
    return {"fisher_mala": draws(result), "devices": np.asarray(len(result.devices)),
            "data_fisher_mala": draws(sharded)}


def one_process():
    """Data rows and R's rows over mesh axes, against the same runs on one device."""
    auto = (AxisType.Auto, AxisType.Auto)
    out = {}
    target = fm.targets.synthetic_logistic_regression(4000, 5, seed=1)
    x0 = target.initial_positions(jax.random.key(0), 4, np.float64)
    with_data = target.extras["logdensity_with_data"]
    mesh = jax.make_mesh((2, 4), ("chain", "data"), axis_types=auto)
    data = fm.sharding.shard_rows(target.extras["data"], mesh)
    for sampler in DATA_SAMPLERS:
        single = fm.sample(jax.random.key(1), sampler, target.logdensity_fn, x0, **RUN)
        sharded = fm.sample(
            jax.random.key(1), sampler, with_data, x0, data=data, mesh=mesh, **RUN
        )
        out[f"data_{sampler}"] = draws(sharded) - draws(single)
        out[f"data_{sampler}_devices"] = np.asarray(len(sharded.devices))

    # What the data-parallel gradient communicates: one all-reduce of the chains' log
    # densities and gradients, never the data.
    def value_and_grad(x, data):
        return map_over_chains(jax.value_and_grad(with_data), x, mesh=mesh, shared=data)

    x = jax.device_put(np.zeros((4, 5)), NamedSharding(mesh, PartitionSpec("chain")))
    hlo = jax.jit(value_and_grad).lower(x, data).compile().as_text()
    collective = re.compile(
        r"= (.+?) (all-reduce|all-gather|all-to-all|reduce-scatter|collective-permute)\("
    )
    found = [m.groups() for line in hlo.splitlines() if (m := collective.search(line))]
    out["data_collectives"] = np.asarray([f"{op} {shape}" for shape, op in found])

    if "fisher_mala" not in DATA_SAMPLERS:
        return out
    gp = fm.targets.get("gp")
    x0 = gp.initial_positions(jax.random.key(0), 2, np.float64)
    mesh = jax.make_mesh((2, 4), ("chain", "precond"), axis_types=auto)
    for sampler, options in PRECOND_RUNS:
        name = sampler.removesuffix("_pooled")
        single = fm.sample(jax.random.key(1), name, gp.logdensity_fn, x0, **RUN, **options)
        sharded = fm.sample(
            jax.random.key(1), name, gp.logdensity_fn, x0, mesh=mesh, **RUN, **options
        )
        out[f"precond_{sampler}"] = draws(sharded) - draws(single)
        spec = sharded.final_state.sqrt_precond.sharding.spec
        out[f"precond_{sampler}_spec"] = np.asarray([str(a) for a in spec])
    return out


if __name__ == "__main__":
    results = multi_process() if int(num_processes) > 1 else one_process()
    if int(num_processes) == 1 or jax.process_index() == 0:
        np.savez(out, **results)
