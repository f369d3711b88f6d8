"""Is the score-difference signal a biased estimate of ``I^{-1}``? (the paper's Section 7,
first open question).

    python -m benchmarks.signal_bias            # every cell, cached; then the table
    python -m benchmarks.signal_bias --render   # the table and figure only

What FisherMALA's recursion (Proposition 4) converges to is the ``A`` that solves

    A^{-1}  proportional to  S(A) = E_{x ~ pi, y ~ q_A(x, .)}[alpha(x, y) d d^T],
    d = grad log pi(y) - grad log pi(x),

(the Rao-Blackwellized signal of Eq. (16); the increment of Eq. (15) has the same
expectation). This script computes that fixed point by a damped iteration on exact
draws of ``pi`` (``fixed_point``, the step ``sigma^2`` set for the target acceptance at
every iterate), compares it with ``I^{-1}`` and with the small-step prediction
``A^{-1} proportional to E[H A H]`` (``H`` the Hessian of ``log pi``; derivation on the docs
page), and measures what the warm-ups learn (``learned``): per target, signal and
warm-up length ``n``, 8 independent chains, the relative Frobenius error of their mean
(the bias) and their spread (the variance), all matrices scaled to trace ``d``.
Cells are cached in ``benchmarks/results/signal_bias/``.
"""

import argparse
import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import templating

RESULTS = Path(__file__).resolve().parent / "results" / "signal_bias"
TABLE = RESULTS.parent / "signal_bias.md"
FIGURE = Path(__file__).resolve().parents[1] / "docs" / "images" / "signal_bias.png"

#: Warm-up lengths and chains (independent estimates) of the measured cells.
LENGTHS = (1000, 4000, 16000, 64000)
CHAINS = 8
#: Exact draws for ``I`` and for the fixed point's expectations.
NUM_EXACT = 100_000
SIGNALS = ("rao_blackwell", "increment", "score", "pooled")


# --- targets with exact draws -------------------------------------------------------------


def _gaussian(dim=10, seed=0):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    cov = q @ np.diag(np.logspace(-1, 1, dim)) @ q.T
    chol = np.linalg.cholesky(cov)
    prec = np.linalg.inv(cov)

    def logdensity(x):
        return -0.5 * x @ (prec @ x)

    def draw(key, n):
        return jax.random.normal(key, (n, dim)) @ chol.T

    return logdensity, draw, dim, cov


def _student_t(nu=3.0):
    """Independent coordinates: N(0, 1), N(0, 2^2), t_nu, 2 t_nu."""
    scales = jnp.array([1.0, 2.0, 1.0, 2.0])
    heavy = jnp.array([False, False, True, True])

    def logdensity(x):
        z = x / scales
        t = -0.5 * (nu + 1) * jnp.log1p(z**2 / nu)
        return jnp.sum(jnp.where(heavy, t, -0.5 * z**2))

    def draw(key, n):
        k1, k2 = jax.random.split(key)
        gauss = jax.random.normal(k1, (n, 4))
        t = jax.random.t(k2, nu, (n, 4))
        return jnp.where(heavy, t, gauss) * scales

    # I_jj = 1 / s^2 (Gaussian), (nu + 1) / ((nu + 3) s^2) (Student-t)
    inverse_fisher = jnp.diag(jnp.where(heavy, (nu + 3) / (nu + 1), 1.0) * scales**2)
    return logdensity, draw, 4, inverse_fisher


def _log_gamma(shapes=(1.0, 2.0, 5.0, 20.0)):
    """Independent ``theta_j = log G_j``, ``G_j ~ Gamma(k_j, 1)``: the posterior of a log
    Poisson rate, skewed for small ``k``; ``I_jj = k_j``, ``E[h_j^2] = k_j (k_j + 1)``."""
    k = jnp.asarray(shapes)

    def logdensity(x):
        return jnp.sum(k * x - jnp.exp(x))

    def draw(key, n):
        return jnp.log(jax.random.gamma(key, k, (n, k.size)))

    return logdensity, draw, k.size, jnp.diag(1.0 / k)


