"""Per-iteration cost of MALA and FisherMALA against a matrix-vector roofline.

    python -m benchmarks.step_cost                      # all cells, ~17 min on 2 cores
    python -m benchmarks.step_cost --dims 100,785 --quick
    python -m benchmarks.step_cost --threads benchmarks/results/loop_threads.json
    taskset -c 0 python -m benchmarks.step_cost --threads benchmarks/results/loop_threads_1core.json

For each dimension d, dtype, number of chains (1, or 16 vmapped with one R per chain, or
16 pooled sharing one R) and target (a standard Gaussian, the cheapest possible log density,
and a logistic regression with 10^4 rows), it measures microseconds per iteration of plain
MALA, FisherMALA frozen and FisherMALA adaptive, each as a jitted ``lax.scan`` of K steps
timed after compilation, and in the same process the roofline: one ``R @ v`` with ``R`` a
jitted argument (batched over chains; 16 columns for pooled chains), and one update of
``R`` as the adaptive step writes it (rank one per chain, rank 16 for pooled chains; buffer
donated), each both as a separate jitted call and inside a ``lax.scan``. Results go to
``benchmarks/results/step_cost.json``; ``--render`` writes the
tables of ``docs/performance.md``.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fisher_mala import fisher, mala, pooled
from fisher_mala.adaptations import fisher_preconditioner, robbins_monro

RESULTS = Path(__file__).resolve().parent / "results" / "step_cost.json"
LOGISTIC_ROWS = 10_000  # rows of the logistic regression's data matrix (the 10^4)


def _timeit(fn, *args, repeats=2):
    out = fn(*args)
    jax.block_until_ready(out)
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(*args)
        jax.block_until_ready(out)
        best = min(best, time.perf_counter() - start)
    return best


def _loop_time(body, carry, length):
    """Microseconds per iteration of ``body`` in a jitted ``lax.scan``, and the final carry.

    The carry is donated, so pass a buffer the caller no longer needs.
    """
    run = jax.jit(lambda c: jax.lax.scan(body, c, jnp.arange(length))[0], donate_argnums=0)
    carry = jax.block_until_ready(run(carry))
    best = np.inf
    for _ in range(3):
        start = time.perf_counter()
        carry = jax.block_until_ready(run(carry))
        best = min(best, time.perf_counter() - start)
    return best / length * 1e6, carry


def _targets(dim, dtype, rows):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(rows, dim)) / np.sqrt(dim), dtype)
    y = jnp.asarray(rng.uniform(size=rows) < 0.5, dtype)

    def gaussian(theta):
        return -0.5 * jnp.sum(theta**2)

    def logistic(theta):
        logits = x @ theta
        return jnp.sum(y * logits - jax.nn.softplus(logits)) - 0.5 * jnp.sum(theta**2)

    return {"gaussian": gaussian, "logistic": logistic}


def _scan(step, length):
    def run(state, key):
        def body(s, i):
            return step(jax.random.fold_in(key, i), s)[0], None

        return jax.lax.scan(body, state, jnp.arange(length))[0]

    return jax.jit(run, donate_argnums=0)


def measure(dim, dtype, chains, target_name, steps):
    """Microseconds per iteration (all chains together) of each kernel and the roofline."""
    logdensity = _targets(dim, dtype, LOGISTIC_ROWS)[target_name]
    key = jax.random.key(0)
    x0 = jnp.zeros(dim, dtype) + 0.01
    out = {}
    mala_kernel = mala.build_kernel()
    adaptive = fisher.adaptive_step(
        fisher_preconditioner(fisher.DAMPING), robbins_monro(), "rao_blackwell"
    )
    frozen = fisher.build_kernel()

    def mala_step(k, s):
        return mala_kernel(k, s, logdensity, 0.1)

    def fisher_adaptive(k, s):
        return adaptive(k, s, logdensity)

    def fisher_frozen(k, s):
        return frozen(k, s, logdensity)

    if chains == "pooled16":
        states = pooled.init(jnp.tile(x0, (16, 1)), logdensity, 0.1)
        pk_adapt = pooled.adaptive_step(fisher_preconditioner(), robbins_monro())
        pk_frozen = pooled.build_kernel()
        kernels = {
            "fisher_frozen": (lambda k, s: pk_frozen(k, s, logdensity), states),
            "fisher_adaptive": (lambda k, s: pk_adapt(k, s, logdensity), states),
        }
        num = 16
    else:
        num = 1 if chains == "1" else 16
        fstate = fisher.init(x0, logdensity, 0.1)
        mstate = mala.init(x0, logdensity)
        kernels = {
            "mala": (mala_step, mstate),
            "fisher_frozen": (fisher_frozen, fstate),
            "fisher_adaptive": (fisher_adaptive, fstate),
        }
        if num > 1:

            def batch(fn):
                return lambda k, s: jax.vmap(fn)(jax.random.split(k, num), s)

            kernels = {
                name: (batch(fn), jax.tree.map(lambda a: jnp.stack([a] * num), st))
                for name, (fn, st) in kernels.items()
            }
    for name, (fn, state) in kernels.items():
        # steady state: the donated state is fed back, so R is updated in place and no
        # buffer is allocated or copied between calls
        run = _scan(fn, steps)
        state = run(jax.tree.map(jnp.copy, state), key)
        jax.block_until_ready(state)
        best = np.inf
        for _ in range(3):
            start = time.perf_counter()
            state = jax.block_until_ready(run(state, key))
            best = min(best, time.perf_counter() - start)
        out[name] = best / steps * 1e6
    # roofline in the same process: R passed as an argument, not a baked-in constant.
    # The update is what the adaptive step writes: rank one per R, rank 16 for pooled chains.
    r = jnp.asarray(np.random.default_rng(1).normal(size=(dim, dim)), dtype)
    v = jnp.ones((num, dim), dtype)

    def product(r, v):
        return jnp.einsum("ij,cj->ci", r, v)

    if chains == "pooled16":
        rr = r

        def rank_update(r, t):
            return r - jnp.einsum("ci,cj->ij", t, t)
    elif num == 1:
        rr = r

        def rank_update(r, t):
            return r - t[0][:, None] * t[0][None, :]
    else:
        rr = jnp.stack([r] * num)

        def product(r, v):
            return jnp.einsum("cij,cj->ci", r, v)

        def rank_update(r, t):
            return r - t[:, :, None] * t[:, None, :]

    t = jnp.full((num, dim), 1e-3, dtype)
    out["matvec"] = _timeit(jax.jit(product), rr, v) * 1e6
    rank_update_call = jax.jit(rank_update, donate_argnums=0)
    holder = [rr]

    def update():
        holder[0] = rank_update_call(holder[0], t)
        return holder[0]

    out["rank_one"] = _timeit(update) * 1e6
    out["frozen_over_2_matvec"] = out["fisher_frozen"] / (2 * out["matvec"])
    out["adaptive_over_roofline"] = out["fisher_adaptive"] / (3 * out["matvec"] + out["rank_one"])
    # the same two operations inside a jitted lax.scan, where every sampler step runs
    # (XLA:CPU runs a product inside a while loop on one thread: see --threads)

    def matvec_body(carry, i):
        r, acc = carry
        return (r, 0.5 * acc + product(r, v + 1e-3 * acc)), None

    out["matvec_loop"], (rr, _) = _loop_time(matvec_body, (holder[0], jnp.zeros_like(v)), steps)

    def rank_one_body(r, i):
        return rank_update(r, (1e-7 * i).astype(dtype) * t), None

    out["rank_one_loop"], _ = _loop_time(rank_one_body, rr, steps)
    out["frozen_over_2_matvec_loop"] = out["fisher_frozen"] / (2 * out["matvec_loop"])
    out["adaptive_over_roofline_loop"] = out["fisher_adaptive"] / (
        3 * out["matvec_loop"] + out["rank_one_loop"]
    )
    if "mala" in out:
        out["frozen_over_mala"] = out["fisher_frozen"] / out["mala"]
        out["adaptive_over_mala"] = out["fisher_adaptive"] / out["mala"]
    return out


def orientation(dims=(785, 2000), chains=16) -> list[dict]:
    """Microseconds of ``R @ v``, ``v @ R`` and ``R.T @ v``: one R, and ``chains`` batched."""
    rows = []
    for dim in dims:
        rng = np.random.default_rng(0)
        r = jnp.asarray(rng.normal(size=(dim, dim)), jnp.float32)
        rb = jnp.asarray(rng.normal(size=(chains, dim, dim)), jnp.float32)
        v, vb = jnp.ones(dim, jnp.float32), jnp.ones((chains, dim), jnp.float32)
        single = {
            "R@v": jax.jit(lambda r, v: r @ v),
            "v@R": jax.jit(lambda r, v: v @ r),
            "R.T@v": jax.jit(lambda r, v: r.T @ v),
        }
        batched = {
            "R@v": jax.jit(jax.vmap(lambda r, v: r @ v)),
            "v@R": jax.jit(jax.vmap(lambda r, v: v @ r)),
        }
        row = {"dim": dim, "chains": chains}
        row.update({f"single {k}": _timeit(f, r, v, repeats=20) * 1e6 for k, f in single.items()})
        row.update(
            {f"batched {k}": _timeit(f, rb, vb, repeats=5) * 1e6 for k, f in batched.items()}
        )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def loop_threads(dim=4000, length=10, rounds=7) -> dict:
    """Why a product inside ``lax.scan`` is slower than a separate call on XLA:CPU.

    Times, for one float32 ``R`` of size ``dim``, ``R @ v`` and ``v @ R`` as separate jitted
    calls, inside a ``lax.scan`` (an XLA while loop) and inside a fully unrolled scan (no
    loop), and one FisherMALA step (frozen and adaptive) in a scan and in an unrolled
    chunk of ``length`` steps. The variants are timed in interleaved rounds (best of
    ``rounds``), so that a slow spell of a shared machine hits all of them. Run it again
    under ``taskset -c 0``: with one core the separate call and the loop agree, i.e. the gap
    is intra-op threads, which XLA:CPU does not use inside a while loop.
    """
    dtype = jnp.float32
    rng = np.random.default_rng(0)
    r = jnp.asarray(rng.normal(size=(dim, dim)), dtype)
    v = jnp.ones(dim, dtype)
    logdensity = _targets(dim, dtype, 10)["gaussian"]
    key = jax.random.key(0)
    timed = {}  # name -> (function of no argument, number of steps it runs)
    for name, fn in {"R@v": lambda r, v: r @ v, "v@R": lambda r, v: v @ r}.items():
        call = jax.jit(fn)
        timed[f"{name} call"] = (lambda call=call: call(r, v), 1)
        for unroll, label in ((1, "loop"), (True, "unrolled")):

            def run(r, v, fn=fn, unroll=unroll):
                def body(acc, i):
                    return 0.5 * acc + fn(r, v + 1e-3 * acc), None

                return jax.lax.scan(body, v, jnp.arange(length), unroll=unroll)[0]

            run = jax.jit(run)
            timed[f"{name} {label}"] = (lambda run=run: run(r, v), length)
    for adapt in (False, True):
        kernel = (
            fisher.adaptive_step(
                fisher_preconditioner(fisher.DAMPING), robbins_monro(), "rao_blackwell"
            )
            if adapt
            else fisher.build_kernel()
        )
        for unroll, label in ((1, "loop"), (True, "unrolled")):

            def run(state, key, kernel=kernel, unroll=unroll):
                def body(s, i):
                    return kernel(jax.random.fold_in(key, i), s, logdensity)[0], None

                return jax.lax.scan(body, state, jnp.arange(length), unroll=unroll)[0]

            run = jax.jit(run)
            state = fisher.init(jnp.full(dim, 0.01, dtype), logdensity, 0.1)
            name = f"fisher {'adaptive' if adapt else 'frozen'} {label}"
            timed[name] = (lambda run=run, state=state: run(state, key), length)
    best = dict.fromkeys(timed, np.inf)
    for fn, _ in timed.values():
        jax.block_until_ready(fn())  # compile
    for _ in range(rounds):
        for name, (fn, steps) in timed.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            best[name] = min(best[name], (time.perf_counter() - start) / steps * 1e6)
    return {
        "dim": dim,
        "length": length,
        "rounds": rounds,
        "cores": len(os.sched_getaffinity(0)),
        **best,
    }


#: Table columns: header and the ``us`` key with its format ("-" where a row lacks it).
COLUMNS = (
    ("MALA µs", "mala", ".0f"),
    ("Fisher frozen µs", "fisher_frozen", ".0f"),
    ("Fisher adaptive µs", "fisher_adaptive", ".0f"),
    ("R@v µs", "matvec", ".0f"),
    ("rank-1 µs", "rank_one", ".0f"),
    ("R@v in loop µs", "matvec_loop", ".0f"),
    ("rank-1 in loop µs", "rank_one_loop", ".0f"),
    ("frozen / 2 R@v", "frozen_over_2_matvec", ".2f"),
    ("adaptive / (3 R@v + rank-1)", "adaptive_over_roofline", ".2f"),
    ("same, loop roofline: frozen", "frozen_over_2_matvec_loop", ".2f"),
    ("adaptive", "adaptive_over_roofline_loop", ".2f"),
    ("adaptive / MALA", "adaptive_over_mala", ".2f"),
)


def render(results, columns=COLUMNS) -> str:
    """Markdown table of ``results``: times, and ratios to both rooflines (or ``columns``)."""
    heads = ["target", "d", "dtype", "chains", *(c[0] for c in columns)]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for row in results:
        m = row["us"]
        cells = [format(m[key], fmt) if key in m else "-" for _, key, fmt in columns]
        lines.append(
            f"| {row['target']} | {row['dim']} | {row['dtype']} | {row['chains']} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def _l3_cache_bytes() -> int | None:
    """The CPU's L3 cache size from Linux sysfs (``None`` where it is not there)."""
    path = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    units = {"K": 2**10, "M": 2**20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def _write(path: Path, argv, rows) -> None:
    meta = {
        "device": str(jax.devices()[0]),
        "device_kind": jax.devices()[0].device_kind,
        "l3_cache_bytes": _l3_cache_bytes(),
        "jax": jax.__version__,
        "matmul_precision": jax.config.jax_default_matmul_precision or "default",
        "command": "python -m benchmarks.step_cost "
        + " ".join(sys.argv[1:] if argv is None else argv),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", default="100,785,2000,4000")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--chains", default="1,16,pooled16")
    parser.add_argument("--targets", default="gaussian,logistic")
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="steps per timed scan (default: sized for ~10 GB/s CPU memory)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--render", action="store_true", help="print the table from --out")
    parser.add_argument(
        "--orientation",
        action="store_true",
        help="only time R@v, v@R, R.T@v (-> results/orientation.json)",
    )
    parser.add_argument(
        "--threads",
        type=Path,
        default=None,
        metavar="JSON",
        help="only time products and steps in and out of a loop "
        "(see loop_threads) and write them to JSON",
    )
    args = parser.parse_args(argv)
    if args.threads is not None:
        row = loop_threads()
        print(json.dumps(row), flush=True)
        args.threads.parent.mkdir(parents=True, exist_ok=True)
        args.threads.write_text(json.dumps({"device": str(jax.devices()[0]), "row": row}, indent=1))
        return
    if args.orientation:
        path = RESULTS.with_name("orientation.json")
        path.write_text(
            json.dumps({"device": str(jax.devices()[0]), "rows": orientation()}, indent=1)
        )
        return
    if args.render:
        print(render(json.loads(args.out.read_text())["rows"]))
        return
    rows = []
    for dtype_name in args.dtypes.split(","):
        with jax.enable_x64(dtype_name == "float64"):
            dtype = jnp.dtype(dtype_name)
            for target in args.targets.split(","):
                for dim in map(int, args.dims.split(",")):
                    for chains in args.chains.split(","):
                        size = dim * dim * dtype.itemsize * (1 if chains != "16" else 16)
                        # about 4 passes over R per step at ~10 GB/s: aim at ~0.5 s per call
                        steps = int(np.clip(5e8 / (4 * size), 20, 500))
                        if args.quick:
                            steps = max(10, steps // 5)
                        if args.steps is not None:
                            steps = args.steps
                        us = measure(dim, dtype, chains, target, steps)
                        row = {
                            "target": target,
                            "dim": dim,
                            "dtype": dtype_name,
                            "chains": chains,
                            "steps": steps,
                            "us": us,
                        }
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        _write(args.out, argv, rows)  # after every cell: a killed run keeps them
    print(render(rows))


if __name__ == "__main__":
    main()
