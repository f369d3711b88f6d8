"""Write ``docs/performance.md`` from the cached benchmark results.

    python -m benchmarks.render_performance

Reads ``benchmarks/results/step_cost.json`` (``python -m benchmarks.step_cost``),
``pooled.json`` (``python -m benchmarks.pooled``), ``race/`` (``python -m
benchmarks.versus_blackjax``) and ``long_run_1e6.json`` (``python -m benchmarks.long_run``);
every number in the page comes from one of them.
"""

import json
import re
from pathlib import Path

import numpy as np

from benchmarks import step_cost, versus_blackjax

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DOCS = HERE.parent / "docs"


def _plot_step_cost(rows, out: Path) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    for ax, dtype in zip(axes, ("float32", "float64"), strict=True):
        for chains, style in (("1", "-"), ("16", "--"), ("pooled16", ":")):
            sel = [r for r in rows if r["target"] == "gaussian" and r["dtype"] == dtype
                   and r["chains"] == chains]
            if not sel:
                continue
            dims = [r["dim"] for r in sel]
            per_chain = 16 if chains != "1" else 1
            for key, color in (("fisher_adaptive", "C0"), ("fisher_frozen", "C1"),
                               ("matvec", "C2")):
                ax.plot(dims, [r["us"][key] / per_chain for r in sel], style, color=color,
                        marker="o", label=f"{key} ({chains})")
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


def _pooled_section(data) -> str:
    lines = ["| target | D* (independent, mean final) | pooled iterations to D* | iteration "
             "ratio | seconds independent burn-in | seconds pooled to D* | seconds ratio | "
             "min ESS pooled, short burn-in | min ESS independent, full burn-in |",
             "|" + "---|" * 9]
    for r in data["rows"]:
        p, i = r["pooled_short_burn_in"], r["independent_full_burn_in"]
        ratio = f"{r['iteration_ratio']:.1f}" if r["iteration_ratio"] else "not reached"
        lines.append(
            f"| {r['target']} | {r['threshold_D*']:.3f} | {r['pooled_iterations_to_D*']} | "
            f"{ratio} | {r['seconds_independent_burn_in']:.1f} | "
            f"{r['seconds_pooled_to_D*']:.1f} | {r['seconds_ratio']:.1f} | "
            f"{p['min_ess_mean']:.0f} ± {p['min_ess_sd']:.0f} ({p['num_warmup']} burn-in) | "
            f"{i['min_ess_mean']:.0f} ± {i['min_ess_sd']:.0f} ({i['num_warmup']} burn-in) |")
    return "\n".join(lines)


def _cost_ratio_section(rows) -> str:
    """Per chain-iteration cost, 16 chains each with R against 16 sharing one R.

    The last columns put the same ratio at the loop rooflines (3 products and the update,
    timed inside a ``lax.scan``), and the rates those rooflines run at: memory traffic of
    16 separate R, arithmetic of the 16-column products of a shared R. Their ratio bounds
    what pooling can save on this hardware.
    """
    lines = ["| target | d | dtype | µs per chain-iteration, 16 chains each with R | "
             "µs per chain-iteration, 16 chains sharing R | ratio | ratio of the loop "
             "rooflines | 16 R: GB/s of `R v` in loop | shared R: GFLOP/s of `R V` in loop |",
             "|" + "---|" * 9]
    for target in ("gaussian", "logistic"):
        for dtype in ("float32", "float64"):
            for dim in (785, 2000, 4000):
                sel = {r["chains"]: r for r in rows if r["target"] == target
                       and r["dtype"] == dtype and r["dim"] == dim}
                if "16" not in sel or "pooled16" not in sel:
                    continue
                each, shared = sel["16"]["us"], sel["pooled16"]["us"]
                a = each["fisher_adaptive"] / 16
                b = shared["fisher_adaptive"] / 16
                bound = "-"
                rates = "- | -"
                if "matvec_loop" in each and "matvec_loop" in shared:
                    bound = (3 * each["matvec_loop"] + each["rank_one_loop"]) / (
                        3 * shared["matvec_loop"] + shared["rank_one_loop"])
                    bound = f"{bound:.1f}"
                    size = 8 if dtype == "float64" else 4
                    gbs = 16 * dim * dim * size / each["matvec_loop"] / 1e3
                    gflops = 2 * 16 * dim * dim / shared["matvec_loop"] / 1e3
                    rates = f"{gbs:.1f} | {gflops:.1f}"
                lines.append(f"| {target} | {dim} | {dtype} | {a:.0f} | {b:.0f} | "
                             f"{a / b:.1f} | {bound} | {rates} |")
    return "\n".join(lines)


