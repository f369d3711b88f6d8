"""Render the cached reproduction results into ``docs/results.md`` and PNG figures."""

import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

import fisher_mala as fm
from benchmarks import templating
from benchmarks.paper_run import (
    EXPERIMENTS,
    FROBENIUS,
    PAPER,
    PAPER_ITERATIONS,
    PAPER_REPEATS,
)

LABELS = {
    "mala": "MALA",
    "adamala": "AdaMALA",
    "hmc": "HMC",
    "mmala": "mMALA",
    "fisher_mala": "FisherMALA",
    "fisher_mala-increment": "FisherMALA-no-RB",
    "fisher_mala-centered": "FisherMALA-paired-est",
    "fisher_mala-score": "FisherMALA (non-centered)",
}
TARGET_LABELS = {
    "gp": "GP target (d = 100)",
    "inhomogeneous": "Inhomogeneous Gaussian (d = 100)",
    "pima": "Pima Indians (d = 7)",
    "caravan": "Caravan (ours d = 86, paper 87)",
    "mnist56": "MNIST 5 vs 6 (d = 785)",
    "heart": "Heart (d = 14)",
    "german": "German Credit (d = 25)",
    "australian": "Australian Credit (d = 15)",
    "ripley": "Ripley (d = 3)",
    "gaussian_2d": "2-d Gaussian",
}
EXPLANATIONS_FILE = Path(__file__).resolve().parent / "templates" / "results_explanations.md"


def _explanations(path: Path = EXPLANATIONS_FILE) -> dict:
    """``{(target or None, config or None): reason}`` from the Markdown list in ``path``."""
    reasons = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^- (\S+), (\S+): (.+)$", line)
        if match:
            target, config, reason = match.groups()
            reasons[(None if target == "any" else target, None if config == "any" else config)] = (
                reason
            )
    return reasons


def load_cells(root: Path) -> dict:
    cells = defaultdict(list)
    for path in sorted(root.glob("*/*/rep*.json")):
        record = json.loads(path.read_text())
        cells[(record["target"], record["config"])].append(record)
    return cells


def _stats(records, key):
    values = np.array([r[key] for r in records])
    return float(values.mean()), float(values.std())


def _protocol_note(records):
    p = records[0]["protocol"]
    notes = []
    if p["num_warmup"] != PAPER_ITERATIONS:
        notes.append(f"{p['num_warmup']} + {p['num_samples']} iterations")
    if len(records) != PAPER_REPEATS:
        notes.append(f"{len(records)} repetitions")
    return ("reduced: " + ", ".join(notes)) if notes else ""


def _explain(target, config):
    reasons = [
        v
        for (t, c), v in _explanations().items()
        if (t in (None, target)) and (c in (None, config))
    ]
    return "; ".join(reasons)


#: The columns of the reproduction's tables.
RESULT_HEADER = [
    "method", "max ESS (ours)", "median ESS (ours)", "min ESS (ours)", "max (paper)",
    "median (paper)", "min (paper)", "notes",
]  # fmt: skip


def table_markdown(name, cells) -> str:
    configs, targets = EXPERIMENTS[name]
    paper = PAPER[name]
    lines = []
    for target in targets:
        present = [c for c in configs if (target, c) in cells]
        if not present and target not in paper:
            continue
        rows = []
        for config in configs:
            ref = paper.get(target, {}).get(config)
            records = cells.get((target, config))
            ours, flags = [], []
            for key in ("max", "median", "min"):
                if records is None:
                    ours.append("not run")
                    continue
                mean, sd = _stats(records, f"ess_{key}")
                flag = ""
                if ref is not None:
                    p_mean, p_sd = ref[key]
                    if not (p_mean - 2 * p_sd <= mean <= p_mean + 2 * p_sd):
                        flag = " ⚑"
                        flags.append(key)
                ours.append(f"{mean:.1f} ± {sd:.1f}{flag}")
            paper_cells = (
                [f"{ref[k][0]:.1f} ± {ref[k][1]:.1f}" for k in ("max", "median", "min")]
                if ref
                else ["-"] * 3
            )
            notes = []
            if records is not None:
                notes.append(_protocol_note(records))
                if flags:
                    notes.append("outside paper ± 2 sd: " + ", ".join(flags))
                    notes.append(_explain(target, config))
            else:
                notes.append("not run on this hardware yet")
            note = "; ".join(n for n in notes if n)
            rows.append([LABELS[config], *ours, *paper_cells, note])
        lines += [
            f"\n**{TARGET_LABELS.get(target, target)}**\n",
            templating.table(RESULT_HEADER, rows),
        ]
    return "\n".join(lines)


