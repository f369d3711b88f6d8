"""How well the low-rank widening whitens the race's Gaussians, by residual directions searched.

Usage::

    python -m benchmarks.widening_residuals            # d = 1000, 10^4, 10^5 (about 8 min)
    python -m benchmarks.widening_residuals --render   # the table from the recorded cells

One chain of rank-8 Fisher NUTS (the race's start and key, its 5000 warm-up iterations) on
``benchmarks.low_rank_race``'s Gaussians, the low-rank widening's inputs (the kept draws and
gradients, whitened, and ``R``) caught as the step-size phase hands them over. On them, the
widening (:func:`fisher_mala.geometric_widening._widened_low_rank`) with ``p = k, 2k, 3k,
4k`` residual directions (:data:`~fisher_mala.geometric_widening.LOW_RANK_RESIDUAL_PER_RANK`),
in one pass over the kept rows and in three
(:data:`~fisher_mala.geometric_widening.LOW_RANK_WIDENING_PASSES`),
and for ``R`` before and after each, the whitened covariance ``R^-1 Sigma R^-T`` (matrix
free, ``scipy.sparse.linalg.eigsh``): its largest and smallest eigenvalues over its median
Rayleigh quotient (the rest's level) and their ratio, the condition number NUTS's step and
trajectories pay for, and the variance over that level of each of the eight directions'
functionals whose ESS the race reports (``low_rank_race.direction_ess``), seen through
``R``: 1 where ``R`` whitens them. The second table: the share of each true rank-8
direction that the principal directions of the kept draws, or of their residuals, hold
(``|P u|``, ``2k`` of each), which says why the draws alone do not find the loose
directions at large ``d``.

Cells cached in ``benchmarks/results/widening_residuals/<target>.json``; the tables in
``benchmarks/results/widening_residuals.md``.
"""

import argparse
import json
from pathlib import Path

import jax
import numpy as np

from benchmarks import low_rank_race

RESULTS = Path(__file__).parent / "results" / "widening_residuals"
TABLE = RESULTS.parent / "widening_residuals.md"
TARGETS = ("gaussian_lowrank", "gaussian_lowrank_10k", "gaussian_lowrank_100k")
PER_RANK = (1, 2, 3, 4)
#: Passes of the widening over the kept rows (``LOW_RANK_WIDENING_PASSES``), at every ``d``
#: here: the library runs one where the rows exceed ``LOW_RANK_WIDENING_PASSES_MAX_BYTES``.
PASSES = (1, 3)


def _label(per_rank: int, passes: int) -> str:
    return f"p={per_rank}k, {passes} pass{'es' if passes > 1 else ''}"


RANK = 8


def _caught_inputs(target):
    """The widening's inputs ``(R, moments, count)`` of the race's first chain."""
    import fisher_mala as fm
    from fisher_mala import geometric_widening as gw
    from fisher_mala.square_roots import LowRankSqrt

    caught, widened = {}, gw._widened_low_rank

    def keep(*arrays):
        caught["inputs"] = [np.asarray(a) for a in arrays]

    def catching(r, whitened_grad, moments, count, xp):
        jax.debug.callback(keep, r.scale, r.basis, r.factors, *moments, count)
        return widened(r, whitened_grad, moments, count, xp)

    gw._widened_low_rank = catching
    try:
        positions, key_run = low_rank_race.race_start(target, chains=1)
        fm.sample(key_run, "fisher_nuts", target.logdensity_fn, positions,
                  num_warmup=low_rank_race.FISHER_WARMUP, num_samples=1, metric="dense",
                  stopping_rule=False, diagnose=False, rank=RANK)  # fmt: skip
    finally:
        gw._widened_low_rank = widened
    scale, basis, factors, *moments, count = caught["inputs"]
    return LowRankSqrt(scale, basis, factors), gw.LowRankMoments(*moments), count


def _whitened_spectrum(target, root) -> dict:
    """The extreme eigenvalues of ``R^-1 Sigma R^-T`` over the rest's level."""
    from scipy.sparse.linalg import LinearOperator, eigsh

    diagonal, loadings, spectrum = target.extras["factors"]
    sd, q = np.sqrt(diagonal), root.basis
    inverse = 1.0 / (1.0 + root.factors) - 1.0

    def whitened_covariance(v):
        v = np.ravel(v)
        w = (v + q @ (inverse * (q.T @ v))) / root.scale  # R^-T v
        y = sd * w
        w = sd * (y + loadings @ ((spectrum - 1.0) * (loadings.T @ y)))  # Sigma w
        w = w / root.scale
        return w + q @ (inverse * (q.T @ w))  # R^-1 w

    operator = LinearOperator((target.dim, target.dim), whitened_covariance, dtype=np.float64)
    top = np.sort(eigsh(operator, k=3, which="LA", return_eigenvectors=False))[::-1]
    bottom = np.sort(eigsh(operator, k=3, which="SA", return_eigenvectors=False))
    probes = np.random.default_rng(0).normal(size=(target.dim, 32))
    probes /= np.linalg.norm(probes, axis=0)
    level = float(np.median([p @ whitened_covariance(p) for p in probes.T]))
    # the directions' functionals a^T x (a = D_t^-1/2 u, as `direction_ess`) read in the
    # whitened coordinates: w = R^T a = S D^1/2 a, their variance w^T W w / w^T w
    functionals = loadings / sd[:, None] * root.scale[:, None]
    functionals = functionals + q @ (root.factors[:, None] * (q.T @ functionals))
    along = [w @ whitened_covariance(w) / (w @ w) / level for w in functionals.T]
    return {"top": list(top / level), "bottom": list(bottom / level),
            "condition": float(top[0] / bottom[0]), "directions": along}  # fmt: skip


