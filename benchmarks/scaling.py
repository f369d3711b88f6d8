"""FisherMALA past one device: time per iteration against d and against the device count.

    python -m benchmarks.scaling --dims 1000,2000,4000,8000,16000,32000   # one device
    python -m benchmarks.scaling --devices 1,2,4,8                        # simulated devices
    python -m benchmarks.scaling --low-rank 1000,10000,100000,1000000 --ranks 8,32,128
    python -m benchmarks.scaling --low-rank-widening 1000,10000,100000,1000000 --ranks 8,32,128
    python -m benchmarks.scaling --write-docs     # the tables of docs/large_problems.md

Each cell times ``--steps`` adaptive FisherMALA iterations (Algorithm 1's kernel, one
chain, float32) in one jit-compiled ``lax.scan``, after compilation, best of three. Two
problems:

* ``precond``: a standard Gaussian in ``d`` dimensions (an ``O(d)`` log density, so the
  ``d x d`` square root is the whole cost), with ``R``'s rows split over a ``"precond"``
  mesh axis of the given devices (``fm.sample(..., mesh=...)``'s placement);
* ``data``: the synthetic logistic regression (``fm.targets.synthetic_logistic_regression``,
  ``--rows`` rows, 20 features), its rows split over a ``"data"`` axis.

Per cell: microseconds per iteration, the bytes of ``R`` (or of the data) held by each
device, the compiled program's memory per device (XLA's memory analysis: arguments, outputs
and temporaries), and the bytes each device sends in collectives per iteration (the
collectives of one compiled step, from its HLO). The device count of a JAX process is fixed
when it starts, so ``--devices`` runs one process per count with
``--xla_force_host_platform_device_count`` on a CPU (the simulated devices share the
machine's cores: the figure of interest is memory and communication, not speed); on a
machine with accelerators, counts up to the number of accelerators. Results are cached in
``benchmarks/results/scaling/`` by device kind.

``--low-rank`` times the diagonal-plus-low-rank Fisher preconditioner
(:mod:`fisher_mala.low_rank`, ``fm.sample(..., rank=k)``) the same way, one device, one
chain, float32, on the standard Gaussian in ``d`` dimensions, for each ``k`` of
``--ranks``: microseconds per adaptive iteration (one gradient, the ``O(d k)`` products, the
learner's update, its cycle's refresh amortized) and the compiled program's memory (the
chain's state, ``12 d k`` numbers of the learner (``d k`` more inside a block: ``Q^T``)
and ``O(d)`` more, and XLA's temporaries): per chain, since the chains of ``fm.sample`` each
have their own.
``--low-rank-widening`` adds, for the same ``(d, k)``, the memory of the step-size phase's
low-rank widening (:mod:`fisher_mala.geometric_widening`): the kept draws and whitened
gradients (``2 m d`` numbers) and the compiled widening's program, compiled, not run.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import templating

RESULTS = Path(__file__).resolve().parent / "results" / "scaling"
DTYPE_BYTES = {"f32": 4, "f64": 8, "s32": 4, "u32": 4, "pred": 1, "bf16": 2, "f16": 2}
COLLECTIVE = re.compile(
    r"= (.+?) (all-reduce|all-gather|all-to-all|reduce-scatter|collective-permute)\("
)


def _program_bytes(compiled) -> int | None:
    """XLA's memory analysis of a compiled program: its arguments, outputs and
    temporaries, in bytes (None where the backend has none)."""
    memory = compiled.memory_analysis()
    if memory is None:
        return None
    return int(
        memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
    )


def collective_bytes(hlo: str) -> int:
    """Bytes of the results of every collective in ``hlo`` (one device's view)."""
    total = 0
    for line in hlo.splitlines():
        match = COLLECTIVE.search(line)
        if not match:
            continue
        for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", match.group(1)):
            size = 1
            for dim in filter(None, dims.split(",")):
                size *= int(dim)
            total += size * DTYPE_BYTES.get(dtype, 4)
    return total


def cell(problem: str, dim: int, devices: int, steps: int, rows: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    import fisher_mala as fm
    from fisher_mala import fisher
    from fisher_mala.adaptations import fisher_preconditioner, robbins_monro
    from fisher_mala.sampling import map_over_chains
    from fisher_mala.sharding import sqrt_precond_sharding

    axis = "precond" if problem == "precond" else "data"
    mesh = jax.make_mesh(
        (1, devices),
        ("chain", axis),
        axis_types=(AxisType.Auto,) * 2,
        devices=jax.devices()[:devices],
    )
    if problem == "precond":
        data = None

        def logdensity(x, data):
            return -0.5 * jnp.sum(x**2)
    else:
        target = fm.targets.synthetic_logistic_regression(rows, dim, seed=0)
        data = jax.device_put(target.extras["data"], NamedSharding(mesh, PartitionSpec(axis)))
        logdensity = target.extras["logdensity_with_data"]
    kernel = fisher.adaptive_step(
        fisher_preconditioner(fisher.DAMPING), robbins_monro(), "rao_blackwell"
    )
    x0 = jax.device_put(
        jnp.full((1, dim), 0.1, jnp.float32), NamedSharding(mesh, PartitionSpec("chain"))
    )

    def chain(x, data, num_steps):
        fn = lambda y: logdensity(y, data)  # noqa: E731
        state = fisher.init(x, fn, 1.0 / dim)

        def body(state, i):
            state, _ = kernel(jax.random.fold_in(jax.random.key(0), i), state, fn)
            return state, None

        state, _ = jax.lax.scan(body, state, jnp.arange(num_steps))
        return state.position

    def run(x, data, num_steps):
        return map_over_chains(lambda c, d=None: chain(c, d, num_steps), x, mesh=mesh, shared=data)

    with sqrt_precond_sharding(mesh):
        start = time.perf_counter()
        compiled = jax.jit(lambda x, d: run(x, d, steps)).lower(x0, data).compile()
        compile_s = time.perf_counter() - start

        # The collectives of one iteration: one kernel step from a state made apart (a
        # loop body's collectives appear once in the HLO whatever the trip count).
        def init(x, data):
            return map_over_chains(
                lambda c, d=None: fisher.init(c, lambda y: logdensity(y, d), 1.0 / dim),
                x,
                mesh=mesh,
                shared=data,
            )

        def step(state, data):
            def one(s, d=None):
                fn = lambda y: logdensity(y, d)  # noqa: E731
                return kernel(jax.random.key(0), s, fn)[0]

            return map_over_chains(one, state, mesh=mesh, shared=data)

        state = jax.jit(init)(x0, data)
        one_step = jax.jit(step).lower(state, data).compile()
        del state
    jax.block_until_ready(compiled(x0, data))
    best = np.inf
    for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(compiled(x0, data))
        best = min(best, time.perf_counter() - start)
    held = 4 * dim * dim / devices if problem == "precond" else 4 * rows * (dim + 1) / devices
    per_device = _program_bytes(compiled)
    return {
        "problem": problem,
        "dim": dim,
        "devices": devices,
        "rows": rows if data else None,
        "steps": steps,
        "us_per_iteration": 1e6 * best / steps,
        "compile_s": compile_s,
        "held_bytes_per_device": held,
        "program_bytes_per_device": per_device,
        "collective_bytes_per_iteration": collective_bytes(one_step.as_text()),
        "device_kind": jax.devices()[0].device_kind,
        "platform": jax.default_backend(),
        "jax": jax.__version__,
    }


def low_rank_cell(dim: int, rank: int, steps: int) -> dict:
    """Adaptive low-rank FisherMALA iterations on the d-dimensional standard Gaussian."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from fisher_mala import low_rank
    from fisher_mala.adaptations import robbins_monro

    def logdensity(x):
        return -0.5 * jnp.sum(x**2)

    def run(x):
        learner = low_rank.init(jax.random.key(0), dim, jnp.float32, rank)
        state = low_rank.fisher_state(x, logdensity(x), -x, 1.0, learner.sqrt_precond)
        (state, learner), _ = low_rank.scan_adaptive(
            jax.random.key(0), (state, learner), logdensity, steps, rank, robbins_monro()
        )
        return state.position, learner.sqrt_precond.factors

    x0 = jnp.full((dim,), 0.1, jnp.float32)
    start = time.perf_counter()
    compiled = jax.jit(run).lower(x0).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(compiled(x0))
    best = np.inf
    for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(compiled(x0))
        best = min(best, time.perf_counter() - start)
    program = _program_bytes(compiled)
    return {
        "problem": "low_rank",
        "dim": dim,
        "rank": rank,
        "steps": steps,
        "us_per_iteration": 1e6 * best / steps,
        "compile_s": compile_s,
        "state_bytes": _low_rank_state_bytes(dim, rank),
        "program_bytes": program,
        "device_kind": jax.devices()[0].device_kind,
        "platform": jax.default_backend(),
        "jax": jax.__version__,
    }


def _low_rank_state_bytes(dim: int, rank: int) -> int:
    """The learner's state in float32: W, Z and the positions' products (d x 3k each), the
    probes (d x 2k), Q (d x k), and O(d) vectors."""
    from fisher_mala import low_rank

    width = min(low_rank.SEARCH_BLOCKS * rank, dim)
    return 4 * dim * (3 * width + min(low_rank.PROBE_BLOCKS * rank, dim - width) + rank + 8)


#: The lines ``run_low_rank``, ``run_low_rank_widening`` and ``_child`` print per cell.
LOG_LINES = {
    "low_rank": re.compile(r"^low_rank d= *(\d+) k= *(\d+): +([\d.]+) us, program +([\d.]+) MB"),
    "low_rank_widening": re.compile(
        r"^low_rank widening d= *(\d+) k= *(\d+): (\d+) draws kept, program +([\d.]+) MB"
    ),
    "precond": re.compile(r"^precond +d= *(\d+) devices=1: +([\d.]+) us/iteration"),
}


def records_from_log(text: str, device_kind: str, jax_version: str, source: str) -> list:
    """Cells rebuilt from the lines a run printed, where its JSON files were lost (the
    device machine's files did not come back): the printed figures, rounded as printed
    (0.1 us, 0.1 MB), no compile time, and for the dense cells no program size."""
    common = {"device_kind": device_kind, "platform": "gpu", "jax": jax_version,
              "compile_s": None, "source": source}  # fmt: skip
    records = []
    for line in text.splitlines():
        if match := LOG_LINES["low_rank"].match(line):
            dim, rank = int(match[1]), int(match[2])
            records.append({"problem": "low_rank", "dim": dim, "rank": rank, "steps": None,
                            "us_per_iteration": float(match[3]),
                            "state_bytes": _low_rank_state_bytes(dim, rank),
                            "program_bytes": float(match[4]) * 1e6, **common})  # fmt: skip
        elif match := LOG_LINES["low_rank_widening"].match(line):
            dim, rank, rows = int(match[1]), int(match[2]), int(match[3])
            records.append({"problem": "low_rank_widening", "dim": dim, "rank": rank,
                            "kept_draws": rows, "moments_bytes": 4 * 2 * rows * dim,
                            "program_bytes": float(match[4]) * 1e6, **common})  # fmt: skip
        elif match := LOG_LINES["precond"].match(line):
            dim = int(match[1])
            records.append({"problem": "precond", "dim": dim, "devices": 1, "rows": None,
                            "steps": None, "us_per_iteration": float(match[2]),
                            "held_bytes_per_device": 4.0 * dim * dim,
                            "program_bytes_per_device": None,
                            "collective_bytes_per_iteration": 0, **common})  # fmt: skip
    return records


def _record_path(record) -> Path:
    kind = record["platform"] if record["platform"] == "cpu" else record["device_kind"]
    folder = RESULTS / kind.replace(" ", "_")
    if record["problem"] == "low_rank":
        return folder / f"low_rank_d{record['dim']}_k{record['rank']}.json"
    if record["problem"] == "low_rank_widening":
        return folder / f"low_rank_widening_d{record['dim']}_k{record['rank']}.json"
    return folder / f"{record['problem']}_d{record['dim']}_n{record['devices']}.json"


def low_rank_widening_cell(dim: int, rank: int) -> dict:
    """The memory of the step-size phase's low-rank widening (one chain, float32): the
    kept draws and whitened gradients (:class:`~fisher_mala.geometric_widening.
    LowRankMoments`, ``m`` rows each) and the compiled widening's program (XLA's memory
    analysis: its arguments, outputs and temporaries), compiled, not run."""
    import jax
    import jax.numpy as jnp

    from fisher_mala import geometric_widening as gw
    from fisher_mala import low_rank
    from fisher_mala.whitened_hmc import FisherHMCState

    def arguments():
        root = low_rank.init(jax.random.key(0), dim, jnp.float32, rank).sqrt_precond
        x = jnp.zeros((dim,), jnp.float32)
        state = FisherHMCState(x, jnp.zeros((), jnp.float32), x, root)
        return state, gw.moments_init(state, 100_000)  # a long phase: the most draws kept

    state, moments = jax.eval_shape(arguments)  # shapes only: nothing allocated
    rows = moments.draws.shape[0]

    def widen(state, moments):
        return gw.widen(state, moments, rows)

    start = time.perf_counter()
    compiled = jax.jit(widen).lower(state, moments).compile()
    compile_s = time.perf_counter() - start
    program = _program_bytes(compiled)
    return {
        "problem": "low_rank_widening",
        "dim": dim,
        "rank": rank,
        "kept_draws": rows,
        "moments_bytes": 4 * 2 * rows * dim,
        "program_bytes": program,
        "compile_s": compile_s,
        "device_kind": jax.devices()[0].device_kind,
        "platform": jax.default_backend(),
        "jax": jax.__version__,
    }


def run_low_rank_widening(dims, ranks) -> None:
    """Every ``(d, k)`` widening cell not cached yet (one process)."""
    import jax

    kind = jax.default_backend() if jax.default_backend() == "cpu" else jax.devices()[0].device_kind
    for rank in ranks:
        for dim in dims:
            path = RESULTS / kind.replace(" ", "_") / f"low_rank_widening_d{dim}_k{rank}.json"
            if path.exists():
                continue
            record = low_rank_widening_cell(dim, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=1))
            print(f"low_rank widening d={dim:8d} k={rank:4d}: {record['kept_draws']} draws kept, "
                  f"program {record['program_bytes'] / 1e6:9.1f} MB", flush=True)  # fmt: skip


def run_low_rank(dims, ranks, steps: int) -> None:
    """Every ``(d, k)`` cell not cached yet (one process; a cell too big is reported)."""
    import jax

    kind = jax.default_backend() if jax.default_backend() == "cpu" else jax.devices()[0].device_kind
    for rank in ranks:
        for dim in dims:
            path = RESULTS / kind.replace(" ", "_") / f"low_rank_d{dim}_k{rank}.json"
            if path.exists():
                continue
            cell_steps = max(64, min(steps, int(2e10 // (dim * rank * 60))))  # bounded time
            try:
                record = low_rank_cell(dim, rank, cell_steps)
            except Exception as err:  # out of memory: the largest d is found by trying
                print(f"low_rank d={dim} k={rank}: {type(err).__name__}: {str(err)[:200]}")
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=1))
            print(f"low_rank d={dim:8d} k={rank:4d}: {record['us_per_iteration']:12.1f} us, "
                  f"program {record['program_bytes'] / 1e6:9.1f} MB", flush=True)  # fmt: skip


def _ns_per_dk(record) -> str:
    value = 1e3 * record["us_per_iteration"] / (record["dim"] * record["rank"])
    return f"{value:.1f}" if value >= 1 else f"{value:.2f}"


def render_low_rank(kind: str = "cpu") -> str:
    """Time and memory per iteration of the low-rank cells, beside the dense ones."""
    folder = RESULTS / kind
    records = [json.loads(p.read_text()) for p in sorted(folder.glob("low_rank_d*.json"))]
    dense = {
        r["dim"]: r
        for p in folder.glob("precond_d*_n1.json")
        if (r := json.loads(p.read_text()))["devices"] == 1
    }
    records.sort(key=lambda r: (r["rank"], r["dim"]))
    widening = {
        (w["dim"], w["rank"]): w
        for p in folder.glob("low_rank_widening_*.json")
        if (w := json.loads(p.read_text()))
    }
    header = ["k", "d", "us / iteration", "ns / (d k)", "program per chain (MB)",
              "learner state (MB)", "widening: program per chain (MB)",
              "dense R: us / iteration", "dense R: program (MB)"]  # fmt: skip
    rows = []
    for r in records:
        d = dense.get(r["dim"])
        w = widening.get((r["dim"], r["rank"]))
        rows.append([
            r["rank"], f"{r['dim']:,}", f"{r['us_per_iteration']:.0f}",
            _ns_per_dk(r),
            f"{r['program_bytes'] / 1e6:.1f}", f"{r['state_bytes'] / 1e6:.1f}",
            f"{w['program_bytes'] / 1e6:.1f} ({w['kept_draws']} draws)" if w else "",
            f"{d['us_per_iteration']:.0f}" if d else "",
            f"{d['program_bytes_per_device'] / 1e6:.0f}" if d and d["program_bytes_per_device"]
            else "",
        ])  # fmt: skip
    return templating.table(header, rows)


PLOT = Path(__file__).resolve().parents[1] / "docs" / "images" / "low_rank_scaling.png"


def plot_low_rank(kind: str = "cpu", out: Path = PLOT) -> Path:
    """Microseconds per adaptive iteration against d: the dense R and the low-rank ones."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = RESULTS / kind
    low = [json.loads(p.read_text()) for p in folder.glob("low_rank_d*.json")]
    dense = sorted(
        (r["dim"], r["us_per_iteration"])
        for p in folder.glob("precond_d*_n1.json")
        if (r := json.loads(p.read_text()))["devices"] == 1
    )
    fig, ax = plt.subplots(figsize=(6.5, 4))
    if dense:
        ax.plot(*zip(*dense, strict=True), "k-o", label="dense R (the paper's)")
    for rank in sorted({r["rank"] for r in low}):
        cells = sorted((r["dim"], r["us_per_iteration"]) for r in low if r["rank"] == rank)
        ax.plot(*zip(*cells, strict=True), "-o", label=f"rank={rank}")
    ax.set(xscale="log", yscale="log", xlabel="d", ylabel="µs per adaptive iteration")
    ax.set_title("FisherMALA's adaptive iteration, one chain, float32, 2 CPU cores", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _child(args) -> None:
    """One process: every cell of one device count."""
    for problem, dim in args.cells:
        try:
            record = cell(problem, dim, args.count, args.steps, args.rows)
        except Exception as err:  # e.g. out of memory: the largest d is found by trying
            print(
                f"{problem} d={dim} devices={args.count}: {type(err).__name__}: {str(err)[:300]}",
                flush=True,
            )
            continue
        path = _record_path(record)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1))
        print(
            f"{problem:8s} d={dim:6d} devices={args.count}: "
            f"{record['us_per_iteration']:10.1f} us/iteration, "
            f"{record['collective_bytes_per_iteration']} bytes exchanged",
            flush=True,
        )


def _spawn(count: int, cells, steps: int, rows: int) -> None:
    env = dict(os.environ)
    import jax  # only to ask for the platform; the child sets its own device count

    if jax.default_backend() == "cpu":
        env["XLA_FLAGS"] = (
            env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={count}"
        ).strip()
    spec = ";".join(f"{p}:{d}" for p, d in cells)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.scaling",
            "--child",
            str(count),
            "--cells",
            spec,
            "--steps",
            str(steps),
            "--rows",
            str(rows),
        ],
        env=env,
        check=True,
    )


