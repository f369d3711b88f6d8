"""The low-rank Fisher preconditioner's race: targets whose posterior is diagonal plus low
rank, at equal precision (float64 everywhere, as nutpie computes).

    python -m benchmarks.low_rank_race                 # every cell, cached
    python -m benchmarks.low_rank_race --render        # the table only
    python -m benchmarks.low_rank_race --inspect latent_gp_poisson   # how R whitens it
    python -m benchmarks.low_rank_race --probe hierarchical_logistic_10k   # a cell's cost
    python -m benchmarks.low_rank_race --probe hierarchical_logistic_10k --seed 1  # another chain
    python -m benchmarks.low_rank_race --probe hierarchical_logistic_10k --robust-uturn off
    python -m benchmarks.low_rank_race --probe hierarchical_logistic_10k --diagonal learned
    python -m benchmarks.low_rank_race --probe hierarchical_logistic_10k --chains 4 --draws 20
                                   # the cell's four chains: each one's tree, step and R
    python -m benchmarks.low_rank_race --probe hierarchical_logistic_10k --draws 400
                                   # and how well R fits along its own directions
    python -m benchmarks.low_rank_race --probe hierarchical_logistic_10k --draws 400 \
        --remeasure off            # R's directions not measured again in the step-size phase
    python -m benchmarks.low_rank_race --placement hierarchical_logistic_10k
                                   # the rank-8 cell batched and sequential, in turns
    python -m benchmarks.low_rank_race --targets gaussian_lowrank --seeds 0,1,2 \
        --samplers fisher_nuts_rank8,fisher_nuts_dense    # per gradient, three seeds

Protocol of the Fisher NUTS race (``benchmarks.versus_blackjax``): 4 chains, min bulk ESS
(ArviZ, rank-normalized, multi-chain) over every coordinate, per second of warm-up plus
sampling (compilation apart) and per gradient evaluation. Samplers:

* ``fisher_nuts_rank8``: ``fm.sample(..., "fisher_nuts", rank=8)``, 5000 warm-up
  iterations (the Fisher phase in full, then the step size), 2000 draws; its diagonal the
  default, ``low_rank_diagonal="whitened"``;
* ``fisher_nuts_rank8_long``: the same after 20 000 warm-up iterations (:data:`LONG_WARMUP`);
* ``fisher_nuts_rank8_learned``: ``fisher_nuts_rank8`` with ``low_rank_diagonal="learned"``
  (``benchmarks/low_rank_diagonal.py`` compares the three diagonals on more keys); like
  ``_unit``, an option, left out of the ratio columns;
* ``fisher_nuts_rank8_unit``: ``fisher_nuts_rank8`` with ``low_rank_diagonal="unit"`` (``D``
  held at the identity), on the targets whose every coordinate has a unit-scale prior
  (:data:`UNIT_PRIOR`); a user's option, not the default, so the ratio columns leave it out;
* ``fisher_nuts_dense``: the same with the dense ``R`` (where it fits);
* ``nuts_diag``: BlackJAX NUTS after ``window_adaptation`` (1000 steps), 2000 draws;
* ``nutpie_diag``, ``nutpie_low_rank``: nutpie on the PyMC version of the model, 1000
  tuning steps, 2000 draws.

Targets (synthetic, fixed seeds):

* ``gaussian_lowrank``: ``d = 1000``, covariance ``D^(1/2) (I + U diag(S - 1) U^T)
  D^(1/2)`` with ``D`` spanning ``e^-2 .. e^2`` and rank 8 (four directions 100, 50, 30 and 20
  times looser than the diagonal, four 10 to 100 times stiffer), its log density in
  ``O(d r)``;
* ``hierarchical_logistic``: a varying-intercept logistic regression, 1000 groups of 8
  observations, 3 covariates, non-centred (``alpha_g = mu + tau z_g``): ``d = 1005``, the
  population parameters correlated with every group's;
* ``latent_gp_poisson``: Poisson counts at 1000 points on a latent Gaussian process
  (squared-exponential kernel, fixed hyperparameters), whitened, with an unknown log
  baseline: ``d = 1001``, the posterior the identity plus a stiff part of rank about 8;
* ``hierarchical_logistic_10k``: the same with 10 000 groups, ``d = 10 005`` (no dense
  ``R`` there: :data:`DENSE_MAX_DIM`);
* ``gaussian_lowrank_10k``, ``gaussian_lowrank_100k``: ``gaussian_lowrank`` with
  ``d = 10 000`` and ``d = 100 000`` (the same spectrum of the rank-8 part, the same
  diagonal's range).

Cells cached in ``benchmarks/results/low_rank_race/<target>/<sampler>.json``; the table in
``benchmarks/results/low_rank_race.md``; the Gaussians' cells along their rank-8
directions (:func:`direction_ess`) in ``benchmarks/results/low_rank_race_directions.md``.
"""

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import templating

