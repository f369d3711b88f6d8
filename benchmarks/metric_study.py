"""Which metric should NUTS use? The same NUTS, the same step-size rule, six metrics.

    python -m benchmarks.metric_study            # every cell, cached; then the table
    python -m benchmarks.metric_study --seed 1   # the repeat with other keys
    python -m benchmarks.metric_study --residual kilpisjarvi [--damping 10 --warmup 20000]
    python -m benchmarks.metric_study --render   # the table only

Per target, float64, 4 chains, the same starts and keys for every metric:

1. FisherMALA runs 5000 warm-up iterations (Algorithm 1 with Fisher NUTS's damping,
   ``FISHER_NUTS_DAMPING``, as in Fisher NUTS's Fisher phase) and 2000 more with ``R``
   frozen;
   each chain's learned ``A = R R^T`` and its 2000 draws and gradients are the
   "warm-up" every metric below may use;
2. BlackJAX's NUTS (multinomial, 10 doublings) then runs from each chain's last draw,
   with the chain's metric fixed: 1000 iterations of dual averaging of the step (target
   acceptance 0.8, BlackJAX's default) and 2000 draws. Reported: the sampling phase's min
   bulk ESS (ArviZ's rank-normalized, over all coordinates and 4 chains) per gradient.

The metrics (inverse mass matrices):

* ``fisher_learned``: ``A``, what Fisher NUTS uses today;
* ``fisher_exact``: ``I^{-1}``, ``I = E[g g^T]`` from reference draws;
* ``covariance_exact``: the posterior covariance from reference draws;
* ``nutpie_diagonal``: ``diag(sqrt(var(x) / var(g)))`` of the chain's warm-up draws and
  gradients (nutpie's diagonal metric);
* ``nutpie_full``: the geometric mean ``Cov(x) # Cov(g)^{-1}`` of the same draws
  and gradients (the full-rank limit of nutpie's low-rank metric, Seyboldt et al.);
* ``fisher_and_draws``: the geometric mean ``A # Cov(x)``: the Fisher recursion's shape and
  the draws' spread.

Reference draws: exact for the targets of ``benchmarks.signal_bias``; for the posteriors,
4 chains x 10000 draws of Fisher NUTS (cached). Cells in ``results/metric_study/``.
"""

import argparse
import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import signal_bias, templating

RESULTS = Path(__file__).resolve().parent / "results" / "metric_study"
TABLE = RESULTS.parent / "metric_study.md"
CHAINS = 4
FISHER_WARMUP, WARMUP_DRAWS, NUTS_ADAPT, NUTS_DRAWS = 5000, 2000, 1000, 2000
NUTS_TARGET_ACCEPTANCE = 0.8
#: Repeats with other warm-up and NUTS keys (``--seed``), for the noise of the comparison.
SEEDS = 2
METRICS = (
    "fisher_learned",
    "fisher_exact",
    "covariance_exact",
    "nutpie_diagonal",
    "nutpie_full",
    "fisher_and_draws",
)
EXACT = tuple(signal_bias.TARGETS)
POSTERIORS = ("arK", "kilpisjarvi", "eight_schools_noncentered", "heart", "ripley")


def _key(base: int, seed: int):
    """The key of seed 0 (the recorded cells) or of a repeat."""
    key = jax.random.key(base)
    return key if seed == 0 else jax.random.fold_in(key, seed)


def _target(name):
    """``(logdensity, dim, initial positions (CHAINS, d))``."""
    if name in EXACT:
        logdensity, draw, dim, _ = signal_bias.TARGETS[name]()
        return logdensity, dim, draw(jax.random.key(11), CHAINS)
    import fisher_mala as fm

    target = fm.targets.get(name)
    x0 = target.initial_positions(jax.random.key(11), CHAINS, jnp.float64)
    return target.logdensity_fn, target.dim, x0


def _reference(name):
    """Reference draws ``(n, d)`` (exact, or long Fisher NUTS runs, cached)."""
    path = RESULTS / f"reference_{name}.npz"
    if path.exists():
        return np.load(path)["draws"]
    if name in EXACT:
        _, draw, _, _ = signal_bias.TARGETS[name]()
        draws = np.asarray(draw(jax.random.key(12), 100_000))
    else:
        import fisher_mala as fm

        logdensity, _, x0 = _target(name)
        result = fm.sample(jax.random.key(12), "fisher_nuts", logdensity, x0,
                           num_samples=10_000, diagnose=False)  # fmt: skip
        draws = np.asarray(result.samples).reshape(-1, x0.shape[1])
    RESULTS.mkdir(parents=True, exist_ok=True)
    np.savez(path, draws=draws)
    return draws


