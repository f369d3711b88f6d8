"""What ``fm.sample``'s checks catch and miss, on failing and on healthy runs.

    python -m benchmarks.run_checks [--cells all|NAME,...] [--write-docs]

Each cell runs ``fm.sample`` (4 chains, the seeds listed) and records which checks of
:func:`fm.diagnose` failed, the diagnostics they read, and the truth they should reflect:
for the hard targets, the sampled standard deviation of the hard parameter against its
reference (``tau`` of the centred eight schools, ``v`` of Neal's funnel), for the mixture,
which mode each chain sat in. Results: ``results/run_checks/CELL.json`` (cached: a cell
that exists is not rerun). ``--write-docs`` writes the table into ``docs/reliability.md``.
"""

import argparse
import json
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import fisher_mala as fm
from benchmarks import cells, templating

RESULTS = Path(__file__).resolve().parent / "results" / "run_checks"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"
MARKERS = ("<!-- checks:start -->", "<!-- checks:end -->")
CHAINS = 4


def mixture(dim=4, offset=3.0, narrow=0.1):
    """``0.5 N(-offset 1, narrow^2 I) + 0.5 N(offset 1, I)``: two modes of different scales."""

    def logdensity(x):
        a = jnp.sum(-0.5 * ((x + offset) / narrow) ** 2) - dim * jnp.log(narrow)
        b = jnp.sum(-0.5 * (x - offset) ** 2)
        return jnp.logaddexp(a, b)

    return fm.targets.Target(
        "mixture", dim, logdensity, extras={"offset": offset, "narrow": narrow}
    )


def _target(name):
    return mixture() if name == "mixture" else fm.targets.get(name)


# name: (target, sampler, options, warm-up, draws, seeds, role)
CELLS = {
    "funnel_fisher_mala": ("funnel", "fisher_mala", {}, 5000, 5000, range(3), "hard"),
    "funnel_mala": ("funnel", "mala", {}, 5000, 5000, range(3), "hard"),
    "funnel_fisher_nuts": ("funnel", "fisher_nuts", {}, 5000, 5000, range(3), "hard"),
    "funnel_mmala": ("funnel", "mmala", {}, 5000, 5000, range(3), "hard"),
    "eight_schools_centered_fisher_mala": (
        "eight_schools_centered",
        "fisher_mala",
        {},
        5000,
        5000,
        range(5),
        "hard",
    ),
    "eight_schools_centered_mala": (
        "eight_schools_centered",
        "mala",
        {},
        5000,
        5000,
        range(5),
        "hard",
    ),
    "eight_schools_centered_fisher_nuts": (
        "eight_schools_centered",
        "fisher_nuts",
        {},
        5000,
        5000,
        range(5),
        "hard",
    ),
    "eight_schools_centered_mmala": (
        "eight_schools_centered",
        "mmala",
        {},
        5000,
        5000,
        range(3),
        "hard",
    ),
    "mixture_fisher_mala": ("mixture", "fisher_mala", {}, 5000, 5000, range(3), "modes"),
    "mixture_pooled": ("mixture", "fisher_mala", {"pooled": True}, 5000, 5000, range(3), "modes"),
    "mixture_split_fisher_mala": (
        "mixture",
        "fisher_mala",
        {"starts": "split"},
        5000,
        5000,
        range(3),
        "modes",
    ),
    "mixture_split_pooled": (
        "mixture",
        "fisher_mala",
        {"pooled": True, "starts": "split"},
        5000,
        5000,
        range(3),
        "modes",
    ),
    "gp_fisher_mala": ("gp", "fisher_mala", {}, 20000, 20000, range(2), "healthy"),
    "inhomogeneous_fisher_mala": (
        "inhomogeneous",
        "fisher_mala",
        {},
        20000,
        20000,
        range(2),
        "healthy",
    ),
    "german_fisher_mala": ("german", "fisher_mala", {}, 20000, 20000, range(2), "healthy"),
    "german_pooled": ("german", "fisher_mala", {"pooled": True}, 20000, 20000, range(2), "healthy"),
    "pima_fisher_mala": ("pima", "fisher_mala", {}, 20000, 20000, range(1), "healthy"),
    "heart_fisher_mala": ("heart", "fisher_mala", {}, 20000, 20000, range(1), "healthy"),
    "australian_fisher_mala": ("australian", "fisher_mala", {}, 20000, 20000, range(1), "healthy"),
    "ripley_fisher_mala": ("ripley", "fisher_mala", {}, 20000, 20000, range(1), "healthy"),
    "eight_schools_noncentered_fisher_mala": (
        "eight_schools_noncentered",
        "fisher_mala",
        {},
        10000,
        10000,
        range(3),
        "healthy",
    ),
    "arK_fisher_mala": ("arK", "fisher_mala", {}, 10000, 10000, range(2), "healthy"),
    "arK_fisher_nuts": ("arK", "fisher_nuts", {}, 5000, 5000, range(2), "healthy"),
}


