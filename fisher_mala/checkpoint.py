"""Save and restore sampler states (any pytree of arrays), atomically and checked.

A state is a NamedTuple of arrays, so a checkpoint is its leaves; restoring needs a
*template* of the same structure (e.g. ``alg.init(position)``), which supplies the
types. Resuming from a saved state with the same keys gives bit-identical draws to an
uninterrupted run (``tests/reliability/test_checkpoint.py``)::

    fm.save_state("chain.npz", state)
    state = fm.load_state("chain.npz", like=alg.init(position))

Crash safety. :func:`save_state` writes a temporary file in the same directory, flushes
and ``fsync``s it, then renames it over ``path`` (atomic on POSIX) and ``fsync``s the
directory: a process killed at any moment leaves either the previous checkpoint or the
new one, never a torn file.

Trust. :func:`load_state` never unpickles (``allow_pickle=False``), refuses a file whose
arrays would expand beyond a size bound before reading any of them, and checks every
leaf against the template: its tree path, shape and dtype (a float64 checkpoint is not
silently cast into a float32 run), that floating-point leaves are finite, and that every
leaf named ``step_size`` is positive.
"""

import os
import tempfile
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["save_state", "load_state", "atomic_write", "save_tree", "load_tree"]

#: A checkpoint may hold at most this many bytes beyond its template's arrays (the tree
#: paths and the archive's headers).
OVERHEAD_BYTES = 1 << 20


def _paths(tree) -> list[str]:
    return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _is_key(leaf) -> bool:
    return jnp.issubdtype(jnp.result_type(leaf), jax.dtypes.prng_key)


def _to_numpy(leaf) -> np.ndarray:
    """A leaf as numpy (a typed PRNG key as its raw data)."""
    if _is_key(leaf):
        return np.asarray(jax.random.key_data(leaf))
    return np.asarray(leaf)


def _spec(leaf) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a leaf as saved (no transfer from the device)."""
    if _is_key(leaf):
        leaf = jax.eval_shape(jax.random.key_data, leaf)
    return tuple(np.shape(leaf)), np.dtype(jnp.result_type(leaf))


def atomic_write(path: Path, write) -> None:
    """``write(file)`` into a temporary file next to ``path``, ``fsync``, rename over
    ``path``, ``fsync`` the directory: ``path`` is the old or the new file, never torn."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def save_state(path, state) -> Path:
    """Write every leaf of ``state`` (and their tree paths, for checking) to ``path``,
    atomically (module docstring). Returns the path written (``.npz`` appended if
    missing)."""
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_suffix(path.suffix + ".npz")
    arrays = {f"leaf_{i:04d}": _to_numpy(leaf) for i, leaf in enumerate(jax.tree.leaves(state))}
    atomic_write(path, lambda file: np.savez(file, __paths__=np.asarray(_paths(state)), **arrays))
    return path


def _bound(template) -> int:
    specs = [_spec(leaf) for leaf in template]
    return sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in specs) + OVERHEAD_BYTES


def _check_size(path: Path, bound: int) -> None:
    """Refuse an archive whose members would expand beyond ``bound`` bytes (read from the
    zip directory, before any member is decompressed)."""
    try:
        with zipfile.ZipFile(path) as archive:
            expanded = sum(info.file_size for info in archive.infolist())
    except zipfile.BadZipFile as err:
        raise ValueError(f"{path} is not a checkpoint written by fm.save_state: {err}") from err
    if expanded > bound:
        raise ValueError(
            f"{path} would expand to {expanded} bytes, more than the {bound} that a state "
            "like the template needs: refusing to read it (not a checkpoint of this run)."
        )


def _check_leaf(path: str, value: np.ndarray, template) -> None:
    shape, dtype = _spec(template)
    if value.shape != shape:
        raise ValueError(
            f"Checkpoint leaf {path} has shape {value.shape}, the template {shape}: "
            "the checkpoint is of another dimension or number of chains."
        )
    if value.dtype != dtype:
        raise ValueError(
            f"Checkpoint leaf {path} is {value.dtype}, the template {dtype}: load it "
            "into a template of the same precision (e.g. under jax.enable_x64 for float64)."
        )
    if np.issubdtype(value.dtype, np.floating) and not np.all(np.isfinite(value)):
        raise ValueError(f"Checkpoint leaf {path} holds NaN or inf: the saved state is broken.")
    if path.endswith(".step_size") and not np.all(value > 0):
        raise ValueError(f"Checkpoint leaf {path} is not positive: not a valid step size.")


