"""Write ``docs/performance.md``: the prose of ``templates/performance.md``, the numbers
of the cached benchmark results.

    python -m benchmarks.render_performance

The template holds every sentence; this module only computes the values its
``{{name}}`` placeholders take (numbers and tables) from ``benchmarks/results/``
(``step_cost.json``: ``python -m benchmarks.step_cost``; ``pooled.json``: ``python -m
benchmarks.pooled``; ``race/``: ``python -m benchmarks.versus_blackjax``;
``driver_checks.json``, ``long_run_1e6.json``, ``step_cost_gpu.json`` and ``race_gpu/``).
A placeholder without a value, a value without a placeholder, or a target whose
explanation the template lacks is an error, so prose and numbers cannot drift apart.
"""

import json
import re
from pathlib import Path

import numpy as np

from benchmarks import step_cost, templating, versus_blackjax
from benchmarks.templating import fill

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DOCS = HERE.parent / "docs"
TEMPLATE = HERE / "templates" / "performance.md"


def _load(name: str):
    path = RESULTS / name
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: run the benchmark that writes it "
            f"(see the docstring of benchmarks/render_performance.py)"
        )
    return json.loads(path.read_text())


def _span(values, fmt=".2f") -> str:
    return f"{min(values):{fmt}}-{max(values):{fmt}}"


