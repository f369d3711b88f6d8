"""The cached-cell harness of every long benchmark (the reproduction, the race, the checks).

A *cell* is one JSON file: a result together with the protocol that produced it (lengths,
chains, options) and the environment it ran in. A cell whose file exists with the same
protocol is never recomputed, so an interrupted run resumes where it stopped; a changed
protocol recomputes it. Files are written whole (a temporary file renamed into place), so
an interrupted write never leaves a cell that looks finished.
"""

import json
import os
import platform
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

__all__ = ["environment", "is_done", "load", "run", "write"]


def load(path: Path) -> dict | None:
    """The cell's record, or ``None`` if it was never written."""
    return json.loads(path.read_text()) if path.exists() else None


def is_done(path: Path, protocol: dict | None = None) -> bool:
    """Whether ``path`` holds a finished cell (with ``protocol``, when given)."""
    record = load(path)
    return record is not None and (protocol is None or record.get("protocol") == protocol)


def write(path: Path, record: dict, indent: int | None = 1) -> None:
    """Write ``record`` to ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(record, indent=indent))
    os.replace(tmp, path)


def run(path: Path, protocol: dict | None, compute: Callable[[], dict], label: str = "") -> dict:
    """The cached record at ``path``, or ``compute()``'s, written there with ``protocol``."""
    if is_done(path, protocol):
        print(f"  cached   {label or path}", flush=True)
        return load(path)
    record = compute()
    if protocol is not None:
        record = {**record, "protocol": protocol}
    write(path, record)
    return record


def environment(dtype=None) -> dict:
    """Where and with what a cell ran: device, platform, library versions, date."""
    import jax
    import numpy as np

    import fisher_mala

    versions = {p: metadata.version(p) for p in ("jax", "jaxlib", "numpy")}
    versions["fisher_mala"] = fisher_mala.__version__  # also when run from a source tree
    env = {
        "device": str(jax.devices()[0]),
        "device_kind": jax.devices()[0].device_kind,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "matmul_precision": jax.config.jax_default_matmul_precision or "default",
        "versions": versions,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if dtype is not None:
        env["dtype"] = np.dtype(dtype).name
    return env