SHORT_TARGETS = {
    "gp": "GP", "inhomogeneous": "Neal", "pima": "Pima", "caravan": "Caravan",
    "mnist56": "MNIST", "heart": "Heart", "german": "German", "australian": "Austr.",
    "ripley": "Ripley",
}  # fmt: skip


#: Method names short enough for a one-row-per-method table at 1200 px.
SHORT_LABELS = {
    **LABELS,
    "fisher_mala-increment": "Fisher, no RB",
    "fisher_mala-centered": "Fisher, paired",
    "fisher_mala-score": "Fisher, score",
}


def _compared(cells):
    """``[(experiment, target, config, ours, paper)]`` for every cell the paper reports:
    ``ours`` and ``paper`` map ``max``/``median``/``min`` to ``(mean, sd)``."""
    out = []
    for name, (configs, targets) in EXPERIMENTS.items():
        for target in targets:
            for config in configs:
                ref = PAPER[name].get(target, {}).get(config)
                records = cells.get((target, config))
                if ref is None or records is None or (name != "table1" and config == "fisher_mala"):
                    continue
                ours = {k: _stats(records, f"ess_{k}") for k in ("max", "median", "min")}
                out.append((name, target, config, ours, {k: tuple(ref[k]) for k in ours}))
    return out


def _within(ours, paper, key):
    p_mean, p_sd = paper[key]
    return p_mean - 2 * p_sd <= ours[key][0] <= p_mean + 2 * p_sd


def figure_overview(cells, out: Path) -> list[str]:
    """Ours against the paper: median and min ESS of every cell, mean ± sd error bars."""
    compared = _compared(cells)
    if not compared:
        return []
    plt = _plt()
    configs = list(dict.fromkeys(c for _, _, c, _, _ in compared))
    markers = dict(zip(configs, "osD^v<>P*", strict=False))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    for ax, key in zip(axes, ("median", "min"), strict=True):
        inside = sum(_within(o, p, key) for *_, o, p in compared)
        for config in configs:
            rows = [(o[key], p[key]) for _, _, c, o, p in compared if c == config]
            (om, osd), (pm, psd) = (np.array(v).T for v in zip(*rows, strict=True))
            ax.errorbar(pm, om, xerr=psd, yerr=osd, fmt=markers[config], ms=5, lw=0.8,
                        capsize=2, label=LABELS[config], alpha=0.85)  # fmt: skip
        lo = min(min(o[key][0], p[key][0]) for *_, o, p in compared) / 2
        hi = max(max(o[key][0], p[key][0]) for *_, o, p in compared) * 2
        line = np.array([lo, hi])
        ax.plot(line, line, color="k", lw=0.8)
        ax.fill_between(line, line / 2, line * 2, color="0.85", zorder=0)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi))
        ax.set_xlabel(f"{key} ESS, paper (mean ± sd)")
        ax.set_ylabel(f"{key} ESS, ours (mean ± sd)")
        ax.set_title(f"{key} ESS: {inside} of {len(compared)} cells within the paper's ± 2 sd",
                     fontsize=10)  # fmt: skip
    axes[1].legend(fontsize=8, loc="upper left")
    fig.suptitle("Every cell of the paper's tables (9 targets): ours against the paper "
                 "(grey: within a factor of 2)", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(out / "overview.png", dpi=100)
    plt.close(fig)
    return ["overview.png"]


def overview_table(cells) -> str:
    """Min ESS ours / paper per method (rows) and target (columns); ⚑ outside ± 2 sd."""
    compared = _compared(cells)
    targets = [t for t in SHORT_TARGETS if any(t == c[1] for c in compared)]
    rows = []
    for config in dict.fromkeys(c for _, _, c, _, _ in compared):
        row = [SHORT_LABELS[config]]
        for target in targets:
            cell = [(o, p) for _, t, c, o, p in compared if (t, c) == (target, config)]
            if not cell:
                row.append("-")
                continue
            o, p = cell[0]
            row.append(f"{o['min'][0] / p['min'][0]:.2f}" + ("" if _within(o, p, "min") else " ⚑"))
        rows.append(row)
    return templating.table(["method", *(SHORT_TARGETS[t] for t in targets)], rows)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_frobenius(root: Path, out: Path) -> list[str]:
    plt = _plt()
    made = []
    for target in FROBENIUS[0]:
        records = {
            c: json.loads(p.read_text())
            for c in FROBENIUS[1]
            if (p := root / "frobenius" / target / f"{c}.json").exists()
        }
        if not records:
            continue
        fig, ax = plt.subplots(figsize=(5, 3.4))
        for config, rec in records.items():
            it = np.asarray(rec["iteration"])
            dist = np.asarray(rec["distance"])
            ax.plot(it, dist.mean(0), label=LABELS[config])
            ax.fill_between(it, dist.min(0), dist.max(0), alpha=0.2)
        ax.set_yscale("log")
        ax.set_xlabel("burn-in iteration")
        ax.set_ylabel(r"$\|\tilde A_n - \tilde\Sigma\|_F$")
        ax.set_title(TARGET_LABELS[target])
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = f"frobenius_{target}.png"
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        made.append(name)
    return made


def figure_gp_covariance(cells, out: Path) -> list[str]:
    plt = _plt()
    target = fm.targets.gp_gaussian()
    true = target.covariance / (np.trace(target.covariance) / target.dim)
    panels = [("true covariance", true)]
    for config in ("fisher_mala", "adamala"):
        records = cells.get(("gp", config))
        if records and "precond" in records[0]:
            panels.append((f"{LABELS[config]} (rep 0)", np.asarray(records[0]["precond"])))
    if len(panels) == 1:
        return []
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.3))
    for ax, (title, image) in zip(np.atleast_1d(axes), panels, strict=True):
        ax.imshow(image, cmap="viridis")
        ax.set_title(title, fontsize=9)
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out / "gp_covariance.png", dpi=100)
    plt.close(fig)
    return ["gp_covariance.png"]