def _plot_step_cost(rows, out: Path) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    for ax, dtype in zip(axes, ("float32", "float64"), strict=True):
        for chains, style in (("1", "-"), ("16", "--"), ("pooled16", ":")):
            sel = [
                r
                for r in rows
                if r["target"] == "gaussian" and r["dtype"] == dtype and r["chains"] == chains
            ]
            if not sel:
                continue
            dims = [r["dim"] for r in sel]
            per_chain = 16 if chains != "1" else 1
            for key, color in (
                ("fisher_adaptive", "C0"),
                ("fisher_frozen", "C1"),
                ("matvec", "C2"),
            ):
                ax.plot(
                    dims,
                    [r["us"][key] / per_chain for r in sel],
                    style,
                    color=color,
                    marker="o",
                    label=f"{key} ({chains})",
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("d")
        ax.set_title(f"standard Gaussian, {dtype}")
    axes[0].set_ylabel("µs per chain-iteration")
    axes[1].legend(fontsize=6)
    fig.tight_layout()
    path = out / "images" / "step_cost.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return "images/step_cost.png"


def _plot_pooled(data, out: Path) -> str:
    """Frobenius distance to the truth against burn-in iteration, pooled and independent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["rows"]
    fig, axes = plt.subplots(1, len(rows), figsize=(4.5 * len(rows), 3.2))
    for ax, r in zip(np.atleast_1d(axes), rows, strict=True):
        it = r["pooled_curve"]["iteration"]
        ax.plot(it, r["independent_curve_mean"], label=f"{r['chains']} independent chains (mean)")
        ax.plot(it, r["pooled_curve"]["distance"], label=f"{r['chains']} chains, one R")
        ax.axhline(r["threshold_D*"], color="grey", ls=":", label="D* (independent, final)")
        ax.axvline(r["pooled_iterations_to_D*"], color="C1", ls="--", lw=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("burn-in iteration")
        ax.set_title(r["target"])
    np.atleast_1d(axes)[0].set_ylabel("Frobenius distance to the covariance")
    np.atleast_1d(axes)[-1].legend(fontsize=7)
    fig.tight_layout()
    path = out / "images" / "pooled.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return "images/pooled.png"


#: The step-cost columns a reader compares (all of them: ``step_cost.json``).
PAGE_COLUMNS = (
    ("MALA µs", "mala", ".0f"),
    ("frozen µs", "fisher_frozen", ".0f"),
    ("adaptive µs", "fisher_adaptive", ".0f"),
    ("frozen / roofline", "frozen_over_2_matvec_loop", ".2f"),
    ("adaptive / roofline", "adaptive_over_roofline_loop", ".2f"),
    ("adaptive / MALA", "adaptive_over_mala", ".2f"),
)


def _goals(rows) -> dict:
    """The step-cost goals counted (d >= 785): both rooflines, and the logistic ratio."""
    big = [r for r in rows if r["dim"] >= 785]
    header = [
        "chains", "roofline", "frozen within 1.2 x", "worst", "adaptive within 1.2 x", "worst"
    ]  # fmt: skip
    lines = []
    for chains, label in (
        ("1", "one chain"),
        ("16", "16 chains, one R each"),
        ("pooled16", "16 chains sharing R"),
    ):
        sel = [r for r in big if r["target"] == "gaussian" and r["chains"] == chains]
        for suffix, roofline in (("", "separate calls"), ("_loop", "in the loop")):
            f_key, a_key = f"frozen_over_2_matvec{suffix}", f"adaptive_over_roofline{suffix}"
            if not sel or not all(f_key in r["us"] for r in sel):
                continue
            frozen = [r["us"][f_key] for r in sel]
            adaptive = [r["us"][a_key] for r in sel]
            lines.append([
                label, roofline, f"{sum(v <= 1.2 for v in frozen)}/{len(sel)}",
                f"{max(frozen):.2f}", f"{sum(v <= 1.2 for v in adaptive)}/{len(sel)}",
                f"{max(adaptive):.2f}",
            ])  # fmt: skip
    logi = [r for r in big if r["target"] == "logistic" and r["chains"] == "1"]
    table = [
        [r["dim"], r["dtype"], f"{r['us']['adaptive_over_mala']:.2f}",
         f"{_logistic_traffic_bound(r['dim']):.2f}"]
        for r in logi
    ]  # fmt: skip
    ok = sum(r["us"]["adaptive_over_mala"] <= 1.2 for r in logi)
    return {
        "goals_table": templating.table(header, lines),
        "logistic_goal_table": templating.table(
            ["d", "dtype", "adaptive / MALA", "traffic bound"], table
        ),
        "logistic_goal_count": f"{ok}/{len(logi)}",
    }


def _logistic_traffic_bound(dim: int, rows: int = step_cost.LOGISTIC_ROWS) -> float:
    """Least adaptive / MALA cost on the logistic regression if both stream memory.

    MALA's gradient reads the ``rows x d`` data twice (``X theta``, ``X^T r``); the adaptive
    step adds three reads of ``R`` and its read-modify-write, five ``d x d`` passes:
    ``(2 rows d + 5 d^2) / (2 rows d) = 1 + 5 d / (2 rows)``.
    """
    return 1 + 5 * dim / (2 * rows)


def _logistic_vs_bound(rows) -> str:
    """Measured adaptive / MALA over the traffic bound, one chain, d >= 2000."""
    ratios = [
        r["us"]["adaptive_over_mala"] / _logistic_traffic_bound(r["dim"])
        for r in rows
        if r["target"] == "logistic" and r["chains"] == "1" and r["dim"] >= 2000
    ]
    if not ratios:
        return "not measured"
    return f"{min(ratios):.2f}-{max(ratios):.2f} x the bound"


def _logistic_values(rows, meta) -> dict:
    ratios = [
        r["us"]["adaptive_over_mala"] / _logistic_traffic_bound(r["dim"])
        for r in rows
        if r["target"] == "logistic" and r["chains"] == "1" and r["dim"] >= 2000
    ]
    cells = {
        r["dtype"]: r["us"]["adaptive_over_mala"]
        for r in rows
        if r["target"] == "logistic" and r["chains"] == "1" and r["dim"] == 785
    }
    size = {
        dt: step_cost.LOGISTIC_ROWS * 785 * (4 if dt == "float32" else 8)
        for dt in ("float32", "float64")
    }
    return {
        "logistic_largest_dim": int(0.2 * 2 * step_cost.LOGISTIC_ROWS / 5),  # 1 + 5d/2n = 1.2
        "logistic_vs_bound": _span(ratios),
        "logistic_data_mb32": f"{size['float32'] / 1e6:.0f}",
        "logistic_data_mb64": f"{size['float64'] / 1e6:.0f}",
        "l3_mib": f"{meta['l3_cache_bytes'] / 2**20:.0f}",
        "r_mb": f"{785 * 785 * 4 / 1e6:.1f}",
        "logistic_785_32": f"{cells['float32']:.2f}",
        "logistic_785_64": f"{cells['float64']:.2f}",
        "logistic_785_order": "above" if cells["float32"] > cells["float64"] else "not above",
    }


def _threads_values() -> dict:
    """The loop-threading experiment (``step_cost --threads``, with and without taskset)."""
    two, one = _load("loop_threads.json")["row"], _load("loop_threads_1core.json")["row"]
    return {
        "threads_dim": two["dim"],
        "threads_cores": two["cores"],
        "threads_length": two["length"],
        "threads_rv_loop": f"{two['R@v loop']:.0f}",
        "threads_rv_unrolled": f"{two['R@v unrolled']:.0f}",
        "threads_rv_ratio": f"{two['R@v loop'] / two['R@v unrolled']:.2f}",
        "threads_vr_loop": f"{two['v@R loop']:.0f}",
        "threads_vr_unrolled": f"{two['v@R unrolled']:.0f}",
        "threads_one_rv_loop": f"{one['R@v loop']:.0f}",
        "threads_one_rv_unrolled": f"{one['R@v unrolled']:.0f}",
        "threads_adaptive_unrolled": f"{two['fisher adaptive unrolled']:.0f}",
        "threads_adaptive_loop": f"{two['fisher adaptive loop']:.0f}",
        "threads_adaptive_ratio": (
            f"{two['fisher adaptive loop'] / two['fisher adaptive unrolled']:.2f}"
        ),
        "threads_frozen_unrolled": f"{two['fisher frozen unrolled']:.0f}",
        "threads_frozen_loop": f"{two['fisher frozen loop']:.0f}",
        "threads_one_adaptive_unrolled": f"{one['fisher adaptive unrolled']:.0f}",
        "threads_one_adaptive_loop": f"{one['fisher adaptive loop']:.0f}",
    }


def _orientation_values() -> dict:
    r = {row["dim"]: row for row in _load("orientation.json")["rows"]}[2000]
    return {
        "orientation_batched": f"{r['batched v@R'] / r['batched R@v']:.1f}",
        "orientation_single": f"{r['single v@R'] / r['single R@v']:.1f}",
        "orientation_transposed": f"{r['single R.T@v'] / r['single R@v']:.0f}",
    }


def _pooled_overhead(rows) -> str:
    """Pooled frozen step less the 16 chains' own MALA work, against its loop roofline."""
    cells = []
    for r in rows:
        if r["target"] != "gaussian" or r["chains"] != "pooled16" or r["dim"] < 785:
            continue
        each = next(
            q
            for q in rows
            if q["target"] == "gaussian"
            and q["chains"] == "16"
            and q["dim"] == r["dim"]
            and q["dtype"] == r["dtype"]
        )
        rest = r["us"]["fisher_frozen"] - each["us"]["mala"]
        cells.append(
            f"d = {r['dim']} {r['dtype']}: {r['us']['frozen_over_2_matvec_loop']:.2f}"
            f" -> {rest / (2 * r['us']['matvec_loop']):.2f}"
        )
    return "; ".join(cells)


def _pooled_cost(rows) -> dict:
    """16 chains each with R against 16 sharing one: per chain-iteration, and the bound."""
    header = [
        "target", "d", "dtype", "µs per chain-iteration, 16 R",
        "µs per chain-iteration, shared R", "ratio", "ratio of the rooflines",
        "16 R: GB/s of `R v`", "shared R: GFLOP/s of `R V`",
    ]  # fmt: skip
    lines = []
    bounds, measured = [], []
    for target in ("gaussian", "logistic"):
        for dtype in ("float32", "float64"):
            for dim in (785, 2000, 4000):
                sel = {
                    r["chains"]: r
                    for r in rows
                    if r["target"] == target and r["dtype"] == dtype and r["dim"] == dim
                }
                if "16" not in sel or "pooled16" not in sel:
                    continue
                each, shared = sel["16"]["us"], sel["pooled16"]["us"]
                a, b = each["fisher_adaptive"] / 16, shared["fisher_adaptive"] / 16
                bound = (3 * each["matvec_loop"] + each["rank_one_loop"]) / (
                    3 * shared["matvec_loop"] + shared["rank_one_loop"]
                )
                size = 8 if dtype == "float64" else 4
                gbs = 16 * dim * dim * size / each["matvec_loop"] / 1e3
                gflops = 2 * 16 * dim * dim / shared["matvec_loop"] / 1e3
                lines.append([
                    target, dim, dtype, f"{a:.0f}", f"{b:.0f}", f"{a / b:.1f}",
                    f"{bound:.1f}", f"{gbs:.1f}", f"{gflops:.1f}",
                ])  # fmt: skip
                if dim >= 2000:
                    bounds.append(bound)
                    measured.append(a / b)
    return {
        "pooled_cost_table": templating.table(header, lines),
        "pooled_bound_span": _span(bounds, ".1f"),
        "pooled_measured_span": _span(measured, ".1f"),
    }


def _block_update_values() -> dict:
    data = _load("block_update.json")
    cells = "; ".join(
        f"d = {r['dim']}: {r['us']['cholesky']:.0f} against "
        f"{r['us']['eigh']:.0f} µs ({r['cholesky_over_eigh']:.2f} x)"
        for r in data["rows"]
    )
    return {"block_update_cells": cells, "block_update_commit": data["script_commit"]}


def _pooled_section(data) -> str:
    header = [
        "target", "D* (independent, mean final)", "pooled iterations to D*", "iteration ratio",
        "seconds independent burn-in", "seconds pooled to D*", "seconds ratio",
        "min ESS pooled, short burn-in", "min ESS independent, full burn-in",
    ]  # fmt: skip
    lines = []
    for r in data["rows"]:
        p, i = r["pooled_short_burn_in"], r["independent_full_burn_in"]
        ratio = f"{r['iteration_ratio']:.1f}" if r["iteration_ratio"] else "not reached"
        lines.append([
            r["target"], f"{r['threshold_D*']:.3f}", r["pooled_iterations_to_D*"], ratio,
            f"{r['seconds_independent_burn_in']:.1f}", f"{r['seconds_pooled_to_D*']:.1f}",
            f"{r['seconds_ratio']:.1f}",
            f"{p['min_ess_mean']:.0f} ± {p['min_ess_sd']:.0f} ({p['num_warmup']} burn-in)",
            f"{i['min_ess_mean']:.0f} ± {i['min_ess_sd']:.0f} ({i['num_warmup']} burn-in)",
        ])  # fmt: skip
    return templating.table(header, lines)


def _race_values(root: Path) -> dict:
    """The race table and the figures of every target where FisherMALA loses.

    The template explains each losing target by name; a losing target it does not name is
    an error (write its explanation first).
    """
    template = TEMPLATE.read_text()
    header = [
        "target", "ratio", "best BlackJAX sampler", "its ESS/grad", "FisherMALA's",
        "its µs/grad", "FisherMALA's", "its min bulk ESS (draws)", "ratio, paper's ESS",
    ]  # fmt: skip
    lines = []
    losers = []
    for target in versus_blackjax.TARGETS:
        rows = {
            s: json.loads(p.read_text())
            for s in versus_blackjax.SAMPLERS
            if (p := root / target / f"{s}.json").exists()
        }
        fisher = [rows[s] for s in ("fisher_mala", "fisher_mala_pooled") if s in rows]
        others = [rows[s] for s in versus_blackjax.SAMPLERS[2:] if s in rows]
        if not fisher or not others:
            continue
        f = max(fisher, key=lambda r: r["bulk_min_per_second"])
        o = max(others, key=lambda r: r["bulk_min_per_second"])
        if f["bulk_min_per_second"] >= o["bulk_min_per_second"]:
            continue
        losers.append(target)
        draws = o["protocol"]["chains"] * o["protocol"]["samples"]

        def us(r):
            return 1e6 * (r["seconds"]["warmup"] + r["seconds"]["sampling"]) / r["grad_evals"]

        lines.append([
            target, f"{f['bulk_min_per_second'] / o['bulk_min_per_second']:.2f}",
            o["sampler"], f"{o['bulk_min_per_grad']:.1e}", f"{f['bulk_min_per_grad']:.1e}",
            f"{us(o):.1f}", f"{us(f):.1f}", f"{o['bulk_min']:.0f} ({draws})",
            f"{f['paper_min_per_second'] / o['paper_min_per_second']:.2f}",
        ])  # fmt: skip
    unexplained = [t for t in losers if f"**{t}**" not in template]
    if unexplained:
        raise ValueError(f"FisherMALA loses on {unexplained}: explain it in {TEMPLATE}")
    explained = [
        t
        for t in versus_blackjax.TARGETS
        if f"**{t}**" in template.split("### Where FisherMALA loses")[1]
    ]
    stale = [t for t in explained if t not in losers]
    check = (
        ""
        if not stale
        else f"FisherMALA no longer loses on {', '.join(stale)}; the explanations above "
        "stay for the record of the earlier race."
    )
    return {
        "race_table": _race_tables(root, "Every sampler on every target"),
        **versus_blackjax.goal_values(root),
        "losses_table": templating.table(header, lines),
        "losses_check": check,
        **_worst_coordinates(root, "caravan"),
    }


def _worst_coordinates(root: Path, target: str) -> dict:
    """Caravan's worst coordinates (``python -m benchmarks.worst_coordinates``)."""
    w = json.loads((root / target / "worst_coordinates.json").read_text())
    worst, median = w["worst"], w["median"]
    first = worst[0]
    return {
        "caravan_worst": first["coordinate"],
        "caravan_worst_ess": f"{first['bulk_ess']:.0f}",
        "caravan_median_ess": f"{median[len(median) // 2]['bulk_ess']:.0f}",
        "caravan_worst_rows": f"{100 * first['nonzero_rows']:.2f}",
        "caravan_num_worst": len(worst),
        "caravan_rows_span": f"{100 * min(r['nonzero_rows'] for r in worst):.2f}-"
        f"{100 * max(r['nonzero_rows'] for r in worst):.1f}",
        "caravan_worst_skew": f"{first['skewness']:.2f}",
        "caravan_skew_span": _span([abs(r["skewness"]) for r in worst]),
        "caravan_num_median": len(median),
        "caravan_median_skew": f"{max(abs(r['skewness']) for r in median):.2f}",
    }


def _per_draw(c) -> float:
    return c["bulk_min"] / (c["protocol"]["chains"] * c["protocol"]["samples"])


def _projection(c, best) -> tuple[float, float, float]:
    """NUTS cell ``c`` at a shortened protocol projected to 1000 + 5000 steps.

    Seconds: its measured adaptation time plus 5000 draws at its measured cost per draw.
    Min ESS/s (a) at its own min bulk ESS per draw, (b) at that of ``best``.
    """
    p = c["protocol"]
    draw_s = c["seconds"]["sampling"] / p["samples"]
    projected = c["seconds"]["warmup"] + 5000 * draw_s
    draws = p["chains"] * 5000
    return projected, _per_draw(c) * draws / projected, _per_draw(best) * draws / projected


def _projection_values(root: Path) -> dict:
    """NUTS cells at a shortened protocol (MNIST on CPU), projected to 1000 + 5000 steps.

    NUTS's time for the full protocol is taken as its measured adaptation time (of fewer
    steps) plus 5000 draws at its measured cost per draw; its min bulk ESS per draw (a) as
    measured, (b) as the best NUTS reached on any target at the full protocol. Where a
    shortened run was later replaced by a full one (its record kept in
    ``<target>/shortened/``), the projection is checked against the measurement.
    """
    cells = [json.loads(p.read_text()) for p in sorted(root.glob("*/nuts_*.json"))]
    full = [
        c
        for c in cells
        if c["protocol"]["nuts_warmup"] >= 1000 and c["protocol"]["samples"] >= 5000
    ]
    short = [c for c in cells if c not in full]
    best = max(full, key=_per_draw)
    header = [
        "target", "sampler", "measured protocol", "gradients per iteration", "adaptation s",
        "ms per draw (4 chains)", "projected s", "min ESS per draw", "projected min ESS/s (a)",
        "(b)", "FisherMALA min ESS/s", "FisherMALA / NUTS (a) / (b)",
    ]  # fmt: skip
    lines = []
    for c in short:
        p = c["protocol"]
        fisher = [
            json.loads(f.read_text())["bulk_min_per_second"]
            for s in ("fisher_mala", "fisher_mala_pooled")
            if (f := root / c["target"] / f"{s}.json").exists()
        ]
        projected, own, optimistic = _projection(c, best)
        leapfrogs = c["grad_evals"] / (p["chains"] * (p["nuts_warmup"] + p["samples"]))
        lines.append([
            c["target"], c["sampler"], f"{p['nuts_warmup']} + {p['samples']}",
            f"{leapfrogs:.0f}", f"{c['seconds']['warmup']:.0f}",
            f"{c['seconds']['sampling'] / p['samples'] * 1e3:.0f}", f"{projected:.0f}",
            f"{_per_draw(c):.2f}", f"{own:.1f}", f"{optimistic:.1f}", f"{max(fisher):.1f}",
            f"{max(fisher) / own:.1f} / {max(fisher) / optimistic:.1f}",
        ])  # fmt: skip
    checks = []
    between = True
    for path in sorted(root.glob("*/shortened/nuts_*.json")):
        old = json.loads(path.read_text())
        now = json.loads((path.parent.parent / path.name).read_text())
        _, own, optimistic = _projection(old, best)
        between &= own <= now["bulk_min_per_second"] <= optimistic
        checks.append([
            old["target"], old["sampler"],
            f"{old['protocol']['nuts_warmup']} + {old['protocol']['samples']}",
            f"{own:.1f}", f"{optimistic:.1f}", f"{now['bulk_min_per_second']:.1f}",
        ])  # fmt: skip
    return {
        "short_targets": ", ".join(sorted({c["target"] for c in short})),
        "best_per_draw": f"{_per_draw(best):.2f}",
        "best_per_draw_cell": f"{best['target']}, {best['sampler']}",
        "projection_table": templating.table(header, lines),
        "projection_check_table": templating.table(
            [
                "target",
                "sampler",
                "shortened protocol",
                "projected (a)",
                "projected (b)",
                "measured at 1000 + 5000",
            ],
            checks,
        ),
        "projection_verdict": (
            "Each measurement lies between (a) and (b)"
            if between
            else "The measurements do not all lie between (a) and (b)"
        ),
    }


def _driver_values() -> dict:
    c = _load("driver_checks.json")
    pb, mem = c["progress_bar"], c["memory"]
    rows = []
    by = {(r["search"], r["initial_step_size"]): r for r in c["initial_step_size"]}
    for guess in sorted({r["initial_step_size"] for r in c["initial_step_size"]}):
        a, b = by[(True, guess)], by[(False, guess)]
        rows.append([
            f"{guess:g}", f"{a['min_ess_mean']:.0f} ± {a['min_ess_sd']:.0f}",
            f"{b['min_ess_mean']:.0f} ± {b['min_ess_sd']:.0f}",
        ])  # fmt: skip
    return {
        "progress_with": f"{pb['seconds_with']:.2f}",
        "progress_without": f"{pb['seconds_without']:.2f}",
        "progress_ratio": f"{pb['ratio']:.3f}",
        "initial_step_table": templating.table(
            [
                "initial sigma^2",
                "min ESS with the search (default)",
                "min ESS without (paper's rule only)",
            ],
            rows,
        ),
        "memory_chains": mem["draws_shape"][0],
        "memory_draws": mem["draws_shape"][1],
        "memory_dim": mem["draws_shape"][2],
        "memory_mb": f"{mem['draws_mb']:.0f}",
        "memory_peak_mb": f"{mem['peak_rss_mb']:.0f}",
        "memory_seconds": f"{mem['seconds']:.0f}",
    }


def _compile_values() -> dict:
    c = _load("compile_cost.json")
    default = c["default"]
    return {
        "compile_wall": f"{default['wall_seconds']:.1f}",
        "compile_seconds": f"{default['compile_seconds']:.1f}",
        "compile_programs": len(default["programs"]),
        "compile_each": ", ".join(f"{s:.1f}" for _, s in default["programs"]),
        "cache_first": f"{c['persistent_cache_first_process']['wall_seconds']:.1f}",
        "cache_second": f"{c['persistent_cache_second_process']['wall_seconds']:.1f}",
    }


def _chain_threads_values() -> dict:
    """The chain-groups section (``python -m benchmarks.chain_threads``)."""
    out = _load("chain_threads.json")
    ratios, long, short = {}, [], []
    for r in out["rows"]:
        one = np.median([x["bulk_min_per_second"] for x in r["one_program"]])
        two = np.median([x["bulk_min_per_second"] for x in r["threads"]])
        seconds = np.median([x["warmup"] + x["sampling"] for x in r["one_program"]])
        name = f"{r['target']} {r['sampler']}"
        ratios[name] = two / one
        if r["target"] in ("caravan", "mnist56") or r["sampler"] == "mala":
            continue
        (long if seconds >= 1.0 else short).append((name, two / one, seconds))
    return {
        "threads_groups": out["groups"],
        "threads_long_low": f"{min(v for _, v, _ in long):.2f}",
        "threads_long_high": f"{max(v for _, v, _ in long):.2f}",
        "threads_long_cells": ", ".join(f"{n}: {v:.2f}" for n, v, _ in long),
        "threads_short": ", ".join(
            f"{n} ({s:.2f} s of warm-up and draws) {v:.2f}" for n, v, s in short
        ),
        "threads_caravan": f"{ratios['caravan fisher_nuts']:.2f}",
        "threads_mala": f"{ratios['gp mala']:.2f}",
        "threads_mnist": f"{ratios['mnist56 fisher_mala']:.2f}",
        "threads_max_dim": out["groups_max_dim"],
        "threads_identical": sum(r["bit_identical"] for r in out["rows"]),
        "threads_cells": len(out["rows"]),
        "threads_large_cells": _ratios_text(_load("chain_threads_large.json")),
    }


def _ratios_text(out: dict) -> str:
    """``target sampler (d = ...): ratio`` of each cell of ``benchmarks.chain_threads --large``
    (one run each way: the groups' min ESS per second over one program's)."""
    return ", ".join(
        f"{r['target']} {r['sampler']} "
        f"{r['threads'][0]['bulk_min_per_second'] / r['one_program'][0]['bulk_min_per_second']:.2f}"
        for r in out["rows"]
    )


def _long_run_values() -> dict:
    lr = _load("long_run_1e6.json")
    return {
        "long_updates": lr["updates"],
        "long_error": f"{lr['relative_error_A']:.1e}",
        "long_eigenvalue": f"{lr['min_eigenvalue_over_max']:.1e}",
        "long_trace_unanchored": f"{lr['trace_error_unanchored']:.1e}",
        "long_trace_anchored": f"{lr['trace_error_anchored_worst']:.1e}",
        "long_seconds": f"{lr['seconds']:.0f}",
    }


H200_PEAK_BANDWIDTH = 4.8e12  # bytes/s, NVIDIA's H200 SXM datasheet (HBM3e)


def _gpu_step_cost_section(data) -> str:
    """GPU step cost against the memory-bandwidth bound computed from the datasheet.

    On a GPU a separate jitted ``R @ v`` call measures dispatch latency (tens of µs), not
    the product, so the in-process ``R@v`` column of the CPU table is meaningless there.
    The bound instead counts the passes over R at the datasheet bandwidth: frozen 2 reads;
    adaptive 3 reads plus the rank-one update's read and write.
    """
    header = [
        "target", "d", "chains", "MALA µs", "Fisher frozen µs", "Fisher adaptive µs",
        "frozen / (2 passes at peak)", "adaptive / (5 passes at peak)", "adaptive / MALA",
    ]  # fmt: skip
    lines = []
    for r in data["rows"]:
        m, d = r["us"], r["dim"]
        copies = 16 if r["chains"] == "16" else 1
        pass_us = copies * d * d * 4 / H200_PEAK_BANDWIDTH * 1e6
        mala_us = f"{m['mala']:.0f}" if "mala" in m else "-"
        over_mala = f"{m['adaptive_over_mala']:.2f}" if "adaptive_over_mala" in m else "-"
        lines.append([
            r["target"], d, r["chains"], mala_us, f"{m['fisher_frozen']:.0f}",
            f"{m['fisher_adaptive']:.0f}", f"{m['fisher_frozen'] / (2 * pass_us):.2f}",
            f"{m['fisher_adaptive'] / (5 * pass_us):.2f}", over_mala,
        ])  # fmt: skip
    return templating.table(header, lines)


def _gpu_values() -> dict:
    """The GPU step-cost table and what it shows, every figure computed from it."""
    data = _load("step_cost_gpu.json")
    us = {(r["target"], r["dim"], r["chains"]): r["us"] for r in data["rows"]}

    def bound(dim, chains, passes):
        copies = 16 if chains == "16" else 1
        return passes * copies * dim * dim * 4 / H200_PEAK_BANDWIDTH * 1e6

    def ratios(target, dim, chains):
        m = us[(target, dim, chains)]
        return (
            m["fisher_frozen"] / bound(dim, chains, 2),
            m["fisher_adaptive"] / bound(dim, chains, 5),
        )

    dims = sorted({d for (t, d, c) in us if t == "gaussian"})
    big, mid = dims[-1], dims[-2]
    f_big, a_big = ratios("gaussian", big, "16")
    pooled = {d: us[("gaussian", d, "pooled16")] for d in dims}
    per_chain = {
        d: us[("gaussian", d, "16")]["fisher_adaptive"] / pooled[d]["fisher_adaptive"] for d in dims
    }
    return {
        "gpu_jax": data["meta"]["jax"],
        "gpu_command": data["meta"]["command"],
        "gpu_table": _gpu_step_cost_section(data),
        "gpu_big": big,
        "gpu_big_gb": f"{16 * big * big * 4 / 1e9:.1f}",
        "gpu_big_frozen": f"{f_big:.2f}",
        "gpu_big_adaptive": f"{a_big:.2f}",
        "gpu_big_percent": f"{100 / max(f_big, a_big):.0f}",
        "gpu_mid": mid,
        "gpu_mid_mb": f"{16 * mid * mid * 4 / 1e6:.0f}",
        "gpu_mid_worst": f"{max(ratios('gaussian', mid, '16')):.2f}",
        "gpu_mala_span": _span([us[("gaussian", d, "1")]["mala"] for d in dims], ".0f"),
        "gpu_one_big": f"{ratios('gaussian', big, '1')[1]:.1f}",
        "gpu_logistic_span": _span(
            [m["adaptive_over_mala"] for (t, d, c), m in us.items() if t == "logistic" and c == "1"]
        ),
        "gpu_logistic_16": f"{
            max(
                m['adaptive_over_mala']
                for (t, d, c), m in us.items()
                if t == 'logistic' and c == '16'
            ):.1f}",
        "gpu_pooled_frozen_span": _span([m["fisher_frozen"] for m in pooled.values()], ".0f"),
        "gpu_pooled_adaptive_span": _span([m["fisher_adaptive"] for m in pooled.values()], ".0f"),
        "gpu_pooled_per_chain": ", ".join(f"{v:.1f} x at d = {d}" for d, v in per_chain.items()),
        **_gpu_race_values(RESULTS / "race_gpu"),
    }