RESULTS = Path(__file__).resolve().parent / "results" / "low_rank_race"
TABLE = RESULTS.parent / "low_rank_race.md"
DIRECTIONS_TABLE = RESULTS.parent / "low_rank_race_directions.md"
SAMPLERS = ("fisher_nuts_rank8", "fisher_nuts_rank8_long", "fisher_nuts_rank8_unit",
            "fisher_nuts_rank8_learned", "fisher_nuts_dense", "nuts_diag", "nutpie_diag",
            "nutpie_low_rank")  # fmt: skip
#: Rank-8 cells of an option, not the default: left out of the ratio columns.
OPTIONS = ("fisher_nuts_rank8_unit", "fisher_nuts_rank8_learned")
#: Targets whose coordinates all have a prior of scale about 1 (non-centred, whitened):
#: ``fisher_nuts_rank8_unit`` runs on them.
UNIT_PRIOR = ("hierarchical_logistic", "latent_gp_poisson")
#: The low-rank learner's longer warm-up (``fisher_nuts_rank8_long``): its iterations cost
#: O(d k), and on ``gaussian_lowrank`` it finds the two loosest directions only after about
#: 20 d of them (the chain must first move along them for the positions to show them).
LONG_WARMUP = 20_000
CHAINS, SAMPLES, FISHER_WARMUP, NUTS_WARMUP = 4, 2000, 5000, 1000


class _Target:
    """What the race's runners read of a target."""

    def __init__(self, name, dim, logdensity_fn, pymc_model):
        self.name, self.dim, self.logdensity_fn = name, dim, logdensity_fn
        self.covariance = None
        self.extras = {"pymc_model": pymc_model}


def gaussian_lowrank(dim=1000, name="gaussian_lowrank"):
    rng = np.random.default_rng(0)
    diagonal = np.exp(rng.uniform(-2, 2, dim))
    loadings = np.linalg.qr(rng.normal(size=(dim, 8)))[0]
    spectrum = np.array([100.0, 50.0, 30.0, 20.0, 0.1, 0.05, 0.02, 0.01])
    weights = 1.0 / spectrum - 1.0  # precision: D^(-1/2) (I + U diag(1/S - 1) U^T) D^(-1/2)
    scale = 1.0 / np.sqrt(diagonal)

    def logdensity(x):
        y = x * scale
        return -0.5 * (y @ y + jnp.sum(weights * (y @ loadings) ** 2))

    def pymc_model():
        import pymc as pm

        with pm.Model() as model:
            x = pm.Flat("x", shape=dim)
            y = x * scale
            pm.Potential("density", -0.5 * ((y**2).sum() + (weights * (y @ loadings) ** 2).sum()))
        return model

    target = _Target(name, dim, logdensity, pymc_model)
    # The covariance's exact factors, for benchmarks that whiten by its exact root.
    target.extras["factors"] = (diagonal, loadings, spectrum)
    return target


