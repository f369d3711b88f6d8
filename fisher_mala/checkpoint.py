"""Save and restore sampler states (any pytree of arrays) with ``numpy.savez``.

A state is a NamedTuple of arrays, so a checkpoint is its leaves; restoring needs a
*template* of the same structure (e.g. ``alg.init(position)``), which supplies the
types. Resuming from a saved state with the same keys gives bit-identical draws to an
uninterrupted run (``tests/reliability/test_checkpoint.py``)::

    fm.save_state("chain.npz", state)
    state = fm.load_state("chain.npz", like=alg.init(position))
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["save_state", "load_state"]


def _paths(tree) -> list[str]:
    return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def save_state(path, state) -> Path:
    """Write every leaf of ``state`` (and their tree paths, for checking) to ``path``."""
    path = Path(path)
    leaves = jax.tree.leaves(state)
    arrays = {f"leaf_{i:04d}": np.asarray(leaf) for i, leaf in enumerate(leaves)}
    np.savez(path, __paths__=np.asarray(_paths(state)), **arrays)
    return path if path.suffix == ".npz" else path.with_suffix(path.suffix + ".npz")


def load_state(path, like):
    """Read a state saved by :func:`save_state`, with the structure and dtypes of ``like``."""
    with np.load(Path(path)) as data:
        paths = data["__paths__"].tolist()
        expected = _paths(like)
        if paths != expected:
            raise ValueError(
                "The checkpoint does not match the structure of `like`: saved leaves "
                f"{paths[:4]}..., expected {expected[:4]}...; pass a state of the same "
                "algorithm and position structure."
            )
        leaves = [data[f"leaf_{i:04d}"] for i in range(len(paths))]
    template = jax.tree.leaves(like)
    restored = [
        jnp.asarray(x, dtype=jnp.result_type(t)) for x, t in zip(leaves, template, strict=True)
    ]
    return jax.tree.unflatten(jax.tree.structure(like), restored)
