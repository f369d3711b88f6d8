"""FisherMALA against the samplers users would otherwise pick, in one process.

    python -m benchmarks.versus_blackjax --targets all
    python -m benchmarks.versus_blackjax --render      # the table of docs/performance.md

Samplers, 4 chains each, from the same N(0, I) starts:

* ``fisher_mala``: ``fm.sample`` (independent chains), ``--fisher-warmup`` (default 5000)
  burn-in iterations then ``--samples`` draws;
* ``fisher_mala_pooled``: the same with one shared preconditioner (``pooled=True``);
* ``nuts_diag`` / ``nuts_dense``: BlackJAX NUTS after ``blackjax.window_adaptation``
  (diagonal / dense inverse mass matrix, target acceptance 0.8), ``--nuts-warmup``
  (default 1000, Stan's) adaptation steps then ``--samples`` draws;
* ``fisher_nuts`` / ``fisher_nuts_pooled`` / ``fisher_hmc``: ``fm.sample`` with NUTS / HMC
  in the coordinates whitened by the Fisher ``R`` (``--fisher-warmup`` warm-up iterations:
  a tenth of them tune the leapfrog step), then ``--samples`` draws
  (``--samples fisher_nuts,...``; ``--render-whitened`` prints their table);
* ``nutpie_diag`` / ``nutpie_low_rank``: nutpie (NUTS in Rust on the target's PyMC model,
  numba backend) with its default and its low-rank mass-matrix adaptation,
  ``--nuts-warmup`` tuning steps then ``--samples`` draws, chains on all cores;
* ``blackjax_mala``: BlackJAX MALA with the step size tuned by the paper's rule during
  ``--fisher-warmup`` iterations (``fm.mala_warmup``; BlackJAX's ``step_size`` is
  ``sigma^2 / 2``).

Reported per (target, sampler): min and median ESS over dimensions with ArviZ's bulk ESS
(multi-chain) and with the paper's estimator (TFP, summed over chains), ESS per gradient
evaluation, min ESS per second counting warm-up and sampling (compile time apart), and the
gradient evaluations. Results are cached in ``benchmarks/results/race/`` (a finished cell
is not recomputed).
"""

import argparse
import json
import os
from pathlib import Path

import jax
import numpy as np

import fisher_mala as fm
from benchmarks import cells, metric_choice, stopping_rule, templating
from benchmarks.race_setup import FULL_PROTOCOL, POSTERIORDB, RESULTS, TARGETS, race_start
from fisher_mala.sampling import (
    _auto_chain_method,
    _chain_mesh,
    _groups,
    _shard,
    _shared_bytes,
    map_over_chains,
)
from fisher_mala.sampling import _compile_and_run as _compile_run
from fisher_mala.whitened_hmc import NUTS_TARGET_ACCEPTANCE
from fisher_mala.whitened_warmup import FISHER_NUTS_DAMPING as DAMPING
from fisher_mala.whitened_warmup import FisherHMCWarmup

SAMPLERS = ("fisher_mala", "fisher_mala_pooled", "nuts_diag", "nuts_dense", "blackjax_mala")
#: NUTS / HMC in the coordinates whitened by the Fisher R (fm.sample's "fisher_nuts", ...).
WHITENED = ("fisher_nuts", "fisher_nuts_pooled", "fisher_hmc")
#: The Fisher NUTS / HMC warm-up's defaults a cell ran with (recorded in its protocol, so
#: that a change of the defaults reruns the cells): the fast start and restart windows of
#: the Fisher phase, dual averaging towards 0.7.
WARMUP_DEFAULTS = "fast start, restart windows, target 0.7"
#: nutpie (Rust NUTS on a PyMC model, numba backend) with its default and low-rank adaptation.
NUTPIE = ("nutpie_diag", "nutpie_low_rank")
#: XLA:CPU devices of a race process (``main`` sets them before JAX starts): each device runs
#: its share of the chains on its own core (``fm.sample``'s placement), as nutpie runs its
#: chains on all cores.
CPU_DEVICES = 2
#: The peers Fisher NUTS races against.
PEERS = ("nuts_diag", "nuts_dense", *NUTPIE)
#: Targets whose posterior correlations are dense (not the diagonal Gaussian, not the
#: non-centred eight schools whose posterior is close to independent).
DENSE_CORRELATED = (
    "gp",
    "pima",
    "caravan",
    "mnist56",
    "heart",
    "german",
    "australian",
    "ripley",
    "diamonds",
    "kilpisjarvi",
    "arK",
)


def _run_nuts(target, positions, key, diagonal, num_warmup, num_samples):
    import blackjax
    from blackjax.adaptation.base import get_filter_adapt_info_fn

    logdensity = target.logdensity_fn
    warmup = blackjax.window_adaptation(
        blackjax.nuts,
        logdensity,
        is_mass_matrix_diagonal=diagonal,
        adaptation_info_fn=get_filter_adapt_info_fn(set(), {"num_integration_steps"}, set()),
    )
    keys = jax.random.split(key, positions.shape[0])
    # The same placement as fm.sample's Fisher NUTS: chains split over the devices, one
    # after the other on each device in small dimension, and on one CPU device in groups
    # run from threads, one per core, where fm.sample groups them.
    mesh = _chain_mesh(positions.shape[0], None)
    method = _auto_chain_method(  # a trajectory sampler
        True, positions, mesh, lambda: _shared_bytes(logdensity, positions)
    )
    groups = _groups(positions.shape[0], positions, mesh, method)
    keys, positions = _shard((keys, positions), mesh)

    def chains(fn, *args):
        return map_over_chains(fn, *args, chain_method=method, mesh=mesh)

    def warm(keys, positions):
        return chains(lambda k, x: warmup.run(k, x, num_warmup), keys, positions)

    ((states, params), info), c1, t1 = _compile_run(
        warm, keys, positions, groups=groups, mapped=2
    )
    grads_warmup = np.asarray(info.info.num_integration_steps).sum()

    def sample(keys, states, params):
        def one(key, state, p):
            kernel = blackjax.nuts(logdensity, **p)

            def body(s, k):
                s, i = kernel.step(k, s)
                return s, (s.position, i.num_integration_steps)

            return jax.lax.scan(body, state, jax.random.split(key, num_samples))[1]

        return chains(one, keys, states, params)

    (draws, steps), c2, t2 = _compile_run(
        sample, jax.random.split(keys[0], len(keys)), states, params, groups=groups, mapped=3
    )
    grads = int(grads_warmup + np.asarray(steps).sum())
    return np.asarray(draws), grads, c1 + c2, t1, t2