def _banana(b=0.1, s1=10.0):
    """Haario's twisted Gaussian: ``x1 ~ N(0, s1^2)``, ``x2 + b (x1^2 - s1^2) ~ N(0, 1)``."""

    def logdensity(x):
        return -0.5 * (x[0] / s1) ** 2 - 0.5 * (x[1] + b * (x[0] ** 2 - s1**2)) ** 2

    def draw(key, n):
        z = jax.random.normal(key, (n, 2))
        x1 = s1 * z[:, 0]
        return jnp.stack([x1, z[:, 1] - b * (x1**2 - s1**2)], axis=1)

    return logdensity, draw, 2, None  # I from exact draws


TARGETS = {
    "gaussian_d10": _gaussian,
    "student_t_d4": _student_t,
    "log_gamma_d4": _log_gamma,
    "banana_d2": _banana,
}


def _normalized(a):
    return a * (a.shape[-1] / jnp.trace(a, axis1=-2, axis2=-1))[..., None, None]


def relative_error(a, b) -> float:
    """``||a - b||_F / ||b||_F`` of the two matrices scaled to trace ``d``."""
    a, b = _normalized(jnp.asarray(a)), _normalized(jnp.asarray(b))
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def fisher_information(logdensity, x):
    """``E[g g^T]`` over the rows of ``x`` and its Monte Carlo standard error (entrywise)."""
    g = jax.vmap(jax.grad(logdensity))(x)
    outer = g[:, :, None] * g[:, None, :]
    return outer.mean(0), outer.std(0) / np.sqrt(x.shape[0])


@functools.partial(jax.jit, static_argnums=0)
def hessian_sandwich(logdensity, x, a):
    """``E[H A H]`` over the rows of ``x`` (the small-step limit of ``S(A) / sigma^2``)."""
    h = jax.vmap(jax.hessian(logdensity))(x)
    return jnp.einsum("nij,jk,nkl->il", h, a, h) / x.shape[0]


@functools.partial(jax.jit, static_argnums=0)
def signal_moment(logdensity, x, noise, a, sigma2):
    """``(S(A), mean acceptance)``: ``E[alpha d d^T]`` of MALA proposals from the rows of
    ``x`` with preconditioner ``a`` and step ``sigma2`` (``noise`` standard normal)."""
    chol = jnp.linalg.cholesky(a)
    value_and_grad = jax.vmap(jax.value_and_grad(logdensity))
    lx, gx = value_and_grad(x)
    y = x + 0.5 * sigma2 * gx @ a + jnp.sqrt(sigma2) * noise @ chol.T
    ly, gy = value_and_grad(y)

    inverse = jnp.linalg.inv(a)

    def log_q(to, frm, g_frm):  # log N(to; frm + sigma2/2 A g, sigma2 A), up to a constant
        r = to - frm - 0.5 * sigma2 * g_frm @ a
        return -0.5 * jnp.sum(r * (r @ inverse), axis=1) / sigma2

    log_ratio = ly + log_q(x, y, gy) - lx - log_q(y, x, gx)
    alpha = jnp.where(jnp.isfinite(log_ratio), jnp.exp(jnp.minimum(log_ratio, 0.0)), 0.0)
    d = gy - gx
    return jnp.einsum("n,ni,nj->ij", alpha, d, d) / x.shape[0], alpha.mean()


def step_for_acceptance(logdensity, x, noise, a, target=0.574, guess=None):
    """``sigma^2`` whose mean acceptance is ``target`` (bisection in ``log sigma^2`` with
    common random numbers, around ``guess`` when given)."""
    lo, hi = (-20.0, 5.0) if guess is None else (np.log(guess) - 2.0, np.log(guess) + 2.0)
    for _ in range(24):
        mid = 0.5 * (lo + hi)
        _, acc = signal_moment(logdensity, x, noise, a, jnp.exp(mid))
        lo, hi = (mid, hi) if acc > target else (lo, mid)
    return float(np.exp(0.5 * (lo + hi)))


def fixed_point(logdensity, x, noise, target=0.574, iterations=16):
    """The ``A`` (trace ``d``) with ``A^{-1}`` proportional to ``S(A)`` at the step for
    ``target``: damped iteration ``Q <- (Q + S(A) / tr-scale) / 2``, ``A = Q^{-1}``.
    Returns ``(A, sigma^2, history of relative changes)``."""
    dim = x.shape[1]
    a = jnp.eye(dim)
    history, sigma2 = [], None
    for _ in range(iterations):
        sigma2 = step_for_acceptance(logdensity, x, noise, a, target, sigma2)
        s, _ = signal_moment(logdensity, x, noise, a, sigma2)
        q = jnp.linalg.inv(a)
        q = 0.5 * (q / jnp.trace(q) + s / jnp.trace(s)) * dim
        new = _normalized(jnp.linalg.inv(q))
        history.append(relative_error(new, a))
        a = new
    return a, sigma2, history