def _goals(rows) -> str:
    """Which step-cost goals hold, counted from the table (d >= 785, Gaussian target).

    Counted against both rooflines: the issue's (a separate jitted call) and the same
    products inside a ``lax.scan``, where every sampler step runs.
    """
    big = [r for r in rows if r["dim"] >= 785]
    lines = []
    for chains, label in (("1", "one chain"), ("16", "16 chains, one R each"),
                          ("pooled16", "16 chains sharing R")):
        sel = [r for r in big if r["target"] == "gaussian" and r["chains"] == chains]
        if not sel:
            continue
        counts = []
        for suffix, roofline in (("", "separate-call roofline"), ("_loop", "loop roofline")):
            f_key, a_key = f"frozen_over_2_matvec{suffix}", f"adaptive_over_roofline{suffix}"
            if not all(f_key in r["us"] for r in sel):
                continue
            frozen = sum(r["us"][f_key] <= 1.2 for r in sel)
            adaptive = sum(r["us"][a_key] <= 1.2 for r in sel)
            worst_f = max(r["us"][f_key] for r in sel)
            worst_a = max(r["us"][a_key] for r in sel)
            counts.append(f"{roofline}: frozen within 1.2 x in {frozen}/{len(sel)} cells "
                          f"(worst {worst_f:.2f}), adaptive in {adaptive}/{len(sel)} "
                          f"(worst {worst_a:.2f})")
        lines.append(f"- {label}: " + "; ".join(counts) + ".")
    logi = [r for r in big if r["target"] == "logistic" and r["chains"] == "1"]
    if logi:
        ok = sum(r["us"]["adaptive_over_mala"] <= 1.2 for r in logi)
        cells = ", ".join(f"d={r['dim']} {r['dtype']}: {r['us']['adaptive_over_mala']:.2f} "
                          f"(traffic bound {_logistic_traffic_bound(r['dim']):.2f})"
                          for r in logi)
        lines.append(f"- logistic regression, one chain, adaptive / MALA <= 1.2 in "
                     f"{ok}/{len(logi)} cells ({cells}).")
    return "\n".join(lines)


def _logistic_traffic_bound(dim: int, rows: int = step_cost.LOGISTIC_ROWS) -> float:
    """Least adaptive / MALA cost on the logistic regression if both stream memory.

    MALA's gradient reads the ``rows x d`` data twice (``X theta``, ``X^T r``); the adaptive
    step adds three reads of ``R`` and its read-modify-write, five ``d x d`` passes:
    ``(2 rows d + 5 d^2) / (2 rows d) = 1 + 5 d / (2 rows)``.
    """
    return 1 + 5 * dim / (2 * rows)


def _logistic_vs_bound(rows) -> str:
    """Measured adaptive / MALA over the traffic bound, one chain, d >= 2000."""
    ratios = [r["us"]["adaptive_over_mala"] / _logistic_traffic_bound(r["dim"]) for r in rows
              if r["target"] == "logistic" and r["chains"] == "1" and r["dim"] >= 2000]
    if not ratios:
        return "not measured"
    return f"{min(ratios):.2f}-{max(ratios):.2f} x the bound"


def _logistic_bounds(rows) -> str:
    """The traffic bound at the measured d, the largest d where 1.2 is possible, the fit."""
    dims = sorted({r["dim"] for r in rows if r["target"] == "logistic" and r["dim"] >= 785})
    if not dims:
        return ""
    largest = int(0.2 * 2 * step_cost.LOGISTIC_ROWS / 5)  # 1 + 5 d / (2 n) = 1.2
    at = ", ".join(f"{_logistic_traffic_bound(d):.2f} at d = {d}" for d in dims)
    return (f": {at}. The goal of 1.2 can only hold up to d = {largest}; at d >= 2000 the "
            f"measured ratios are {_logistic_vs_bound(rows)}")


def _logistic_cache_text(rows, meta) -> str:
    """At d = 785, MALA alone may run partly from cache: float32 against float64."""
    l3 = (meta or {}).get("l3_cache_bytes")
    cells = {r["dtype"]: r for r in rows if r["target"] == "logistic" and r["chains"] == "1"
             and r["dim"] == 785}
    if not l3 or set(cells) != {"float32", "float64"}:
        return ""
    size = {dt: step_cost.LOGISTIC_ROWS * 785 * (4 if dt == "float32" else 8) for dt in cells}
    ratio = {dt: r["us"]["adaptive_over_mala"] for dt, r in cells.items()}
    higher = "above" if ratio["float32"] > ratio["float64"] else "not above"
    return (f" At d = 785 the float32 data matrix ({size['float32'] / 1e6:.0f} MB) about fills "
            f"this CPU's {l3 / 2**20:.0f} MiB L3 cache, so MALA alone can run partly from "
            f"cache while the {785 * 785 * 4 / 1e6:.1f} MB of `R` push the data out; the "
            f"float64 data ({size['float64'] / 1e6:.0f} MB) never fit. Measured: "
            f"{ratio['float32']:.2f} in float32, {higher} the {ratio['float64']:.2f} of "
            f"float64.")


def _threads_facts() -> str:
    """The loop-threading experiment (``step_cost --threads``, with and without taskset)."""
    both = [RESULTS / "loop_threads.json", RESULTS / "loop_threads_1core.json"]
    if not all(p.exists() for p in both):
        return ""
    two, one = (json.loads(p.read_text())["row"] for p in both)
    return (
        f" Measured with `python -m benchmarks.step_cost --threads "
        f"benchmarks/results/loop_threads.json` at d = {two['dim']}, float32, one R "
        f"({two['cores']} cores): `R @ v` takes {two['R@v loop']:.0f} µs inside a "
        f"`lax.scan` and {two['R@v unrolled']:.0f} µs in a fully unrolled scan (no loop), "
        f"{two['R@v loop'] / two['R@v unrolled']:.2f} x; `v @ R` takes "
        f"{two['v@R loop']:.0f} and {two['v@R unrolled']:.0f} µs (not multi-threaded "
        f"either way). Pinned to one core (`taskset -c 0`, same command writing "
        f"`loop_threads_1core.json`) the loop and the unrolled `R @ v` agree "
        f"({one['R@v loop']:.0f} and {one['R@v unrolled']:.0f} µs), so the gap is the "
        f"second thread. A whole FisherMALA step shows it too: in chunks of "
        f"{two['length']} unrolled steps the adaptive step takes "
        f"{two['fisher adaptive unrolled']:.0f} µs against {two['fisher adaptive loop']:.0f} "
        f"µs in the loop ({two['fisher adaptive loop'] / two['fisher adaptive unrolled']:.2f}"
        f" x), the frozen step {two['fisher frozen unrolled']:.0f} against "
        f"{two['fisher frozen loop']:.0f} µs; on one core "
        f"{one['fisher adaptive unrolled']:.0f} against {one['fisher adaptive loop']:.0f} "
        f"µs. The library keeps the loop: unrolling multiplies compile time by the chunk "
        f"length and the gain exists only where XLA:CPU has idle cores."
    )