def _run_blackjax_mala(target, positions, key, num_warmup, num_samples):
    import blackjax

    warmup = fm.mala_warmup(target.logdensity_fn)
    keys = jax.random.split(key, positions.shape[0])
    mesh = _chain_mesh(positions.shape[0], None)
    keys, positions = _shard((keys, positions), mesh)

    def chains(fn, *args):
        return map_over_chains(fn, *args, mesh=mesh)

    def warm(keys, positions):
        return chains(lambda k, x: warmup.run(k, x, num_warmup), keys, positions)

    ((states, params), info), c1, t1 = _compile_run(warm, keys, positions)

    def sample(keys, positions, sigma2):
        def one(key, x, s2):
            kernel = blackjax.mala(target.logdensity_fn, step_size=s2 / 2.0)
            state = kernel.init(x)

            def body(s, k):
                s, _ = kernel.step(k, s)
                return s, s.position

            return jax.lax.scan(body, state, jax.random.split(key, num_samples))[1]

        return chains(one, keys, positions, sigma2)

    draws, c2, t2 = _compile_run(
        sample, jax.random.split(keys[0], len(keys)), states.position, params.step_size
    )
    grads = int(np.asarray(info.num_grad_evals).sum() + num_samples * positions.shape[0])
    return np.asarray(draws), grads, c1 + c2, t1, t2


def pymc_model(target):
    """The PyMC version of a race target (same density up to a constant)."""
    import pymc as pm

    if "pymc_model" in target.extras:  # targets that bring their own
        return target.extras["pymc_model"]()
    with pm.Model() as model:
        if target.covariance is not None:
            if np.count_nonzero(target.covariance - np.diag(np.diag(target.covariance))):
                pm.MvNormal("x", mu=target.mean, cov=target.covariance)
            else:
                pm.Normal("x", mu=target.mean, sigma=np.sqrt(np.diag(target.covariance)))
        elif "X" in target.extras:
            theta = pm.Normal("x", 0.0, 1.0, shape=target.dim)
            pm.Bernoulli(
                "y", logit_p=pm.math.dot(target.extras["X"], theta), observed=target.extras["y"]
            )
        else:
            raise ValueError(f"No PyMC version of target {target.name!r}.")
    return model


#: Bytes of nutpie's trace above which it writes the trace to a temporary Zarr store on
#: disk as it samples, and only the draws are read back: held in memory, the d = 10^5
#: race cell's trace (4 chains x 3000 draws x 10^5 coordinates, twice, in float64) takes
#: 19 GB of this machine's 23.
NUTPIE_IN_MEMORY_BYTES = 4 * 1024**3


def _run_nutpie(target, positions, seed, adaptation, num_warmup, num_samples):
    """nutpie on the target's PyMC model; ``positions`` only give the number of chains.

    nutpie starts from its own jittered initial points (in (-2, 2) around zero) and runs
    its chains on all cores. Gradient evaluations are nutpie's ``n_steps`` (leapfrog steps)
    of warm-up and sampling. A trace over :data:`NUTPIE_IN_MEMORY_BYTES` goes to disk.
    """
    import tempfile
    import time

    import nutpie

    start = time.perf_counter()
    compiled = nutpie.compile_pymc_model(pymc_model(target))
    compile_s = time.perf_counter() - start
    # the trace holds every draw twice (constrained and not), warm-up included
    trace_bytes = 2 * positions.shape[0] * (num_warmup + num_samples) * target.dim * 8
    with tempfile.TemporaryDirectory(prefix="nutpie_trace_") as directory:
        store = None
        if trace_bytes > NUTPIE_IN_MEMORY_BYTES:  # written to disk as it goes, read back
            store = nutpie.zarr_store.LocalStore(directory)
        start = time.perf_counter()
        trace = nutpie.sample(
            compiled,
            draws=num_samples,
            tune=num_warmup,
            chains=positions.shape[0],
            seed=seed,
            progress_bar=False,
            adaptation=adaptation,
            save_warmup=True,
            store_unconstrained=True,
            zarr_store=store,
        )
        seconds = time.perf_counter() - start
        # The unconstrained draws (log of positive parameters, PyMC's declaration order,
        # which the targets follow): the same coordinates as the JAX samplers'.
        draws = np.asarray(trace.sample_stats["unconstrained_draw"])
        grads = int(
            np.asarray(trace.sample_stats["n_steps"]).sum()
            + np.asarray(trace.warmup_sample_stats["n_steps"]).sum()
        )
        del trace
    # nutpie does not split its time: warm-up and sampling are reported together.
    return draws, grads, compile_s, seconds, 0.0


def _reference_check(target, draws) -> dict:
    """Max |z| of the means and the sd ratios against a posteriordb reference, if any."""
    ref = target.extras.get("reference")
    if ref is None:
        return {}
    draws = target.extras["constrain"](np.asarray(draws, np.float64))
    flat = draws.reshape(-1, draws.shape[-1])
    mcse = flat.std(0) / np.sqrt(fm.ess(draws, method="mean", per_chain=False))
    ref_mcse = np.asarray(ref["sd"]) / np.sqrt(ref["num_draws"])
    z = (flat.mean(0) - np.asarray(ref["mean"])) / np.sqrt(mcse**2 + ref_mcse**2)
    ratio = flat.std(0) / np.asarray(ref["sd"])
    return {
        "reference_max_abs_z": float(np.abs(z).max()),
        "reference_sd_ratio": [float(ratio.min()), float(ratio.max())],
    }


