"""Crash-safe runs: ``fm.sample(..., checkpoint=path, checkpoint_every=n)`` (layer 5).

What is saved, atomically (:func:`fisher_mala.checkpoint.save_tree`), when the warm-up
ends and after every block of the sampling phase (at most ``n`` iterations apart): the
chains' states, the tuned parameters, the warm-up's info, the number of draws done and
the draws so far (with ``output=``, only their count: the files hold them), and a
fingerprint of the run. Calling ``fm.sample`` again with the same arguments and the same
``checkpoint`` path skips what is done and returns draws **bit-identical** to an
uninterrupted run (the keys of every iteration are derived from the run's key and the
iteration's index, so nothing random is lost). A checkpoint of another run (another
sampler, options, length, dimension, dtype, key or starting points) is refused, naming
what differs. The warm-ups that are schedules of compiled phases (every sampler but
Fisher NUTS / HMC) run in segments of at most ``n`` iterations, the run saved after each
(the chain's state inside its phase, the adaptation's state and the acceptance
statistics so far), so a run killed during its warm-up resumes there too. Fisher NUTS and
Fisher HMC, whose warm-up makes choices on the host between its compiled stages, save after
each of its parts (:meth:`fisher_mala.whitened_warmup.FisherHMCWarmup.segmented_run`: the
Fisher phase's segments, the host's choices so far, the step-size phase's parts).
"""

import hashlib
from pathlib import Path

import jax
import numpy as np

from fisher_mala.checkpoint import load_tree, save_tree

__all__ = ["fingerprint", "RunCheckpoint"]


def _describe(value):
    """A stable description of an option (callables by their qualified name)."""
    if callable(value):
        return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', repr(value))}"
    if isinstance(value, dict):
        return {str(k): _describe(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [_describe(v) for v in value]
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    array = np.asarray(value)
    return hashlib.sha256(array.tobytes()).hexdigest()[:16] + str(array.dtype)


def _digest(tree) -> str:
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(tree):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        array = np.asarray(leaf)
        digest.update(f"{array.shape}{array.dtype}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def fingerprint(name, options, rng_key, positions, logdensity_fn, **protocol) -> dict:
    """What identifies a run: a checkpoint is resumed only by a run with the same one."""
    return {
        "sampler": name,
        "options": _describe(options),
        "key": _digest(rng_key),
        "initial_positions": _digest(positions),
        "logdensity_fn": _describe(logdensity_fn),
        **{k: _describe(v) for k, v in protocol.items()},
    }


class RunCheckpoint:
    """Saves and restores one ``fm.sample`` run (module docstring)."""

    def __init__(self, path, every: int | None, identity: dict, max_bytes: int):
        self.path = Path(path)
        if self.path.suffix != ".npz":
            self.path = self.path.with_suffix(self.path.suffix + ".npz")
        if every is not None and (isinstance(every, bool) or int(every) < 1):
            raise ValueError(f"`checkpoint_every` must be an integer >= 1, got {every!r}.")
        self.every = every
        self.identity = identity
        self.max_bytes = max_bytes

    def load(self):
        """The saved run (a dict), or ``None`` when there is no checkpoint yet."""
        if not self.path.exists():
            return None
        tree, meta = load_tree(self.path, self.max_bytes)
        saved = meta.get("identity", {})
        differs = sorted(
            k for k in set(saved) | set(self.identity) if saved.get(k) != self.identity.get(k)
        )
        if differs:
            raise ValueError(
                f"{self.path} is the checkpoint of another run (it differs in: "
                f"{', '.join(differs)}); pass the same arguments to resume it, or another "
                "`checkpoint` path to start a new run."
            )
        stage = meta.get("stage", "sampling")
        if stage == "staged_warmup":  # Fisher NUTS / HMC: the warm-up's own tree and meta
            return {"tree": tree, "meta": meta["warmup"], "timings": meta["timings"],
                    "stage": "warmup"}  # fmt: skip
        return {**tree, "timings": meta["timings"], "done": int(meta["done"]), "stage": stage,
                "chosen": meta.get("chosen", {})}  # fmt: skip

    def save(self, states, parameters, info, done: int, draws, timings, chosen=None) -> None:
        """The run in its sampling phase: ``done`` draws made; ``chosen``: what the warm-up
        chose for the draws on the host (a dict of JSON values: the sampling step's
        options, the target acceptance), restored on resume."""
        tree = {"states": states, "parameters": parameters, "info": info, "draws": draws}
        meta = {"identity": self.identity, "done": int(done), "timings": list(timings),
                "chosen": dict(chosen or {})}  # fmt: skip
        save_tree(self.path, tree, meta)

    def save_warmup(self, states, start, rates, trace, done: int, timings) -> None:
        """The run inside its warm-up: ``done`` of its segments run
        (:func:`fisher_mala.schedule.segments`), with the per-iteration acceptance
        statistics and snapshots so far."""
        tree = {"states": states, "start": start, "rates": rates, "trace": trace}
        meta = {
            "identity": self.identity,
            "done": int(done),
            "timings": list(timings),
            "stage": "warmup",
        }
        save_tree(self.path, tree, meta)

    def save_staged(self, tree, warmup_meta: dict, timings) -> None:
        """The run inside a Fisher NUTS / HMC warm-up: the parts' tree and where they
        are (:meth:`fisher_mala.whitened_warmup.FisherHMCWarmup.segmented_run`)."""
        meta = {
            "identity": self.identity,
            "timings": list(timings),
            "stage": "staged_warmup",
            "warmup": warmup_meta,
        }
        save_tree(self.path, tree, meta)
