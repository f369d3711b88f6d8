"""Fisher NUTS against nutpie's low-rank metric at matched lengths, per gradient.

    python -m benchmarks.nutpie_race                  # every cell, cached
    python -m benchmarks.nutpie_race --render         # the table only
    python -m benchmarks.nutpie_race --inspect NAME   # one Fisher NUTS run of NAME, looked into
    python -m benchmarks.nutpie_race --seed 2 --root benchmarks/results/nutpie_race_seed2
    python -m benchmarks.nutpie_race --seeds          # every seed's ratios, per target
    python -m benchmarks.nutpie_race --funnel         # eight seeds of eight_schools_centered

The protocol of the Fisher NUTS race (``benchmarks.versus_blackjax``: its cells, its
starts, float64 everywhere as nutpie computes), at matched lengths: 4 chains of 2000
draws each, after each sampler's default warm-up (Fisher NUTS: ``fm.sample``'s
``num_warmup``, an upper bound that the stopping rule ends early; nutpie: 1000 tuning
steps). Score: min bulk ESS (ArviZ,
rank-normalized, multi-chain) over every coordinate per gradient evaluation, warm-up
included; also per second (warm-up plus sampling, compilation apart). Every cell is
checked against the posteriordb reference draws (max |z| of the means).

Targets: the race's posteriordb posteriors (:mod:`fisher_mala.targets.posteriordb`) and the
eight added for this race (:mod:`fisher_mala.targets.posteriordb_more`). The nine
posteriors of :data:`HELD_OUT` are kept aside, bundled nowhere and tuned on by nobody, to
check the defaults on afterwards.

Cells cached in ``benchmarks/results/nutpie_race/<target>/<sampler>.json``; the table in
``benchmarks/results/nutpie_race.md``.
"""

import argparse
import ast
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from benchmarks import cells

RESULTS = Path(__file__).resolve().parent / "results" / "nutpie_race"
TABLE = RESULTS.parent / "nutpie_race.md"
TARGETS = ("kilpisjarvi", "arK", "eight_schools_noncentered", "eight_schools_centered",
           "diamonds", "kidiq_interaction", "earn_height", "logearn_logheight_male",
           "mesquite", "nes1996", "sblri", "gp_regr", "hmm_drive_0")  # fmt: skip
SAMPLERS = ("fisher_nuts", "nutpie_low_rank")
#: posteriordb posteriors kept aside to check the defaults on (never bundled or tuned on).
HELD_OUT = ("mesquite-logmesquite_logvash", "earnings-logearn_interaction", "nes1972-nes",
            "sblrc-blr", "garch-garch11", "arma-arma11", "gp_pois_regr-gp_pois_regr",
            "low_dim_gauss_mix-low_dim_gauss_mix", "hmm_example-hmm_example")  # fmt: skip
CHAINS, SAMPLES = 4, 2000
#: Warm-up iterations: Fisher NUTS's default (``fm.sample``), nutpie's default.
FISHER_WARMUP, NUTPIE_WARMUP = 20_000, 1000


def _args(root: Path, seed: int = 0) -> SimpleNamespace:
    """The arguments ``versus_blackjax.run_cell`` reads, at this race's lengths."""
    return SimpleNamespace(
        chains=CHAINS, samples=SAMPLES, fisher_warmup=FISHER_WARMUP, nuts_warmup=NUTPIE_WARMUP,
        float64=True, metric="auto", stopping_rule="on", root=root, seed=seed,
    )  # fmt: skip


def run(targets, samplers, root: Path = RESULTS, seed: int = 0) -> None:
    from benchmarks import versus_blackjax

    for target in targets:
        for sampler in samplers:
            versus_blackjax.run_cell(target, sampler, _args(root, seed), root=root)


#: A cell fails the reference check when the means of its draws are more than this many
#: Monte Carlo standard errors from the posteriordb reference's (the tests' bound is 4.5)...
FAILED_Z = 5.0
#: ... or a standard deviation is off by more than this factor either way (the tests
#: allow 15%): draws that wrong have no efficiency to compare.
FAILED_SD_FACTOR = 1.5