def _pooled_overhead(rows) -> str:
    """Pooled frozen step less the 16 chains' own MALA work, against its loop roofline."""
    cells = []
    for r in rows:
        if r["target"] != "gaussian" or r["chains"] != "pooled16" or r["dim"] < 785:
            continue
        each = next((q for q in rows if q["target"] == "gaussian" and q["chains"] == "16"
                     and q["dim"] == r["dim"] and q["dtype"] == r["dtype"]), None)
        if each is None or "matvec_loop" not in r["us"]:
            continue
        rest = r["us"]["fisher_frozen"] - each["us"]["mala"]
        cells.append(f"d = {r['dim']} {r['dtype']}: {r['us']['frozen_over_2_matvec_loop']:.2f}"
                     f" -> {rest / (2 * r['us']['matvec_loop']):.2f}")
    if not cells:
        return ""
    return (
        "\n- **Pooled chains against the loop roofline.** The roofline counts only the "
        "products with `R`; the 16 chains also draw their noise, evaluate their gradients "
        "and run their accept steps, the work of a 16-chain MALA step, which at d = 785 is a "
        "good part of a pooled step. Subtracting the measured 16-chain MALA step from the "
        "pooled frozen step, its ratio to the loop roofline becomes: " + "; ".join(cells)
        + "."
    )


def _analysis(orient, rows=(), meta=None) -> str:
    o = {r["dim"]: r for r in orient["rows"]} if orient else {}
    facts = ""
    if 2000 in o:
        r = o[2000]
        facts = (f" (`python -m benchmarks.step_cost --orientation`, d = 2000: batched "
                 f"`v @ R` {r['batched v@R'] / r['batched R@v']:.1f}x the batched `R @ v`; "
                 f"for one R, `v @ R` {r['single v@R'] / r['single R@v']:.1f}x and "
                 f"`R.T @ v` {r['single R.T@v'] / r['single R@v']:.0f}x `R @ v`)")
    return f"""
### Where the goals are missed, and why

- **The separate-call roofline uses both cores; a sampler step cannot.** XLA:CPU runs a
  large `R @ v` on its intra-op thread pool when the product is a top-level operation,
  but runs it on one thread inside a while loop, and every step of every sampler here
  runs inside a `lax.scan`.{_threads_facts()} Against the same products timed inside a
  `lax.scan` (the "loop roofline" columns) the steps are close to their bound.
- **16 vmapped chains, each with its own R.** XLA:CPU runs the per-chain product
  `g_y^T R` through a batched-dot path that is slower than the batched `R v` of the
  roofline{facts}. The library already uses the fast orientation for one R (`v @ R`,
  never `R.T @ v`); the frozen step, whose two passes include one such product, pays it
  most. Pooled chains avoid it (their products are matrix-matrix).{_pooled_overhead(rows)}
- **Logistic regression, Fisher overhead over MALA.** The gradient costs two passes over
  the `10^4 x d` data matrix; the adaptive step adds five passes over the `d x d` matrix
  `R` (three reads, one read-modify-write), so when both stream memory the ratio is at
  least `1 + 5 d / (2 x 10^4)`, the "traffic bound" in the goals above{_logistic_bounds(rows)}
  (the bound assumes every pass streams at the same rate).{_logistic_cache_text(rows, meta)}
- **Small d (100).** A separate jitted `R @ v` call costs more in dispatch than a whole
  step, so those ratios are far below 1 and say nothing.
- These machines are shared: expect 10-30% noise in any single cell.
"""


def _block_update_text() -> str:
    """The rank-C gain by Cholesky against its first form by eigendecomposition."""
    path = RESULTS / "block_update.json"
    if not path.exists():
        return ""
    data = json.loads(path.read_text())
    cells = "; ".join(f"d = {r['dim']}: {r['us']['cholesky']:.0f} against "
                      f"{r['us']['eigh']:.0f} µs ({r['cholesky_over_eigh']:.2f} x)"
                      for r in data["rows"])
    return (f"\nThe rank-16 gain is formed from a 16 x 16 Cholesky factorization (How it "
            f"works, section 7); its first form used a symmetric eigendecomposition. The "
            f"pooled adaptive step of 16 chains with each (`{data['command']}`, standard "
            f"Gaussian, float32, interleaved rounds): {cells}.\n")


