"""What compiling costs a short Fisher NUTS run: each XLA program's compile seconds.

One ``fm.sample(key, "fisher_nuts", ...)`` call (1 chain, 1000 + 1000) on a 23-d Gaussian
(the size of ``benchmarks.numpyro_wall``'s count model), in a fresh process per warm-up
setting, with JAX's compile log on: the seconds of each program over 0.2 s (the warm-up's
parts and the sampling loop), and the call's wall time. Settings: the default warm-up, and
without the restart windows / the fast start (``--set``-style options of ``fm.sample``);
then the default twice more, two fresh processes sharing JAX's persistent compilation
cache (a new temporary directory; ``jax_persistent_cache_min_compile_time_secs`` 0.5): what
a user's next process pays for the same model once the first has compiled it
(``docs/performance.md``). Cached in ``benchmarks/results/compile_cost.json``.

    python -m benchmarks.compile_cost
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "compile_cost.json"
SETTINGS = {
    "default": {},
    "no_restart_windows": {"restart_windows": ()},
    "no_restart_windows_no_fast_start": {"restart_windows": (), "fast_start": False},
}

_CHILD = """
import json, logging, sys, time
import jax, jax.numpy as jnp
import fisher_mala as fm
seconds = []
class Compiles(logging.Handler):
    def emit(self, record):
        text = record.getMessage()
        if text.startswith("Finished XLA compilation of"):
            name, took = text[len("Finished XLA compilation of "):].rsplit(" in ", 1)
            seconds.append((name, float(took.split()[0])))
logging.getLogger("jax").addHandler(Compiles())
logging.getLogger("jax").setLevel(logging.WARNING)
jax.config.update("jax_log_compiles", True)
options = json.loads(sys.argv[1])
options = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
dim = 23
scales = jnp.linspace(0.5, 2.0, dim)
ld = lambda x: -0.5 * jnp.sum((x / scales) ** 2)
start = time.perf_counter()
fm.sample(jax.random.key(0), "fisher_nuts", ld, jnp.full((1, dim), 0.1), num_warmup=1000,
          num_samples=1000, diagnose=False, **options)
wall = time.perf_counter() - start
big = [(name, s) for name, s in seconds if s > 0.2]
print(json.dumps({"wall_seconds": wall, "programs": big,
                  "compile_seconds": sum(s for _, s in seconds)}))
"""


#: The persistent-cache cells: the first process fills the cache, the second reads it.
CACHED = ("persistent_cache_first_process", "persistent_cache_second_process")


def _child(options: dict, env=None) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(options)],
                         capture_output=True, text=True, check=True, env=env)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> dict:
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for name, options in SETTINGS.items():
        if name not in results:
            results[name] = _child(options)
            RESULTS.write_text(json.dumps(results, indent=1))
    if not all(name in results for name in CACHED):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": cache,
                   "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.5"}  # fmt: skip
            for name in CACHED:
                results[name] = _child({}, env)
        RESULTS.write_text(json.dumps(results, indent=1))
    for name, cell in results.items():
        programs = ", ".join(f"{s:.1f}" for _, s in cell["programs"])
        print(f"{name:34s} wall {cell['wall_seconds']:5.1f} s, compile "
              f"{cell['compile_seconds']:4.1f} s; programs over 0.2 s: {programs}")  # fmt: skip
    return results


if __name__ == "__main__":
    main()