def hierarchical_logistic(groups=1000, per_group=8, features=3, name="hierarchical_logistic"):
    rng = np.random.default_rng(1)
    group = np.repeat(np.arange(groups), per_group)
    x = rng.normal(size=(groups * per_group, features))
    alpha = 0.5 + 1.0 * rng.normal(size=groups)
    beta = np.array([1.0, -0.5, 0.25])
    y = (rng.uniform(size=group.size) < 1 / (1 + np.exp(-(alpha[group] + x @ beta)))).astype(float)

    def logdensity(theta):
        mu, log_tau, b, z = theta[0], theta[1], theta[2 : 2 + features], theta[2 + features :]
        tau = jnp.exp(log_tau)
        logits = mu + tau * z[group] + x @ b
        lik = jnp.sum(y * logits - jnp.logaddexp(0.0, logits))
        # mu ~ N(0, 2), tau ~ HalfNormal(1) (log-Jacobian log_tau), b ~ N(0, 1), z ~ N(0, 1)
        prior = -0.125 * mu**2 - 0.5 * tau**2 + log_tau - 0.5 * b @ b - 0.5 * z @ z
        return lik + prior

    def pymc_model():
        import pymc as pm

        with pm.Model() as model:
            mu = pm.Normal("mu", 0.0, 2.0)
            tau = pm.HalfNormal("tau", 1.0)
            b = pm.Normal("b", 0.0, 1.0, shape=features)
            z = pm.Normal("z", 0.0, 1.0, shape=groups)
            pm.Bernoulli("y", logit_p=mu + tau * z[group] + pm.math.dot(x, b), observed=y)
        return model

    return _Target(name, 2 + features + groups, logdensity, pymc_model)


def latent_gp_poisson(points=1000, lengthscale=1.5):
    """Poisson counts on a latent Gaussian process (squared-exponential kernel, fixed
    hyperparameters), whitened: ``f = L z``, ``z ~ N(0, I)``, ``log rate = c + f``; ``d =
    points + 1``. The posterior precision of ``z`` is ``I + L^T W L`` (``W`` the rates): the
    data inform the few smooth directions the kernel allows (eigenvalues about 1460 down
    to 10 in the first eight, 3.1 and 0.9 in the next two, at the true rates), every
    other direction keeps its prior: identity plus rank 8, nearly."""
    rng = np.random.default_rng(2)
    t = np.linspace(0.0, 10.0, points)
    kernel = np.exp(-0.5 * (t[:, None] - t[None]) ** 2 / lengthscale**2)
    chol = np.linalg.cholesky(kernel + 1e-6 * np.eye(points))  # jitter: the kernel's tail
    counts = rng.poisson(np.exp(1.0 + chol @ rng.normal(size=points))).astype(float)

    def logdensity(theta):
        c, z = theta[0], theta[1:]
        eta = c + chol @ z
        # c ~ N(0, 1), z ~ N(0, I); log(y!) left out (a constant)
        return jnp.sum(counts * eta - jnp.exp(eta)) - 0.5 * (c**2 + z @ z)

    def pymc_model():
        import pymc as pm

        with pm.Model() as model:
            c = pm.Normal("c", 0.0, 1.0)
            z = pm.Normal("z", 0.0, 1.0, shape=points)
            pm.Poisson("y", mu=pm.math.exp(c + pm.math.dot(chol, z)), observed=counts)
        return model

    return _Target("latent_gp_poisson", points + 1, logdensity, pymc_model)


def hierarchical_logistic_10k():
    return hierarchical_logistic(groups=10_000, name="hierarchical_logistic_10k")


def gaussian_lowrank_10k():
    return gaussian_lowrank(10_000, name="gaussian_lowrank_10k")


def gaussian_lowrank_100k():
    return gaussian_lowrank(100_000, name="gaussian_lowrank_100k")


TARGETS = {"gaussian_lowrank": gaussian_lowrank, "hierarchical_logistic": hierarchical_logistic,
           "latent_gp_poisson": latent_gp_poisson,
           "hierarchical_logistic_10k": hierarchical_logistic_10k,
           "gaussian_lowrank_10k": gaussian_lowrank_10k,
           "gaussian_lowrank_100k": gaussian_lowrank_100k}  # fmt: skip
#: Above this ``d`` the dense ``R`` (and the rank-8 learner's long warm-up) are not run: a
#: leapfrog step's two ``d x d`` products alone (2 10^8 flops at d = 10^4) would take the
#: cell hours on this machine's 2 cores.
DENSE_MAX_DIM = 2000