def _gpu_race_values(race: Path) -> dict:
    """Why NUTS on MNIST is absent from the GPU race, with the times from the session log.

    The session log marks each phase with its offset in seconds; the race phase is from
    ``race on MNIST`` to the next mark. FisherMALA's cells took their recorded compile,
    warm-up and sampling seconds; the process start-up is taken as that of the session's
    first process (its offset at the first phase mark minus the total it printed).
    """
    text = (RESULTS / "gpu_logs" / "session_call1_stdout.log").read_text()
    paths = sorted((race / "mnist56").glob("fisher_mala*.json"))
    cells = [json.loads(path.read_text()) for path in paths]
    marks = [(int(m.group(1)), m.group(2)) for m in re.finditer(r"^== \+(\d+) s (.*)$", text, re.M)]
    start = next(i for i, (_, name) in enumerate(marks) if name.startswith("race on MNIST"))
    race_s = marks[start + 1][0] - marks[start][0]
    startup = marks[0][0] - float(re.search(r"\(total ([\d.]+) s\)", text).group(1))
    fisher_s = sum(sum(c["seconds"].values()) for c in cells)
    nuts_s = race_s - fisher_s - startup
    best = max(c["bulk_min_per_second"] for c in cells)
    p = cells[0]["protocol"]
    draws = p["chains"] * p["samples"]
    needed = best * nuts_s / draws
    reached = sorted(
        {
            c["target"]
            for path in (RESULTS / "race").glob("*/nuts_*.json")
            if (c := json.loads(path.read_text()))["bulk_min"]
            / (c["protocol"]["chains"] * c["protocol"]["samples"])
            > needed
        }
    )
    return {
        "gpu_race_warmup": p["nuts_warmup"],
        "gpu_race_samples": p["samples"],
        "gpu_race_chains": p["chains"],
        "gpu_race_seconds": race_s,
        "gpu_race_fisher_seconds": f"{fisher_s:.0f}",
        "gpu_race_startup": f"{startup:.0f}",
        "gpu_race_nuts_seconds": f"{nuts_s:.0f}",
        "gpu_race_best": f"{best:.0f}",
        "gpu_race_needed_ess": f"{round(best * nuts_s, -2):,.0f}",
        "gpu_race_draws": f"{draws:,}",
        "gpu_race_needed_per_draw": f"{needed:.1f}",
        "gpu_race_reached": ", ".join(reached) or "no target",
        "gpu_race_table": _race_tables(race, "Every sampler on every target, on the GPU"),
    }