def _pooled_bound_text(rows) -> str:
    """Why pooling saves less than 8x per chain-iteration here, with the bounds computed."""
    pairs = []
    for r in rows:
        if r["chains"] != "pooled16" or r["dim"] < 2000 or "matvec_loop" not in r["us"]:
            continue
        each = next((q for q in rows if q["chains"] == "16" and q["dim"] == r["dim"]
                     and q["dtype"] == r["dtype"] and q["target"] == r["target"]), None)
        if each is None:
            continue
        e, p = each["us"], r["us"]
        bound = (3 * e["matvec_loop"] + e["rank_one_loop"]) / (
            3 * p["matvec_loop"] + p["rank_one_loop"])
        pairs.append((bound, e["fisher_adaptive"] / p["fisher_adaptive"]))
    span = ""
    if pairs:
        bounds, measured = [b for b, _ in pairs], [m for _, m in pairs]
        span = (f": at d >= 2000 the bound is {min(bounds):.1f}-{max(bounds):.1f} and the "
                f"measured ratio {min(measured):.1f}-{max(measured):.1f}")
    return f"""
Why not 8x on these CPUs: sixteen separate R cost sixteen matrix-vector passes, bounded by
memory bandwidth; one shared R costs the same products as 16-column matrix products,
bounded by arithmetic (`2 x 16 d^2` flops each). Pooling saves the memory traffic, not
the flops, so its saving is at most the ratio of the two rates, the "ratio of the loop
rooflines" column. On 2 cores the arithmetic of a 16-column product is only a few times
faster than streaming 16 matrices{span}. At d = 785 the bound is higher (the shared R fits
in cache), but there the chains' own work outside `R` (noise, gradients, accept steps:
the 16-chain MALA step) is a large part of a pooled step, and on the logistic regression
the gradients dominate both. On a machine whose flop rate is high relative to its
bandwidth (many cores, a GPU) the bound is higher: see section 6.
"""


WHY_NUTS_WINS = {
    "gp": "a Gaussian is the best case of NUTS with a dense mass matrix: once the "
    "window adaptation has estimated the covariance, the target is a standard normal in "
    "its metric and the draws are antithetic (bulk ESS above the number of draws)",
    "inhomogeneous": "the target is diagonal, so a diagonal mass matrix is already the "
    "ideal preconditioner and a dense one adds nothing; then the optimal Langevin step "
    "shrinks as d^(-1/3), the HMC step only as d^(-1/4) (Roberts and Rosenthal 1998; "
    "Beskos et al. 2013), and NUTS's long trajectories give antithetic draws; and a "
    "diagonal metric costs O(d) per gradient where FisherMALA's dense R costs O(d^2) "
    "(microseconds per gradient on the Fisher NUTS page)",
}


def _worst_coordinates_text(root: Path, target: str) -> str | None:
    """Why FisherMALA's min ESS is low on ``target``, from ``worst_coordinates.json``."""
    path = root / target / "worst_coordinates.json"
    if not path.exists():
        return None
    w = json.loads(path.read_text())
    worst, median = w["worst"], w["median"]
    first = worst[0]
    skew_worst = [abs(r["skewness"]) for r in worst]
    skew_median = [abs(r["skewness"]) for r in median]
    rows = ""
    if "nonzero_rows" in first:
        rows = (f", whose covariate is nonzero in {100 * first['nonzero_rows']:.2f}% of the data "
                f"rows (the {len(worst)} worst: {100 * min(r['nonzero_rows'] for r in worst):.2f}"
                f"-{100 * max(r['nonzero_rows'] for r in worst):.1f}%)")
    return (
        f"FisherMALA's min ESS is set by a few coordinates (`python -m "
        f"benchmarks.worst_coordinates --target {target}`): the worst, coordinate "
        f"{first['coordinate']} (bulk ESS {first['bulk_ess']:.0f}, against "
        f"{median[len(median) // 2]['bulk_ess']:.0f} at the median){rows}, has a skewed "
        f"marginal (skewness {first['skewness']:.2f}); the {len(worst)} worst have |skewness| "
        f"{min(skew_worst):.2f}-{max(skew_worst):.2f}, the {len(median)} around the median at "
        f"most {max(skew_median):.2f}. Such posteriors are shaped by the prior and a handful "
        f"of observations: a global linear preconditioner cannot straighten them, and "
        f"MALA's local steps cross them slowly, while NUTS's multi-step trajectories "
        f"cross them within an iteration"
    )


def _race_analysis(root: Path) -> str:
    """Why FisherMALA loses where it loses, with the figures that show it."""
    lines = []
    for target in versus_blackjax.TARGETS:
        rows = {s: json.loads(p.read_text()) for s in versus_blackjax.SAMPLERS
                if (p := root / target / f"{s}.json").exists()}
        fisher = {s: rows[s] for s in ("fisher_mala", "fisher_mala_pooled") if s in rows}
        others = {s: rows[s] for s in versus_blackjax.SAMPLERS[2:] if s in rows}
        if not fisher or not others:
            continue
        best_f = max(fisher.values(), key=lambda r: r["bulk_min_per_second"])
        best_o = max(others.values(), key=lambda r: r["bulk_min_per_second"])
        if best_f["bulk_min_per_second"] >= best_o["bulk_min_per_second"]:
            continue
        paper_ratio = best_f["paper_min_per_second"] / best_o["paper_min_per_second"]
        draws = best_o["protocol"]["chains"] * best_o["protocol"]["samples"]
        antithetic = " (antithetic)" if best_o["bulk_min"] > draws else ""
        lines.append(
            f"- **{target}** ({best_f['bulk_min_per_second'] / best_o['bulk_min_per_second']:.2f}"
            f" x {best_o['sampler']}): "
            f"{_worst_coordinates_text(root, target) or WHY_NUTS_WINS.get(target, 'not analysed')}"
            f". Per "
            f"gradient evaluation {best_o['sampler']} gets {best_o['bulk_min_per_grad']:.1e} "
            f"min bulk ESS against FisherMALA's {best_f['bulk_min_per_grad']:.1e}, and it "
            f"reaches a min bulk ESS of {best_o['bulk_min']:.0f} from {draws} "
            f"draws{antithetic}; with "
            f"the paper's estimator, which caps ESS at the number of draws, the ratio is "
            f"{paper_ratio:.2f}.")
    if not lines:
        return ""
    return "### Where FisherMALA loses, and why\n\n" + "\n".join(lines) + "\n"


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