def _truth(target, draws) -> dict:
    """The sampled spread of the hard parameter against the truth, or each chain's mode."""
    if target.name == "mixture":
        sd = draws.std(axis=1).mean(axis=-1)  # each chain's spread (narrow 0.1, wide 1)
        return {
            "chain_modes": ["narrow" if m < 0 else "wide" for m in draws.mean(axis=(1, 2))],
            "chain_sd": sd.round(3).tolist(),
        }
    if target.name == "funnel":
        return {
            "parameter": "v",
            "sd_ratio": float(draws[..., 0].std() / 3.0),
            "mean": float(draws[..., 0].mean()),
        }
    if "reference" not in target.extras:
        return {}
    ref = target.extras["reference"]
    values = target.extras["constrain"](draws)
    if "tau" not in ref["names"]:
        ratios = values.reshape(-1, values.shape[-1]).std(0) / np.asarray(ref["sd"])
        return {"parameter": "all", "sd_ratio_range": [float(ratios.min()), float(ratios.max())]}
    i = ref["names"].index("tau")
    return {
        "parameter": "tau",
        "sd_ratio": float(values[..., i].std() / ref["sd"][i]),
        "mean_ratio": float(values[..., i].mean() / ref["mean"][i]),
    }


def run_cell(name):
    path = RESULTS / f"{name}.json"
    if cells.is_done(path):
        return cells.load(path)
    target_name, sampler, options, num_warmup, num_samples, seeds, role = CELLS[name]
    options = dict(options)
    starts = options.pop("starts", "normal")
    target = _target(target_name)
    runs = []
    for seed in seeds:
        with jax.enable_x64(True):
            x0 = target.initial_positions(jax.random.key(100 + seed), CHAINS, jnp.float64)
            if starts == "split":  # two chains in each mode, drawn from that mode
                offset, narrow = target.extras["offset"], target.extras["narrow"]
                half = CHAINS // 2
                centre = jnp.repeat(jnp.array([-offset, offset]), half)[:, None]
                scale = jnp.repeat(jnp.array([narrow, 1.0]), half)[:, None]
                x0 = centre + scale * x0
            start = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = fm.sample(
                    jax.random.key(seed),
                    sampler,
                    target.logdensity_fn,
                    x0,
                    num_warmup=num_warmup,
                    num_samples=num_samples,
                    **options,
                )
            seconds = time.perf_counter() - start
        d = fm.diagnose(result)
        draws = np.asarray(result.samples, np.float64)
        runs.append(
            {
                "seed": seed,
                "warned": any(issubclass(w.category, fm.SamplingWarning) for w in caught),
                "checks": [f.check for f in d.findings],
                "max_rhat": float(np.nanmax(d.rhat)),
                "min_bulk_ess": float(d.ess_bulk.min()),
                "min_tail_ess": float(d.ess_tail.min()),
                "acceptance": d.chain_acceptance.round(3).tolist(),
                "longest_streaks": (
                    None
                    if d.longest_rejection_streak is None
                    else d.longest_rejection_streak.tolist()
                ),
                "messages": [f.message for f in d.findings],
                "truth": _truth(target, draws),
                "seconds": round(seconds, 1),
            }
        )
        print(f"  {name} seed {seed}: {runs[-1]['checks']} {runs[-1]['truth']}", flush=True)
    record = {
        "cell": name,
        "target": target_name,
        "sampler": sampler,
        "options": CELLS[name][2],
        "num_warmup": num_warmup,
        "num_samples": num_samples,
        "chains": CHAINS,
        "role": role,
        "runs": runs,
        "jax": jax.__version__,
    }
    cells.write(path, record)
    return record