def _fisher(target, positions, key, rank, num_warmup=FISHER_WARMUP, **options):
    import fisher_mala as fm

    options = options if rank is None else {"rank": rank, **options}
    r = fm.sample(key, "fisher_nuts", target.logdensity_fn, positions,
                  num_warmup=num_warmup, num_samples=SAMPLES, metric="dense",
                  stopping_rule=False, diagnose=False, **options)  # fmt: skip
    return (np.asarray(r.samples), int(np.sum(r.num_grad_evals)), r.compile_seconds,
            r.warmup_seconds, r.sampling_seconds)  # fmt: skip


def record_of(target, out, start: float) -> dict:
    """A cell's numbers from ``(draws, gradients, compile, warm-up and sampling seconds)``
    of a run that began at ``start`` (``time.perf_counter``)."""
    import fisher_mala as fm

    draws, grads, compile_s, warm_s, sample_s = out
    bulk = fm.ess(np.asarray(draws, np.float64), method="bulk")
    record = {
        "dim": target.dim, "chains": CHAINS,
        "bulk_min": float(np.nanmin(bulk)), "grad_evals": grads,
        "bulk_min_per_grad": float(np.nanmin(bulk) / grads),
        "bulk_min_per_second": float(np.nanmin(bulk) / (warm_s + sample_s)),
        "seconds": {"compile": compile_s, "warmup": warm_s, "sampling": sample_s,
                    "wall": time.perf_counter() - start},
        "dtype": "float64", "device_kind": jax.devices()[0].device_kind, "jax": jax.__version__,
    }  # fmt: skip
    if "factors" in target.extras:
        record["directions_bulk"] = [float(e) for e in direction_ess(target, draws)]
    return record


def direction_ess(target, draws) -> np.ndarray:
    """Bulk ESS of the draws along the Gaussian's rank-8 directions: ``S^(-1/2) U^T
    D^(-1/2) x``, unit variance under the target. Their loadings spread over every
    coordinate, so at large ``d`` each coordinate's variance hardly depends on them and a
    sampler that crosses the loose directions slowly still mixes every coordinate; the
    min over the coordinates alone then flatters it."""
    import fisher_mala as fm

    diagonal, loadings, spectrum = target.extras["factors"]
    weights = loadings / np.sqrt(diagonal)[:, None] / np.sqrt(spectrum)
    projected = np.stack([np.asarray(chain, np.float64) @ weights for chain in draws])
    return fm.ess(projected, method="bulk")


def race_start(target, seed: int = 0, chains: int = CHAINS):
    """``(positions, key)``: the race's starts (0.1 times normal draws, float64) and the
    run's key, both from ``seed``."""
    key_init, key_run = jax.random.split(jax.random.key(seed))
    return jax.random.normal(key_init, (chains, target.dim), jnp.float64) * 0.1, key_run


