"""The NumPyro user's switch: ``NUTS`` against ``fm.FisherNUTSKernel`` and
``fm.FisherMALAKernel`` inside ``numpyro.infer.MCMC``, by the clock.

    python -m benchmarks.numpyro_wall            # every cell, cached; then the table
    python -m benchmarks.numpyro_wall --render   # the table only
    python -m benchmarks.numpyro_wall --cell gp_latent fisher_nuts 4 --set metric=diagonal
    python -m benchmarks.numpyro_wall --cell count fisher_nuts 1 --again   # a second run
    python -m benchmarks.numpyro_wall --cell logistic nuts 4 --fresh   # not cached, printed
    python -m benchmarks.numpyro_wall --setup     # the kernels' model set-up, two ways
    python -m benchmarks.numpyro_wall --compiles logistic 4   # where the seconds go
    python -m benchmarks.numpyro_wall --fast-compile   # the Fisher phase's two compilations

Three models (a hierarchical negative-binomial count model, a logistic regression, a
latent Gaussian-process Poisson model; synthetic data, fixed seeds), float64, 1000
warm-up and 1000 draws per chain (FisherMALA: 5000 + 5000, a MALA-type sampler's
lengths), ``chain_method="sequential"``, 1 and 4 chains, each cell in a fresh process (no
cell reuses what another compiled). Wall time: ``MCMC.run`` by the clock, compilation
included (the imports and the model's set-up before it are not); min bulk ESS over every
latent coordinate (ArviZ's rank-normalized, over the chains). Each cell runs with
:data:`SEEDS` keys (a single run's min ESS, and a single chain's above all, varies by a
third between keys): the table shows the median seconds and the median min ESS over them.
Cells in ``benchmarks/results/numpyro_wall/`` (``<model>_<kernel>_<chains>[_s<seed>].json``).

The issue's question is the clock for equal ESS: ``fisher_nuts_equal`` runs Fisher NUTS
(1000 warm-up) with the draws per chain that give NUTS's min ESS, 1000 times the ratio of
the two kernels' median min ESS in the recorded cells (run after them), right after a run
of NUTS's cell again (``nuts_paired``: the machine's load drifts between batches of cells
by more than the draws cost), and the second table sets the two side by side.
"""

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import templating

RESULTS = Path(__file__).resolve().parent / "results" / "numpyro_wall"
TABLE = RESULTS.parent / "numpyro_wall.md"
KERNELS = ("nuts", "fisher_nuts", "fisher_nuts_warm", "fisher_mala")
CHAINS = (1, 4)
#: The keys ``jax.random.key(seed)`` of each cell's runs.
SEEDS = (0, 1, 2)
#: Warm-up and draws per chain; ``fisher_nuts_warm``: 1000 draws after the warm-up the
#: kernel's short-warm-up warning asks for (``fm.numpyro_kernel.suggested_num_warmup``,
#: at least 1000); ``fisher_nuts_equal``: 1000 warm-up, the draws of :func:`equal_draws`.
LENGTHS = {"nuts": 1000, "fisher_nuts": 1000, "fisher_nuts_warm": 1000, "fisher_mala": 5000,
           "fisher_nuts_equal": 1000, "nuts_paired": 1000}  # fmt: skip