def render(kind: str = "cpu") -> str:
    records = [
        json.loads(p.read_text())
        for p in sorted((RESULTS / kind).glob("*.json"))
        if not p.name.startswith("low_rank")
    ]
    records.sort(key=lambda r: (r["problem"], r["devices"], r["dim"]))
    header = [
        "problem", "d", "devices", "us / iteration", "held per device (MB)",
        "program per device (MB)", "sent per iteration per device (bytes)",
    ]  # fmt: skip
    rows = []
    for r in records:
        program = r["program_bytes_per_device"]
        rows.append([
            r["problem"], r["dim"], r["devices"], f"{r['us_per_iteration']:.0f}",
            f"{r['held_bytes_per_device'] / 1e6:.1f}",
            "n/a" if program is None else f"{program / 1e6:.1f}",
            r["collective_bytes_per_iteration"],
        ])  # fmt: skip
    return templating.table(header, rows)


DOCS = Path(__file__).resolve().parents[1] / "docs" / "large_problems.md"


def write_docs(page: Path = DOCS) -> str:
    """Write the measured tables between the page's ``scaling`` markers; returns the page."""
    text = page.read_text()
    for kind in sorted(p.name for p in RESULTS.iterdir() if p.is_dir()):
        for name, table in (("scaling", render), ("low-rank", render_low_rank)):
            start, end = f"<!-- {name}:{kind}:start -->", f"<!-- {name}:{kind}:end -->"
            if start in text:
                head, rest = text.split(start)
                text = head + start + "\n" + table(kind) + "\n" + end + rest.split(end)[1]
    page.write_text(text)
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", default="", help="one device, precond problem, these d")
    parser.add_argument("--devices", default="", help="device counts (precond and data)")
    parser.add_argument("--dim", type=int, default=4000, help="d of the --devices cells")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--render",
        default=None,
        nargs="?",
        const="cpu",
        help="print the tables of one device kind (default cpu)",
    )
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cells", default="", help=argparse.SUPPRESS)
    parser.add_argument("--write-docs", action="store_true", help="fill docs/large_problems.md")
    parser.add_argument("--low-rank", default="", help="low-rank cells: these d")
    parser.add_argument("--ranks", default="8,32,128", help="k of the --low-rank cells")
    parser.add_argument("--low-rank-widening", default="",
                        help="the low-rank widening's memory: these d")  # fmt: skip
    parser.add_argument("--from-log", nargs=3, metavar=("LOG", "DEVICE_KIND", "JAX"),
                        help="cells rebuilt from a run's printed lines (missing ones only)")
    args = parser.parse_args(argv)
    if args.from_log:
        log, device_kind, jax_version = args.from_log
        text = Path(log).read_text()
        for record in records_from_log(text, device_kind, jax_version, Path(log).name):
            path = _record_path(record)
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(record, indent=1))
                print("wrote", path.relative_to(RESULTS))
        return
    if args.low_rank_widening:
        dims = [int(d) for d in args.low_rank_widening.split(",")]
        run_low_rank_widening(dims, [int(k) for k in args.ranks.split(",")])
        print(render_low_rank())
        return
    if args.low_rank:
        dims = [int(d) for d in args.low_rank.split(",")]
        run_low_rank(dims, [int(k) for k in args.ranks.split(",")], args.steps)
        print(render_low_rank())
        return
    if args.write_docs:
        write_docs()
        plot_low_rank()
        return
    if args.render:
        print(render(args.render))
        return
    if args.child is not None:
        args.count = args.child
        args.cells = [(p, int(d)) for p, d in (c.split(":") for c in args.cells.split(";"))]
        _child(args)
        return
    if args.dims:
        _spawn(1, [("precond", int(d)) for d in args.dims.split(",")], args.steps, args.rows)
    for count in filter(None, args.devices.split(",")):
        _spawn(int(count), [("precond", args.dim), ("data", 20)], args.steps, args.rows)


if __name__ == "__main__":
    main()