def geometric_mean(a, b):
    """``a # b = a^{1/2} (a^{-1/2} b a^{-1/2})^{1/2} a^{1/2}`` (symmetric positive definite)."""

    def power(m, p):
        w, v = np.linalg.eigh(m)
        return (v * w**p) @ v.T

    root, inverse_root = power(a, 0.5), power(a, -0.5)
    return root @ power(inverse_root @ b @ inverse_root, 0.5) @ root


def _warmup(name, seed=0, damping=None, num_warmup=FISHER_WARMUP):
    """Per chain: learned ``A``, warm-up draws and gradients (``damping``: Fisher NUTS's
    by default)."""
    import fisher_mala as fm

    logdensity, _, x0 = _target(name)
    from fisher_mala.whitened_warmup import FISHER_NUTS_DAMPING

    # Fisher NUTS's Fisher phase: Algorithm 1 with its damping (0.1, not Algorithm 1's 10)
    damping = FISHER_NUTS_DAMPING if damping is None else damping
    result = fm.sample(_key(13, seed), "fisher_mala", logdensity, x0,
                       num_warmup=num_warmup, num_samples=WARMUP_DRAWS,
                       damping=damping, diagnose=False)  # fmt: skip
    r = np.asarray(result.parameters.sqrt_precond)
    x = np.asarray(result.samples)
    g = np.asarray(jax.vmap(jax.vmap(jax.grad(logdensity)))(jnp.asarray(x)))
    return r @ np.swapaxes(r, 1, 2), x, g


def metrics(name, seed=0) -> dict:
    """``{metric: (CHAINS, d, d)}`` for one target."""
    logdensity, dim, _ = _target(name)
    ref = _reference(name)
    grads = np.asarray(jax.vmap(jax.grad(logdensity))(jnp.asarray(ref)))
    fisher_exact = np.linalg.inv(grads.T @ grads / grads.shape[0])
    cov_exact = np.cov(ref.T).reshape(dim, dim)
    learned, x, g = _warmup(name, seed)
    out = {m: [] for m in METRICS}
    for c in range(CHAINS):
        cov_x = np.cov(x[c].T).reshape(dim, dim)
        cov_g = np.cov(g[c].T).reshape(dim, dim)
        out["fisher_learned"].append(learned[c])
        out["fisher_exact"].append(fisher_exact)
        out["covariance_exact"].append(cov_exact)
        out["nutpie_diagonal"].append(np.diag(np.sqrt(np.diag(cov_x) / np.diag(cov_g))))
        out["nutpie_full"].append(geometric_mean(cov_x, np.linalg.inv(cov_g)))
        out["fisher_and_draws"].append(geometric_mean(learned[c], cov_x))
    return {m: np.stack(v) for m, v in out.items()}, x[:, -1]


@functools.lru_cache
def nuts_runner(logdensity):
    """``(keys, starts, metrics) -> (draws, steps, step sizes)``: 4 chains of NUTS with a
    fixed dense metric each, dual averaging then draws; compiled once per target."""
    import blackjax
    from blackjax.adaptation.step_size import dual_averaging_adaptation

    kernel = blackjax.mcmc.nuts.build_kernel()
    da_init, da_update, da_final = dual_averaging_adaptation(NUTS_TARGET_ACCEPTANCE)

    def chain(key, x0, inverse_mass):
        state = blackjax.mcmc.nuts.init(x0, logdensity)
        k_adapt, k_draw = jax.random.split(key)

        def adapt(carry, k):
            state, da = carry
            state, info = kernel(k, state, logdensity, jnp.exp(da.log_step_size), inverse_mass)
            return (state, da_update(da, info.acceptance_rate)), None

        (state, da), _ = jax.lax.scan(adapt, (state, da_init(0.1)),
                                      jax.random.split(k_adapt, NUTS_ADAPT))  # fmt: skip
        step = da_final(da)

        def draw(state, k):
            state, info = kernel(k, state, logdensity, step, inverse_mass)
            return state, (state.position, info.num_integration_steps)

        _, (xs, steps) = jax.lax.scan(draw, state, jax.random.split(k_draw, NUTS_DRAWS))
        return xs, steps, step

    return jax.jit(jax.vmap(chain))


