"""What the checks cost next to the sampling call they check (issue: diagnostics at the
sampler's speed).

For each cell: one ``fm.sample`` call with ``diagnose=False`` (timed by the clock, compile
included), then ``fm.diagnose`` on its result (one pass, :mod:`fisher_mala.convergence_pass`;
its first call in the cell's process, ``scipy.special`` imported before: that import, once
per process, is timed apart and shown below the table), and the ArviZ 1.x calls it
replaces (``az.rhat``, bulk and tail ``az.ess``, and the per-chain mean ESS of the
chains-disagree check), timed the same way. Cells are cached in
``benchmarks/results/diagnostics_cost/<cell>.json`` (on an accelerator,
``<cell>_<device kind>.json``, e.g. ``quickstart_mala_NVIDIA_H200.json``; delete one to
rerun it); the table is written to ``benchmarks/results/diagnostics_cost.md``, which the
reliability page shows. ``--no-arviz`` leaves the ArviZ column out (on a lent GPU, whose
time is short, that column times the host's NumPy, not the device).

    python -m benchmarks.diagnostics_cost               # quickstart and mnist56 cells
    python -m benchmarks.diagnostics_cost --backends    # R-hat + bulk ESS: three backends
    python -m benchmarks.diagnostics_cost --render      # the table only
    python -m benchmarks.diagnostics_cost --rerun --cells mnist56_fisher_mala  # not cached
    python -m benchmarks.diagnostics_cost --block-values  # the pass per block size
    python -m benchmarks.diagnostics_cost --page-faults   # the heap primed or not
    python -m benchmarks.diagnostics_cost --transforms    # the pass's share in the FFT
    python -m benchmarks.diagnostics_cost --pool          # new threads or the kept pool
    python -m benchmarks.diagnostics_cost --plans         # the plan for 2 to 16 cores

``--backends`` times rank-normalized R-hat and bulk ESS on AR(1) draws of the cells'
shapes with the library's vectorized NumPy code (one estimator at a time, and the one pass
of :mod:`fisher_mala.convergence_pass` that ``fm.diagnose`` runs, in blocks within its
working memory), ArviZ's NumPy backend (per coordinate)
and ArviZ's numba backend (``arviz_stats.numba``, where numba and einops are installed:
the bench extra brings them, not the library), the first call of each excluded (numba
compiles then).
"""

import argparse
import json
import platform
import time
import warnings
from pathlib import Path

import numpy as np

from benchmarks import templating

RESULTS = Path(__file__).resolve().parent / "results" / "diagnostics_cost"
TABLE = RESULTS.parent / "diagnostics_cost.md"

#: cell -> (target, sampler, chains, warm-up, draws); the quickstart's protocol, and
#: mnist56 (d = 785) with FisherMALA and Fisher NUTS for the cost of the checks at a large d.
CELLS = {
    "quickstart_mala": ("gp", "mala", 4, 20_000, 20_000),
    "quickstart_fisher_mala": ("gp", "fisher_mala", 4, 20_000, 20_000),
    "mnist56_fisher_mala": ("mnist56", "fisher_mala", 4, 2_000, 2_000),
    "mnist56_fisher_nuts": ("mnist56", "fisher_nuts", 4, 2_000, 2_000),
}
#: The cells run by default (cached: ``mnist56_fisher_nuts`` took 11.5 minutes on 2 CPU cores,
#: its 4 x 4000 NUTS transitions about 30 gradients each; on a GPU it is left to ``--cells``).
DEFAULT_CELLS = (
    "quickstart_mala", "quickstart_fisher_mala", "mnist56_fisher_mala", "mnist56_fisher_nuts",
)  # fmt: skip


def _arviz_seconds(x: np.ndarray) -> float:
    import arviz as az

    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        az.rhat(x)
        az.ess(x, method="bulk")
        az.ess(x, method="tail", prob=(0.05, 0.95))
        for c in range(x.shape[0]):
            az.ess(x[c : c + 1], method="mean")
    return time.perf_counter() - start