def _reduced_protocol_bounds(root: Path) -> str:
    """Projected NUTS figures where NUTS ran a shortened protocol (MNIST on CPU).

    NUTS's time for the full protocol (1000 adaptation steps + 5000 draws) is taken as its
    measured adaptation time (of fewer steps) plus 5000 draws at its measured cost per
    draw. Its min bulk ESS per draw is taken (a) as measured and (b) as the best NUTS
    reached on any target at the full protocol. Where a shortened run was later replaced
    by a full one (its record kept in ``<target>/shortened/``), the projection is checked
    against the measurement.
    """
    cells = [json.loads(p.read_text()) for p in sorted(root.glob("*/nuts_*.json"))]
    full = [c for c in cells if c["protocol"]["nuts_warmup"] >= 1000
            and c["protocol"]["samples"] >= 5000]
    short = [c for c in cells if c not in full]
    if not full:
        return ""
    best = max(full, key=_per_draw)
    lines = []
    for c in short:
        p = c["protocol"]
        fisher = [json.loads(f.read_text())["bulk_min_per_second"]
                  for s in ("fisher_mala", "fisher_mala_pooled")
                  if (f := root / c["target"] / f"{s}.json").exists()]
        if not fisher:
            continue
        projected, own, optimistic = _projection(c, best)
        leapfrogs = c["grad_evals"] / (p["chains"] * (p["nuts_warmup"] + p["samples"]))
        lines.append(
            f"| {c['target']} | {c['sampler']} | {p['nuts_warmup']} + {p['samples']} | "
            f"{leapfrogs:.0f} | "
            f"{c['seconds']['warmup']:.0f} | "
            f"{c['seconds']['sampling'] / p['samples'] * 1e3:.0f} | {projected:.0f} | "
            f"{_per_draw(c):.2f} | {own:.1f} | {optimistic:.1f} | {max(fisher):.1f} | "
            f"{max(fisher) / own:.1f} / {max(fisher) / optimistic:.1f} |")
    checks, between = [], True
    for path in sorted(root.glob("*/shortened/nuts_*.json")):
        old = json.loads(path.read_text())
        now_path = path.parent.parent / path.name
        if not now_path.exists():
            continue
        now = json.loads(now_path.read_text())
        _, own, optimistic = _projection(old, best)
        between &= own <= now["bulk_min_per_second"] <= optimistic
        checks.append(
            f"| {old['target']} | {old['sampler']} | {old['protocol']['nuts_warmup']} + "
            f"{old['protocol']['samples']} | {own:.1f} | {optimistic:.1f} | "
            f"{now['bulk_min_per_second']:.1f} |")
    if not lines and not checks:
        return ""
    text = ["### Targets where NUTS ran a shortened protocol\n"]
    if lines:
        text.append(
            "On 2 CPU cores NUTS cannot run the full protocol on "
            f"{', '.join(sorted({c['target'] for c in short}))} within a session, so it ran a "
            "shorter one. Projected to the full protocol (1000 + 5000): its measured "
            "adaptation time (for fewer steps) plus 5000 draws at its measured cost per "
            "draw, with its min bulk ESS per draw (a) as measured, (b) at the best NUTS "
            f"reached on any target at the full protocol ({_per_draw(best):.2f}, "
            f"{best['target']}, {best['sampler']}), an optimistic case.\n\n"
            "| target | sampler | measured protocol | gradients per iteration | adaptation s | "
            "ms per draw (4 chains) | projected s | min ESS per draw | projected min ESS/s "
            "(a) | (b) | FisherMALA min ESS/s | FisherMALA / NUTS (a) / (b) |\n"
            + "|---" * 12 + "|\n" + "\n".join(lines) + "\n")
    if checks:
        text.append(
            "How good is the projection? Where a shortened NUTS run was later repeated "
            "at the full protocol, the shortened run's projection against the "
            "measurement (min bulk ESS/s):\n\n"
            "| target | sampler | shortened protocol | projected (a) | projected (b) | "
            "measured at 1000 + 5000 |\n|---|---|---|---|---|---|\n" + "\n".join(checks)
            + "\n\n" + ("Each measurement lies between (a) and (b)" if between else
                         "The measurements do not all lie between (a) and (b)")
            + ": with a full adaptation NUTS finds a larger step size and shorter "
            "trajectories, so (a) is pessimistic for NUTS, the more so the shorter the "
            "adaptation it ran (the measured protocol column).\n")
    return "\n".join(text)


H200_PEAK_BANDWIDTH = 4.8e12  # bytes/s, NVIDIA's H200 SXM datasheet (HBM3e)


def _gpu_step_cost_section(data) -> str:
    """GPU step cost against the memory-bandwidth bound computed from the datasheet.

    On a GPU a separate jitted ``R @ v`` call measures dispatch latency (tens of µs), not
    the product, so the in-process ``R@v`` column of the CPU table is meaningless there.
    The bound instead counts the passes over R at the datasheet bandwidth: frozen 2 reads;
    adaptive 3 reads plus the rank-one update's read and write.
    """
    lines = ["| target | d | chains | MALA µs | Fisher frozen µs | Fisher adaptive µs | "
             "frozen / (2 passes at peak) | adaptive / (5 passes at peak) | "
             "adaptive / MALA |", "|" + "---|" * 9]
    for r in data["rows"]:
        m, d = r["us"], r["dim"]
        copies = 16 if r["chains"] == "16" else 1
        pass_us = copies * d * d * 4 / H200_PEAK_BANDWIDTH * 1e6
        mala_us = f"{m['mala']:.0f}" if "mala" in m else "-"
        over_mala = f"{m['adaptive_over_mala']:.2f}" if "adaptive_over_mala" in m else "-"
        lines.append(f"| {r['target']} | {d} | {r['chains']} | {mala_us} | "
                     f"{m['fisher_frozen']:.0f} | {m['fisher_adaptive']:.0f} | "
                     f"{m['fisher_frozen'] / (2 * pass_us):.2f} | "
                     f"{m['fisher_adaptive'] / (5 * pass_us):.2f} | {over_mala} |")
    return "\n".join(lines)