def run_cell(target_name, sampler, args, root=RESULTS):
    path = root / target_name / f"{sampler}.json"
    protocol = {
        "chains": args.chains,
        "samples": args.samples,
        "fisher_warmup": args.fisher_warmup,
        "nuts_warmup": args.nuts_warmup,
    }
    if getattr(args, "score_prior_weight", None) is not None:
        protocol["score_prior_weight"] = args.score_prior_weight
    if sampler in WHITENED:
        damping = getattr(args, "damping", None)
        protocol["damping"] = DAMPING if damping is None else damping
        protocol["metric"] = getattr(args, "metric", "auto")
        protocol["stopping_rule"] = getattr(args, "stopping_rule", "on") == "on"
        if getattr(args, "target_acceptance", None) is not None:
            protocol["target_acceptance"] = args.target_acceptance
        # the warm-up's defaults (cells before: Algorithm 1's start, target 0.8)
        protocol["warmup_defaults"] = WARMUP_DEFAULTS
    if sampler not in NUTPIE and jax.default_backend() == "cpu":
        protocol["cpu_devices"] = jax.device_count()
    float64 = target_name in POSTERIORDB or getattr(args, "float64", False)
    if getattr(args, "float64", False):
        protocol["float64"] = True
    if getattr(args, "seed", 0):
        protocol["seed"] = args.seed
    if cells.is_done(path, protocol):
        print(f"  cached   {target_name:14s} {sampler}")
        return
    with jax.enable_x64(float64):
        _run_and_record(target_name, sampler, args, protocol, path)


def _run_and_record(target_name, sampler, args, protocol, path):
    target = fm.targets.get(target_name)
    seed = getattr(args, "seed", 0)
    positions, key_run = race_start(target, args.chains, seed)
    extra_record = {}
    if sampler.startswith("fisher_mala"):
        r = fm.sample(
            key_run,
            "fisher_mala",
            target.logdensity_fn,
            positions,
            num_warmup=args.fisher_warmup,
            num_samples=args.samples,
            pooled=sampler.endswith("pooled"),
        )
        draws, grads = np.asarray(r.samples), int(np.sum(r.num_grad_evals))
        compile_s, warm_s, sample_s = r.compile_seconds, r.warmup_seconds, r.sampling_seconds
    elif sampler in WHITENED:
        name, pooled = sampler.removesuffix("_pooled"), sampler.endswith("pooled")
        extra = {
            "damping": protocol["damping"],
            "metric": protocol["metric"],
            "stopping_rule": protocol["stopping_rule"],
        }
        if "score_prior_weight" in protocol and not pooled:
            extra["score_prior_weight"] = protocol["score_prior_weight"]
        if "target_acceptance" in protocol:
            extra["hmc_target_acceptance_rate"] = protocol["target_acceptance"]
        r = fm.sample(
            key_run,
            name,
            target.logdensity_fn,
            positions,
            num_warmup=args.fisher_warmup,
            num_samples=args.samples,
            pooled=pooled,
            **extra,
        )
        draws, grads = np.asarray(r.samples), int(np.sum(r.num_grad_evals))
        compile_s, warm_s, sample_s = r.compile_seconds, r.warmup_seconds, r.sampling_seconds
        chosen = isinstance(r.parameters.sqrt_precond, fm.DiagonalSqrt)
        extra_record = {
            "metric_chosen": "diagonal" if chosen else "dense",
            "warmup_iterations": int(r.warmup_info.acceptance_rate.shape[-1]),
            "step_size": np.asarray(r.parameters.step_size).tolist(),
            "acceptance_mean": float(np.mean(r.sample_stats["acceptance_rate"])),
            "target_acceptance": float(r.target_acceptance),
            "divergences": int(np.sum(r.sample_stats["is_divergent"])),
        }
    elif sampler in NUTPIE:
        draws, grads, compile_s, warm_s, sample_s = _run_nutpie(
            target, positions, seed, sampler.removeprefix("nutpie_"), args.nuts_warmup,
            args.samples,
        )  # fmt: skip
    elif sampler.startswith("nuts"):
        draws, grads, compile_s, warm_s, sample_s = _run_nuts(
            target, positions, key_run, sampler == "nuts_diag", args.nuts_warmup, args.samples
        )
    else:
        draws, grads, compile_s, warm_s, sample_s = _run_blackjax_mala(
            target, positions, key_run, args.fisher_warmup, args.samples
        )
    bulk = fm.ess(draws, method="bulk", per_chain=False)
    paper = fm.ess(draws, method="paper", per_chain=False)
    seconds = warm_s + sample_s
    record = {
        "target": target_name,
        "sampler": sampler,
        "protocol": protocol,
        "dim": target.dim,
        "bulk_min": float(bulk.min()),
        "bulk_median": float(np.median(bulk)),
        "paper_min": float(paper.min()),
        "paper_median": float(np.median(paper)),
        "grad_evals": grads,
        "bulk_min_per_grad": float(bulk.min() / grads),
        "bulk_min_per_second": float(bulk.min() / seconds),
        "paper_min_per_second": float(paper.min() / seconds),
        "seconds": {"compile": compile_s, "warmup": warm_s, "sampling": sample_s},
        "device": str(jax.devices()[0]),
        "device_kind": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "matmul_precision": jax.config.jax_default_matmul_precision or "default",
        "dtype": str(positions.dtype),
        **_reference_check(target, draws),
        **extra_record,
    }
    cells.write(path, record)
    print(
        f"  computed {target_name:14s} {sampler:20s} bulk min {bulk.min():9.1f} "
        f"min ESS/s {bulk.min() / seconds:9.2f}  ({seconds:.1f} s)",
        flush=True,
    )