def run_cell(target_name: str, sampler: str, rerun: bool = False, seed: int = 0) -> dict:
    """One cell, cached in ``<target>/<sampler>.json`` (another ``seed``: its starts and
    keys, in ``<target>/seed<seed>/<sampler>.json``)."""
    folder = RESULTS / target_name / (f"seed{seed}" if seed else "")
    path = folder / f"{sampler}.json"
    if path.exists() and not rerun:
        return json.loads(path.read_text())
    from benchmarks import versus_blackjax

    target = TARGETS[target_name]()
    positions, key_run = race_start(target, seed)
    start = time.perf_counter()
    if sampler == "fisher_nuts_rank8_long":
        out = _fisher(target, positions, key_run, 8, LONG_WARMUP)
    elif sampler in OPTIONS:
        diagonal = sampler.removeprefix("fisher_nuts_rank8_")
        out = _fisher(target, positions, key_run, 8, low_rank_diagonal=diagonal)
    elif sampler.startswith("fisher_nuts"):
        out = _fisher(target, positions, key_run, 8 if sampler.endswith("rank8") else None)
    elif sampler == "nuts_diag":
        out = versus_blackjax._run_nuts(target, positions, key_run, True, NUTS_WARMUP, SAMPLES)
    else:
        out = versus_blackjax._run_nutpie(target, positions, 0, sampler.removeprefix("nutpie_"),
                                          NUTS_WARMUP, SAMPLES)  # fmt: skip
    record = {"target": target_name, "sampler": sampler, **record_of(target, out, start)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    print(f"{target_name:22s} {sampler:18s} min ESS {record['bulk_min']:8.1f} "
          f"ESS/s {record['bulk_min_per_second']:9.2f} ESS/grad {record['bulk_min_per_grad']:.2e}",
          flush=True)  # fmt: skip
    return record


def seeds_table(target_name: str, samplers: list[str], seeds: list[int]) -> str:
    """Per-gradient min bulk ESS of ``samplers`` on ``target_name`` for each seed (0: the
    race's cells): over the coordinates, along the rank-8 directions, and the smaller of
    the two (the directions table's figure), with that over the last sampler's (e.g.
    ``fisher_nuts_rank8,fisher_nuts_dense``: the rank-8 learner against the dense ``R``)."""

    def per_gradient(cell):
        coordinates = cell["bulk_min"] / cell["grad_evals"]
        along = min(cell["directions_bulk"]) / cell["grad_evals"]
        return coordinates, along, min(coordinates, along)

    rows = []
    for seed in seeds:
        cells = [run_cell(target_name, sampler, seed=seed) for sampler in samplers]
        last = per_gradient(cells[-1])[2]
        for sampler, cell in zip(samplers, cells, strict=True):
            figures = per_gradient(cell)
            rows.append([seed, sampler, *(f"{v:.2e}" for v in figures),
                         f"{figures[2] / last:.3f}"])  # fmt: skip
    return templating.table(["seed", "sampler", "per gradient, coordinates",
                             "per gradient, directions", "per gradient, the smaller",
                             f"the smaller over {samplers[-1]}'s"], rows)  # fmt: skip


#: ``--placement``: runs of the ``fisher_nuts_rank8`` cell per ``chain_method``, in turns.
PLACEMENT_REPEATS = 2


def placement(target_name: str, repeats: int = PLACEMENT_REPEATS) -> str:
    """The ``fisher_nuts_rank8`` cell of ``target_name`` with its chains batched
    (``chain_method="vectorized"``) and one after the other (``"sequential"``), ``repeats``
    runs each, alternating so that the machine's drift falls on both (each run cached in
    ``<target>/placement/<method>_<i>.json``): what ``chain_method="auto"`` should choose
    there. Returns the table of runs."""
    target = TARGETS[target_name]()
    positions, key_run = race_start(target)
    rows = []
    for i in range(repeats):
        for method in ("vectorized", "sequential"):
            path = RESULTS / target_name / "placement" / f"{method}_{i}.json"
            if not path.exists():
                start = time.perf_counter()
                out = _fisher(target, positions, key_run, 8, chain_method=method)
                record = {"target": target_name, "chain_method": method, "run": i,
                          **record_of(target, out, start)}  # fmt: skip
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(record, indent=1))
            r = json.loads(path.read_text())
            seconds = r["seconds"]["warmup"] + r["seconds"]["sampling"]
            rows.append([method, i, f"{r['bulk_min']:.0f}", f"{r['bulk_min_per_second']:.3g}",
                         f"{r['bulk_min_per_grad']:.2e}", f"{seconds:.0f}",
                         f"{1e6 * seconds / r['grad_evals']:.0f}"])  # fmt: skip
            print(rows[-1], flush=True)
    return templating.table(["chain_method", "run", "min bulk ESS", "per second",
                             "per gradient", "warm-up + sampling (s)", "µs per gradient"],
                            rows)  # fmt: skip


def render() -> str:
    rows = []
    for target in TARGETS:
        cells = {s: json.loads(p.read_text()) for s in SAMPLERS
                 if (p := RESULTS / target / f"{s}.json").exists()}  # fmt: skip
        mine = [r for s, r in cells.items()
                if s.startswith("fisher_nuts_rank8") and s not in OPTIONS]  # fmt: skip
        if not mine:
            continue
        # the better default rank-8 cell (either warm-up) in each unit, against every other
        best_second = max(r["bulk_min_per_second"] for r in mine)
        best_grad = max(r["bulk_min_per_grad"] for r in mine)
        for s, r in cells.items():
            rows.append([
                target, r["dim"], s, f"{r['bulk_min']:.0f}", f"{r['bulk_min_per_second']:.3g}",
                f"{r['bulk_min_per_grad']:.2e}",
                "" if s.startswith("fisher_nuts_rank8")
                else f"{best_second / r['bulk_min_per_second']:.2f}",
                "" if s.startswith("fisher_nuts_rank8")
                else f"{best_grad / r['bulk_min_per_grad']:.2f}",
            ])  # fmt: skip
    text = templating.table(
        ["target", "d", "sampler", "min bulk ESS", "per second", "per gradient",
         "best rank-8 over it, /s", "best rank-8 over it, /grad"], rows)  # fmt: skip
    TABLE.write_text(text + "\n")
    directions = directions_table()
    DIRECTIONS_TABLE.write_text(directions + "\n")
    return text + "\n\n" + directions