def figure_inhomogeneous(cells, out: Path) -> list[str]:
    plt = _plt()
    made = []
    present = [c for c in EXPERIMENTS["table1"][0] if ("inhomogeneous", c) in cells]
    if present:
        fig, ax = plt.subplots(figsize=(5, 3.4))
        for config in present:
            ess = np.mean([r["ess"] for r in cells[("inhomogeneous", config)]], axis=0)
            ax.plot(np.arange(1, len(ess) + 1), ess, label=LABELS[config])
        ax.set_yscale("log")
        ax.set_xlabel("dimension i (sd = i / 100)")
        ax.set_ylabel("ESS (mean over repetitions)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "inhomogeneous_ess.png", dpi=100)
        plt.close(fig)
        made.append("inhomogeneous_ess.png")
    learned = [c for c in ("fisher_mala", "adamala") if ("inhomogeneous", c) in cells]
    if learned:
        target = fm.targets.inhomogeneous_gaussian()
        true_var = np.diag(target.covariance) / (np.trace(target.covariance) / target.dim)
        fig, ax = plt.subplots(figsize=(5, 3.4))
        ax.plot(np.sqrt(true_var), "k--", label="true (trace-normalized)")
        for config in learned:
            diag = np.asarray(cells[("inhomogeneous", config)][0]["precond_diag"])
            ax.plot(np.sqrt(diag), label=f"{LABELS[config]} (rep 0)")
        ax.set_xlabel("dimension")
        ax.set_ylabel("standard deviation")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "inhomogeneous_sd.png", dpi=100)
        plt.close(fig)
        made.append("inhomogeneous_sd.png")
    return made


def figure_logtarget(cells, out: Path) -> list[str]:
    plt = _plt()
    made = []
    for target in EXPERIMENTS["table1"][1]:
        present = [c for c in ("adamala", "hmc", "mmala", "fisher_mala") if (target, c) in cells]
        if not present:
            continue
        fig, axes = plt.subplots(1, len(present), figsize=(3 * len(present), 2.6), sharey=True)
        for ax, config in zip(np.atleast_1d(axes), present, strict=True):
            rec = cells[(target, config)][0]
            trace = np.asarray(rec["logdensity_trace"])
            ax.plot(np.arange(len(trace)) * rec["logdensity_thin"], trace, lw=0.6)
            ax.set_title(LABELS[config], fontsize=9)
            ax.set_xlabel("sampling iteration")
        np.atleast_1d(axes)[0].set_ylabel("log target")
        fig.suptitle(TARGET_LABELS[target], fontsize=10)
        fig.tight_layout()
        name = f"logtarget_{target}.png"
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        made.append(name)
    return made


