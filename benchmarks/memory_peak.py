"""Peak host memory of ``fm.sample`` against the bytes of the draws it keeps.

Each cell runs in a fresh process: a small run first (JAX, XLA and the compiled loops
loaded: the baseline), then the measured run; the cell reports the growth of the peak
resident set (``ru_maxrss``, which counts the pages of memory-mapped files read, that the
system can drop) and of the peak anonymous memory (``RssAnon``, sampled every 5 ms: what
the process itself holds) over the baseline, as multiples of the kept draws' bytes.
Cells: the draws in memory with ``diagnose=True``, with ``diagnose=False``, and streamed
to files (``output=``). Cached in ``benchmarks/results/memory_peak/<cell>.json``; the table
goes to ``benchmarks/results/memory_peak.md`` (shown on the reliability page).

    python -m benchmarks.memory_peak            # 4 chains x 100000 draws x d = 200, float32
    python -m benchmarks.memory_peak --render
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks import templating

RESULTS = Path(__file__).resolve().parent / "results" / "memory_peak"
TABLE = RESULTS.parent / "memory_peak.md"
CHAINS, DRAWS, DIM = 4, 100_000, 200
CELLS = {
    "in_memory_diagnose": {"diagnose": True},
    "in_memory_no_diagnose": {"diagnose": False},
    "streamed_diagnose": {"diagnose": True, "output": True},
}

_CHILD = """
import json, resource, sys, tempfile, threading, time
import jax, jax.numpy as jnp, numpy as np
import fisher_mala as fm
anon = [0]
def watch():  # the peak of anonymous memory (file-backed pages of memory maps left out)
    while True:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    anon[0] = max(anon[0], int(line.split()[1]) * 1024)
        time.sleep(0.005)
chains, draws, dim = (int(a) for a in sys.argv[1:4])
options = json.loads(sys.argv[4])
scales = jnp.linspace(0.5, 2.0, dim)
ld = lambda x: -0.5 * jnp.sum((x / scales) ** 2)
x0 = jnp.zeros((chains, dim))
def run(n, **kw):
    return fm.sample(jax.random.key(0), "mala", ld, x0, num_warmup=200, num_samples=n, **kw)
run(200, diagnose=options["diagnose"])  # baseline: everything loaded and compiled once
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
threading.Thread(target=watch, daemon=True).start()
time.sleep(0.05)
anon_base = anon[0]
kw = {"diagnose": options["diagnose"]}
if options.get("output"):
    kw["output"] = tempfile.mkdtemp()
r = run(draws, **kw)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
kept = chains * draws * dim * 4
time.sleep(0.05)
print(json.dumps({"baseline_bytes": base, "peak_bytes": peak, "kept_bytes": kept,
                  "anon_baseline_bytes": anon_base, "anon_peak_bytes": anon[0]}))
"""


def run_cell(name: str) -> dict:
    path = RESULTS / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    args = [sys.executable, "-c", _CHILD, str(CHAINS), str(DRAWS), str(DIM)]
    out = subprocess.run([*args, json.dumps(CELLS[name])], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    cell = json.loads(out.stdout.strip().splitlines()[-1])
    kept = cell["kept_bytes"]
    cell["growth_over_kept"] = (cell["peak_bytes"] - cell["baseline_bytes"]) / kept
    cell["anon_growth_over_kept"] = (cell["anon_peak_bytes"] - cell["anon_baseline_bytes"]) / kept
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cell, indent=1))
    return cell


def render() -> str:
    header = [
        f"run ({CHAINS} chains x {DRAWS} draws x d = {DIM}, float32)",
        "kept draws (MB)",
        "peak RSS growth (MB)",
        "/ kept draws",
        "peak anonymous memory growth (MB)",
        "/ kept draws",
    ]
    rows = []
    for name in CELLS:
        path = RESULTS / f"{name}.json"
        if path.exists():
            c = json.loads(path.read_text())
            growth = c["peak_bytes"] - c["baseline_bytes"]
            anon = c["anon_peak_bytes"] - c["anon_baseline_bytes"]
            rows.append([
                name.replace("_", " "), f"{c['kept_bytes'] / 1e6:.0f}", f"{growth / 1e6:.0f}",
                f"{c['growth_over_kept']:.2f}", f"{anon / 1e6:.0f}",
                f"{c['anon_growth_over_kept']:.2f}",
            ])  # fmt: skip
    TABLE.write_text(templating.table(header, rows) + "\n")
    return TABLE.read_text()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true")
    args = parser.parse_args(argv)
    if not args.render:
        for name in CELLS:
            print(name, run_cell(name))
    print(render())


if __name__ == "__main__":
    main()
