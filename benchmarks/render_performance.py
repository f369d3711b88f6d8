"""Write ``docs/performance.md`` from the cached benchmark results.

    python -m benchmarks.render_performance

Reads ``benchmarks/results/step_cost.json`` (``python -m benchmarks.step_cost``),
``pooled.json`` (``python -m benchmarks.pooled``), ``race/`` (``python -m
benchmarks.versus_blackjax``) and ``long_run_1e6.json`` (``python -m benchmarks.long_run``);
every number in the page comes from one of them.
"""

import json
from pathlib import Path

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
    lines = ["| target | d | dtype | µs per chain-iteration, 16 chains each with R | "
             "µs per chain-iteration, 16 chains sharing R | ratio |", "|---|---|---|---|---|---|"]
    for target in ("gaussian", "logistic"):
        for dtype in ("float32", "float64"):
            for dim in (785, 2000, 4000):
                sel = {r["chains"]: r for r in rows if r["target"] == target
                       and r["dtype"] == dtype and r["dim"] == dim}
                if "16" in sel and "pooled16" in sel:
                    a = sel["16"]["us"]["fisher_adaptive"] / 16
                    b = sel["pooled16"]["us"]["fisher_adaptive"] / 16
                    lines.append(f"| {target} | {dim} | {dtype} | {a:.0f} | {b:.0f} | "
                                 f"{a / b:.1f} |")
    return "\n".join(lines)


def _goals(rows) -> str:
    """Which step-cost goals hold, counted from the table (d >= 785, Gaussian target)."""
    big = [r for r in rows if r["dim"] >= 785]
    lines = []
    for chains, label in (("1", "one chain"), ("16", "16 chains, one R each"),
                          ("pooled16", "16 chains sharing R")):
        sel = [r for r in big if r["target"] == "gaussian" and r["chains"] == chains]
        if not sel:
            continue
        frozen = sum(r["us"]["frozen_over_2_matvec"] <= 1.2 for r in sel)
        adaptive = sum(r["us"]["adaptive_over_roofline"] <= 1.2 for r in sel)
        worst_f = max(r["us"]["frozen_over_2_matvec"] for r in sel)
        worst_a = max(r["us"]["adaptive_over_roofline"] for r in sel)
        lines.append(f"- {label}: frozen within 1.2 x roofline in {frozen}/{len(sel)} cells "
                     f"(worst {worst_f:.2f}), adaptive in {adaptive}/{len(sel)} "
                     f"(worst {worst_a:.2f}).")
    logi = [r for r in big if r["target"] == "logistic" and r["chains"] == "1"]
    if logi:
        ok = sum(r["us"]["adaptive_over_mala"] <= 1.2 for r in logi)
        cells = ", ".join(f"d={r['dim']} {r['dtype']}: {r['us']['adaptive_over_mala']:.2f}"
                          for r in logi)
        lines.append(f"- logistic regression, one chain, adaptive / MALA <= 1.2 in "
                     f"{ok}/{len(logi)} cells ({cells}).")
    return "\n".join(lines)


def _analysis(orient) -> str:
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

- **16 vmapped chains, each with its own R.** XLA:CPU runs the per-chain product
  `g_y^T R` through a batched-dot path that is slower than the batched `R v` of the
  roofline{facts}. The library already uses the fast orientation for one R (`v @ R`,
  never `R.T @ v`); the frozen step, whose two passes include one such product, pays it
  most. Pooled chains avoid it (their products are matrix-matrix) and are the
  recommended way to run many chains.
- **Logistic regression, Fisher overhead over MALA.** The gradient costs two passes over
  the `10^4 x d` data matrix; FisherMALA adds three or four passes over the `d x d` matrix
  `R`: the overhead is about `2 d / 10^4`, small only while `d` is well below the number
  of rows (d = 785); at d = 2000 and 4000 the preconditioner is as large as the data.
- **Small d (100).** A separate jitted `R @ v` call costs more in dispatch than a whole
  step, so those ratios are far below 1 and say nothing.
- These machines are shared and the runs are short (`--quick`): expect 10-30% noise in
  any single cell.