def _overlaps(target, root, moments) -> dict:
    """``|P u|`` of each true direction ``u`` (in ``D``-scaled coordinates, as ``R`` sees
    it) for ``P`` the projection on ``2k`` principal directions of the kept draws, or of
    their residuals."""
    from fisher_mala import geometric_widening as gw

    diagonal, loadings, _ = target.extras["factors"]
    u = loadings * np.sqrt(diagonal)[:, None] / root.scale[:, None]  # D^(-1/2) Sigma's root
    inverse = 1.0 / (1.0 + root.factors) - 1.0
    u = u + root.basis @ (inverse[:, None] * (root.basis.T @ u))  # R^-1 applied
    u = u / np.linalg.norm(u, axis=0)
    draws, grads = moments.draws, moments.grads
    centred = draws - draws.mean(0)
    top = np.linalg.svd(centred, full_matrices=False)[2][: 2 * RANK].T
    ratio, _, level = gw._coordinate_ratios(draws, grads, np)
    residual = gw._residual_directions(draws, grads, np.sqrt(ratio * level), 2 * RANK, np)
    residual = np.linalg.qr(residual)[0]
    return {"draws": list(np.linalg.norm(top.T @ u, axis=0)),
            "residuals": list(np.linalg.norm(residual.T @ u, axis=0))}  # fmt: skip


def run_cell(name: str) -> dict:
    from fisher_mala import geometric_widening as gw

    path = RESULTS / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    target = low_rank_race.TARGETS[name]()
    root, moments, count = _caught_inputs(target)
    record = {"dim": target.dim, "kept_draws": int(moments.draws.shape[0]),
              "before": _whitened_spectrum(target, root),
              "overlaps": _overlaps(target, root, moments)}  # fmt: skip
    default = (gw.LOW_RANK_RESIDUAL_PER_RANK, gw.LOW_RANK_WIDENING_PASSES,
               gw.LOW_RANK_WIDENING_PASSES_MAX_BYTES)  # fmt: skip
    try:
        gw.LOW_RANK_WIDENING_PASSES_MAX_BYTES = float("inf")  # the passes at every d
        for per_rank in PER_RANK:
            for passes in PASSES:
                gw.LOW_RANK_RESIDUAL_PER_RANK, gw.LOW_RANK_WIDENING_PASSES = per_rank, passes
                g = np.zeros(target.dim)
                widened = gw._widened_low_rank(root, g, moments, count, np)[0]
                record[_label(per_rank, passes)] = _whitened_spectrum(target, widened)
    finally:
        (gw.LOW_RANK_RESIDUAL_PER_RANK, gw.LOW_RANK_WIDENING_PASSES,
         gw.LOW_RANK_WIDENING_PASSES_MAX_BYTES) = default  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    return record


def _default_passes(cell) -> int:
    """The passes ``fm.sample`` runs on a cell's kept rows (float64, as the race's)."""
    import jax.numpy as jnp

    from fisher_mala import geometric_widening as gw

    rows = jax.ShapeDtypeStruct((cell["kept_draws"], cell["dim"]), jnp.float64)
    return gw.low_rank_widening_passes(rows)


def render() -> str:
    rows = ["| target | d | kept draws | R | largest / rest | smallest / rest | condition "
            "| directions / rest: loose | directions / rest: stiff |",
            "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    shares = ["| target | principal directions of | share of each true direction held |",
              "|---|---|---|"]  # fmt: skip
    for name in TARGETS:
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        cell = json.loads(path.read_text())
        labels = [(p, n) for p in PER_RANK for n in PASSES]
        for label in ["before", *(_label(p, n) for p, n in labels)]:
            s = cell[label]
            what = "before the widening" if label == "before" else f"widened, {label}"
            if label == _label(3, _default_passes(cell)):
                what += " (the default)"
            along = np.asarray(s["directions"])  # the Gaussians' four loose, four stiff
            loose, stiff = (f"{a.min():.2f}-{a.max():.2f}" for a in (along[:4], along[4:]))
            numbers = (f"{s['top'][0]:.1f} | {s['bottom'][0]:.3f} | {s['condition']:.1f} | "
                       f"{loose} | {stiff}")  # fmt: skip
            rows.append(f"| {name} | {cell['dim']} | {cell['kept_draws']} | {what} | {numbers} |")
        for kind in ("draws", "residuals"):
            held = ", ".join(f"{v:.2f}" for v in cell["overlaps"][kind])
            shares.append(f"| {name} | the kept {kind} ({2 * RANK}) | {held} |")
    return "\n".join(rows) + "\n\n" + "\n".join(shares) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true")
    args = parser.parse_args(argv)
    if not args.render:
        with jax.enable_x64(True):
            for name in TARGETS:
                run_cell(name)
    TABLE.write_text(render())
    print(TABLE.read_text())


if __name__ == "__main__":
    main()