def directions_table() -> str:
    """The Gaussians' cells that recorded the ESS along the rank-8 directions
    (:func:`direction_ess`): min bulk ESS over the coordinates and over the directions, and
    per second and per gradient by the smaller of the two."""
    rows = []
    for target in TARGETS:
        cells = {s: r for s in SAMPLERS
                 if (p := RESULTS / target / f"{s}.json").exists()
                 and "directions_bulk" in (r := json.loads(p.read_text()))}  # fmt: skip
        if "fisher_nuts_rank8" not in cells:
            continue
        both = {s: min(r["bulk_min"], min(r["directions_bulk"])) for s, r in cells.items()}
        per_wall_second = {s: r["bulk_min_per_second"] / r["bulk_min"] for s, r in cells.items()}
        per_second = {s: both[s] * per_wall_second[s] for s in cells}
        per_grad = {s: both[s] / r["grad_evals"] for s, r in cells.items()}
        for s, r in cells.items():
            mine = s == "fisher_nuts_rank8"
            rows.append([
                target, r["dim"], s, f"{r['bulk_min']:.0f}", f"{min(r['directions_bulk']):.0f}",
                f"{per_second[s]:.3g}", f"{per_grad[s]:.2e}",
                "" if mine else f"{per_second['fisher_nuts_rank8'] / per_second[s]:.2f}",
                "" if mine else f"{per_grad['fisher_nuts_rank8'] / per_grad[s]:.2f}",
            ])  # fmt: skip
    return templating.table(
        ["target", "d", "sampler", "min bulk ESS, coordinates", "min bulk ESS, directions",
         "per second", "per gradient", "rank 8 over it, /s", "rank 8 over it, /grad"],
        rows)  # fmt: skip


def inspect(target_name: str) -> None:
    """One rank-8 Fisher NUTS run of a target (the race's warm-up, 500 draws): per chain,
    the extreme eigenvalues of ``R^T H R``, ``H`` the negative Hessian of the log density
    at the draws' mean (all equal when ``R`` whitens the posterior there; a small one is a
    direction ``R`` holds too narrow, printed by its largest coordinates)."""
    import fisher_mala as fm
    from fisher_mala.square_roots import dense

    target = TARGETS[target_name]()
    positions, key_run = race_start(target)
    r = fm.sample(key_run, "fisher_nuts", target.logdensity_fn, positions,
                  num_warmup=FISHER_WARMUP, num_samples=500, metric="dense",
                  stopping_rule=False, diagnose=False, rank=8)  # fmt: skip
    mean = jnp.asarray(np.asarray(r.samples).reshape(-1, target.dim).mean(0))
    hessian = -np.asarray(jax.hessian(target.logdensity_fn)(mean))
    top = np.sort(np.linalg.eigvalsh(hessian))[::-1][:10]
    print(f"{target_name}: largest eigenvalues of H", np.round(top, 1))
    for c in range(CHAINS):
        matrix = np.asarray(dense(jax.tree.map(lambda x, c=c: x[c], r.parameters.sqrt_precond)))
        eig, vectors = np.linalg.eigh(matrix.T @ hessian @ matrix)
        narrow = matrix @ vectors[:, 0]  # the direction R holds narrowest, in x
        narrow /= np.linalg.norm(narrow)
        top = np.argsort(-np.abs(narrow))[:3]
        print(f"chain {c}: eigenvalues of R^T H R: largest {eig.max():.3g}, median "
              f"{np.median(eig):.3g}, smallest {eig.min():.3g}, along coordinates {top} "
              f"(weights {np.round(np.abs(narrow[top]), 2)})")  # fmt: skip
    print("leapfrog steps per draw", float(np.mean(r.sample_stats["num_grad_evals"])))