def _cell_path(name: str) -> Path:
    import jax

    if jax.default_backend() == "cpu":
        return RESULTS / f"{name}.json"
    return RESULTS / f"{name}_{jax.devices()[0].device_kind.replace(' ', '_')}.json"


def run_cell(name: str, arviz: bool = True) -> dict:
    import jax

    import fisher_mala as fm
    from fisher_mala.checks import coordinate_names

    path = _cell_path(name)
    if path.exists():
        return json.loads(path.read_text())
    start = time.perf_counter()
    import scipy.special  # noqa: F401  (the normal scores' ndtri; once per process)

    import_seconds = time.perf_counter() - start
    target_name, sampler, chains, num_warmup, num_samples = CELLS[name]
    target = fm.targets.get(target_name)
    key_init, key_run = jax.random.split(jax.random.key(0))
    x0 = target.initial_positions(key_init, chains)
    start = time.perf_counter()
    result = fm.sample(key_run, sampler, target.logdensity_fn, x0, num_warmup=num_warmup,
                       num_samples=num_samples, diagnose=False)  # fmt: skip
    sample_seconds = time.perf_counter() - start
    start = time.perf_counter()
    fm.diagnose(result)
    diagnose_seconds = time.perf_counter() - start
    _, x = coordinate_names(result)
    cell = {
        "target": target_name,
        "sampler": sampler,
        "shape": list(x.shape),
        "sample_seconds": sample_seconds,
        "compile_warmup_sampling_seconds": [
            result.compile_seconds,
            result.warmup_seconds,
            result.sampling_seconds,
        ],
        "diagnose_seconds": diagnose_seconds,
        "import_seconds": import_seconds,
        "arviz_seconds": _arviz_seconds(np.asarray(x, np.float64)) if arviz else None,
        "device": str(jax.devices()[0]),
        "device_kind": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "machine": f"{platform.machine()}, {jax.device_count()} device(s)",
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cell, indent=1))
    return cell


def _ar1(shape, rho=0.9, seed=0):
    rng = np.random.default_rng(seed)
    x = np.empty(shape)
    x[:, 0] = rng.normal(size=(shape[0], shape[2]))
    noise = rng.normal(size=shape) * np.sqrt(1 - rho**2)
    for t in range(1, shape[1]):
        x[:, t] = rho * x[:, t - 1] + noise[:, t]
    return x