def _truth_cell(run) -> str:
    t = run["truth"]
    if not t:
        return ""
    if "chain_modes" in t:
        return (
            "modes "
            + "/".join(m[0] for m in t["chain_modes"])
            + ", sd "
            + "/".join(f"{v:.2f}" for v in t["chain_sd"])
        )
    if "sd_ratio_range" in t:
        low, high = t["sd_ratio_range"]
        return f"every sd x {low:.2f}-{high:.2f}"
    return f"sd({t['parameter']}) x {t['sd_ratio']:.2f}"


def render(root=RESULTS) -> str:
    header = [
        "cell", "role", "warm-up + draws", "seed", "checks failed", "max R-hat",
        "min bulk ESS", "acceptance by chain", "truth",
    ]  # fmt: skip
    lines = []
    for name in CELLS:
        path = root / f"{name}.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        for run in r["runs"]:
            checks = ", ".join(run["checks"]) or "none"
            lines.append([
                name, r["role"], f"{r['num_warmup']} + {r['num_samples']}", run["seed"],
                checks, f"{run['max_rhat']:.3f}", f"{run['min_bulk_ess']:.0f}",
                ", ".join(f"{a:.2f}" for a in run["acceptance"]), _truth_cell(run),
            ])  # fmt: skip
    return templating.table(header, lines)


PLOT = DOCS.parent / "images" / "run_checks.png"
#: The checks, in the order the figure shows them.
CHECK_NAMES = (
    "rhat", "ess", "chains_disagree", "acceptance", "rejection_streak", "divergences",
    "nonfinite",
)  # fmt: skip


def plot(out=PLOT, root=RESULTS) -> Path:
    """Which checks fired, as the share of each cell's seeds: hard and multi-modal cells
    (which should fail some) above healthy ones (which should fail none)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(p.read_text()) for n in CELLS if (p := root / f"{n}.json").exists()]
    order = {"hard": 0, "modes": 1, "healthy": 2}
    records.sort(key=lambda r: order.get(r["role"], 3))
    share = np.array([
        [np.mean([name in run["checks"] for run in r["runs"]]) for name in CHECK_NAMES]
        for r in records
    ])  # fmt: skip
    fig, ax = plt.subplots(figsize=(8, 0.27 * len(records) + 1.6))
    ax.imshow(share, cmap="Reds", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(CHECK_NAMES)), CHECK_NAMES, rotation=30, ha="right", fontsize=8)
    labels = [f"{r['cell']} ({r['role']}, {len(r['runs'])} seeds)" for r in records]
    ax.set_yticks(range(len(records)), labels, fontsize=8)
    for i in range(len(records)):
        if not share[i].any():
            ax.text(len(CHECK_NAMES) / 2 - 0.5, i, "no check fired", ha="center", va="center",
                    fontsize=7, color="0.4")  # fmt: skip
    ax.set_title("Share of seeds in which each check fired (red: all)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def write_docs(page=DOCS) -> str:
    text = page.read_text()
    head, rest = text.split(MARKERS[0])
    _, tail = rest.split(MARKERS[1])
    table = templating.collapsed("Every run: the checks that failed, R-hat, ESS, truth", render())
    new = f"{head}{MARKERS[0]}\n{table}\n{MARKERS[1]}{tail}"
    page.write_text(new)
    return new


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="all")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    if args.write_docs:
        write_docs()
        plot()
        return
    names = list(CELLS) if args.cells == "all" else args.cells.split(",")
    for name in names:
        run_cell(name)
    print(render())


if __name__ == "__main__":
    main()