def reference_failure(cell: dict) -> str | None:
    """Why a cell's draws disagree with the reference (``None`` when they agree or there
    is no reference)."""
    z = cell.get("reference_max_abs_z")
    low, high = cell.get("reference_sd_ratio", (1.0, 1.0))
    if z is not None and not z <= FAILED_Z:
        return f"max abs z {z:.1f}"
    if not (1 / FAILED_SD_FACTOR <= low and high <= FAILED_SD_FACTOR):
        return f"sd ratio {low:.2g}-{high:.2g}"
    return None


def rows(root: Path = RESULTS, targets=TARGETS) -> list[dict]:
    """One row per target with both cells: the per-gradient and per-second ratios, each
    sampler's reference check."""
    out = []
    for target in targets:
        fisher = cells.load(root / target / "fisher_nuts.json")
        nutpie = cells.load(root / target / "nutpie_low_rank.json")
        if fisher is None or nutpie is None:
            continue
        out.append({
            "target": target,
            "dim": fisher["dim"],
            "fisher_per_grad": fisher["bulk_min_per_grad"],
            "nutpie_per_grad": nutpie["bulk_min_per_grad"],
            "per_grad": fisher["bulk_min_per_grad"] / nutpie["bulk_min_per_grad"],
            "per_second": fisher["bulk_min_per_second"] / nutpie["bulk_min_per_second"],
            "fisher_grads": fisher["grad_evals"],
            "nutpie_grads": nutpie["grad_evals"],
            "fisher_z": fisher.get("reference_max_abs_z", np.nan),
            "nutpie_z": nutpie.get("reference_max_abs_z", np.nan),
            "failed": {name: why for name, cell in (("Fisher NUTS", fisher), ("nutpie", nutpie))
                       if (why := reference_failure(cell)) is not None},
        })  # fmt: skip
    return out