def run_backends() -> dict:
    """Seconds of R-hat + bulk ESS per backend, on AR(1) draws of each cell's shape."""
    path = RESULTS / "backends.json"
    if path.exists():
        return json.loads(path.read_text())
    import arviz as az
    import xarray as xr

    from fisher_mala import convergence, convergence_pass
    from fisher_mala.checks import WORKING_MEMORY_FLOOR

    def budget(x):  # fm.diagnose's working memory
        return max(x.nbytes // 8, WORKING_MEMORY_FLOOR)

    def timed(fn):
        fn()  # first call: imports, numba compilation
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    out = {}
    for shape in ((4, 20_000, 100), (4, 2_000, 785)):
        x = _ar1(shape)
        row = {
            "vectorized": timed(lambda x=x: convergence.rhat_and_ess(x)),
            "one_pass": timed(
                lambda x=x: convergence_pass.diagnostics_pass(x, budget_bytes=budget(x))
            ),
            "arviz_numpy": timed(lambda x=x: (az.rhat(x), az.ess(x, method="bulk"))),
        }
        try:
            from arviz_stats.numba import diagnostics as numba_diagnostics

            data = xr.Dataset({"x": (("chain", "draw", "dim"), x)})
            row["arviz_numba"] = timed(
                lambda d=data: (numba_diagnostics.rhat(d), numba_diagnostics.ess(d))
            )
        except Exception as err:  # numba missing or the backend failing
            row["arviz_numba"] = f"unavailable: {type(err).__name__}: {err}"[:200]
        out[" x ".join(map(str, shape))] = row
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    return out


def _quickstart_draws(name: str) -> np.ndarray:
    """The draws of cell ``name``'s sampling call (as :func:`run_cell` makes them)."""
    import jax

    import fisher_mala as fm
    from fisher_mala.checks import coordinate_names

    target_name, sampler, chains, num_warmup, num_samples = CELLS[name]
    target = fm.targets.get(target_name)
    key_init, key_run = jax.random.split(jax.random.key(0))
    result = fm.sample(key_run, sampler, target.logdensity_fn,
                       target.initial_positions(key_init, chains), num_warmup=num_warmup,
                       num_samples=num_samples, diagnose=False)  # fmt: skip
    return np.asarray(coordinate_names(result)[1])


def run_transforms(repeats: int = 5) -> str:
    """On the MALA quickstart's draws: the one pass's seconds by the clock, the CPU seconds
    of the process during it, and the CPU seconds its threads spend in NumPy's ``rfft`` and
    ``irfft`` (each thread's own time, summed), for the fastest of ``repeats`` passes after
    a first. Printed, not cached."""
    import threading

    from numpy import fft

    from fisher_mala import convergence_pass

    x = _quickstart_draws("quickstart_mala")
    spent, lock = {"rfft": 0.0, "irfft": 0.0}, threading.Lock()
    originals = {name: getattr(fft, name) for name in spent}

    def timed(name):
        def call(*args, **kwargs):
            start = time.thread_time()
            try:
                return originals[name](*args, **kwargs)
            finally:
                with lock:
                    spent[name] += time.thread_time() - start

        return call

    best = None
    try:
        for name in spent:
            setattr(fft, name, timed(name))
        convergence_pass.diagnostics_pass(x)
        for _ in range(repeats):
            spent.update(rfft=0.0, irfft=0.0)
            start, cpu = time.perf_counter(), time.process_time()
            convergence_pass.diagnostics_pass(x)
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
            if best is None or seconds < best[0]:
                best = (seconds, cpu, dict(spent))
    finally:
        for name, function in originals.items():
            setattr(fft, name, function)
    seconds, cpu, spent = best
    return (
        f"quickstart MALA draws {x.shape}: the pass {seconds:.3f} s by the clock, "
        f"{cpu:.3f} CPU s; in rfft {spent['rfft']:.3f} CPU s, in irfft {spent['irfft']:.3f}"
    )


def run_block_values(sizes=(2**40, 2**21, 2**20, 2**19), repeats=6) -> dict:
    """Median seconds of the one pass on the quickstart cells' draws, per block size
    (``convergence_pass.BLOCK_VALUES``; 2^40: no bound, one block per thread), the sizes
    taking turns so that the machine's drift falls on all alike. Printed, not cached."""
    from fisher_mala import convergence_pass

    default = convergence_pass.BLOCK_VALUES
    out = {}
    for name in ("quickstart_mala", "quickstart_fisher_mala"):
        x = _quickstart_draws(name)
        seconds = {size: [] for size in sizes}
        try:
            for _ in range(repeats):
                for size in sizes:
                    convergence_pass.BLOCK_VALUES = size
                    start = time.perf_counter()
                    convergence_pass.diagnostics_pass(x)
                    seconds[size].append(time.perf_counter() - start)
        finally:
            convergence_pass.BLOCK_VALUES = default
        out[name] = {f"2^{int(np.log2(k))}": float(np.median(v)) for k, v in seconds.items()}
    return out


def render() -> str:
    header = [
        "cell", "draws (chains x draws x d)", "`fm.sample` call (s)", "`fm.diagnose` (s)",
        "diagnose / sample", "ArviZ calls it replaces (s)", "device",
    ]  # fmt: skip
    rows = []
    cells = []  # the CPU's cells first, then each accelerator's, in CELLS's order
    for name in CELLS:
        cells += [p for p in [RESULTS / f"{name}.json"] if p.exists()]
    for name in CELLS:
        cells += sorted(p for p in RESULTS.glob(f"{name}_*.json"))
    for path in cells:
        c = json.loads(path.read_text())
        arviz = c["arviz_seconds"]
        device = c["device"] + (f" ({c['device_kind']})" if c["device"][:3] != "cpu" else "")
        rows.append([
            f"{c['target'] if c['target'] != 'gp' else 'quickstart'}_{c['sampler']}",
            " x ".join(map(str, c["shape"])), f"{c['sample_seconds']:.1f}",
            f"{c['diagnose_seconds']:.2f}",
            f"{c['diagnose_seconds'] / c['sample_seconds']:.1%}",
            "not run" if arviz is None else f"{arviz:.1f}", device,
        ])  # fmt: skip
    text = templating.table(header, rows) + "\n"
    imports = [json.loads(p.read_text()).get("import_seconds")
               for p in cells if json.loads(p.read_text())["device"][:3] == "cpu"]  # fmt: skip
    imports = [v for v in imports if v]
    if imports:
        text += (
            f"\nThe first `fm.diagnose` of a process also imports `scipy.special`: "
            f"{max(imports):.2f} s here, once (left out of the column above).\n"
        )
    backends = RESULTS / "backends.json"
    if backends.exists():
        header = [
            "draws",
            "this library, one estimator at a time (R-hat, bulk and tail ESS)",
            "this library, `fm.diagnose`'s one pass (and each chain's ESS)",
            "ArviZ, NumPy",
            "ArviZ, numba",
        ]
        rows = []
        for shape, row in json.loads(backends.read_text()).items():
            numba = row["arviz_numba"]
            numba = f"{numba:.2f}" if isinstance(numba, float) else numba
            one_pass = f"{row['one_pass']:.2f}" if "one_pass" in row else "not run"
            rows.append([
                shape, f"{row['vectorized']:.2f}", one_pass, f"{row['arviz_numpy']:.2f}", numba,
            ])  # fmt: skip
        text += (
            "\nR-hat and bulk ESS alone, on AR(1) draws of the same shapes (seconds; "
            "`--backends`):\n\n" + templating.table(header, rows) + "\n"
        )
    TABLE.write_text(text)
    return text


def _timed_pass(x: np.ndarray, budget: int) -> tuple[float, int]:
    """Seconds and minor page faults of one ``diagnostics_pass`` of ``x`` in this process."""
    import resource

    from fisher_mala import convergence_pass

    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    convergence_pass.diagnostics_pass(x, budget_bytes=budget)
    seconds = time.perf_counter() - start
    return seconds, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def page_faults(prime: bool, passes: int = 3) -> str:
    """Seconds and minor page faults of ``passes`` one passes in this process over AR(1)
    draws of the quickstart's shape (float32, as the quickstart keeps them), ``fm.diagnose``'s
    working memory, with the heap primed or not (``convergence_pass.PRIME_HEAP``; the
    priming lasts for the process, so each way runs in its own)."""

    import scipy.special  # noqa: F401  (imported before the first pass, as in run_cell)

    from fisher_mala import convergence_pass
    from fisher_mala.checks import WORKING_MEMORY_FLOOR

    convergence_pass.PRIME_HEAP = prime
    x = _ar1((4, 20_000, 100)).astype(np.float32)
    budget = max(x.nbytes // 8, WORKING_MEMORY_FLOOR)
    cells = []
    for _ in range(passes):
        seconds, faults = _timed_pass(x, budget)
        cells.append(f"{seconds:.3f} s, {faults} faults")
    return f"heap primed: {prime}; passes: " + "; ".join(cells)


def run_page_faults(rounds: int = 3) -> None:
    """:func:`page_faults` each way in fresh processes, the ways taking turns (printed)."""
    import subprocess
    import sys

    for _ in range(rounds):
        for way in ("off", "on"):
            command = [sys.executable, "-m", "benchmarks.diagnostics_cost", "--page-faults", way]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            print(out.strip(), flush=True)


def run_pool(rounds: int = 4) -> str:
    """After the MALA quickstart's ``fm.sample`` call, in its process: the one pass on new
    threads (the pool dropped first, as every pass did before the pool was kept) and on
    the kept pool's threads, taking turns; seconds and minor page faults of each (printed)."""

    import scipy.special  # noqa: F401  (imported before the first pass, as in run_cell)

    from fisher_mala import convergence_pass
    from fisher_mala.checks import WORKING_MEMORY_FLOOR

    x = _quickstart_draws("quickstart_mala")
    budget = max(x.nbytes // 8, WORKING_MEMORY_FLOOR)
    lines = []
    for _ in range(rounds):
        for way in ("new threads", "kept pool"):
            if way == "new threads":
                for pool in convergence_pass._POOLS.values():
                    pool.shutdown()
                convergence_pass._POOLS.clear()
            seconds, faults = _timed_pass(x, budget)
            lines.append(f"{way}: {seconds:.3f} s, {faults} page faults")
    return "\n".join(lines)


def run_plans(cores=(2, 4, 8, 16), repeats=2) -> None:
    """On AR(1) draws of ``mnist56``'s shape (float32) with ``fm.diagnose``'s working memory:
    the pass's plan (workers, coordinates per block) for each number of cores, without
    and with the floor on a block's draws (``convergence_pass.MIN_BLOCK_VALUES``; 1 gives
    the plan before it), and the best of ``repeats`` passes on this machine's own cores
    (more workers than cores take turns: a stand-in for a larger host, not its clock);
    printed line by line."""
    import os

    import scipy.special  # noqa: F401  (imported before the first pass, as in run_cell)

    from fisher_mala import convergence_pass
    from fisher_mala.checks import WORKING_MEMORY_FLOOR

    x = _ar1((4, 2000, 785)).astype(np.float32)  # mnist56_fisher_mala's draws
    budget = max(x.nbytes // 8, WORKING_MEMORY_FLOOR)
    real_count, default = os.cpu_count, convergence_pass.MIN_BLOCK_VALUES
    print(f"{os.cpu_count()} cores here; draws {x.shape}, working memory {budget >> 20} MB")
    try:
        for n in cores:
            for floor in (1, default):
                os.cpu_count = lambda n=n: n
                convergence_pass.MIN_BLOCK_VALUES = floor
                workers, blocks = convergence_pass._plan(x, budget)
                seconds = min(_timed_pass(x, budget)[0] for _ in range(repeats))
                print(
                    f"planned for {n} cores, blocks of at least {floor} draws: {workers} "
                    f"workers, {blocks[1].stop - blocks[1].start} coordinates a block: "
                    f"{seconds:.2f} s",
                    flush=True,
                )
    finally:
        os.cpu_count, convergence_pass.MIN_BLOCK_VALUES = real_count, default


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true", help="write the table only")
    parser.add_argument("--cells", default=",".join(DEFAULT_CELLS))
    parser.add_argument("--rerun", action="store_true",
                        help="run the cells of --cells again, replacing them")  # fmt: skip
    parser.add_argument("--backends", action="store_true", help="time the three backends")
    parser.add_argument("--no-arviz", action="store_true", help="leave ArviZ's column out")
    parser.add_argument("--block-values", action="store_true",
                        help="the one pass's seconds per block size (printed)")  # fmt: skip
    parser.add_argument("--page-faults", nargs="?", const="both", choices=("both", "on", "off"),
                        help="the pass with the heap primed and not, fresh processes")  # fmt: skip
    parser.add_argument(
        "--pool", action="store_true", help="the pass on new threads and on the kept pool (printed)"
    )
    parser.add_argument(
        "--transforms",
        action="store_true",
        help="the pass's seconds in the FFT, MALA quickstart (printed)",
    )
    parser.add_argument("--plans", action="store_true",
                        help="the pass's plan and seconds for 2 to 16 cores (printed)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.plans:
        run_plans()
        return
    if args.transforms:
        print(run_transforms())
        return
    if args.pool:
        print(run_pool())
        return
    if args.page_faults:
        if args.page_faults == "both":
            run_page_faults()
        else:
            print(page_faults(args.page_faults == "on"))
        return
    if args.block_values:
        print(run_block_values())
        return
    if args.backends:
        print(run_backends())
    elif not args.render:
        for name in args.cells.split(","):
            if args.rerun:
                _cell_path(name).unlink(missing_ok=True)
            print(name, run_cell(name, arviz=not args.no_arviz))
    print(render())


if __name__ == "__main__":
    main()