def _is_full(protocol) -> bool:
    """The race's lengths (the placement, e.g. ``cpu_devices``, may differ)."""
    return all(protocol.get(k) == v for k, v in FULL_PROTOCOL.items())


def _per_second(value: float) -> str:
    """Min ESS/s with one decimal, or three significant digits below 1."""
    return f"{value:.1f}" if value >= 1 else f"{value:.3g}"


#: Marks a peer's cell run with a shortened protocol in the Fisher NUTS race's tables.
SHORTENED_MARK = "†"


def _full_peer(record) -> bool:
    """Whether a peer's cell ran the race's protocol (NUTS cells may have been shortened)."""
    return record["sampler"] not in ("nuts_diag", "nuts_dense") or _is_full(record["protocol"])


def _protocol(record) -> str:
    p = record["protocol"]
    warm = p["nuts_warmup"] if record["sampler"].startswith("nuts") else p["fisher_warmup"]
    devices = f", {p['cpu_devices']} CPU devices" if "cpu_devices" in p else ""
    return f"{p['chains']} x ({warm} + {p['samples']}){devices}"


def render(root=RESULTS) -> str:
    """Markdown tables of the cached cells (the goal's numbers: :func:`goal_values`).

    The columns a reader compares; each cell's record also has median ESS, the paper's
    estimator's ESS, gradient counts and compile time.
    """
    header = [
        "target", "sampler", "min ESS bulk", "min ESS/grad (bulk)", "min ESS/s (bulk)",
        "min ESS/s (paper)", "warm-up + sampling s", "protocol",
    ]  # fmt: skip
    lines, verdicts = [], []
    for target, rows, fisher, others in _fisher_mala_rows(root):
        for s, r in rows.items():
            sec = r["seconds"]
            lines.append([
                target, s, f"{r['bulk_min']:.0f}", f"{r['bulk_min_per_grad']:.2e}",
                f"{r['bulk_min_per_second']:.1f}", f"{r['paper_min_per_second']:.1f}",
                f"{sec['warmup'] + sec['sampling']:.1f}", _protocol(r),
            ])  # fmt: skip
        if fisher and others:
            best_other = max(others, key=others.get)
            shortened = (
                ""
                if _full_peer(rows[best_other])
                else f" (shortened: {_protocol(rows[best_other])})"
            )
            verdicts.append([
                target, f"{max(fisher):.1f}",
                f"{best_other} {others[best_other]:.1f}{shortened}",
                f"{max(fisher) / others[best_other]:.2f}",
            ])  # fmt: skip
    summary = [
        "target", "best FisherMALA min ESS/s", "best BlackJAX sampler, min ESS/s", "ratio"
    ]  # fmt: skip
    return templating.table(header, lines) + "\n\n" + templating.table(summary, verdicts)


def _fisher_mala_rows(root):
    """Per target: its cells, FisherMALA's min ESS/s and the other samplers' (by name)."""
    for target in TARGETS:
        rows = {
            s: json.loads(p.read_text())
            for s in SAMPLERS
            if (p := root / target / f"{s}.json").exists()
        }
        fisher = [
            rows[s]["bulk_min_per_second"]
            for s in ("fisher_mala", "fisher_mala_pooled")
            if s in rows
        ]
        others = {s: rows[s]["bulk_min_per_second"] for s in SAMPLERS[2:] if s in rows}
        yield target, rows, fisher, others


def goal_values(root=RESULTS) -> dict:
    """The FisherMALA race's goal, counted, for ``templates/performance.md``: targets where
    FisherMALA is at least equal to the best BlackJAX sampler at the full protocol, at a
    shortened one, and the others with their ratios."""
    wins, short_wins, rest = [], [], []
    for target, rows, fisher, others in _fisher_mala_rows(root):
        if not fisher or not others:
            continue
        best_other = max(others, key=others.get)
        ratio = max(fisher) / others[best_other]
        if ratio < 1:
            rest.append((target, ratio))
        elif _full_peer(rows[best_other]):
            wins.append(target)
        else:
            short_wins.append(target)
    return {
        "race_goal_wins": len(wins),
        "race_goal_targets": len(wins) + len(short_wins) + len(rest),
        "race_goal_win_list": ", ".join(wins) or "none",
        "race_goal_short_wins": ", ".join(short_wins) or "no target",
        "race_goal_below": ", ".join(f"{t} ({r:.2f})" for t, r in rest) or "no target",
        "race_goal_within": "all within 2x"
        if all(r >= 0.5 for _, r in rest)
        else "not all within 2x",
    }


def render_whitened(root=RESULTS) -> dict:
    """The Fisher NUTS race: min bulk ESS per second and per gradient, against the peers
    (tables, and the issue's goals counted)."""
    names = (*WHITENED, "fisher_mala", *PEERS)
    lines, per_grad, cost = [], [], []
    wins, grad_wins, below = [], [], []
    for target in (*TARGETS, *POSTERIORDB):
        rows = {
            s: json.loads(p.read_text())
            for s in names
            if (p := root / target / f"{s}.json").exists()
        }
        if not any(s in rows for s in WHITENED):
            continue
        dim = next(iter(rows.values()))["dim"]
        marks = {
            s: _diagonal_mark(r) + ("" if _full_peer(r) else SHORTENED_MARK)
            for s, r in rows.items()
        }
        cells = [
            f"{_per_second(rows[s]['bulk_min_per_second'])}{marks[s]}" if s in rows else ""
            for s in names
        ]
        grads = [
            f"{rows[s]['bulk_min_per_grad']:.2e}{marks[s]}" if s in rows else "" for s in names
        ]
        fisher = max(rows[s]["bulk_min_per_second"] for s in WHITENED[:2] if s in rows)
        # a shortened peer's cell is shown, not compared (a short warm-up is not its best)
        peers = [rows[s]["bulk_min_per_second"] for s in PEERS if s in rows and _full_peer(rows[s])]
        ratio = f"{fisher / max(peers):.2f}" if peers else ""
        if peers:
            wins.append(fisher >= max(peers))
            if fisher < max(peers):
                below.append(f"{target} ({fisher / max(peers):.2f})")
        if "nutpie_low_rank" in rows and target in DENSE_CORRELATED:
            best = max(rows[s]["bulk_min_per_grad"] for s in WHITENED[:2] if s in rows)
            grad_wins.append(best > rows["nutpie_low_rank"]["bulk_min_per_grad"])
        lines.append([target, dim, *cells, ratio])
        per_grad.append([target, *grads])
        micro = [
            f"{1e6 * _seconds(rows[s]) / rows[s]['grad_evals']:.1f}" if s in rows else ""
            for s in names
        ]
        cost.append([target, *micro])
    return {
        "race_table": templating.table(["target", "d", *names, "Fisher NUTS / best peer"], lines),
        "race_per_grad_table": templating.table(["target", *names], per_grad),
        "race_cost_table": templating.table(["target", *names], cost),
        "race_wins": sum(wins),
        "race_targets": len(wins),
        "race_below": ", ".join(below) or "none",
        "race_grad_wins": sum(grad_wins),
        "race_grad_targets": len(grad_wins),
    }