def _models():
    import numpyro
    import numpyro.distributions as dist

    rng = np.random.default_rng(0)
    groups, per_group = 20, 10
    group = np.repeat(np.arange(groups), per_group)
    counts = rng.negative_binomial(5, 5 / (5 + np.exp(1.0 + rng.normal(0, 0.5, groups)[group])))

    def count(group, y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        phi = numpyro.sample("phi", dist.HalfNormal(10.0))
        with numpyro.plate("groups", groups):
            raw = numpyro.sample("raw", dist.Normal(0.0, 1.0))
        rate = jnp.exp(mu + sigma * raw[group])
        numpyro.sample("y", dist.NegativeBinomial2(rate, phi), obs=y)

    x = rng.normal(size=(500, 5)) * np.array([1.0, 3.0, 0.3, 1.0, 2.0])
    w = rng.normal(size=5)
    labels = (rng.uniform(size=500) < 1 / (1 + np.exp(-(x @ w)))).astype(float)

    def logistic(x, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
        b = numpyro.sample("b", dist.Normal(0.0, 5.0))
        numpyro.sample("y", dist.Bernoulli(logits=x @ w + b), obs=y)

    points = np.linspace(0, 10, 30)
    truth = np.sin(points)
    events = rng.poisson(np.exp(truth))

    def gp_latent(t, y=None):
        amplitude = numpyro.sample("amplitude", dist.LogNormal(0.0, 0.5))
        length = numpyro.sample("length", dist.LogNormal(0.5, 0.5))
        k = amplitude**2 * jnp.exp(-0.5 * (t[:, None] - t[None]) ** 2 / length**2)
        chol = jnp.linalg.cholesky(k + 1e-6 * jnp.eye(t.size))
        raw = numpyro.sample("raw", dist.Normal(0.0, 1.0).expand([t.size]).to_event(1))
        numpyro.sample("y", dist.Poisson(jnp.exp(chol @ raw)), obs=y)

    return {
        "count": (count, (group,), {"y": counts}),
        "logistic": (logistic, (x,), {"y": labels}),
        "gp_latent": (gp_latent, (points,), {"y": events}),
    }


def _path(model_name: str, kernel_name: str, chains: int, seed: int = 0) -> Path:
    suffix = f"_s{seed}" if seed else ""
    return RESULTS / f"{model_name}_{kernel_name}_{chains}{suffix}.json"


def cell(
    model_name: str, kernel_name: str, chains: int, options=None, seed: int = 0, again=False,
    fresh=False,
) -> dict:
    """One cell (cached), or with ``options`` for the Fisher kernel or ``fresh``: printed,
    not cached. ``again``: then a second ``MCMC.run`` on the same data (key ``seed + 1``),
    its seconds printed (not cached): what a user's next run costs once the first has
    compiled."""
    path = _path(model_name, kernel_name, chains, seed)
    if path.exists() and not options and not again and not fresh:
        return json.loads(path.read_text())
    from numpyro.infer import MCMC, NUTS

    import fisher_mala as fm
    from fisher_mala import convergence

    model, args, kwargs = _models()[model_name]
    kernels = {"nuts": NUTS, "nuts_paired": NUTS, "fisher_nuts": fm.FisherNUTSKernel,
               "fisher_nuts_warm": fm.FisherNUTSKernel,
               "fisher_nuts_equal": fm.FisherNUTSKernel,
               "fisher_mala": fm.FisherMALAKernel}  # fmt: skip
    kernel = kernels[kernel_name](model, **(options or {}))
    num = num_warmup = LENGTHS[kernel_name]
    if kernel_name == "fisher_nuts_equal":
        num = equal_draws(model_name, chains)
    if kernel_name == "fisher_nuts_warm":  # found in another process: nothing of it compiled here
        command = [sys.executable, "-m", "benchmarks.numpyro_wall", "--suggest", model_name]
        num_warmup = int(subprocess.run(command, check=True, capture_output=True, text=True)
                         .stdout.split()[-1])  # fmt: skip
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num, num_chains=chains,
                chain_method="sequential", progress_bar=False)  # fmt: skip
    start = time.perf_counter()
    mcmc.run(jax.random.key(seed), *args, **kwargs)
    jax.block_until_ready(mcmc.get_samples())
    seconds = time.perf_counter() - start
    samples = mcmc.get_samples(group_by_chain=True)
    flat = np.concatenate(
        [np.asarray(v).reshape(chains, num, -1) for k, v in sorted(samples.items())], axis=-1
    )
    ess = convergence.ess_bulk(flat)
    if again:
        start = time.perf_counter()
        mcmc.run(jax.random.key(seed + 1), *args, **kwargs)
        jax.block_until_ready(mcmc.get_samples())
        again = time.perf_counter() - start
        print(f"{model_name} {kernel_name} {chains}: first run {seconds:.1f} s, "
              f"second run {again:.1f} s", flush=True)  # fmt: skip
        return {"seconds": seconds, "again_seconds": again}
    out = {
        "model": model_name,
        "kernel": kernel_name,
        "chains": chains,
        "seed": seed,
        "warmup": num_warmup,
        "draws": num,
        "seconds": seconds,
        "min_ess": float(np.nanmin(ess)),
        "ess_per_second": float(np.nanmin(ess)) / seconds,
    }
    if options or fresh:
        print({**out, "options": options or {}}, flush=True)
        return out
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(out, flush=True)
    return out


def suggested(model_name: str) -> int:
    """The warm-up that ``FisherNUTSKernel``'s short-warm-up warning asks for (at least
    1000) on ``model_name``."""
    from numpyro.infer.util import initialize_model

    import fisher_mala as fm
    from fisher_mala.numpyro_kernel import suggested_num_warmup

    model, args, kwargs = _models()[model_name]
    params = initialize_model(jax.random.key(0), model, model_args=args, model_kwargs=kwargs)
    dim = sum(np.size(v) for v in jax.tree.leaves(params[0][0]))
    return max(LENGTHS["fisher_nuts_warm"], suggested_num_warmup(fm.FisherNUTSKernel(model), dim))


def equal_draws(model: str, chains: int) -> int:
    """Fisher NUTS's draws per chain for NUTS's min ESS: ``LENGTHS["nuts"]`` times NUTS's
    median min ESS over Fisher NUTS's, in the recorded cells (at least 100)."""
    nuts, fisher = _median_cell(model, "nuts", chains), _median_cell(model, "fisher_nuts", chains)
    if nuts is None or fisher is None:
        raise RuntimeError(f"{model}, {chains} chains: record the nuts and fisher_nuts cells first")
    return max(100, math.ceil(LENGTHS["nuts"] * nuts[1] / fisher[1]))


def _median_cell(model: str, kernel: str, chains: int):
    """``(seconds, min ESS, runs)``: the medians over the recorded seeds, or None."""
    runs = [json.loads(p.read_text()) for seed in SEEDS
            if (p := _path(model, kernel, chains, seed)).exists()]  # fmt: skip
    if not runs:
        return None
    seconds = float(np.median([r["seconds"] for r in runs]))
    return seconds, float(np.median([r["min_ess"] for r in runs])), runs


#: The ways a kernel can set a model up for the chains of a run (:func:`setup_seconds`).
SETUP_WAYS = ("eager_then_finder", "kernel")


def setup_seconds(model_name: str, way: str) -> str:
    """Seconds to set ``model_name`` up for a first chain and then a second, by the clock,
    in this process (run each way in its own: nothing compiled by the other). ``way``:
    ``"eager_then_finder"``, NumPyro's ``initialize_model`` with a batch of one key (as
    ``MCMC`` does for NUTS, there with one key) and then the compiled program that finds
    further chains' points, the kernels' set-up before it used that program's trace;
    ``"kernel"``, ``fm.FisherNUTSKernel``'s set-up (``numpyro_kernel._initialize``)."""
    from numpyro.infer import init_to_uniform
    from numpyro.infer.util import initialize_model

    import fisher_mala as fm
    from fisher_mala.numpyro_kernel import _initialize

    if way not in SETUP_WAYS:
        raise ValueError(f"`way` must be one of {SETUP_WAYS}, got {way!r}.")
    model, args, kwargs = _models()[model_name]
    kernel = fm.FisherNUTSKernel(model)
    keys = jax.random.split(jax.random.key(0))

    def initialize(keys):
        return initialize_model(keys, model, dynamic_args=True, init_strategy=init_to_uniform,
                                model_args=args, model_kwargs=kwargs)  # fmt: skip

    if way == "kernel":
        parts = [lambda key=key: _initialize(kernel, key, None, args, kwargs) for key in keys]
    else:
        finder = jax.jit(lambda keys: initialize(keys).param_info)
        parts = [lambda: initialize(keys[0][None]).param_info, lambda: finder(keys[1][None])]
    seconds = []
    for part in parts:
        start = time.perf_counter()
        jax.block_until_ready(part())
        seconds.append(time.perf_counter() - start)
    return f"{model_name} {way}: first chain {seconds[0]:.2f} s, second {seconds[1]:.2f} s"


def setup_table() -> str:
    """:func:`setup_seconds` for every model and way, each in a fresh process."""
    lines = []
    for model in ("count", "logistic", "gp_latent"):
        for way in SETUP_WAYS:
            command = [sys.executable, "-m", "benchmarks.numpyro_wall", "--setup", f"{model}:{way}"]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            lines.append(out.strip().splitlines()[-1])
    return "\n".join(lines)


def render() -> str:
    rows = []
    for model in ("count", "logistic", "gp_latent"):
        for chains in CHAINS:
            c = {k: _median_cell(model, k, chains) for k in KERNELS}
            if not all(c.values()):
                continue
            nuts = c["nuts"][1] / c["nuts"][0]
            warm = c["fisher_nuts_warm"][2][0].get("warmup", 1000)
            seeds = min(len(v[2]) for v in c.values())
            rows.append(
                (
                    model,
                    chains,
                    warm,
                    seeds,
                    " / ".join(f"{c[k][0]:.1f}" for k in KERNELS),
                    " / ".join(f"{c[k][1]:.0f}" for k in KERNELS),
                    " / ".join(f"{c[k][1] / c[k][0] / nuts:.2f}" for k in KERNELS[1:]),
                )
            )
    text = templating.table(
        ("model", "chains", "warm-up (3rd)", "keys",
         "median seconds: NUTS / Fisher NUTS / Fisher NUTS, warmer / FisherMALA",
         "median min bulk ESS (same order)", "ESS/s over NUTS's (same order)"),
        rows,
    )  # fmt: skip
    equal = []
    for model in ("count", "logistic", "gp_latent"):
        for chains in CHAINS:
            nuts, fisher = (
                _median_cell(model, k, chains) for k in ("nuts_paired", "fisher_nuts_equal")
            )
            if nuts is None or fisher is None:
                continue
            seconds = f"{nuts[0]:.1f} / {fisher[0]:.1f}"
            ess, ratio = f"{nuts[1]:.0f} / {fisher[1]:.0f}", f"{nuts[0] / fisher[0]:.2f}"
            draws = fisher[2][0]["draws"]
            equal.append((model, chains, draws, len(fisher[2]), seconds, ess, ratio))
    if equal:
        text += "\n\n" + templating.table(
            ("model", "chains", "Fisher NUTS's draws", "keys",
             "median seconds: NUTS / Fisher NUTS", "median min bulk ESS (same order)",
             "NUTS's seconds over Fisher NUTS's"),
            equal,
        )  # fmt: skip
    TABLE.write_text(text + "\n")
    return text


def compiles(model_name: str, chains: int) -> None:
    """Print, for NUTS and for Fisher NUTS (1000 + 1000), ``MCMC.run``'s seconds and the
    backend compilations of its programs (``jax.monitoring``'s duration events, the
    longest first): NumPyro compiles its sampling loop (``_fori_collect_loop``) once per
    chain with ``chain_method="sequential"``, whatever the kernel."""
    from numpyro.infer import MCMC, NUTS

    import fisher_mala as fm

    events = []

    def listener(event, duration, **kwargs):
        if event.endswith("backend_compile_duration"):
            events.append((duration, kwargs.get("fun_name", "?")))

    jax.monitoring.register_event_duration_secs_listener(listener)
    model, args, kwargs = _models()[model_name]
    for name, kernel in (("NUTS", NUTS(model)), ("Fisher NUTS", fm.FisherNUTSKernel(model))):
        events.clear()
        mcmc = MCMC(kernel, num_warmup=1000, num_samples=1000, num_chains=chains,
                    chain_method="sequential", progress_bar=False)  # fmt: skip
        start = time.perf_counter()
        mcmc.run(jax.random.key(0), *args, **kwargs)
        jax.block_until_ready(mcmc.get_samples())
        seconds = time.perf_counter() - start
        total = sum(d for d, _ in events)
        longest = sorted(events, reverse=True)[:6]
        print(f"{name}: {seconds:.1f} s, of which {total:.1f} s compiling {len(events)} "
              "programs; the longest: " + ", ".join(f"{f} {d:.2f} s" for d, f in longest))


def fast_compile() -> None:
    """Print, for ``FisherNUTSKernel``'s Fisher phase (1000 warm-up iterations) on the three
    models and on logistic regressions with 20 predictors and 2000, 6000 and 20 000 rows,
    XLA's flops per iteration (its cost analysis) and the seconds to compile and to run
    the program, compiled as ``jax.jit`` does and with
    ``fm.numpyro_kernel.FAST_COMPILE_OPTIONS`` (the median of three compilations each,
    in turns)."""
    from functools import partial

    import numpyro
    import numpyro.distributions as dist

    import fisher_mala as fm
    from fisher_mala import numpyro_kernel

    def wide_logistic(x, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
        numpyro.sample("y", dist.Bernoulli(logits=x @ w), obs=y)

    models = dict(_models())
    rng = np.random.default_rng(0)
    for rows in (2000, 6000, 20_000):
        x = rng.normal(size=(rows, 20))
        labels = rng.uniform(size=rows) < 0.5
        models[f"logistic, {rows} rows"] = (wide_logistic, (x,), {"y": labels})
    num_warmup = 1000
    for name, (model, args, kwargs) in models.items():
        kernel = fm.FisherNUTSKernel(model)
        kernel._num_warmup = num_warmup
        key_model, key_warmup = jax.random.split(jax.random.key(0))
        params, evaluated = numpyro_kernel._initialize(kernel, key_model, None, args, kwargs)
        warmup = kernel._warmup(lambda z, potential=kernel._potential_fn: -potential(z))
        times, flops = {None: [], "fast": []}, None
        for _ in range(3):
            for way in times:  # a new function: jax.jit keeps what it compiled for one
                fisher_phase = partial(numpyro_kernel._fisher_phase, warmup, num_steps=num_warmup)
                lowered = jax.jit(fisher_phase).lower(key_warmup, params, evaluated=evaluated)
                flops = lowered.cost_analysis()["flops"]
                start = time.perf_counter()
                options = numpyro_kernel.FAST_COMPILE_OPTIONS if way else None
                compiled = lowered.compile(options)
                compiled_at = time.perf_counter()
                jax.block_until_ready(compiled(key_warmup, params, evaluated=evaluated))
                times[way].append((compiled_at - start, time.perf_counter() - compiled_at))
        (jit_compile, jit_run), (fast_compile, fast_run) = (
            np.median(t, axis=0) for t in times.values()
        )
        print(f"{name}: {flops:.2g} flops per iteration; as jax.jit: compile {jit_compile:.2f} s"
              f" + run {jit_run:.3f} s; fast: {fast_compile:.2f} + {fast_run:.3f} s",
              flush=True)  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true", help="the table only")
    parser.add_argument("--cell", nargs=3, metavar=("MODEL", "KERNEL", "CHAINS"),
                        help="one cell, in this process (each cell's fresh process)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="with --cell: the run's key")
    parser.add_argument("--suggest", metavar="MODEL", help="print the warmer warm-up's length")
    parser.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                        help="with --cell: a kernel option (a string), not cached")  # fmt: skip
    parser.add_argument("--fresh", action="store_true",
                        help="with --cell: run it even where cached, print it, cache nothing")
    parser.add_argument("--setup", nargs="?", const="all", metavar="MODEL:WAY",
                        help="the seconds of the kernels' model set-up (see setup_seconds)")
    parser.add_argument("--again", action="store_true",
                        help="with --cell: time a second run on the same data")  # fmt: skip
    parser.add_argument("--compiles", nargs=2, metavar=("MODEL", "CHAINS"),
                        help="the compilations of NUTS's and Fisher NUTS's runs")  # fmt: skip
    parser.add_argument("--fast-compile", action="store_true",
                        help="the Fisher phase compiled two ways (see fast_compile)")
    args = parser.parse_args(argv)
    if args.fast_compile:
        with jax.enable_x64(True):
            fast_compile()
        return
    if args.compiles:
        with jax.enable_x64(True):
            compiles(args.compiles[0], int(args.compiles[1]))
        return
    if args.suggest:
        with jax.enable_x64(True):
            print(suggested(args.suggest))
        return
    if args.cell:
        model, kernel, chains = args.cell
        options = dict(option.split("=", 1) for option in args.set)
        with jax.enable_x64(True):
            cell(model, kernel, int(chains), options, args.seed, args.again, args.fresh)
        return
    if args.setup:
        with jax.enable_x64(True):
            print(setup_table() if args.setup == "all" else setup_seconds(*args.setup.split(":")))
        return
    if not args.render:
        for seed in SEEDS:
            for model in ("count", "logistic", "gp_latent"):
                for chains in CHAINS:
                    for kernel in KERNELS:
                        if _path(model, kernel, chains, seed).exists():
                            continue
                        # a fresh process: no cell reuses what another compiled
                        command = ["-m", "benchmarks.numpyro_wall", "--cell", model, kernel,
                                   str(chains), "--seed", str(seed)]  # fmt: skip
                        subprocess.run([sys.executable, *command], check=True)
        for seed in SEEDS:  # after the cells whose ESS sets their draws
            for model in ("count", "logistic", "gp_latent"):
                for chains in CHAINS:
                    for kernel in ("nuts_paired", "fisher_nuts_equal"):  # back to back
                        if _path(model, kernel, chains, seed).exists():
                            continue
                        command = ["-m", "benchmarks.numpyro_wall", "--cell", model, kernel,
                                   str(chains), "--seed", str(seed)]  # fmt: skip
                        subprocess.run([sys.executable, *command], check=True)
    print(render())


if __name__ == "__main__":
    main()
