"""Per-iteration cost of MALA and FisherMALA against a matrix-vector roofline.

    python -m benchmarks.step_cost                      # all cells, ~10 min on 2 cores
    python -m benchmarks.step_cost --dims 100,785 --quick

For each dimension d, dtype, number of chains (1, or 16 vmapped with one R per chain, or
16 pooled sharing one R) and target (a standard Gaussian, the cheapest possible log density,
and a logistic regression with 10^4 rows), it measures microseconds per iteration of plain
MALA, FisherMALA frozen and FisherMALA adaptive, each as a jitted ``lax.scan`` of K steps
timed after compilation, and in the same process the roofline: one ``R @ v`` with ``R`` a
jitted argument (batched over chains), and one rank-one update ``R - t u^T`` (buffer
donated). Results go to ``benchmarks/results/step_cost.json``; ``--render`` writes the
tables of ``docs/performance.md``.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fisher_mala import fisher, mala, pooled

RESULTS = Path(__file__).resolve().parent / "results" / "step_cost.json"


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
    logdensity = _targets(dim, dtype, 10_000)[target_name]
    key = jax.random.key(0)
    x0 = jnp.zeros(dim, dtype) + 0.01
    out = {}
    mala_kernel = mala.build_kernel()
    adaptive = fisher.build_kernel(adapt=True)
    frozen = fisher.build_kernel(adapt=False)

    def mala_step(k, s):
        return mala_kernel(k, s, logdensity, 0.1)

    def fisher_adaptive(k, s):
        return adaptive(k, s, logdensity)

    def fisher_frozen(k, s):
        return frozen(k, s, logdensity)

    if chains == "pooled16":
        states = pooled.init(jnp.tile(x0, (16, 1)), logdensity, 0.1)
        pk_adapt, pk_frozen = pooled.build_kernel(True), pooled.build_kernel(False)
        kernels = {
            "fisher_frozen": (lambda k, s: pk_frozen(k, s, logdensity), states),
            "fisher_adaptive": (lambda k, s: pk_adapt(k, s, logdensity), states),
        }
        num = 16
    else:
        num = 1 if chains == "1" else 16
        fstate = fisher.init(x0, logdensity, 0.1)
        mstate = mala.init(x0, logdensity)
        kernels = {"mala": (mala_step, mstate), "fisher_frozen": (fisher_frozen, fstate),
                   "fisher_adaptive": (fisher_adaptive, fstate)}
        if num > 1:
            def batch(fn):
                return lambda k, s: jax.vmap(fn)(jax.random.split(k, num), s)

            kernels = {name: (batch(fn), jax.tree.map(lambda a: jnp.stack([a] * num), st))
                       for name, (fn, st) in kernels.items()}
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
    # roofline in the same process: R passed as an argument, not a baked-in constant
    shared = chains == "pooled16" or num == 1
    r = jnp.asarray(np.random.default_rng(1).normal(size=(dim, dim)), dtype)
    v = jnp.ones((num, dim), dtype)
    if shared:
        matvec = jax.jit(lambda r, v: jnp.einsum("ij,cj->ci", r, v))
        rank_one = jax.jit(lambda r, t, u: r - t[:, None] * u[None, :], donate_argnums=0)
        rr = r
    else:
        rr = jnp.stack([r] * num)
        matvec = jax.jit(lambda r, v: jnp.einsum("cij,cj->ci", r, v))
        rank_one = jax.jit(lambda r, t, u: r - t[:, :, None] * u[:, None, :], donate_argnums=0)
    out["matvec"] = _timeit(matvec, rr, v) * 1e6
    t = jnp.ones((dim,) if shared else (num, dim), dtype) * 1e-3
    holder = [rr]

    def update():
        holder[0] = rank_one(holder[0], t, t)
        return holder[0]

    out["rank_one"] = _timeit(update) * 1e6
    out["frozen_over_2_matvec"] = out["fisher_frozen"] / (2 * out["matvec"])
    out["adaptive_over_roofline"] = out["fisher_adaptive"] / (3 * out["matvec"] + out["rank_one"])
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
        row.update({f"batched {k}": _timeit(f, rb, vb, repeats=5) * 1e6
                    for k, f in batched.items()})
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def render(results) -> str:
    lines = ["| target | d | dtype | chains | MALA µs | Fisher frozen µs | Fisher adaptive µs | "
             "R@v µs | rank-1 µs | frozen / 2 R@v | adaptive / (3 R@v + rank-1) | "
             "adaptive / MALA |", "|" + "---|" * 12]
    for row in results:
        m = row["us"]
        mala_us = f"{m['mala']:.0f}" if "mala" in m else "-"
        ratio_mala = f"{m['adaptive_over_mala']:.2f}" if "adaptive_over_mala" in m else "-"
        lines.append(
            f"| {row['target']} | {row['dim']} | {row['dtype']} | {row['chains']} | {mala_us} | "
            f"{m['fisher_frozen']:.0f} | {m['fisher_adaptive']:.0f} | {m['matvec']:.0f} | "
            f"{m['rank_one']:.0f} | {m['frozen_over_2_matvec']:.2f} | "
            f"{m['adaptive_over_roofline']:.2f} | {ratio_mala} |")
    return "\n".join(lines)


def _write(path: Path, argv, rows) -> None:
    meta = {"device": str(jax.devices()[0]), "device_kind": jax.devices()[0].device_kind,
            "jax": jax.__version__,
            "matmul_precision": jax.config.jax_default_matmul_precision or "default",
            "command": "python -m benchmarks.step_cost "
            + " ".join(sys.argv[1:] if argv is None else argv)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", default="100,785,2000,4000")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--chains", default="1,16,pooled16")
    parser.add_argument("--targets", default="gaussian,logistic")
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per timed scan (default: sized for ~10 GB/s CPU memory)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--render", action="store_true", help="print the table from --out")
    parser.add_argument("--orientation", action="store_true",
                        help="only time R@v, v@R, R.T@v (-> results/orientation.json)")
    args = parser.parse_args(argv)
    if args.orientation:
        path = RESULTS.with_name("orientation.json")
        path.write_text(json.dumps({"device": str(jax.devices()[0]), "rows": orientation()},
                                   indent=1))
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
                        row = {"target": target, "dim": dim, "dtype": dtype_name,
                               "chains": chains, "steps": steps, "us": us}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        _write(args.out, argv, rows)  # after every cell: a killed run keeps them
    print(render(rows))


if __name__ == "__main__":
    main()