FLOAT64 = RESULTS.parent / "race_f64"


def _best_ratio(fisher: dict, peers: dict, key: str):
    """``(ratio, peer)``: the best Fisher cell over the best peer in ``key``."""
    mine = max(r[key] for r in fisher.values())
    peer = max(peers, key=lambda s: peers[s][key])
    return mine / peers[peer][key], peer


def race_ratios(root=RESULTS, float64_root=FLOAT64) -> list[dict]:
    """Per target (peers run in full): the best Fisher NUTS cell (per-chain or pooled R)
    against the best peer, in min bulk ESS per second and per gradient; and, where the
    paper's targets were rerun in float64 (``--float64 --root results/race_f64``), the same
    at equal precision (nutpie computes in float64; BlackJAX's cells there when rerun)."""
    out = []
    for target in (*TARGETS, *POSTERIORDB):
        rows = {
            s: json.loads(p.read_text())
            for s in (*WHITENED[:2], *PEERS)
            if (p := root / target / f"{s}.json").exists()
        }
        peers = {s: r for s, r in rows.items() if s in PEERS and _full_peer(r)}
        fisher = {s: r for s, r in rows.items() if s in WHITENED}
        if not peers or not fisher:
            continue
        row = {"target": target, "dim": next(iter(rows.values()))["dim"]}
        for unit in ("second", "grad"):
            key = f"bulk_min_per_{unit}"
            mine = max(fisher.values(), key=lambda r: r[key])
            peer = max(peers, key=lambda s: peers[s][key])
            row[unit] = (mine[key], peer, peers[peer][key], mine[key] / peers[peer][key])
        if target in POSTERIORDB:  # raced in float64 from the start
            row["float64"] = row["second"][3], row["second"][1]
        else:
            wide = {
                s: json.loads(p.read_text())
                for s in (*WHITENED[:2], *PEERS)
                if (p := float64_root / target / f"{s}.json").exists()
            }
            fisher64 = {s: r for s, r in wide.items() if s in WHITENED}
            peers64 = {s: r for s, r in peers.items() if s in NUTPIE}
            peers64.update({s: r for s, r in wide.items() if s in PEERS and _full_peer(r)})
            if fisher64 and peers64:
                row["float64"] = _best_ratio(fisher64, peers64, "bulk_min_per_second")
        out.append(row)
    return out


def render_lead(root=RESULTS) -> str:
    """The compact race table: Fisher NUTS against the best peer, ratios."""
    lines = [
        [
            r["target"], r["dim"],
            f"**{r['float64'][0]:.2f}** ({r['float64'][1]})" if "float64" in r else "not rerun",
            "(float64)" if r["target"] in POSTERIORDB
            else f"{r['second'][3]:.2f} ({r['second'][1]})",
            f"{r['grad'][3]:.2f} ({r['grad'][1]})",
        ]
        for r in race_ratios(root)
    ]  # fmt: skip
    header = ["target", "d", "per second, all float64 (best peer)",
              "per second, JAX float32 (best peer)", "per gradient (best peer)"]  # fmt: skip
    return templating.table(header, lines)


LEAD_PLOT = RESULTS.parents[2] / "docs" / "images" / "fisher_nuts_vs_best_peer.png"


def plot_lead(out=LEAD_PLOT, root=RESULTS) -> Path:
    """Fisher NUTS over the best peer per target, per second and per gradient, peer named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    ratios = race_ratios(root)
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.42 * len(ratios) + 1.4), sharey=True)
    y = np.arange(len(ratios))[::-1]
    titles = ("per second, all float64", "per gradient")
    for ax, unit, title in zip(axes, ("second", "grad"), titles, strict=True):
        # per second at equal precision (float64) where the cells were rerun
        pairs = [
            r["float64"] if unit == "second" and "float64" in r else (r[unit][3], r[unit][1])
            for r in ratios
        ]
        marks = [" (float32)" if unit == "second" and "float64" not in r else "" for r in ratios]
        values = np.array([v for v, _ in pairs])
        colors = ["tab:blue" if v >= 1 else "tab:red" for v in values]
        ax.barh(y, values - 1.0, left=1.0, color=colors, height=0.7)  # from 1: even
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xscale("log")
        for yi, v, (_, peer), mark in zip(y, values, pairs, marks, strict=True):
            ax.text(max(v, 1.0) * 1.06, yi, f"{v:.2f} vs {peer}{mark}", va="center",
                    ha="left", fontsize=8)  # fmt: skip
        ticks = [t for t in (0.25, 0.5, 1, 2, 4, 8) if values.min() / 2 <= t <= values.max() * 8]
        ax.set_xlim(min(values.min(), 1.0) / 1.3, max(values.max(), 1.0) * 8)
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(title, fontsize=10)
    fig.suptitle("min bulk ESS, Fisher NUTS over the best peer", fontsize=11)
    axes[0].set_yticks(y, [f"{r['target']} (d = {r['dim']})" for r in ratios], fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _diagonal_mark(record) -> str:
    """``*`` for a Fisher NUTS / HMC cell that sampled with a diagonal metric."""
    return "\\*" if record.get("metric_chosen") == "diagonal" else ""


def _seconds(record) -> float:
    return record["seconds"]["warmup"] + record["seconds"]["sampling"]


HANDOVER = RESULTS.parent / "fisher_nuts_handover"
#: Fisher NUTS cells with another damping than the default (``--damping L --root
#: DAMPING_ROOT/lambda_L``).
DAMPING_ROOT = RESULTS.parent / "fisher_nuts_damping"


def _damping(record) -> float:
    """The Fisher phase's damping of a cell (cells run before it was recorded used 10)."""
    return float(record["protocol"].get("damping", 10.0))