"""


WHY_NUTS_WINS = {
    "gp": "a Gaussian is the best case of NUTS with a dense mass matrix: once the "
    "window adaptation has estimated the covariance, the target is a standard normal in "
    "its metric and the draws are antithetic (bulk ESS above the number of draws)",
    "inhomogeneous": "the target is diagonal, so a diagonal mass matrix is already the "
    "ideal preconditioner and a dense one adds nothing; then the optimal Langevin step "
    "shrinks as d^(-1/3), the HMC step only as d^(-1/4) (Roberts and Rosenthal 1998; "
    "Beskos et al. 2013), and NUTS's long trajectories give antithetic draws",
}


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
            f" x {best_o['sampler']}): {WHY_NUTS_WINS.get(target, 'not analysed')}. Per "
            f"gradient evaluation {best_o['sampler']} gets {best_o['bulk_min_per_grad']:.1e} "
            f"min bulk ESS against FisherMALA's {best_f['bulk_min_per_grad']:.1e}, and it "
            f"reaches a min bulk ESS of {best_o['bulk_min']:.0f} from {draws} "
            f"draws{antithetic}; with "
            f"the paper's estimator, which caps ESS at the number of draws, the ratio is "
            f"{paper_ratio:.2f}.")
    if not lines:
        return ""
    return "### Where FisherMALA loses, and why\n\n" + "\n".join(lines) + "\n"


def _reduced_protocol_bounds(root: Path) -> str:
    """Projected NUTS figures where NUTS ran a shortened protocol (Caravan, MNIST on CPU).

    NUTS's time for the full protocol (1000 adaptation steps + 5000 draws) is taken as its
    measured adaptation time (of fewer steps: a lower bound, since the first steps, from
    a poor step size, are the dearest) plus 5000 draws at its measured cost per draw. Its
    min bulk ESS per draw is taken (a) as measured and (b) as the best NUTS reached on any
    target at the full protocol, an optimistic case.
    """
    cells = [json.loads(p.read_text()) for p in sorted(root.glob("*/nuts_*.json"))]
    full = [c for c in cells if c["protocol"]["nuts_warmup"] >= 1000
            and c["protocol"]["samples"] >= 5000]
    short = [c for c in cells if c not in full]
    if not full or not short:
        return ""

    def per_draw(c):
        return c["bulk_min"] / (c["protocol"]["chains"] * c["protocol"]["samples"])

    best = max(full, key=per_draw)
    lines = []
    for c in short:
        p = c["protocol"]
        fisher = [json.loads(f.read_text())["bulk_min_per_second"]
                  for s in ("fisher_mala", "fisher_mala_pooled")
                  if (f := root / c["target"] / f"{s}.json").exists()]
        if not fisher:
            continue
        draw_s = c["seconds"]["sampling"] / p["samples"]
        projected = c["seconds"]["warmup"] + 5000 * draw_s
        draws = p["chains"] * 5000
        own, optimistic = per_draw(c) * draws / projected, per_draw(best) * draws / projected
        leapfrogs = c["grad_evals"] / (p["chains"] * (p["nuts_warmup"] + p["samples"]))
        lines.append(
            f"| {c['target']} | {c['sampler']} | {p['nuts_warmup']} + {p['samples']} | "
            f"{leapfrogs:.0f} | "
            f"{c['seconds']['warmup']:.0f} | {draw_s * 1e3:.0f} | {projected:.0f} | "
            f"{per_draw(c):.2f} | {own:.1f} | {optimistic:.1f} | {max(fisher):.1f} | "
            f"{max(fisher) / own:.1f} / {max(fisher) / optimistic:.1f} |")
    return (
        "### Targets where NUTS ran a shortened protocol\n\n"
        "On 2 CPU cores NUTS cannot run the full protocol on Caravan and MNIST within a "
        "session, so it ran a shorter one. Projected to the full protocol (1000 + 5000): "
        "its measured adaptation time (for fewer steps, so a lower bound: the first steps, "
        "from a poor step size, are the dearest) plus 5000 draws at its measured cost per "
        "draw, with its min bulk ESS per draw (a) as measured, (b) at the best NUTS "
        f"reached on any target at the full protocol ({per_draw(best):.2f}, "
        f"{best['target']}, {best['sampler']}), an optimistic case.\n\n"
        "| target | sampler | measured protocol | gradients per iteration | adaptation s | "
        "ms per draw (4 chains) | projected s | min ESS per draw | projected min ESS/s (a) "
        "| (b) | FisherMALA min ESS/s | FisherMALA / NUTS (a) / (b) |\n" + "|---" * 12
        + "|\n" + "\n".join(lines) + "\n\n"
        "The projection keeps the trajectory length of the shortened run. On MNIST, 100 "
        "adaptation steps leave NUTS with a small step size and trajectories near the "
        "maximum tree depth (1023 steps), so there the projection is pessimistic for NUTS: "
        "after 1000 adaptation steps its trajectories would likely be shorter. The GPU "
        "race (section 6) gives the firmer MNIST figure.\n")


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
        _gpu_step_cost_section(data), "\n",
        "- 16 chains, one R each, d = 4000 (1 GB of preconditioners): the frozen step is "
        "within 1.10 x and the adaptive within 1.13 x of the bandwidth bound, i.e. at "
        "about 90% of the datasheet bandwidth. At d = 2000 (256 MB) both are within 1.3 x.\n"
        "- One chain: a step costs at least the ~10-13 µs of a MALA step (one scan "
        "iteration's kernel launches), so at d <= 2000 the time is launch-bound, not "
        "bandwidth-bound; at d = 4000 the adaptive step is 1.8 x the bound. Run many "
        "chains on a GPU.\n"
        "- Logistic regression (10^4 rows), one chain: adaptive / MALA is 1.75-1.79: the "
        "gradient is two small matrix products that also run at launch speed, so the "
        "extra kernels of the preconditioner show; with 16 chains it is 2.1.\n"
        "- Pooled chains (`pooled16`): the frozen step of 16 chains sharing R costs about "
        "what one chain's does (31-93 µs), but the adaptive step costs 308-434 µs almost "
        "independently of d, a fixed per-step overhead of the rank-16 update (which part "
        "was not profiled in the GPU time available). Per chain-iteration the shared R is "
        "2.8 x cheaper than 16 separate ones at d = 4000, even at d = 2000, and 3 x dearer "
        "at d = 785: on a GPU, pool chains for the faster burn-in (section 2), not for the "
        "cost per step.\n",
    ]
    if race.exists():
        parts += [
            "### The race on the GPU (partial)\n",
            "`python -m benchmarks.versus_blackjax --targets mnist56 --root "
            "benchmarks/results/race_gpu` and the same for Ripley, run inside the time box "
            "of the GPU session; cells that did not finish are absent. On MNIST, BlackJAX "
            "NUTS with a diagonal mass matrix did not finish its 1000 adaptation steps and "
            "5000 draws (4 chains): by the log (`gpu_logs/session_call1_stdout.log`, "
            "its timestamps) the race process ran 109 s, of which FisherMALA's two "
            "cells and start-up took about 45 s, so NUTS ran about 65 s and was stopped. To "
            "match FisherMALA's 322 min ESS/s it would have needed a min bulk ESS above "
            "322 x 65, about 21 000, from its 20 000 draws: more than one effective draw "
            "per draw in MNIST's worst coordinate, which NUTS reached in the CPU race only "
            "on the two Gaussians, Heart and German. "
            "The CPU race of section 3 has MNIST with all samplers.\n",
            versus_blackjax.render(race), "\n",
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
        parts += [
            "## 1. Cost per iteration against the matrix-vector roofline\n",
            f"`{data['meta']['command']}` ({data['meta']['device']}, jax "
            f"{data['meta']['jax']}). Microseconds per iteration for all chains together. "
            "`R@v` is one product of `R` (a jitted argument, batched over the chains' "
            "matrices for `16`) with a vector; `rank-1` one update `R - t u^T` (donated). "
            "Goals at d >= 785 on the Gaussian: frozen <= 1.2 x (2 R@v), adaptive <= 1.2 x "
            "(3 R@v + rank-1); on the logistic regression (10^4 rows), adaptive / MALA <= 1.2. "
            "Below d = 785 a separate `R@v` call costs more in dispatch than inside a step, "
            "so the ratios there are not meaningful.\n",
            step_cost.render(data["rows"]), "\n", "### Goals\n", _goals(data["rows"]),
            _analysis(json.loads(orient.read_text()) if orient.exists() else None)]
        plot = _plot_step_cost(data["rows"], out)
        if plot:
            parts.append(f"![cost against d]({plot})\n")
        parts += ["### Sharing one R (pooled chains): cost per chain-iteration\n",
                  "From the same run: the adaptive step of 16 chains each with its own R "
                  "against 16 chains sharing one R (goal: at least 8x cheaper).\n",
                  _cost_ratio_section(data["rows"]), "\n"]
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
                  _pooled_section(json.loads(pooled.read_text())), "\n"]
    race = RESULTS / "race"
    if race.exists():
        parts += ["## 3. The race against BlackJAX\n",
                  "`python -m benchmarks.versus_blackjax --targets all` (protocol in its "
                  "docstring: 4 chains, 5000 draws each; FisherMALA 5000 burn-in "
                  "iterations, NUTS 1000 window-adaptation steps). ESS per second counts "
                  "warm-up and sampling, not compilation.\n",
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
        parts += ["## 5. The driver: progress bar, initial step size, memory\n",
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
        parts += ["## 4. Long-run numerics\n",
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