def learned(target_name, signal, num_warmup, seed=0):
    """``(CHAINS, d, d)``: the ``A = R R^T`` learned by FisherMALA's warm-up of
    ``num_warmup`` iterations, one per independent chain, scaled to trace ``d``."""
    from fisher_mala import warmups

    logdensity, draw, dim, _ = TARGETS[target_name]()
    key_x, key_run = jax.random.split(jax.random.key(seed))
    x0 = draw(key_x, CHAINS)
    keys = jax.random.split(key_run, CHAINS)
    if signal == "pooled":
        warmup = warmups.pooled_fisher_mala_warmup(logdensity)
        (_, parameters), _ = jax.jit(lambda k, x: warmup.run(k, x, num_warmup))(keys[0], x0)
        r = jnp.broadcast_to(parameters.sqrt_precond, (CHAINS, dim, dim))
    else:
        warmup = warmups.fisher_mala_warmup(logdensity, signal=signal)
        run = jax.jit(jax.vmap(lambda k, x: warmup.run(k, x, num_warmup)[0][1].sqrt_precond))
        r = run(keys, x0)
    return _normalized(r @ jnp.swapaxes(r, -1, -2))


def theory_cell(target_name: str) -> dict:
    path = RESULTS / f"theory_{target_name}.json"
    if path.exists():
        return json.loads(path.read_text())
    logdensity, draw, dim, exact = TARGETS[target_name]()
    kx, kn = jax.random.split(jax.random.key(1))
    x = draw(kx, NUM_EXACT)
    noise = jax.random.normal(kn, x.shape)
    fisher, fisher_se = fisher_information(logdensity, x)
    estimated = _normalized(jnp.linalg.inv(fisher))
    inverse_fisher = estimated if exact is None else _normalized(jnp.asarray(exact))
    fixed, sigma2, history = fixed_point(logdensity, x, noise)
    # the small-step prediction: damped iteration of A^{-1} ~ E[H A H]
    a = jnp.eye(dim)
    for _ in range(60):
        q = jnp.linalg.inv(a)
        s = hessian_sandwich(logdensity, x, a)
        a = _normalized(jnp.linalg.inv(0.5 * (q / jnp.trace(q) + s / jnp.trace(s)) * dim))
    # the fixed point against the step: smaller steps (higher acceptance)
    by_step = {}
    for acceptance in (0.35, 0.574, 0.8, 0.95):
        point, step, _ = fixed_point(logdensity, x, noise, target=acceptance, iterations=10)
        by_step[str(acceptance)] = {
            "sigma2": step,
            "error_vs_inverse_fisher": relative_error(point, inverse_fisher),
        }
    cell = {
        "target": target_name,
        "dim": dim,
        "inverse_fisher": np.asarray(inverse_fisher).tolist(),
        "inverse_fisher_exact": exact is not None,
        "estimated_vs_exact": relative_error(estimated, inverse_fisher),
        "fisher_max_relative_se": float(jnp.max(fisher_se / jnp.abs(fisher).max())),
        "fixed_point": np.asarray(fixed).tolist(),
        "fixed_point_sigma2": sigma2,
        "fixed_point_last_change": history[-1],
        "fixed_point_error_vs_inverse_fisher": relative_error(fixed, inverse_fisher),
        "small_step": np.asarray(a).tolist(),
        "small_step_error_vs_inverse_fisher": relative_error(a, inverse_fisher),
        "fixed_point_error_vs_small_step": relative_error(fixed, a),
        "by_step": by_step,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cell, indent=1))
    return cell


