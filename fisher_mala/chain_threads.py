"""The chains of one XLA:CPU device on every core: groups of chains run from threads.

JAX on a CPU is one device unless the process starts with
``--xla_force_host_platform_device_count``; one device runs one program at a time on one
core, and a sampler's loops (NUTS trees, MALA's scan over draws) use no more while their
arrays are small. Two executions of a compiled program started from two threads run at
once, each on its own core. So where the chains are independent (every sampler but the
pooled ones), :func:`sample <fisher_mala.sampling.sample>` compiles each loop for one
group of chains and runs the groups from threads, one per core: one program, draws that
do not depend on the timing, the memory of one call. Batched chains are grouped up to
``fisher_mala.sampling.GROUPS_MAX_DIM`` coordinates (above, XLA spreads a batch's matrix
products over the cores itself, and the groups would compete for them); chains run one
after the other at every dimension (one chain's matrix-vector products stay on one core).
"""

import os
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["chain_groups", "GroupedExecutable"]


def _cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def chain_groups(num_chains: int, cores: int | None = None) -> int:
    """How many groups of chains to run at once on one XLA:CPU device: the largest divisor
    of ``num_chains`` up to the cores (1 on any other backend, with several devices or
    processes: there the chains are placed on devices instead)."""
    if jax.default_backend() != "cpu" or jax.device_count() > 1 or jax.process_count() > 1:
        return 1
    cores = _cores() if cores is None else cores
    return max(g for g in range(1, min(cores, num_chains) + 1) if num_chains % g == 0)


def _join(outs):
    """The groups' outputs joined on their leading axis, on the host (a CPU array's host
    view is its buffer: no compiled concatenation per shape), one array per leaf."""

    def join(*xs):
        if jax.dtypes.issubdtype(jnp.result_type(xs[0]), jax.dtypes.prng_key):
            return jnp.concatenate(xs)
        return jax.device_put(np.concatenate([np.asarray(x) for x in xs]))

    return jax.tree.map(join, *outs)


#: One pool for every grouped call of the process (its threads only wait on XLA), and
#: its number of threads.
_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0


def _pool(groups: int) -> ThreadPoolExecutor:
    global _POOL, _POOL_SIZE
    if _POOL is None or _POOL_SIZE < groups:
        _POOL, _POOL_SIZE = (
            ThreadPoolExecutor(groups, thread_name_prefix="fisher_mala_chains"),
            groups,
        )
    return _POOL


def _forget_pool() -> None:
    """A forked child has none of its parent's threads: it starts a pool of its own."""
    global _POOL
    _POOL = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


class GroupedExecutable:
    """``fn`` compiled for one group of chains, called on every group from threads.

    The program takes the group's index and every argument whole, and slices the group's
    chains (leading axis) out of the first ``mapped`` arguments itself; every output has
    the chains on its leading axis. Calling this object runs the groups at once and joins
    their outputs in chain order.
    """

    def __init__(self, fn, args, groups: int, mapped: int):
        size = int(jnp.shape(jax.tree.leaves(args[:mapped])[0])[0]) // groups

        def of_group(index, *args):
            part = jax.tree.map(
                lambda x: jax.lax.dynamic_slice_in_dim(x, index * size, size), args[:mapped]
            )
            return fn(*part, *args[mapped:])

        self.compiled = jax.jit(of_group).lower(np.int32(0), *args).compile()
        self.groups = groups

    def __call__(self, *args):
        x64 = jax.config.jax_enable_x64  # a thread's own setting: the caller's, passed on

        def run(index):
            with jax.enable_x64(x64):
                return jax.block_until_ready(self.compiled(np.int32(index), *args))

        return _join(list(_pool(self.groups).map(run, range(self.groups))))