def _whitened_cells(*paths):
    """Per-chain and pooled Fisher NUTS cells with a dense R, keyed by (target, sampler,
    damping); cells that sampled with a diagonal metric are left out of these comparisons."""
    cells = {}
    for path in paths:
        r = json.loads(path.read_text())
        if r["sampler"] in WHITENED[:2] and r.get("metric_chosen") != "diagonal":
            key = (r["target"], r["sampler"], _damping(r))
            cells.setdefault(key, {})[r["protocol"]["fisher_warmup"]] = r
    return cells


def render_handover(root=HANDOVER, main_root=RESULTS) -> str:
    """Fisher NUTS against the warm-up length (the hand-over point), min bulk ESS/s."""
    cells = _whitened_cells(
        *root.glob("warmup_*/*/*.json"),
        *main_root.glob("*/fisher_nuts*.json"),
        *DAMPING_ROOT.glob("lambda_*/*/fisher_nuts*.json"),
    )
    warmups = sorted({w for by_w in cells.values() for w in by_w})
    keys = sorted(
        (k for k, v in cells.items() if len(v) > 1),
        key=lambda k: ((*TARGETS, *POSTERIORDB).index(k[0]), -k[2], k[1]),
    )
    header = ["target", "sampler", "damping", *(f"warm-up {w}" for w in warmups)]
    lines = []
    for target, sampler, damping in keys:
        by_w = cells[(target, sampler, damping)]
        row = [
            f"{by_w[w]['bulk_min_per_second']:.0f} ({by_w[w]['bulk_min']:.0f})" if w in by_w else ""
            for w in warmups
        ]
        lines.append([target, sampler, f"{damping:g}", *row])
    return templating.table(header, lines)


def render_damping(main_root=RESULTS) -> str:
    """Fisher NUTS with the default damping against other dampings, min ESS per gradient."""
    cells = _whitened_cells(
        *main_root.glob("*/fisher_nuts*.json"), *DAMPING_ROOT.glob("lambda_*/*/fisher_nuts*.json")
    )
    dampings = sorted({k[2] for k in cells}, reverse=True)
    heads = [f"{s}, damping {d:g}" for d in dampings for s in WHITENED[:2]]
    lines = []
    for target in (*TARGETS, *POSTERIORDB):
        row = []
        for damping in dampings:
            for sampler in WHITENED[:2]:
                r = cells.get((target, sampler, damping), {}).get(FULL_PROTOCOL["fisher_warmup"])
                row.append(f"{r['bulk_min_per_grad']:.3f} ({r['bulk_min']:.0f})" if r else "")
        if sum(bool(c) for c in row) > 2:
            lines.append([target, *row])
    return templating.table(["target", *heads], lines)


#: Fisher NUTS with the stopping rule on and off, by warm-up length
#: (``--fisher-warmup W --stopping-rule R --root STOPPING/warmup_W/rule_R``).
STOPPING = RESULTS.parent / "fisher_nuts_stopping"
KEEP_LEARNING = RESULTS.parent / "fisher_nuts_keep_learning"
#: ``--repeats K``: the same cells run K times more (rep0, rep1, ...), interleaved, for the
#: targets where one run's ratio is within the shared machine's noise.
REPEATS = RESULTS.parent / "race_repeats"


def render_repeats(root=REPEATS) -> dict:
    """Min bulk ESS/s of every repetition, per target and sampler, and the median."""
    runs = sorted(root.glob("rep*")) if root.exists() else []
    cells = {}
    for run in runs:
        for path in sorted(run.glob("*/*.json")):
            record = json.loads(path.read_text())
            cells.setdefault((record["target"], record["sampler"]), []).append(
                record["bulk_min_per_second"]
            )
    lines = [
        [target, sampler, ", ".join(f"{v:.0f}" for v in values), f"{np.median(values):.0f}"]
        for (target, sampler), values in sorted(cells.items())
    ]
    header = ["target", "sampler", "min ESS/s, each run", "median"]
    return {"repeats": len(runs), "repeats_table": templating.table(header, lines)}