def measured_cell(target_name: str, signal: str, num_warmup: int) -> dict:
    """The mean and spread (root mean square Frobenius distance to the mean) of the
    ``A`` learned by ``CHAINS`` chains, scaled to trace ``d``."""
    path = RESULTS / f"learned_{target_name}_{signal}_{num_warmup}.json"
    if path.exists():
        return json.loads(path.read_text())
    a = learned(target_name, signal, num_warmup)
    mean = a.mean(0)
    spread = float(jnp.sqrt(jnp.mean(jnp.sum((a - mean) ** 2, axis=(1, 2)))))
    out = {"target": target_name, "signal": signal, "num_warmup": num_warmup,
           "mean": np.asarray(mean).tolist(), "spread": spread}  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    return out


def errors(cell: dict, theory: dict, against: str) -> tuple[float, float]:
    """``(bias, sd)`` of a measured cell relative to ``theory[against]``."""
    truth = jnp.asarray(theory[against])
    norm = float(jnp.linalg.norm(_normalized(truth)))
    return relative_error(jnp.asarray(cell["mean"]), truth), cell["spread"] / norm


def render() -> str:
    theory = [json.loads((RESULTS / f"theory_{t}.json").read_text()) for t in TARGETS]
    rows = [
        (
            t["target"],
            t["dim"],
            f"{t['fixed_point_sigma2']:.3g}",
            f"{t['fixed_point_error_vs_inverse_fisher']:.3f}",
            f"{t['small_step_error_vs_inverse_fisher']:.3f}",
            f"{t['fixed_point_error_vs_small_step']:.3f}",
            " / ".join(f"{v['error_vs_inverse_fisher']:.3f}" for v in t["by_step"].values()),
        )
        for t in theory
    ]
    text = templating.table(
        (
            "target",
            "d",
            "sigma^2 at 0.574",
            "fixed point vs I^-1",
            "small-step limit vs I^-1",
            "fixed point vs small-step",
            "fixed point vs I^-1, acceptance 0.35 / 0.574 / 0.8 / 0.95",
        ),
        rows,
    )
    measured = []
    for t, th in zip(TARGETS, theory, strict=True):
        for signal in SIGNALS:
            cells = [measured_cell(t, signal, n) for n in LENGTHS]
            against = [errors(c, th, "inverse_fisher") for c in cells]
            measured.append(
                (
                    t,
                    signal,
                    *(
                        f"{bias:.3f}" + ("" if signal == "pooled" else f" ± {sd:.3f}")
                        for bias, sd in against
                    ),
                    f"{errors(cells[-1], th, 'fixed_point')[0]:.3f}",
                )
            )
    text += "\n\n" + templating.table(
        (
            "target",
            "signal",
            *(
                f"n = {n}: bias ± sd vs I^-1 (pooled: one A)" if n == LENGTHS[0] else f"n = {n}"
                for n in LENGTHS
            ),
            f"n = {LENGTHS[-1]}: bias vs fixed point",
        ),
        measured,
    )
    TABLE.write_text(text + "\n")
    _figure()
    return text


def _figure() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for t in TARGETS:
        theory = json.loads((RESULTS / f"theory_{t}.json").read_text())
        cells = [measured_cell(t, "rao_blackwell", n) for n in LENGTHS]
        bias = [errors(c, theory, "inverse_fisher")[0] for c in cells]
        line = axes[0].loglog(LENGTHS, bias, "o-", label=t)[0]
        axes[0].axhline(theory["fixed_point_error_vs_inverse_fisher"], color=line.get_color(),
                        ls=":", lw=1)  # fmt: skip
        steps = theory["by_step"]
        errors_by_step = [v["error_vs_inverse_fisher"] for v in steps.values()]
        axes[1].plot([float(a) for a in steps], errors_by_step, "o-", color=line.get_color())
    axes[0].set(xlabel="warm-up length n", ylabel="||mean A_n - I^-1|| / ||I^-1||",
                title="learned (8 chains, Eq. 16); dotted: fixed point")  # fmt: skip
    axes[1].set(xlabel="target acceptance (larger: smaller sigma^2)",
                ylabel="fixed point vs I^-1",
                title="the fixed point's bias against the step")  # fmt: skip
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(FIGURE, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true", help="the table only")
    args = parser.parse_args()
    with jax.enable_x64(True):
        if not args.render:
            for t in TARGETS:
                print(t, {k: v for k, v in theory_cell(t).items() if "error" in k}, flush=True)
                for signal in SIGNALS:
                    for n in LENGTHS:
                        print(measured_cell(t, signal, n), flush=True)
        print(render())


if __name__ == "__main__":
    main()