def _gpu_findings(data) -> str:
    """What the GPU step-cost table shows, every figure computed from it."""
    us = {(r["target"], r["dim"], r["chains"]): r["us"] for r in data["rows"]}

    def bound(dim, chains, passes):
        copies = 16 if chains == "16" else 1
        return passes * copies * dim * dim * 4 / H200_PEAK_BANDWIDTH * 1e6

    def ratios(target, dim, chains):
        m = us[(target, dim, chains)]
        return (m["fisher_frozen"] / bound(dim, chains, 2),
                m["fisher_adaptive"] / bound(dim, chains, 5))

    dims = sorted({d for (t, d, c) in us if t == "gaussian"})
    big, mid = dims[-1], dims[-2] if len(dims) > 1 else dims[-1]
    f_big, a_big = ratios("gaussian", big, "16")
    mid_worst = max(ratios("gaussian", mid, "16"))
    mala_one = [us[("gaussian", d, "1")]["mala"] for d in dims]
    logistic_one = [m["adaptive_over_mala"] for (t, d, c), m in us.items()
                    if t == "logistic" and c == "1"]
    logistic_16 = [m["adaptive_over_mala"] for (t, d, c), m in us.items()
                   if t == "logistic" and c == "16"]
    pooled = {d: us[("gaussian", d, "pooled16")] for d in dims}
    per_chain = {d: us[("gaussian", d, "16")]["fisher_adaptive"] / pooled[d]["fisher_adaptive"]
                 for d in dims}
    cheaper = ", ".join(f"{v:.1f} x at d = {d}" for d, v in per_chain.items())
    lines = [
        f"- 16 chains, one R each, d = {big} ({16 * big * big * 4 / 1e9:.1f} GB of "
        f"preconditioners): the frozen step is within {f_big:.2f} x and the adaptive within "
        f"{a_big:.2f} x of the bandwidth bound, i.e. at about "
        f"{100 / max(f_big, a_big):.0f}% of the datasheet bandwidth. At d = {mid} "
        f"({16 * mid * mid * 4 / 1e6:.0f} MB) both are within {mid_worst:.2f} x.",
        f"- One chain: a step costs at least the {min(mala_one):.0f}-{max(mala_one):.0f} µs "
        f"of a MALA step (one scan iteration's kernel launches), so at small d the time is "
        f"launch-bound, not bandwidth-bound; at d = {big} the adaptive step is "
        f"{ratios('gaussian', big, '1')[1]:.1f} x the bound. Run many chains on a GPU.",
    ]
    if logistic_one:
        lines.append(
            f"- Logistic regression (10^4 rows), one chain: adaptive / MALA is "
            f"{min(logistic_one):.2f}-{max(logistic_one):.2f}: the gradient is two small "
            f"matrix products that also run at launch speed, so the extra kernels of the "
            f"preconditioner show"
            + (f"; with 16 chains it is {max(logistic_16):.1f}." if logistic_16 else "."))
    frozen = [m["fisher_frozen"] for m in pooled.values()]
    adaptive = [m["fisher_adaptive"] for m in pooled.values()]
    lines.append(
        f"- Pooled chains (`pooled16`): the frozen step of 16 chains sharing R costs "
        f"{min(frozen):.0f}-{max(frozen):.0f} µs, about what one chain's does, but the "
        f"adaptive step costs {min(adaptive):.0f}-{max(adaptive):.0f} µs almost "
        f"independently of d, a fixed per-step overhead of the rank-16 update (which part "
        f"was not profiled in the GPU time available). These figures are from the update's "
        f"first version, which formed its 16 x 16 gain by a symmetric eigendecomposition; it "
        f"now uses a Cholesky factorization and two triangular solves (How it works, "
        f"section 7), not yet timed on a GPU. Per chain-iteration, 16 separate R "
        f"against one shared R: {cheaper} (above 1: sharing is cheaper). On a GPU, pool "
        f"chains for the faster burn-in (section 2) and at large d.")
    return "\n".join(lines) + "\n"