def render_keep_learning(root=KEEP_LEARNING, main_root=RESULTS) -> dict:
    """Fisher NUTS with R frozen after the Fisher phase against R learning from its draws."""
    variants = sorted(root.glob("n0_*"), key=lambda p: float(p.name[3:]))
    head = ["frozen R", *[f"learning, n0 = {p.name[3:]}" for p in variants]]
    lines = []
    # The learning variants run the whole Fisher phase (the stopping rule needs a frozen
    # R), so the frozen R they are compared with is the whole phase's too, when measured.
    frozen_roots = [
        STOPPING / "warmup_5000" / "rule_off",
        main_root,
        *DAMPING_ROOT.glob("lambda_*"),
    ]
    dampings = set()
    for target in (*TARGETS, *POSTERIORDB):
        paths = [p / target / "fisher_nuts.json" for p in variants]
        if not paths or not all(p.exists() for p in paths):
            continue
        learning = [json.loads(p.read_text()) for p in paths]
        damping = _damping(learning[0])
        if any(_damping(r) != damping for r in learning):
            continue  # a variant not yet rerun at this damping
        frozen = [
            r
            for p in frozen_roots
            if (path := p / target / "fisher_nuts.json").exists()
            and _damping(r := json.loads(path.read_text())) == damping
            and r.get("metric_chosen") != "diagonal"  # learning keeps a dense R
            and _is_full(r["protocol"])
        ]
        frozen.sort(key=lambda r: r["protocol"].get("stopping_rule", False))
        if not frozen:
            continue
        dampings.add(damping)
        rows = [frozen[0], *learning]
        cells = [f"{r['bulk_min_per_second']:.0f} ({r['bulk_min_per_grad']:.3f})" for r in rows]
        lines.append([target, *cells])
    return {
        "keep_learning_table": templating.table(["target", *head], lines),
        "keep_learning_damping": ", ".join(f"{d:g}" for d in sorted(dampings)),
    }


def render_stopping(root=STOPPING) -> str:
    """Fisher NUTS with the Fisher phase ended by the stopping rule or run in full."""
    header = [
        "target", "warm-up", "Fisher iterations with the rule", "min ESS/s, full / rule",
        "min ESS per gradient, full / rule",
    ]  # fmt: skip
    lines = []
    warmups = sorted(int(p.name.removeprefix("warmup_")) for p in root.glob("warmup_*"))
    for target in (*TARGETS, *POSTERIORDB):
        for warmup in warmups:
            pair = [
                cells.load(root / f"warmup_{warmup}" / f"rule_{rule}" / target / "fisher_nuts.json")
                for rule in ("off", "on")
            ]
            if None in pair:
                continue
            off, on = pair
            warm = FisherHMCWarmup(lambda x: x, damping=on["protocol"]["damping"])
            num_fisher, _ = warm.split(warmup)
            used = next(
                n
                for n in range(num_fisher + 1)
                if n + warm.tuning_steps(warmup, n) == on["warmup_iterations"]
            )
            lines.append([
                target, warmup, f"{used} of {num_fisher}",
                f"{off['bulk_min_per_second']:.0f} / {on['bulk_min_per_second']:.0f}",
                f"{off['bulk_min_per_grad']:.3f} / {on['bulk_min_per_grad']:.3f}",
            ])  # fmt: skip
    return templating.table(header, lines)


#: Fisher NUTS by the step-size phase's dual-averaging target
#: (``--target-acceptance A --root ACCEPTANCE/accept_A``).
ACCEPTANCE = RESULTS.parent / "fisher_nuts_acceptance"


def render_acceptance(root=ACCEPTANCE) -> dict:
    """Fisher NUTS's min ESS per gradient, step and gradients per draw, by target acceptance."""
    accepts = sorted(
        (p.name.removeprefix("accept_") for p in root.glob("accept_*")), key=float, reverse=True
    )
    base = [float(a) for a in accepts].index(NUTS_TARGET_ACCEPTANCE)  # ratios to the default
    head = [f"acceptance {a}" for a in accepts]
    lines = []
    ratios = []
    for target in (*TARGETS, *POSTERIORDB):
        rows = [cells.load(root / f"accept_{a}" / target / "fisher_nuts.json") for a in accepts]
        if None in rows:
            continue
        per_draw = [
            r["grad_evals"] / (r["protocol"]["chains"] * r["protocol"]["samples"]) for r in rows
        ]
        lines.append([
            target,
            *(
                f"{r['bulk_min_per_grad']:.3f} ({np.mean(r['step_size']):.2f}, {g:.1f})"
                for r, g in zip(rows, per_draw, strict=True)
            ),
        ])  # fmt: skip
        ratios.append([r["bulk_min_per_grad"] / rows[base]["bulk_min_per_grad"] for r in rows])
    ratios = np.asarray(ratios)
    summary = [
        f"{a}: geometric mean {np.exp(np.mean(np.log(col))):.2f}, "
        f"{np.sum(col < 1)} of {len(col)} targets lower"
        for i, (a, col) in enumerate(zip(accepts, ratios.T, strict=True))
        if i != base
    ]
    return {
        "acceptance_table": templating.table(["target", *head], lines),
        "acceptance_default": accepts[base],
        "acceptance_summary": "; ".join(summary),
    }


def render_chain_method(path=RESULTS.parent / "chain_method.json") -> str:
    """Fisher NUTS's ``chain_method`` table (``python -m benchmarks.chain_method``)."""
    rows = json.loads(path.read_text())["rows"]
    counts = sorted({r.get("devices", 1) for r in rows})
    heads = [
        f"{m}, {c} device{'s' if c > 1 else ''}"
        for c in counts
        for m in ("vectorized", "sequential")
    ]
    lines = []
    for target in dict.fromkeys(r["target"] for r in rows):
        cells = [
            ", ".join(
                f"{r['bulk_min_per_second']:.0f}"
                for r in rows
                if r["target"] == target and r["chain_method"] == m and r.get("devices", 1) == c
            )
            for c in counts
            for m in ("vectorized", "sequential")
        ]
        lines.append([target, *cells])
    return templating.table(["target", *heads], lines)


def render_mnist(roots=(RESULTS.parent / "race_gpu", RESULTS)) -> str:
    """MNIST (d = 785): every cached cell of the GPU and CPU races, with device and protocol.

    Seconds are not comparable across devices; ESS per gradient is.
    """
    header = [
        "sampler", "device", "warm-up + draws", "min bulk ESS", "min ESS per gradient",
        "min ESS/s",
    ]  # fmt: skip
    lines = []
    for root in roots:
        for sampler in (*WHITENED, "fisher_mala", "fisher_mala_pooled", *PEERS):
            path = root / "mnist56" / f"{sampler}.json"
            if not path.exists():
                continue
            r = json.loads(path.read_text())
            p = r["protocol"]
            warmup = p["fisher_warmup"] if sampler.startswith("fisher") else p["nuts_warmup"]
            device = "CPU (2 cores)" if r.get("device_kind", "cpu") == "cpu" else r["device_kind"]
            name = f"{sampler} (damping {_damping(r):g})" if sampler in WHITENED else sampler
            lines.append([
                name, device, f"{warmup} + {p['samples']}", f"{r['bulk_min']:.0f}",
                f"{r['bulk_min_per_grad']:.2e}", f"{r['bulk_min_per_second']:.3g}",
            ])  # fmt: skip
    return templating.table(header, lines)


