"""Run the paper's cells (Section 5, Appendix E) and cache them; ``benchmarks.paper`` is
the command line, ``benchmarks.paper_render`` turns the cache into tables and figures.

Every (target, configuration) cell runs its repetitions as vmapped chains (each from its
own N(0, I) start, as in the paper) and caches one JSON per repetition under
``benchmarks/results/<target>/<config>/rep<r>.json``; a cell whose files exist with the
same protocol is never recomputed, so an interrupted run resumes. ``--iterations`` and
``--repeats`` give a reduced protocol, which is recorded in the files and shown in the
tables. Each file records the device, dtype, library versions and wall-clock times.
"""

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import fisher_mala as fm
from benchmarks import cells

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DOCS = HERE.parent / "docs"
PAPER = json.loads((HERE / "paper_values.json").read_text())

PAPER_ITERATIONS = 20_000
PAPER_REPEATS = 10
ALL_TARGETS = (
    "gp",
    "inhomogeneous",
    "pima",
    "caravan",
    "mnist56",
    "heart",
    "german",
    "australian",
    "ripley",
)
CONFIGS = {  # name -> (sampler, options)
    "mala": ("mala", {}),
    "adamala": ("adamala", {}),
    "hmc": ("hmc", {}),
    "mmala": ("mmala", {}),
    "fisher_mala": ("fisher_mala", {}),
    "fisher_mala-increment": ("fisher_mala", {"signal": "increment"}),
    "fisher_mala-centered": ("fisher_mala", {"signal": "centered"}),
    "fisher_mala-score": ("fisher_mala", {"signal": "score"}),
}
EXPERIMENTS = {
    "table1": (["mala", "adamala", "hmc", "mmala", "fisher_mala"], ALL_TARGETS),
    "variants": (["fisher_mala", "fisher_mala-increment", "fisher_mala-centered"], ALL_TARGETS),
    "noncentered": (["fisher_mala-score"], ("gp", "ripley", "pima", "caravan", "mnist56")),
}
FROBENIUS = (
    ("gaussian_2d", "gp", "inhomogeneous"),
    ("fisher_mala", "fisher_mala-increment", "adamala"),
)


def _environment(dtype) -> dict:
    return cells.environment(dtype)


def _cell_dir(target: str, config: str, root: Path = RESULTS) -> Path:
    return root / target / config


def _protocol(iterations: int, repeats: int) -> dict:
    return {"num_warmup": iterations, "num_samples": iterations, "repeats": repeats}


def cell_is_done(target, config, protocol, root=RESULTS) -> bool:
    """A (target, configuration) cell is one file per repetition, all with ``protocol``."""
    files = [
        _cell_dir(target, config, root) / f"rep{r:02d}.json" for r in range(protocol["repeats"])
    ]
    return all(cells.is_done(f, protocol) for f in files)