def render(root: Path = RESULTS, targets=TARGETS, first_column: str = "target") -> str:
    """The markdown table of :func:`rows`, the geometric mean of the ratios (also over the
    targets where both samplers' draws pass the reference check, when one fails), and
    the failed checks."""
    table = rows(root, targets)
    lines = [
        f"| {first_column} | d | Fisher NUTS ESS/grad | nutpie low-rank ESS/grad "
        "| ratio per gradient | ratio per second | gradients (Fisher / nutpie) "
        "| max abs z (Fisher / nutpie) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        failed = "".join(f"; **{k} wrong: {v}**" for k, v in r["failed"].items())
        lines.append(
            f"| `{r['target']}` | {r['dim']} | {r['fisher_per_grad']:.2e} | "
            f"{r['nutpie_per_grad']:.2e} | {r['per_grad']:.2f} | {r['per_second']:.2f} | "
            f"{r['fisher_grads']} / {r['nutpie_grads']} | "
            f"{r['fisher_z']:.2f} / {r['nutpie_z']:.2f}{failed} |"
        )
    if table:
        geo = np.exp(np.mean(np.log([r["per_grad"] for r in table])))
        worst = min(table, key=lambda r: r["per_grad"])
        rest = [r["per_grad"] for r in table if r is not worst] or [np.nan]
        agreed = [r["per_grad"] for r in table if not r["failed"]]
        both = ""
        if len(agreed) < len(table):
            both = (
                f"; over the {len(agreed)} where both samplers' draws agree with the "
                f"reference, {np.exp(np.mean(np.log(agreed))):.2f}"
            )
        lines.append("")
        lines.append(
            f"Geometric mean of the per-gradient ratio over {len(table)} targets: "
            f"**{geo:.2f}** ({np.exp(np.mean(np.log(rest))):.2f} without the lowest, "
            f"{worst['per_grad']:.2f} on `{worst['target']}`{both}); ratio per second above "
            f"1 on {sum(r['per_second'] > 1 for r in table)} of {len(table)}."
        )
    for r in table:
        for name, why in r["failed"].items():
            lines.append(
                f"\n`{r['target']}`: {name}'s draws disagree with the reference ({why}; "
                f"bounds: max abs z {FAILED_Z:g}, sd within a factor {FAILED_SD_FACTOR:g})."
            )
    return "\n".join(lines)


#: The seeds' roots summarized by ``--seeds`` (seed 0 is the default root).
SEED_ROOTS = (RESULTS, RESULTS.parent / "nutpie_race_seed1", RESULTS.parent / "nutpie_race_seed2")
#: Five more seeds of the funnel alone (its min ESS varies far more than the others'):
#: ``--targets eight_schools_centered --seed s --root .../nutpie_race_funnel/seed{s}``.
FUNNEL_ROOTS = SEED_ROOTS + tuple(RESULTS.parent / "nutpie_race_funnel" / f"seed{s}"
                                  for s in range(3, 16))  # fmt: skip


def render_seeds(roots=SEED_ROOTS) -> str:
    """Per target, the per-gradient ratio in each seed and their geometric mean; then the
    geometric mean over the targets and the lowest target, per seed and over the seeds
    (a single run's min ESS varies by 10-15%, and more on a funnel)."""
    per_seed = [{r["target"]: r for r in rows(root)} for root in roots]
    targets = [t for t in TARGETS if all(t in seed for seed in per_seed)]
    lines = [
        "| target | " + " | ".join(f"seed {i}" for i in range(len(roots)))
        + " | geometric mean over the seeds |",
        "|---|" + "---|" * (len(roots) + 1),
    ]
    means = {}
    for t in targets:
        ratios = [seed[t]["per_grad"] for seed in per_seed]
        means[t] = float(np.exp(np.mean(np.log(ratios))))
        cells_text = " | ".join(
            f"{v:.2f}" + "".join(f" ({name} wrong: {why})" if name != "nutpie" else
                                 " (nutpie wrong)" for name, why in seed[t]["failed"].items())
            for v, seed in zip(ratios, per_seed, strict=True)
        )  # fmt: skip
        lines.append(f"| `{t}` | {cells_text} | {means[t]:.2f} |")
    if len(targets) < 2:  # one target: its row, and how far each sampler moves by seed
        lines += ["", _seed_spread([seed[targets[0]] for seed in per_seed])]
        return "\n".join(lines)
    overall = [np.exp(np.mean(np.log([seed[t]["per_grad"] for t in targets])))
               for seed in per_seed]  # fmt: skip
    lowest = min(means, key=means.get)
    pooled = np.exp(np.mean(np.log(list(means.values()))))
    lines.append("")
    lines.append(
        f"Geometric mean over the {len(targets)} targets, per seed: "
        + ", ".join(f"{v:.2f}" for v in overall)
        + f"; of the per-target means over the seeds: **{pooled:.2f}**"
        f", the lowest {means[lowest]:.2f} on `{lowest}`."
    )
    return "\n".join(lines)


#: A seed's ratio below this counts as behind (the race's goal: no target below 0.8).
BEHIND = 0.8


def _seed_spread(cells_by_seed: list[dict]) -> str:
    """How often one seed of a sampler is below :data:`BEHIND` times another seed of the
    *same* sampler (ordered pairs of seeds, min ESS per gradient): the share of seeds a
    race between two equally efficient samplers puts below the goal by chance alone."""
    shares = {}
    for name in ("fisher", "nutpie"):
        values = np.array([c[f"{name}_per_grad"] for c in cells_by_seed])
        ratios = values[:, None] / values[None, :]
        off_diagonal = ~np.eye(values.size, dtype=bool)
        shares[name] = (np.mean(ratios[off_diagonal] < BEHIND), ratios[off_diagonal].min(),
                        ratios[off_diagonal].max())  # fmt: skip
    behind = np.mean([c["per_grad"] < BEHIND for c in cells_by_seed])
    (f_share, f_low, f_high), (n_share, n_low, n_high) = shares["fisher"], shares["nutpie"]
    return (
        f"Each sampler against itself on another seed (ordered pairs of the {len(cells_by_seed)}"
        f" seeds, min ESS per gradient): nutpie is below {BEHIND:g} times itself in "
        f"{n_share:.0%} of the pairs (ratios {n_low:.2f} to {n_high:.2f}), Fisher NUTS in "
        f"{f_share:.0%} ({f_low:.2f} to {f_high:.2f}); Fisher NUTS against nutpie: "
        f"{behind:.0%} of the seeds."
    )


def use_cpu_devices() -> None:
    """Start JAX with the race's XLA:CPU devices (``versus_blackjax.CPU_DEVICES``), unless
    ``XLA_FLAGS`` already sets a count; call before JAX is first used."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        from benchmarks.versus_blackjax import CPU_DEVICES

        count = f"--xla_force_host_platform_device_count={CPU_DEVICES}"
        os.environ["XLA_FLAGS"] = f"{flags} {count}"


def _probe_steps(r, target, chain: int, fractions=(1.0, 0.5, 0.25, 0.1), transitions=30):
    """From chain ``chain``'s first draw, ``transitions`` Fisher NUTS transitions at each
    fraction of its tuned step, with its ``R``: mean acceptance (printed). A chain stuck
    where its step is too large moves at a fraction of it."""
    import jax

    from fisher_mala import whitened_hmc

    kernel = jax.jit(whitened_hmc.build_kernel("nuts"), static_argnums=2)
    root = jax.tree.map(lambda a: a[chain], r.parameters.sqrt_precond)
    step = float(np.asarray(r.parameters.step_size)[chain])
    start = jax.numpy.asarray(np.asarray(r.samples)[chain, 0])
    cells = []
    for fraction in fractions:
        state = whitened_hmc.init(start, target.logdensity_fn, root)
        rates = []
        for i in range(transitions):
            state, info = kernel(jax.random.key(i), state, target.logdensity_fn, step * fraction)
            rates.append(float(info.acceptance_rate))
        cells.append(f"x{fraction:g}: {np.mean(rates):.2f}")
    print(f"chain {chain} from its first draw, {transitions} transitions at its step "
          f"{step:.3g} times: acceptance " + ", ".join(cells))  # fmt: skip


def inspect(name: str, regroup: bool = True, damping=None, seed: int = 0, **options) -> None:
    """One Fisher NUTS run of the race on ``name``: its warnings (a chain regrouped at the
    end of the Fisher phase names the log densities), warm-up length, divergences, and per
    chain the eigenvalues of ``Sigma^(-1/2) A Sigma^(-1/2)`` times the squared step
    (``A = R R^T`` learned, ``Sigma`` the draws' covariance; all near 1 when ``R``
    whitens the posterior), and the draws against the posteriordb reference (max |z|).
    ``seed``: the race's starts and keys (``--seed``)."""
    import warnings

    import jax

    jax.config.update("jax_enable_x64", True)
    import fisher_mala as fm
    from benchmarks.race_setup import race_start
    from benchmarks.versus_blackjax import _reference_check

    target = fm.targets.get(name)
    positions, key = race_start(target, CHAINS, seed)
    options = {"regroup": regroup, **options, **({} if damping is None else {"damping": damping})}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", fm.SamplingWarning)
        r = fm.sample(key, "fisher_nuts", target.logdensity_fn, positions,
                      num_warmup=FISHER_WARMUP, num_samples=SAMPLES, diagnose=False,
                      **options)  # fmt: skip
    for w in caught:
        if "Fisher phase" in str(w.message):
            print("warning:", w.message)
    draws = np.asarray(r.samples)
    ess = fm.ess(draws, method="bulk", per_chain=False).min()
    print(f"min bulk ESS per gradient {ess / np.sum(r.num_grad_evals):.2e}",
          "| warm-up iterations", r.warmup_info.acceptance_rate.shape[-1],
          "| divergences", np.asarray(r.sample_stats["is_divergent"]).sum(-1),
          f"| leapfrog steps per draw {np.mean(r.sample_stats['num_grad_evals']):.2f}",
          f"| acceptance {np.mean(r.sample_stats['acceptance_rate']):.3f}",
          f"| target {r.target_acceptance}")  # fmt: skip
    by_chain = np.asarray(r.sample_stats["acceptance_rate"]).mean(-1)
    print("acceptance by chain", np.round(by_chain, 2))
    _probe_steps(r, target, int(np.argmin(by_chain)))
    check = _reference_check(target, draws)
    if check:
        low, high = check["reference_sd_ratio"]
        print(f"reference: max abs z {check['reference_max_abs_z']:.2f}, "
              f"sd ratios {low:.3f} to {high:.3f}")  # fmt: skip
    sqrt = r.parameters.sqrt_precond
    if isinstance(sqrt, fm.DiagonalSqrt):
        sqrt = np.stack([np.diag(s) for s in np.asarray(sqrt.scale)])
    chol = np.linalg.cholesky(np.cov(draws.reshape(-1, draws.shape[-1]).T))
    for c, (rc, step) in enumerate(zip(np.asarray(sqrt), np.asarray(r.parameters.step_size),
                                       strict=True)):  # fmt: skip
        whitened = np.linalg.solve(chol, rc)
        eig = np.linalg.eigvalsh(whitened @ whitened.T) * step**2
        print(f"chain {c}: eigenvalues of Sigma^-1/2 A Sigma^-1/2 x step^2", np.round(eig, 4))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="all")
    parser.add_argument("--samplers", default="all")
    parser.add_argument("--render", action="store_true")
    parser.add_argument("--inspect", metavar="NAME", help="look into one Fisher NUTS run")
    parser.add_argument("--no-regroup", action="store_true", help="with --inspect: regroup=False")
    parser.add_argument("--damping", type=float, help="with --inspect: the Fisher phase's damping")
    parser.add_argument("--stuck-acceptance", type=float,
                        help="with --inspect: STUCK_ACCEPTANCE (0: no restart)")  # fmt: skip
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE",
        help="with --inspect: another option of fm.sample (a Python literal)",
    )  # fmt: skip
    parser.add_argument("--root", type=Path, default=RESULTS)
    parser.add_argument("--seeds", action="store_true", help="every seed's ratios, per target")
    parser.add_argument("--funnel", action="store_true", help="the funnel's ratios, 16 seeds")
    parser.add_argument(
        "--seed", type=int, default=0, help="other starts and keys (with another --root)"
    )
    args = parser.parse_args(argv)
    if args.seeds or args.funnel:
        text = render_seeds(FUNNEL_ROOTS if args.funnel else SEED_ROOTS)
        name = "nutpie_race_funnel.md" if args.funnel else "nutpie_race_seeds.md"
        (RESULTS.parent / name).write_text(text + "\n")
        print(text)
        return
    if args.inspect:
        if args.stuck_acceptance is not None:
            from fisher_mala import whitened_warmup_looks

            whitened_warmup_looks.STUCK_ACCEPTANCE = args.stuck_acceptance
        extra = {k: ast.literal_eval(v) for k, v in (o.split("=", 1) for o in args.set)}
        inspect(args.inspect, not args.no_regroup, args.damping, args.seed, **extra)
        return
    if not args.render:
        use_cpu_devices()
        targets = TARGETS if args.targets == "all" else args.targets.split(",")
        samplers = SAMPLERS if args.samplers == "all" else args.samplers.split(",")
        run(targets, samplers, args.root, args.seed)
    text = render(args.root)
    (args.root.parent / f"{args.root.name}.md").write_text(text + "\n")  # TABLE for the default
    print(text)


if __name__ == "__main__":
    main()