def _gpu_race_findings(race: Path) -> str:
    """Why NUTS on MNIST is absent from the GPU race, with the times from the session log.

    The session log marks each phase with its offset in seconds; the race phase is from
    ``race on MNIST`` to the next mark. FisherMALA's cells took their recorded compile,
    warm-up and sampling seconds; the process start-up is taken as that of the session's
    first process (its offset at the first phase mark minus the total it printed).
    """
    log = RESULTS / "gpu_logs" / "session_call1_stdout.log"
    paths = sorted((race / "mnist56").glob("fisher_mala*.json"))
    cells = [json.loads(p.read_text()) for p in paths]
    if not log.exists() or not cells:
        return ""
    text = log.read_text()
    marks = [(int(m.group(1)), m.group(2)) for m in re.finditer(r"^== \+(\d+) s (.*)$", text,
                                                                   re.M)]
    start = next(i for i, (_, name) in enumerate(marks) if name.startswith("race on MNIST"))
    race_s = marks[start + 1][0] - marks[start][0]
    first_total = float(re.search(r"\(total ([\d.]+) s\)", text).group(1))
    startup = marks[0][0] - first_total
    fisher_s = sum(sum(c["seconds"].values()) for c in cells)
    nuts_s = race_s - fisher_s - startup
    best = max(c["bulk_min_per_second"] for c in cells)
    draws = cells[0]["protocol"]["chains"] * cells[0]["protocol"]["samples"]
    needed = best * nuts_s / draws
    reached = sorted({
        c["target"] for p in (RESULTS / "race").glob("*/nuts_*.json")
        if (c := json.loads(p.read_text()))["bulk_min"]
        / (c["protocol"]["chains"] * c["protocol"]["samples"]) > needed
    })
    return (
        f"On MNIST, BlackJAX NUTS with a diagonal mass matrix did not finish its "
        f"{cells[0]['protocol']['nuts_warmup']} adaptation steps and "
        f"{cells[0]['protocol']['samples']} draws ({cells[0]['protocol']['chains']} chains). "
        f"By the session log (`gpu_logs/session_call1_stdout.log`, its time marks) the race "
        f"process ran {race_s} s; FisherMALA's two cells took {fisher_s:.0f} s (compile, "
        f"warm-up, sampling) and start-up about {startup:.0f} s, so NUTS ran about "
        f"{nuts_s:.0f} s and was stopped unfinished. To match FisherMALA's "
        f"{best:.0f} min ESS/s it would have needed a min bulk ESS above {best:.0f} x "
        f"{nuts_s:.0f}, about {round(best * nuts_s, -2):,.0f}, from its {draws:,} draws: "
        f"{needed:.1f} effective draws per draw in MNIST's worst coordinate, which NUTS "
        f"reached in the CPU race (section 3) only on {', '.join(reached) or 'no target'}, "
        f"where its draws are antithetic."
    )


def _gpu_section() -> list[str]:
    sc = RESULTS / "step_cost_gpu.json"
    race = RESULTS / "race_gpu"
    if not sc.exists():
        return []
    data = json.loads(sc.read_text())
    parts = [
        "## 6. On a GPU (NVIDIA H200)\n",
        "One session had an H200 for 15 minutes; `benchmarks/gpu_session.sh` ran everything "
        "below (and the GPU cells of the reproduction) in one call, float32 with full-"
        "precision matrix products (`JAX_DEFAULT_MATMUL_PRECISION=highest`, no TF32), jax "
        f"{data['meta']['jax']}. Logs: `benchmarks/results/gpu_logs/`.\n",
        "### Cost per iteration\n",
        f"`{data['meta']['command']}`, 200 steps per timed scan. The bound is the time "
        "to stream R at the datasheet's 4.8 TB/s: 2 passes for the frozen step, 3 reads "
        "plus the rank-one read and write for the adaptive step (R of all 16 chains for "
        "`16`, one shared R for `pooled16`). On a GPU a separately jitted `R @ v` call "
        "measures dispatch latency, not the product, so no in-process roofline column is "
        "shown.\n",
        _gpu_step_cost_section(data), "\n", _gpu_findings(data),
    ]
    if race.exists():
        parts += [
            "### The race on the GPU (partial)\n",
            "`python -m benchmarks.versus_blackjax --targets mnist56 --root "
            "benchmarks/results/race_gpu` and the same for Ripley, run inside the time box "
            "of the GPU session; cells that did not finish are absent. "
            + _gpu_race_findings(race)
            + " The CPU race of section 3 has MNIST with all samplers.\n",
            versus_blackjax.render(race, goal=False), "\n",
        ]
    return parts


