"""Where the square root ``R`` lives when a mesh splits it over devices (issue: scale-out).

A ``d x d`` square root in float32 takes ``4 d^2`` bytes: 40 GB at ``d = 10^5``, more than
one device holds. :func:`fisher_mala.sample` with a mesh that has a ``"precond"`` axis
splits ``R``'s **rows** over that axis: every function that makes a new ``R``
(:func:`~fisher_mala.sqrt_precond.initial_sqrt_precond`, the rank-one and rank-C updates)
passes it through :func:`constrain_sqrt_precond`, and XLA partitions the rest:

* ``R w`` (a proposal, the update's ``R u``): each device multiplies its rows, no exchange;
* ``g^T R`` (the whitened gradient): each device's rows give a partial ``d``-vector, summed
  over the axis (an all-reduce of ``d`` numbers);
* the update ``R - (R u) u^T``: local to each device's rows;
* ``tr(R R^T)``: a local sum of squares, then a scalar all-reduce.

The hint is a context (set while ``fm.sample`` traces its loops), so the kernels keep
their signatures and cost nothing when no mesh is given.
"""

import contextlib
import contextvars

import jax
from jax.sharding import NamedSharding, PartitionSpec

__all__ = [
    "DATA_AXIS",
    "PRECOND_AXIS",
    "constrain_sqrt_precond",
    "put_global",
    "shard_rows",
    "sqrt_precond_sharding",
]

#: The mesh axis over which a data set's rows are split (by convention; any axis works).
DATA_AXIS = "data"

#: The mesh axis over which ``R``'s rows are split.
PRECOND_AXIS = "precond"

_SHARDING: contextvars.ContextVar = contextvars.ContextVar("sqrt_precond_sharding", default=None)


def constrain_sqrt_precond(sqrt_precond):
    """``sqrt_precond`` with its rows split over the mesh of :func:`sqrt_precond_sharding`."""
    sharding = _SHARDING.get()
    if sharding is None:
        return sqrt_precond
    return jax.lax.with_sharding_constraint(sqrt_precond, sharding)


@contextlib.contextmanager
def sqrt_precond_sharding(mesh):
    """Within the block, every new ``R`` has its rows over ``mesh``'s ``"precond"`` axis.

    Does nothing when ``mesh`` is ``None`` or has no ``"precond"`` axis.
    """
    if mesh is None or PRECOND_AXIS not in mesh.axis_names:
        yield
        return
    token = _SHARDING.set(NamedSharding(mesh, PartitionSpec(PRECOND_AXIS, None)))
    try:
        yield
    finally:
        _SHARDING.reset(token)


def shard_rows(data, mesh, axis: str = DATA_AXIS):
    """Place every array of ``data`` with its rows (first axis) split over ``mesh[axis]``.

    ``jax.device_put`` with a ``NamedSharding`` does the same in one process; this also
    works under ``jax.distributed`` with several processes, each holding the whole data set
    (each process places only its devices' rows). The number of rows must be a multiple of
    the axis size.
    """
    import numpy as np

    if axis not in mesh.axis_names:
        raise ValueError(f"The mesh has no {axis!r} axis (its axes are {mesh.axis_names}).")
    size = mesh.shape[axis]
    for leaf in jax.tree.leaves(data):
        shape = np.shape(leaf)
        if not shape or shape[0] % size:
            raise ValueError(
                f"An array of shape {shape} cannot be split into {size} equal row blocks."
            )
    return put_global(data, NamedSharding(mesh, PartitionSpec(axis)))


def put_global(tree, sharding):
    """``jax.device_put`` that also works with several processes (same values in each).

    Under ``jax.distributed`` each process places only its own devices' blocks
    (``jax.make_array_from_callback``); PRNG key arrays travel as their key data.
    """
    import jax.numpy as jnp
    import numpy as np

    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)

    def put(leaf):
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            impl = jax.random.key_impl(leaf)
            return jax.random.wrap_key_data(put(jax.random.key_data(leaf)), impl=impl)
        host = np.asarray(leaf)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(put, tree)
