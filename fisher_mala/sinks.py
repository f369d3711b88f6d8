"""Where the sampling phase's draws go, block by block: memory or files (layer 5).

``fm.sample`` runs the sampling phase in compiled blocks of draws and hands each block
(on the host) to a sink:

* :class:`MemorySink` keeps the blocks and joins them at the end (the default);
* :class:`FileSink` (``fm.sample(..., output=path)``) writes them into ``.npy`` files
  preallocated for the whole run and memory-mapped, so that the host holds one block at
  a time however long the run, and a crashed run keeps every block written. After each
  block the files are flushed and ``progress.json`` (written atomically) records how
  many draws are complete: :func:`read_output` reads the draws so far, also while the
  run goes on, as arrays or as an ArviZ ``DataTree``.

Both also say how many bytes they need (:func:`estimate_bytes`), which ``fm.sample``
checks against the free memory before the warm-up starts.
"""

import json
import os
from pathlib import Path

import jax
import numpy as np

from fisher_mala.checkpoint import atomic_write

__all__ = ["MemorySink", "FileSink", "read_output", "estimate_bytes", "available_bytes"]


def _leaf_name(path) -> str:
    return jax.tree_util.keystr(path).strip("[]'.").replace("']['", ".") or "x"


class MemorySink:
    """Keeps every block in arrays allocated for the whole run at the first block (no
    joining copy at the end)."""

    def __init__(self, num_draws: int):
        self.num_draws = int(num_draws)
        self.arrays = None

    def append(self, done: int, block) -> None:
        if self.arrays is None:
            self.arrays = jax.tree.map(
                lambda x: np.empty((x.shape[0], self.num_draws, *x.shape[2:]), x.dtype), block
            )
        n = jax.tree.leaves(block)[0].shape[1]

        def put(target, leaf):
            target[:, done : done + n] = leaf

        jax.tree.map(put, self.arrays, block)

    def result(self):
        return self.arrays

    def saved_draws(self, done: int):
        """The draws so far, for a checkpoint."""
        if self.arrays is None or done == 0:
            return None
        return jax.tree.map(lambda a: a[:, :done], self.arrays)

    def restore(self, done: int, draws) -> None:
        """Resume with the ``done`` draws a checkpoint saved."""
        if draws is not None and done:
            self.append(0, jax.tree.map(np.asarray, draws))