def figure_step_sizes(cells, out: Path) -> list[str]:
    plt = _plt()
    targets = [
        t
        for t in ("gp", "pima", "caravan", "mnist56")
        if any((t, c) in cells for c in ("mala", "adamala", "fisher_mala"))
    ]
    if not targets:
        return []
    fig, axes = plt.subplots(1, len(targets), figsize=(3.2 * len(targets), 3))
    for ax, target in zip(np.atleast_1d(axes), targets, strict=True):
        configs = [c for c in ("mala", "adamala", "fisher_mala") if (target, c) in cells]
        data = [[r["step_size"] for r in cells[(target, c)]] for c in configs]
        ax.boxplot(data, tick_labels=[LABELS[c] for c in configs])
        ax.set_yscale("log")
        ax.set_title(TARGET_LABELS[target], fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
    np.atleast_1d(axes)[0].set_ylabel(r"final $\sigma^2$")
    fig.tight_layout()
    fig.savefig(out / "step_sizes.png", dpi=100)
    plt.close(fig)
    return ["step_sizes.png"]


def _hardware(cells) -> str:
    seen = defaultdict(list)
    for (target, config), records in sorted(cells.items()):
        env = records[0]["environment"]
        precision = env.get("matmul_precision", "default")
        seen[
            f"{env['device_kind']} ({env['device']}), {env['cpu_count']} CPU cores, "
            f"{env['dtype']}, matmul precision {precision}, jax {env['versions']['jax']}"
        ].append(f"{target}/{config}")
    lines = []
    for hw, names in seen.items():
        listed = ", ".join(names) if len(names) <= 12 else "all other cells"
        lines.append(f"- {hw}: {len(names)} cells ({listed})")
    return "\n".join(lines)


def _timing_table(cells) -> str:
    header = ["target", "method", "reps", "device", "warm-up s", "sampling s", "compile s"]
    rows = []
    for (target, config), records in sorted(cells.items()):
        s = records[0]["seconds"]
        device = records[0]["environment"]["device"].split(":")[0]
        rows.append([
            target, LABELS[config], len(records), device, f"{s['warmup']:.1f}",
            f"{s['sampling']:.1f}", f"{s['compile']:.1f}",
        ])  # fmt: skip
    return templating.table(header, rows)


def render(root: Path, out: Path) -> Path:
    """Write ``out/results.md`` (``templates/results.md`` with the tables and figures of the
    cache in ``root``) and ``out/images/results/*.png``."""
    images = out / "images" / "results"
    images.mkdir(parents=True, exist_ok=True)
    cells = load_cells(root)
    # The paper's figures, regenerated, shown under the table whose runs drew them.
    frobenius = figure_frobenius(root, images)
    neal = [f for f in frobenius if "inhomogeneous" in f]
    figures = {
        "figures_learning": [f for f in frobenius if f not in neal]
        + figure_gp_covariance(cells, images),
        "figures_inhomogeneous": figure_inhomogeneous(cells, images) + neal,
        "figures_logtarget": figure_logtarget(cells, images),
        "figures_step_sizes": figure_step_sizes(cells, images),
    }
    figures["figure_overview"] = figure_overview(cells, images)
    titles = {
        "table1": "Table 1 and Appendix E: every target, every sampler (max / median / min ESS)",
        "variants": "FisherMALA variants: every target",
        "noncentered": "FisherMALA from the raw score: every target",
    }
    values = {
        "hardware": _hardware(cells),
        "overview_table": overview_table(cells),
        **{
            name: templating.collapsed(title, table_markdown(name, cells))
            for name, title in titles.items()
        },
        **{
            key: "\n\n".join(f"![{fig}](images/results/{fig})" for fig in names)
            or "(no cached cells for this figure)"
            for key, names in figures.items()
        },
        "timing_table": templating.collapsed("Wall-clock time of every cell", _timing_table(cells)),
    }
    values["figures_logtarget"] = templating.collapsed(
        "The log target across the sampling phase, every target", values["figures_logtarget"]
    )
    path = out / "results.md"
    path.write_text(templating.fill(templating.load("results.md"), values))
    return path