def _race_tables(root, title: str) -> str:
    """:func:`versus_blackjax.render`'s full table, collapsed, then its summary table."""
    full, summary = versus_blackjax.render(root).split("\n\n", 1)
    return templating.collapsed(title, full) + "\n" + summary


#: Tables too wide or too long to show open: collapsed under these titles.
COLLAPSED = {
    "step_cost_table": "Every cell: microseconds per iteration and the ratios",
    "pooled_cost_table": "Every cell: shared R against 16 R",
    "pooled_table": "Every target: burn-in to the independent chains' distance",
    "losses_table": "The figures of each target where FisherMALA loses",
    "projection_table": "Every projection of the shortened NUTS cells",
    "gpu_table": "Every GPU cell: microseconds per iteration",
}


def values(out: Path = DOCS) -> dict:
    """Every placeholder's value, the wide tables collapsed (writes the plots)."""
    found = _values(out)
    for name, title in COLLAPSED.items():
        found[name] = templating.collapsed(title, found[name])
    return found


def _values(out: Path = DOCS) -> dict:
    """Every placeholder's value (writes the two plots under ``out/images``)."""
    data = _load("step_cost.json")
    rows, meta = data["rows"], data["meta"]
    pooled = _load("pooled.json")
    return {
        "step_cost_plot": _plot_step_cost(rows, out),
        "step_cost_command": meta["command"].strip(),
        "step_cost_device": meta["device"],
        "step_cost_jax": meta["jax"],
        "step_cost_table": step_cost.render(rows, PAGE_COLUMNS),
        **_goals(rows),
        **_logistic_values(rows, meta),
        **_threads_values(),
        **_orientation_values(),
        "pooled_overhead": _pooled_overhead(rows),
        **_pooled_cost(rows),
        **_block_update_values(),
        "pooled_plot": _plot_pooled(pooled, out),
        "pooled_table": _pooled_section(pooled),
        **_race_values(RESULTS / "race"),
        **_projection_values(RESULTS / "race"),
        **_driver_values(),
        **_compile_values(),
        **_chain_threads_values(),
        **_long_run_values(),
        **_gpu_values(),
    }


def render(out: Path = DOCS) -> Path:
    """Write ``out/performance.md`` (and its plots) from the template and the results."""
    text = fill(TEMPLATE.read_text(), values(out))
    path = out / "performance.md"
    path.write_text(re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n")
    return path


if __name__ == "__main__":
    print(render())