def load_state(path, like, max_bytes: int | None = None):
    """Read a state saved by :func:`save_state`, checked against ``like`` (module docstring).

    Parameters
    ----------
    path
        The checkpoint.
    like
        A template state of the run to resume (structure, shapes and dtypes).
    max_bytes
        The most bytes the archive may expand to (default: the template's arrays plus
        :data:`OVERHEAD_BYTES`).
    """
    path = Path(path)
    template = jax.tree.leaves(like)
    _check_size(path, _bound(template) if max_bytes is None else int(max_bytes))
    expected = _paths(like)
    with np.load(path, allow_pickle=False) as data:
        paths = data["__paths__"].tolist()
        if paths != expected:
            raise ValueError(
                "The checkpoint does not match the structure of `like`: saved leaves "
                f"{paths[:4]}..., expected {expected[:4]}...; pass a state of the same "
                "algorithm and position structure."
            )
        leaves = [data[f"leaf_{i:04d}"] for i in range(len(paths))]
    restored = []
    for name, value, leaf in zip(paths, leaves, template, strict=True):
        _check_leaf(name, value, leaf)
        if _is_key(leaf):
            impl = jax.random.key_impl(leaf)
            restored.append(jax.random.wrap_key_data(jnp.asarray(value), impl=impl))
        else:
            restored.append(jnp.asarray(value))
    return jax.tree.unflatten(jax.tree.structure(like), restored)


#: Modules whose NamedTuple types a self-describing checkpoint may name (and import).
TRUSTED_MODULES = ("fisher_mala.", "blackjax.")


def _describe(tree, leaves: list):
    """A JSON description of ``tree``'s structure; its arrays appended to ``leaves``."""
    if tree is None:
        return {"none": True}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        kind = type(tree)
        return {
            "namedtuple": f"{kind.__module__}:{kind.__qualname__}",
            "fields": {f: _describe(getattr(tree, f), leaves) for f in tree._fields},
        }
    if isinstance(tree, dict):
        return {"dict": {str(k): _describe(v, leaves) for k, v in tree.items()}}
    if isinstance(tree, tuple | list):
        return {type(tree).__name__: [_describe(v, leaves) for v in tree]}
    leaves.append(tree)
    if _is_key(tree):
        return {"key": len(leaves) - 1, "impl": str(jax.random.key_impl(tree))}
    return {"leaf": len(leaves) - 1}


def _namedtuple(name: str):
    module, _, qualname = name.partition(":")
    if not module.startswith(TRUSTED_MODULES):
        raise ValueError(f"The checkpoint names a type outside fisher_mala and BlackJAX: {name}.")
    import importlib

    kind = importlib.import_module(module)
    for part in qualname.split("."):
        kind = getattr(kind, part)
    if not (isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields")):
        raise ValueError(f"The checkpoint names {name}, which is not a NamedTuple.")
    return kind


def _rebuild(spec, leaves):
    if "none" in spec:
        return None
    if "namedtuple" in spec:
        kind = _namedtuple(spec["namedtuple"])
        return kind(**{f: _rebuild(v, leaves) for f, v in spec["fields"].items()})
    if "dict" in spec:
        return {k: _rebuild(v, leaves) for k, v in spec["dict"].items()}
    if "tuple" in spec:
        return tuple(_rebuild(v, leaves) for v in spec["tuple"])
    if "list" in spec:
        return [_rebuild(v, leaves) for v in spec["list"]]
    if "key" in spec:
        data = jnp.asarray(leaves[spec["key"]])
        return jax.random.wrap_key_data(data, impl=spec["impl"])
    return leaves[spec["leaf"]]


def save_tree(path, tree, meta: dict) -> Path:
    """Atomically write a pytree of arrays with a JSON description of its structure and
    ``meta`` (JSON); :func:`load_tree` needs no template."""
    import json

    leaves: list = []
    spec = _describe(tree, leaves)
    arrays = {f"leaf_{i:04d}": _to_numpy(leaf) for i, leaf in enumerate(leaves)}
    header = np.asarray(json.dumps({"spec": spec, "meta": meta}))
    path = Path(path)
    atomic_write(path, lambda file: np.savez(file, __header__=header, **arrays))
    return path


def load_tree(path, max_bytes: int):
    """``(tree, meta)`` written by :func:`save_tree`: no pickle, at most ``max_bytes``
    expanded, types only from :data:`TRUSTED_MODULES`; leaves as numpy arrays."""
    import json

    path = Path(path)
    _check_size(path, int(max_bytes))
    with np.load(path, allow_pickle=False) as data:
        header = json.loads(str(data["__header__"]))
        names = sorted(k for k in data.files if k.startswith("leaf_"))
        leaves = [data[k] for k in names]
    return _rebuild(header["spec"], leaves), header["meta"]