def probe(target_name: str, draws: int = 40, seed: int = 0, robust_uturn: bool = True,
          diagonal: str = "whitened", chains: int = 1) -> None:
    """One chain of rank-8 Fisher NUTS after the race's warm-up, a few draws: the cost of a
    gradient, the warm-up's seconds and the gradients per draw (the tree's size), which
    say how long a cell would take before running one. ``seed`` 0 is the race's first
    chain's start and key; others are other chains. ``robust_uturn=False``: BlackJAX's
    U-turn criterion (``--robust-uturn off``). ``diagonal``: ``low_rank_diagonal``
    (``--diagonal learned``). ``chains``: that many chains in one run, as a cell runs them
    (vmapped: each iteration costs the largest tree of any chain), each chain's tree
    size, step, ``D``'s range and ``R``'s factors printed."""
    import fisher_mala as fm

    target = TARGETS[target_name]()
    positions, key_run = race_start(target, seed, chains)
    gradient = jax.jit(jax.value_and_grad(target.logdensity_fn))
    jax.block_until_ready(gradient(positions[0]))
    start = time.perf_counter()
    for _ in range(20):
        jax.block_until_ready(gradient(positions[0]))
    seconds = (time.perf_counter() - start) / 20
    r = fm.sample(key_run, "fisher_nuts", target.logdensity_fn, positions,
                  num_warmup=FISHER_WARMUP, num_samples=draws, metric="dense",
                  stopping_rule=False, diagnose=False, rank=8,
                  robust_uturn=robust_uturn, low_rank_diagonal=diagonal)  # fmt: skip
    steps = np.asarray(r.sample_stats["num_grad_evals"])
    print(f"{target_name} (seed {seed}, {diagonal} diagonal): d = {target.dim}, "
          f"a gradient {seconds * 1e3:.2f} ms, "
          f"warm-up {r.warmup_seconds:.1f} s, gradients per draw {steps.mean():.1f} (median "
          f"{np.median(steps):.0f}, max {steps.max()}), "
          f"step {float(np.asarray(r.parameters.step_size).ravel()[0]):.3g}")  # fmt: skip
    if chains > 1:
        root = jax.tree.map(np.asarray, r.parameters.sqrt_precond)
        scale = root.scale / np.median(root.scale, axis=1, keepdims=True)
        for c in range(chains):
            print(f"  chain {c}: gradients per draw {steps[c].mean():.1f} (max {steps[c].max()}), "
                  f"step {np.asarray(r.parameters.step_size).ravel()[c]:.3g}, D^(1/2) over its "
                  f"median {scale[c].min():.2f} to {scale[c].max():.2f}, factors c "
                  f"{np.round(np.sort(root.factors[c]), 2)}")  # fmt: skip
        return
    if draws >= 100:  # enough to measure R along its own directions, and a min ESS
        _print_fit(target, r)