class FileSink:
    """Writes blocks into memory-mapped ``.npy`` files under ``directory`` (module doc).

    Layout: ``samples/<name>.npy`` (one file per leaf of the kept draws, ``(chains,
    draws, ...)``), ``sample_stats/<name>.npy``, and ``progress.json`` with the number of
    complete draws and the leaves' names in the order of the draws' tree.
    """

    def __init__(self, directory, num_draws: int, treedef=None):
        self.directory = Path(directory)
        self.num_draws = int(num_draws)
        self.arrays = None
        self.treedef = treedef

    def _open(self, block):
        samples, stats = block
        self.directory.mkdir(parents=True, exist_ok=True)
        self.treedef = self.treedef or jax.tree.structure(samples)
        names = [_leaf_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(samples)[0]]
        self.names = {"samples": names, "sample_stats": sorted(stats)}
        self.arrays = {"samples": [], "sample_stats": {}}
        for group in ("samples", "sample_stats"):
            (self.directory / group).mkdir(exist_ok=True)
        for name, leaf in zip(names, jax.tree.leaves(samples), strict=True):
            self.arrays["samples"].append(self._memmap("samples", name, leaf))
        for name in self.names["sample_stats"]:
            self.arrays["sample_stats"][name] = self._memmap("sample_stats", name, stats[name])
        self._progress(0)

    def _memmap(self, group, name, leaf):
        shape = (leaf.shape[0], self.num_draws, *leaf.shape[2:])
        path = self.directory / group / f"{name}.npy"
        return np.lib.format.open_memmap(path, mode="w+", dtype=leaf.dtype, shape=shape)

    def _progress(self, done: int) -> None:
        text = json.dumps({"draws_done": done, "num_draws": self.num_draws, **self.names})
        atomic_write(self.directory / "progress.json", lambda f: f.write(text.encode()))

    def append(self, done: int, block) -> None:
        if self.arrays is None:
            self._open(block)
        samples, stats = block
        n = jax.tree.leaves(samples)[0].shape[1]
        for target, leaf in zip(self.arrays["samples"], jax.tree.leaves(samples), strict=True):
            target[:, done : done + n] = leaf
        for name, target in self.arrays["sample_stats"].items():
            target[:, done : done + n] = stats[name]
        for target in [*self.arrays["samples"], *self.arrays["sample_stats"].values()]:
            target.flush()
        self._progress(done + n)

    def saved_draws(self, done: int):
        """Nothing: the files hold the draws (a checkpoint records their count)."""
        return None

    def restore(self, done: int, draws) -> None:
        """Resume writing into the files of an interrupted run, after its ``done`` draws."""
        del draws
        if not done:
            return
        progress = json.loads((self.directory / "progress.json").read_text())
        if int(progress["draws_done"]) < done or int(progress["num_draws"]) != self.num_draws:
            raise ValueError(
                f"{self.directory} holds {progress['draws_done']} of {progress['num_draws']} "
                f"draws, the checkpoint {done} of {self.num_draws}: not this run's output."
            )
        self.names = {k: progress[k] for k in ("samples", "sample_stats")}

        def open_(group, name):
            return np.load(self.directory / group / f"{name}.npy", mmap_mode="r+")

        self.arrays = {
            "samples": [open_("samples", name) for name in self.names["samples"]],
            "sample_stats": {n: open_("sample_stats", n) for n in self.names["sample_stats"]},
        }

    def result(self):
        """The draws as read-only memory maps (nothing read into memory)."""
        samples, stats, _ = read_output(self.directory, treedef=self.treedef)
        return samples, stats


def read_output(directory, treedef=None, as_arviz: bool = False):
    """The draws a run wrote to ``directory`` so far (``fm.sample(..., output=...)``).

    Returns ``(samples, sample_stats, draws_done)``: memory-mapped arrays cut to the
    complete draws, ``samples`` as a dict by leaf name (or in the draws' tree with
    ``treedef``); with ``as_arviz=True``, an ArviZ ``DataTree`` of them instead.
    """
    directory = Path(directory)
    progress = json.loads((directory / "progress.json").read_text())
    done = int(progress["draws_done"])

    def load(group, name):
        return np.load(directory / group / f"{name}.npy", mmap_mode="r")[:, :done]

    leaves = [load("samples", name) for name in progress["samples"]]
    stats = {name: load("sample_stats", name) for name in progress["sample_stats"]}
    if treedef is not None:
        samples = jax.tree.unflatten(treedef, leaves)
    else:
        samples = dict(zip(progress["samples"], leaves, strict=True))
    if as_arviz:
        import arviz as az

        names = progress["samples"]
        posterior = {name: np.asarray(leaf) for name, leaf in zip(names, leaves, strict=True)}
        stats = {k: np.asarray(v) for k, v in stats.items()}
        return az.from_dict({"posterior": posterior, "sample_stats": stats})
    return samples, stats, done


def estimate_bytes(num_chains: int, num_draws: int, draw_bytes: int, stat_bytes: int) -> int:
    """Bytes of ``num_draws`` kept draws of every chain and their sample statistics."""
    return int(num_chains) * int(num_draws) * (int(draw_bytes) + int(stat_bytes))


def available_bytes() -> tuple[int | None, int | None]:
    """``(host, device)``: free host memory (``MemAvailable``, Linux) and free memory of the
    default device (its allocator's limit minus what is in use), ``None`` where unknown."""
    host = None
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    host = int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        try:
            host = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            host = None
    device = None
    try:
        stats = jax.devices()[0].memory_stats() or {}
        if "bytes_limit" in stats:
            device = int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    except Exception:  # pragma: no cover - backends without memory statistics
        device = None
    return host, device