def cell(name: str, seed: int = 0) -> dict:
    """One target's six metrics; ``seed`` > 0 repeats it with other warm-up and NUTS keys
    (the references and starts are the same)."""
    path = RESULTS / (f"{name}.json" if seed == 0 else f"{name}_seed{seed}.json")
    if path.exists():
        return json.loads(path.read_text())
    from fisher_mala import convergence

    logdensity, dim, _ = _target(name)
    chosen, starts = metrics(name, seed)
    rows = {}
    for metric in METRICS:
        keys = jax.random.split(_key(14, seed), CHAINS)
        run = nuts_runner(logdensity)
        xs, steps, step = run(keys, jnp.asarray(starts), jnp.asarray(chosen[metric]))
        ess = convergence.ess_bulk(np.asarray(xs))
        grads = int(np.sum(steps))
        rows[metric] = {
            "min_ess": float(np.min(ess)),
            "grads": grads,
            "min_ess_per_grad": float(np.min(ess)) / grads,
            "step_size": np.asarray(step).tolist(),
            "mean_steps": float(np.mean(steps)),
        }
        print(name, metric, rows[metric], flush=True)
    out = {"target": name, "dim": dim, "metrics": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    return out


def render() -> str:
    rows = []
    for name in EXACT + POSTERIORS:
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        c = json.loads(path.read_text())
        values = [c["metrics"][m]["min_ess_per_grad"] for m in METRICS]
        best = max(values)
        rows.append(
            (
                name,
                c["dim"],
                *(f"**{v:.4f}**" if v == best else f"{v:.4f}" for v in values),
            )
        )
    text = templating.table(("target", "d", *METRICS), rows)
    text += "\n\n" + _by_seed()
    TABLE.write_text(text + "\n")
    return text


def _by_seed() -> str:
    """Geometric mean over the targets of each metric's ESS per gradient relative to the
    learned ``A``, per seed (the seeds' spread is the noise of the comparison)."""
    rows = []
    for seed in range(SEEDS):
        cells = []
        for name in EXACT + POSTERIORS:
            path = RESULTS / (f"{name}.json" if seed == 0 else f"{name}_seed{seed}.json")
            if path.exists():
                cells.append(json.loads(path.read_text())["metrics"])
        if not cells:
            continue
        ratios = {
            m: np.exp(np.mean([np.log(c[m]["min_ess_per_grad"] / c["fisher_learned"]
                                      ["min_ess_per_grad"]) for c in cells]))
            for m in METRICS[1:]
        }  # fmt: skip
        rows.append((seed, len(cells), *(f"{ratios[m]:.2f}" for m in METRICS[1:])))
    return templating.table(
        ("seed", "targets", *(f"{m} / fisher_learned" for m in METRICS[1:])), rows
    )


def residual(name: str, seed: int = 0, damping=None, num_warmup=FISHER_WARMUP) -> dict:
    """How far each chain's learned ``A`` is from the reference covariance: the eigenvalues
    of ``Cov^{-1/2} A Cov^{-1/2}`` scaled to mean 1 (all 1 when ``A`` is proportional to the
    covariance; their ratio is the condition number NUTS is left with), and the
    covariance's own eigenvalues."""
    cov = np.cov(_reference(name).T)
    w, v = np.linalg.eigh(cov)
    root = (v * w**-0.5) @ v.T
    learned, _, _ = _warmup(name, seed, damping, num_warmup)
    left = [np.linalg.eigvalsh(root @ a @ root) for a in learned]
    return {
        "covariance_eigenvalues": w.tolist(),
        "whitened_eigenvalues": [(e / e.mean()).tolist() for e in left],
        "condition_numbers": [float(e.max() / e.min()) for e in left],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true", help="the table only")
    parser.add_argument("--targets", nargs="*", default=list(EXACT + POSTERIORS))
    parser.add_argument("--seed", type=int, default=0, help=f"0 to {SEEDS - 1}")
    parser.add_argument("--residual", metavar="TARGET", help="the learned A against the truth")
    parser.add_argument("--damping", type=float, help="--residual: the Fisher damping")
    parser.add_argument("--warmup", type=int, default=FISHER_WARMUP, help="--residual: its length")
    args = parser.parse_args()
    with jax.enable_x64(True):
        if args.residual:
            out = residual(args.residual, args.seed, args.damping, args.warmup)
            print(json.dumps(out, indent=1))
            return
        if not args.render:
            for name in args.targets:
                cell(name, args.seed)
        print(render())


if __name__ == "__main__":
    main()