def _print_fit(target, r) -> None:
    """How the chain's rank-8 ``R`` fits its draws along its own directions ``q`` (in
    ``D``-scaled coordinates): the geometric mean of the whitened draws' and gradients'
    variances along each (1 where ``R`` fits; the diagonal of the ``k x k`` measure of
    ``geometric_widening._remeasured``), and the draws' min bulk ESS per gradient."""
    import fisher_mala as fm

    x = np.asarray(r.samples)[0]
    root = jax.tree.map(lambda a: np.asarray(a)[0], r.parameters.sqrt_precond)
    q, c = root.basis, root.factors
    grads = np.asarray(jax.jit(jax.vmap(jax.grad(target.logdensity_fn)))(jnp.asarray(x)))
    scaled_g = grads * root.scale  # D^{1/2} g
    along_x = ((x - x.mean(0)) / root.scale) @ q / (1.0 + c)  # R^{-1} x along q
    along_g = scaled_g @ q * (1.0 + c)  # R^T g along q
    # |R^T g|^2 = |D^{1/2} g|^2 + sum_k ((1 + c_k)^2 - 1) (q_k^T D^{1/2} g)^2
    squares = np.sum(scaled_g**2, axis=1) + ((scaled_g @ q) ** 2) @ ((1.0 + c) ** 2 - 1.0)
    fisher_scale = target.dim / np.mean(squares)
    ratio = np.sqrt(along_x.var(0, ddof=1) / along_g.var(0, ddof=1)) / fisher_scale
    steps = np.asarray(r.sample_stats["num_grad_evals"])
    ess = fm.ess(x[None], method="bulk")
    print(f"  along R's directions, the draws' geometric-mean variance over R's: "
          f"{np.round(np.sort(ratio), 2)}; min bulk ESS {ess.min():.0f} of {len(x)} draws, "
          f"{ess.min() / steps.sum():.2e} per gradient")  # fmt: skip
    if "factors" in target.extras:  # a Gaussian: how much of each true direction R holds
        loadings, spectrum = target.extras["factors"][1:]
        print(f"  factors c {np.round(np.sort(c), 2)}; |Q^T u| along the true directions "
              f"(variance {', '.join(f'{v:g}' for v in spectrum)}): "
              f"{np.round(np.linalg.norm(q.T @ loadings, axis=0), 2)}")  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--samplers", default=",".join(SAMPLERS))
    parser.add_argument("--inspect", metavar="TARGET",
                        help="one rank-8 run: how well its R whitens the posterior")  # fmt: skip
    parser.add_argument("--probe", metavar="TARGET",
                        help="one chain, 40 draws: how long a cell would take")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0,
                        help="--probe: the start and key (0: the race's first chain)")  # fmt: skip
    parser.add_argument("--draws", type=int, default=40,
                        help="--probe: draws (100 or more: R's fit too)")  # fmt: skip
    parser.add_argument("--remeasure", choices=("on", "off"), default="on",
                        help="--probe: off: the widening rescales D only")  # fmt: skip
    parser.add_argument("--diagonal", choices=("learned", "unit", "whitened"),
                        default="whitened", help="--probe: low_rank_diagonal")  # fmt: skip
    parser.add_argument("--chains", type=int, default=1,
                        help="--probe: chains in the run (a cell's 4: lockstep cost)")  # fmt: skip
    parser.add_argument("--robust-uturn", choices=("on", "off"), default="on",
                        help="--probe: NUTS's U-turn checks across subtrees")  # fmt: skip
    parser.add_argument("--placement", metavar="TARGET",
                        help="the rank-8 cell batched and sequential, in turns")  # fmt: skip
    parser.add_argument("--rerun", action="store_true",
                        help="run the cells of --targets and --samplers again, recorded or not")
    parser.add_argument("--seeds", metavar="S1,S2,...",
                        help="the cells of --targets and --samplers at these seeds' starts "
                        "and keys, per gradient (the Gaussians' directions too)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.seeds:
        with jax.enable_x64(True):
            for target in args.targets.split(","):
                print(seeds_table(target, args.samplers.split(","),
                                  [int(s) for s in args.seeds.split(",")]))  # fmt: skip
        return
    if args.placement:
        with jax.enable_x64(True):
            print(placement(args.placement))
        return
    if args.probe:
        if args.remeasure == "off":  # every ratio within the band: R's factors kept
            from fisher_mala import geometric_widening

            geometric_widening.LOW_RANK_REMEASURE_THRESHOLD = float("inf")
        with jax.enable_x64(True):
            probe(args.probe, args.draws, seed=args.seed,
                  robust_uturn=args.robust_uturn == "on", diagonal=args.diagonal,
                  chains=args.chains)
        return
    if args.inspect:
        with jax.enable_x64(True):
            inspect(args.inspect)
        return
    if not args.render:
        with jax.enable_x64(True):
            for target in args.targets.split(","):
                for sampler in args.samplers.split(","):
                    big = sampler in ("fisher_nuts_dense", "fisher_nuts_rank8_long")
                    if big and TARGETS[target]().dim > DENSE_MAX_DIM:
                        continue
                    if sampler == "fisher_nuts_rank8_unit" and target not in UNIT_PRIOR:
                        continue
                    try:
                        run_cell(target, sampler, args.rerun)
                    except Exception as err:
                        print(f"{target} {sampler}: {type(err).__name__}: {str(err)[:300]}")
    print(render())


if __name__ == "__main__":
    main()