def render(out: Path = DOCS) -> Path:
    parts = ["# Performance\n",
             "Every number here comes from a cached benchmark result; the command that "
             "produced it is given with each table, and `python -m "
             "benchmarks.render_performance` rewrites this page. Hardware: sections 1-5 on "
             "the machines of this project, 2 CPU cores (XLA:CPU); section 6 on an NVIDIA "
             "H200. Timings are wall-clock and the CPU machines are shared, so compare "
             "ratios measured in one run, not absolute numbers across tables.\n"]
    sc = RESULTS / "step_cost.json"
    orient = RESULTS / "orientation.json"
    if sc.exists():
        data = json.loads(sc.read_text())
        plot = _plot_step_cost(data["rows"], out)
        parts += ["## 1. Cost per iteration against the matrix-vector roofline\n"]
        if plot:
            parts.append(f"![cost per iteration against d, with the roofline]({plot})\n")
        parts += [
            f"`{data['meta']['command']}` ({data['meta']['device']}, jax "
            f"{data['meta']['jax']}). Microseconds per iteration for all chains together. "
            "`R@v` is one product of `R` (a jitted argument, batched over the chains' "
            "matrices for `16`, with 16 columns for `pooled16`) with a vector; `rank-1` one "
            "update of `R` as the adaptive step writes it (`R - t u^T`, rank 16 for "
            "`pooled16`; donated). Both are timed as separate jitted calls (the issue's "
            "roofline) and again inside a `lax.scan` (\"in loop\"), where every sampler "
            "step runs; the two differ on XLA:CPU (see below). "
            "Goals at d >= 785 on the Gaussian: frozen <= 1.2 x (2 R@v), adaptive <= 1.2 x "
            "(3 R@v + rank-1); on the logistic regression (10^4 rows), adaptive / MALA <= 1.2. "
            "Below d = 785 a separate `R@v` call costs more in dispatch than inside a step, "
            "so the ratios there are not meaningful.\n",
            step_cost.render(data["rows"]), "\n", "### Goals\n", _goals(data["rows"]),
            _analysis(json.loads(orient.read_text()) if orient.exists() else None,
                      data["rows"], data["meta"])]
        parts += ["### Sharing one R (pooled chains): cost per chain-iteration\n",
                  "From the same run: the adaptive step of 16 chains each with its own R "
                  "against 16 chains sharing one R (goal: at least 8x cheaper).\n",
                  _cost_ratio_section(data["rows"]), "\n",
                  _pooled_bound_text(data["rows"]), _block_update_text()]
    pooled = RESULTS / "pooled.json"
    if pooled.exists():
        parts += ["## 2. One preconditioner for all chains: burn-in saved\n",
                  "`python -m benchmarks.pooled` (16 chains). D* is the mean Frobenius "
                  "distance `||A~ - Sigma~||_F` that independent chains reach after the "
                  "paper's 2 x 10^4 burn-in; the pooled warm-up's first iteration below D* "
                  "gives the iteration ratio (goal: at least 4x fewer). The last two "
                  "columns sample 2 x 10^4 draws after a pooled burn-in shortened to that "
                  "iteration (rounded up to 500) and after the full independent burn-in "
                  "(paper's ESS estimator, mean ± sd over chains).\n",
                  f"![Frobenius distance against burn-in iteration, pooled and independent]"
                  f"({_plot_pooled(json.loads(pooled.read_text()), out)})\n",
                  "*The pooled chains' distance (one R learned from 16 chains' signals) "
                  "against the mean over 16 independent chains; the dashed line is where "
                  "the pooled chains reach D\\*.*\n",
                  _pooled_section(json.loads(pooled.read_text())), "\n"]
    race = RESULTS / "race"
    if race.exists():
        parts += ["## 3. The race against BlackJAX\n",
                  "![min bulk ESS per second by target and sampler, log scale]"
                  "(images/fisher_nuts_race.png)\n",
                  "*Min bulk ESS per second (warm-up + sampling) of every sampler raced, "
                  "peers side by side, log scale (`python -m benchmarks.versus_blackjax "
                  "--write-docs` draws it; the Fisher NUTS page discusses the NUTS "
                  "samplers).*\n",
                  "`python -m benchmarks.versus_blackjax --targets all` (protocol in its "
                  "docstring: 4 chains, 5000 draws each; FisherMALA 5000 burn-in "
                  "iterations, NUTS 1000 window-adaptation steps). ESS per second counts "
                  "warm-up and sampling, not compilation. The JAX cells run on two XLA:CPU "
                  "devices, two chains on each core (the Fisher NUTS page gives the "
                  "placement); cells whose protocol column has no device count are from "
                  "the earlier race on one device.\n",
                  versus_blackjax.render(race), "\n", _race_analysis(race),
                  _reduced_protocol_bounds(race)]
    checks = RESULTS / "driver_checks.json"
    if checks.exists():
        c = json.loads(checks.read_text())
        pb, mem = c["progress_bar"], c["memory"]
        rows = ["| initial sigma^2 | min ESS with the search (default) | min ESS without "
                "(paper's rule only) |", "|---|---|---|"]
        by = {(r["search"], r["initial_step_size"]): r for r in c["initial_step_size"]}
        for guess in sorted({r["initial_step_size"] for r in c["initial_step_size"]}):
            a, b = by.get((True, guess)), by.get((False, guess))
            if a and b:
                rows.append(f"| {guess:g} | {a['min_ess_mean']:.0f} ± {a['min_ess_sd']:.0f} | "
                            f"{b['min_ess_mean']:.0f} ± {b['min_ess_sd']:.0f} |")
        parts += ["## 4. The driver: progress bar, initial step size, memory\n",
                  "`python -m benchmarks.driver_checks`. Progress bar (GP target, 4 chains, "
                  "2 x 10^4 + 2 x 10^4): warm-up + sampling "
                  f"{pb['seconds_with']:.2f} s with the bar, {pb['seconds_without']:.2f} s "
                  f"without: ratio {pb['ratio']:.3f} (goal below 1.05).\n",
                  "Initial step size on the inhomogeneous Gaussian (smallest scale 0.01; 4 "
                  "chains, the paper's protocol; min ESS with the paper's estimator, mean ± "
                  "sd over chains): with the default bracketing search the result no longer "
                  "depends on the guess.\n", "\n".join(rows), "\n",
                  f"Memory: {mem['draws_shape'][0]} chains x {mem['draws_shape'][1]} draws "
                  f"of d = {mem['draws_shape'][2]} (float32) take {mem['draws_mb']:.0f} MB; "
                  f"the whole process peaked at {mem['peak_rss_mb']:.0f} MB resident "
                  f"({mem['seconds']:.0f} s). Use `thinning` to keep fewer draws.\n"]
    long_run = RESULTS / "long_run_1e6.json"
    if long_run.exists():
        lr = json.loads(long_run.read_text())
        parts += ["## 5. Long-run numerics\n",
                  "`python -m benchmarks.long_run --updates 1000000 --dim 50`: "
                  f"{lr['updates']} float32 updates of the Prop. 4 recursion against float64 "
                  f"on the same signals: relative Frobenius error of `R R^T` "
                  f"{lr['relative_error_A']:.1e}; smallest / largest eigenvalue "
                  f"{lr['min_eigenvalue_over_max']:.1e} (positive definite); O(d)-tracked "
                  f"trace error {lr['trace_error_unanchored']:.1e} without re-anchoring and "
                  f"at most {lr['trace_error_anchored_worst']:.1e} with re-anchoring every "
                  f"1000 updates; {lr['seconds']:.0f} s.\n"]
    parts += _gpu_section()
    path = out / "performance.md"
    path.write_text("\n".join(parts))
    return path


if __name__ == "__main__":
    print(render())