DOCS_PAGE = RESULTS.parents[2] / "docs" / "fisher_nuts.md"
MARKERS = ("<!-- race:start -->", "<!-- race:end -->")


def render_whitened_page() -> str:
    """The race section of ``docs/fisher_nuts.md``: ``templates/fisher_nuts_race.md`` with
    every table and count of the cached cells."""
    full = render_whitened()
    for name, title in (
        ("race_table", "Min bulk ESS per second, every sampler"),
        ("race_per_grad_table", "Min bulk ESS per gradient evaluation, every sampler"),
        ("race_cost_table", "Microseconds per gradient evaluation, every sampler"),
    ):
        full[name] = templating.collapsed(title, full[name])
    values = {
        "lead_table": render_lead(),
        **full,
        **render_repeats(),
        "mnist_table": render_mnist(),
        "metric_table": metric_choice.render(),
        "damping_table": render_damping(),
        "handover_table": render_handover(),
        **render_keep_learning(),
        "chain_method_table": render_chain_method(),
        "stopping_looks_table": stopping_rule.render(),
        "stopping_table": render_stopping(),
        **render_acceptance(),
    }
    return templating.fill(templating.load("fisher_nuts_race.md"), values).strip()


def write_whitened_docs(page=DOCS_PAGE) -> str:
    """Replace the race tables of ``docs/fisher_nuts.md`` by the rendered cached cells."""
    text = page.read_text()
    head, rest = text.split(MARKERS[0])
    _, tail = rest.split(MARKERS[1])
    new = f"{head}{MARKERS[0]}\n{render_whitened_page()}\n{MARKERS[1]}{tail}"
    page.write_text(new)
    return new


PLOT = DOCS_PAGE.parent / "images" / "fisher_nuts_race.png"


def plot_whitened(out=PLOT, root=RESULTS) -> Path:
    """Min bulk ESS/s per target: the Fisher samplers (FisherMALA included) and the peers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ("fisher_nuts_pooled", "fisher_nuts", "fisher_hmc", "fisher_mala", *PEERS)
    targets = [t for t in (*TARGETS, *POSTERIORDB) if (root / t / "fisher_nuts.json").exists()]
    fig, ax = plt.subplots(figsize=(12, 4.2))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        records = [cells.load(root / t / f"{name}.json") for t in targets]
        values = [r["bulk_min_per_second"] if r and _full_peer(r) else np.nan for r in records]
        ax.bar(np.arange(len(targets)) + i * width, values, width, label=name)
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(targets)) + 0.4 - width / 2, targets, rotation=30, ha="right")
    ax.set_ylabel("min bulk ESS per second")
    ax.legend(ncol=4, fontsize=10, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="all")
    parser.add_argument("--samplers", default="all")
    for option, default in FULL_PROTOCOL.items():
        parser.add_argument(f"--{option.replace('_', '-')}", type=int, default=default)
    parser.add_argument(
        "--score-prior-weight",
        type=float,
        default=None,
        help="Fisher NUTS keeps learning R from its draws' scores",
    )
    parser.add_argument(
        "--damping",
        type=float,
        default=None,
        help=f"Fisher phase damping of Fisher NUTS / HMC (default {DAMPING})",
    )
    parser.add_argument(
        "--metric",
        default="auto",
        choices=("auto", "dense", "diagonal"),
        help="metric of Fisher NUTS / HMC (cells before it existed: dense)",
    )
    parser.add_argument(
        "--stopping-rule",
        default="on",
        choices=("on", "off"),
        help="Fisher NUTS / HMC end the Fisher phase by the stopping rule "
        "(cells before it existed: off)",
    )
    parser.add_argument(
        "--target-acceptance",
        type=float,
        default=None,
        help="dual-averaging target of Fisher NUTS / HMC's step-size phase",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=0,
        help="run the cells this many times into results/race_repeats/repK",
    )
    parser.add_argument(
        "--float64",
        action="store_true",
        help="run the paper's targets in float64 too, as nutpie computes (with --root "
        "results/race_f64: the equal-precision cells)",
    )
    parser.add_argument("--render", action="store_true")
    parser.add_argument(
        "--render-whitened", action="store_true", help="print the Fisher NUTS race tables"
    )
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help="write the Fisher NUTS race tables into docs/fisher_nuts.md",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=RESULTS,
        help="cache folder (e.g. results/race_gpu for an accelerator's run)",
    )
    args = parser.parse_args(argv)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:  # before JAX starts its backend
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={CPU_DEVICES}"
    if args.render:
        print(render(args.root))
        return
    if args.write_docs:
        write_whitened_docs()
        plot_whitened()
        plot_lead()
        return
    if args.render_whitened:
        print(render_whitened_page())
        return
    targets = TARGETS if args.targets == "all" else args.targets.split(",")
    samplers = SAMPLERS if args.samplers == "all" else args.samplers.split(",")
    samplers = (*SAMPLERS, *WHITENED, *NUTPIE) if args.samplers == "every" else samplers
    if args.repeats:
        for k in range(args.repeats):
            for target in targets:
                for sampler in samplers:
                    run_cell(target, sampler, args, root=REPEATS / f"rep{k}")
        print(render_repeats()["repeats_table"])
        return
    for target in targets:
        for sampler in samplers:
            run_cell(target, sampler, args, root=args.root)
    print(render())


if __name__ == "__main__":
    main()