def run_cell(
    target_name,
    config,
    iterations,
    repeats,
    dtype=jnp.float32,
    root=RESULTS,
    seed=0,
    progress=False,
):
    """Run one (target, configuration) cell and cache one JSON per repetition."""
    protocol = _protocol(iterations, repeats)
    if cell_is_done(target_name, config, protocol, root):
        print(f"  cached   {target_name:14s} {config}")
        return
    sampler, options = CONFIGS[config]
    target = fm.targets.get(target_name)
    key_init, key_run = jax.random.split(jax.random.key(seed))
    positions = target.initial_positions(key_init, repeats, dtype)
    start = time.perf_counter()
    result = fm.sample(
        key_run,
        sampler,
        target.logdensity_fn,
        positions,
        num_warmup=iterations,
        num_samples=iterations,
        progress_bar=progress,
        **options,
    )
    total = time.perf_counter() - start
    ess = fm.ess(result, method="paper", per_chain=True)  # (repeats, d)
    env = _environment(dtype)
    out = _cell_dir(target_name, config, root)
    out.mkdir(parents=True, exist_ok=True)
    logdensity = np.asarray(result.sample_stats["logdensity"], np.float64)
    thin = max(1, logdensity.shape[1] // 1000)
    for r in range(repeats):
        record = {
            "target": target_name,
            "config": config,
            "sampler": sampler,
            "options": options,
            "repeat": r,
            "dim": target.dim,
            "protocol": protocol,
            "ess": ess[r].tolist(),
            "ess_max": float(ess[r].max()),
            "ess_median": float(np.median(ess[r])),
            "ess_min": float(ess[r].min()),
            "ess_bulk_min": None,
            "step_size": float(np.asarray(result.parameters.step_size)[r]),
            "acceptance_rate": float(np.mean(result.sample_stats["acceptance_rate"][r])),
            "num_grad_evals": int(result.num_grad_evals[r]),
            "logdensity_trace": logdensity[r, ::thin].tolist(),
            "logdensity_thin": thin,
            "seconds": {
                "compile": result.compile_seconds,
                "warmup": result.warmup_seconds,
                "sampling": result.sampling_seconds,
                "total": total,
                "note": f"whole cell: {repeats} vmapped chains",
            },
            "environment": env,
        }
        precond = result.parameters.sqrt_precond
        if precond is not None:
            rr = np.asarray(precond[r], np.float64)
            a = rr @ rr.T
            a /= np.trace(a) / a.shape[0]
            record["precond_diag"] = np.diag(a).tolist()
            if r == 0 and a.shape[0] <= 100:
                record["precond"] = a.tolist()
        cells.write(out / f"rep{r:02d}.json", record, indent=None)
    print(
        f"  computed {target_name:14s} {config:22s} {total:8.1f} s  "
        f"min ESS {ess.min(axis=1).mean():9.1f}"
    )


def run_frobenius(
    target_name, config, iterations, repeats, every, root=RESULTS, seed=0, dtype=jnp.float32
):
    """Warm-up only, recording ||A~_n - Sigma~||_F every ``every`` iterations."""
    path = root / "frobenius" / target_name / f"{config}.json"
    protocol = {"num_warmup": iterations, "repeats": repeats, "every": every}
    if cells.is_done(path, protocol):
        print(f"  cached   frobenius {target_name} {config}")
        return
    sampler, options = CONFIGS[config]
    target = fm.targets.get(target_name)
    warmup_cls = {
        "fisher_mala": fm.warmups.fisher_mala_warmup,
        "adamala": fm.warmups.adamala_warmup,
    }[sampler]
    warmup = warmup_cls(target.logdensity_fn, trace_every=every, record_precond=True, **options)
    key_init, key_run = jax.random.split(jax.random.key(seed))
    positions = target.initial_positions(key_init, repeats, dtype)
    sigma = jnp.asarray(target.covariance / (np.trace(target.covariance) / target.dim), dtype)

    @jax.jit
    def distances(keys, positions):
        def one(key, x):
            _, info = warmup.run(key, x, iterations)
            return info.trace.iteration, jax.vmap(lambda a: jnp.linalg.norm(a - sigma))(
                info.trace.normalized_precond
            )

        return jax.vmap(one)(keys, positions)

    start = time.perf_counter()
    iters, dist = distances(jax.random.split(key_run, repeats), positions)
    record = {
        "target": target_name,
        "config": config,
        "protocol": protocol,
        "iteration": np.asarray(iters[0]).tolist(),
        "distance": np.asarray(dist, np.float64).tolist(),
        "initial_distance": float(np.linalg.norm(np.eye(target.dim) - np.asarray(sigma))),
        "seconds": time.perf_counter() - start,
        "environment": _environment(dtype),
    }
    cells.write(path, record, indent=None)
    print(f"  computed frobenius {target_name} {config} final {np.mean(dist[:, -1]):.3f}")


def _targets(arg, default):
    return default if arg in (None, "all") else tuple(arg.split(","))


def cmd_run(args):
    if args.experiment == "frobenius":
        for target in _targets(args.targets, FROBENIUS[0]):
            for config in _targets(args.samplers, FROBENIUS[1]):
                run_frobenius(target, config, args.iterations, args.repeats, args.every, args.root)
        return
    configs, targets = EXPERIMENTS[args.experiment]
    for target in _targets(args.targets, targets):
        for config in _targets(args.samplers, configs):
            run_cell(
                target,
                config,
                args.iterations,
                args.repeats,
                root=args.root,
                progress=args.progress,
            )
