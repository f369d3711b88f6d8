"""Widen the Fisher metric where the posterior is wider than its Fisher matrix says (layer 4).

The Fisher matrix ``F = E[g g^T]`` of a posterior bounds its covariance from below:
``Cov(x) >= F^{-1}`` (integration by parts gives ``E[x g^T] = -I``, then Cauchy-Schwarz),
with equality only along directions where the posterior is Gaussian. Along a skewed or
heavy-tailed direction (a hierarchical scale, a Gaussian process's length scale) the
Fisher metric is too narrow, and NUTS pays for it with short, slow trajectories: on a
latent Gaussian-process model the length scale's posterior variance is 12.5 times what
its Fisher information says.

Halfway through the step-size phase (``R`` frozen, NUTS's draws), the geometric mean
``M`` of the whitened draws' covariance ``C_z`` and the inverse of their whitened
gradients' covariance ``C_g`` (``M C_g M = C_z``; Seyboldt et al.'s "Fisher HMC" criterion,
nutpie's) is exact for a Gaussian from any ``n > d`` distinct draws, since the gradient is
then linear in the position: ``M`` is the covariance. Where ``M`` exceeds the Fisher scale
``c = d / E|R^T g|^2`` by more than :data:`WIDENING_THRESHOLD`, ``R`` is widened along
``M``'s eigenvectors to ``M``'s variance, ``R <- R (I + V diag(sqrt(mu / c) - 1) V^T)``,
and the step size is tuned again in the phase's second half. Directions within the
threshold keep the Fisher metric untouched (bit for bit: the chain is then the one of an
unsplit phase). A low-rank ``R`` (:class:`~fisher_mala.square_roots.LowRankSqrt`) keeps
the half's last draws instead of ``d x d`` sums (:class:`LowRankMoments`), and on them
rescales its diagonal per coordinate, finds where it is wrong from the principal
directions of the draws' and gradients' residuals (zero along every direction ``R`` gets
right, for a Gaussian exactly), and takes the geometric-mean covariance in the span of
those and its own ``k`` directions, either way, where it is far from what ``R`` says,
three times over the same rows, each time whitened by the root the last one gave
(:func:`_widened_low_rank`). Nothing is widened
in a funnel, whose gradients' sizes vary by orders of
magnitude across the draws (:func:`gradient_kurtosis_ratio` above
:data:`WIDENING_MAX_KURTOSIS_RATIO`): no one metric fits it, and a wider one sends the
trajectories into its neck with a step too large there.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fisher_mala.low_rank import _apply, _inverse_factors
from fisher_mala.pytree import ravel
from fisher_mala.square_roots import DiagonalSqrt, LowRankSqrt

__all__ = [
    "LOW_RANK_DRAWS_PER_RANK",
    "LOW_RANK_MAX_DRAWS",
    "LOW_RANK_RESIDUAL_PER_RANK",
    "LOW_RANK_REMEASURE_THRESHOLD",
    "LOW_RANK_REMEASURE_BOUNDS",
    "LOW_RANK_WIDENING_PASSES",
    "LOW_RANK_WIDENING_PASSES_MAX_BYTES",
    "low_rank_widening_passes",
    "LowRankMoments",
    "low_rank_draws",
    "WIDENING_THRESHOLD",
    "WIDENING_MAX_DIM",
    "WIDENING_MAX_KURTOSIS_RATIO",
    "gradient_kurtosis_ratio",
    "WIDENING_MIN_EXTRA_DRAWS",
    "Moments",
    "widening_point",
    "moments_init",
    "moments_update",
    "widen",
    "widen_on_host",
    "widened_root",
    "geometric_mean",
]

#: ``M``'s eigenvalue over the Fisher scale above which a direction is widened. The
#: geometric mean is exact for Gaussian directions; on near-Gaussian posteriors (a
#: logistic regression) its ratios stay below 1.15 from 50 to 4000 NUTS draws, on a
#: latent Gaussian process the length scale's is 3.5-4.6.
WIDENING_THRESHOLD = 2.0
#: Largest :func:`gradient_kurtosis_ratio` at which ``R`` is widened. In a funnel the
#: gradient's size varies by orders of magnitude between its neck and its mouth, no one
#: metric fits, and a metric widened toward the mouth sends NUTS's trajectories into the
#: neck with a step too large for it (on Neal's funnel the widening multiplied the
#: divergent transitions 2.6 to 9.5 times). Their ratios are 2.2 to 6.0 on the funnel's
#: chains and 1.7 to 5.5 on the centred eight schools'; 1.0 to 1.5 on the non-centred
#: eight schools', about 1 on a latent Gaussian process's, a count model's and a
#: logistic regression's (``python -m benchmarks.widening_check``, with ``--race``).
WIDENING_MAX_KURTOSIS_RATIO = 1.5
#: Largest dimension widened: ``M`` costs a few ``d x d`` eigendecompositions, once.
WIDENING_MAX_DIM = 1000
#: Draws beyond ``d`` the first half of the step-size phase must hold (the covariance of
#: ``n`` draws has rank ``n - 1``).
WIDENING_MIN_EXTRA_DRAWS = 16


#: The low-rank widening keeps the last ``m`` draws of the phase's first half and their
#: whitened gradients (``2 m d`` numbers, not ``d x d`` sums): ``m = min(
#: LOW_RANK_DRAWS_PER_RANK k, LOW_RANK_MAX_DRAWS)``, fewer when the half holds fewer (down
#: to ``LOW_RANK_MIN_DRAWS``). Before the widening measured in the span of the residuals'
#: principal directions (:func:`_widened_low_rank`), half of them chose the directions and
#: half measured them, so ``m`` set how loose a direction had to be to stand out of the
#: noise of ``d / m``: on
#: ``benchmarks.low_rank_race``'s Gaussian (``d = 1000``, four directions 20 to 100 times
#: looser than the diagonal) rank-8 Fisher NUTS's min ESS per gradient was 3.3e-3
#: without the widening, 2.4e-2 with m = 64, 4.0e-2 with 128 and 6.5e-2 with 192 (dense
#: Fisher NUTS: 8.0e-2), before the halves had to agree on the direction; with that check,
#: 6.2e-2 with 192 and 7.0e-2 with 234 (the race's step-size phase holds
#: 250 draws before the widening), and on its latent Gaussian process 1.3e-2 and 2.2e-2.
LOW_RANK_DRAWS_PER_RANK = 32
LOW_RANK_MAX_DRAWS = 256
LOW_RANK_MIN_DRAWS = 32
#: Principal directions of the kept rows' residuals searched per rank (``p = 3 k``, with
#: ``k + p <= m / 2`` so that the ``(k + p)``-dimensional covariances are measured from at
#: least twice as many draws). On the widening's inputs in the race's first chain of rank-8
#: Fisher NUTS on ``benchmarks.low_rank_race``'s Gaussian (``python -m
#: benchmarks.widening_residuals``), the condition number of the whitened covariance after
#: the widening was 97, 10.2, 8.5 and 6.7 with ``p = k, 2k, 3k, 4k`` at ``d = 10^5`` (1114
#: before it) and 9.6, 3.4, 2.9 and 2.6 at ``d = 1000`` (273 before): ``4k`` would keep
#: fewer than twice the span's dimension in draws for ``k = 32``.
LOW_RANK_RESIDUAL_PER_RANK = 3
#: The low-rank widening measures ``R`` on all kept draws in the span of its directions
#: ``Q`` and the residuals' (:func:`_measured_in`): the geometric mean of the whitened
#: draws' and gradients' covariances there (exact for a Gaussian whose eigendirections the
#: span holds, as ``M`` above) over the level of the rest (the coordinates' median ratio);
#: along each of its eigenvectors whose eigenvalue is above this, or below its inverse,
#: ``R`` takes that variance. The recursion's
#: factors can be far from the posterior's when the Fisher phase is short for ``d`` (on
#: ``benchmarks.low_rank_race``'s hierarchical logistic regression with ``d = 10 005``,
#: ratios of 0.45 to 4.8 along all eight of its directions, ``python -m
#: benchmarks.low_rank_race --probe hierarchical_logistic_10k``), where their variance is
#: measured to a few percent: 256 draws give a ratio's log a standard deviation of about
#: 0.06 for independent draws, 0.15 for an effective sample of 45, against
#: ``log 1.5 = 0.41``.
LOW_RANK_REMEASURE_THRESHOLD = 1.5
#: Ratios outside these bounds are not taken as measurements (a chain that did not move
#: along a direction measures a variance of 0 up to rounding): such a direction keeps
#: ``R``'s factor, as ``low_rank.THETA_BOUNDS`` bounds one cycle of the learner.
LOW_RANK_REMEASURE_BOUNDS = (1e-4, 1e4)
#: Passes of the low-rank widening's three steps over the same kept rows
#: (:func:`_widened_low_rank`), each from the root the last one gave. On
#: ``benchmarks.low_rank_race``'s Gaussian, the race's first chain, one pass left the
#: four stiff directions' functionals at 0.68-0.72 of the rest's variance seen through
#: ``R`` at ``d = 1000`` (condition number 2.9) and 0.43-0.49 at ``d = 10^5`` (8.5); three
#: passes 0.99-1.03 (2.0) and 0.99-1.02 (1.4) (``python -m benchmarks.widening_residuals``).
LOW_RANK_WIDENING_PASSES = 3
#: The passes after the first hold the kept rows whitened again (``2 m d`` numbers) and
#: their temporaries, about three times the kept rows' bytes more; above this many bytes of
#: kept rows (``m = 256`` rows at ``d = 131 072`` in float64, ``262 144`` in float32: 1.5 GB
#: more per chain at most) one pass runs, and the widening's memory stays within 1.7 times
#: the kept rows (``tests/test_geometric_widening.py``): at ``d = 10^6`` the kept rows are
#: already 2 GB in float32.
LOW_RANK_WIDENING_PASSES_MAX_BYTES = 512 << 20


def low_rank_widening_passes(draws) -> int:
    """Passes of the low-rank widening over the kept rows ``draws`` ``(m, d)``:
    :data:`LOW_RANK_WIDENING_PASSES` while the rows take at most
    :data:`LOW_RANK_WIDENING_PASSES_MAX_BYTES`, else one."""
    nbytes = 2 * draws.shape[0] * draws.shape[1] * jnp.dtype(draws.dtype).itemsize
    return LOW_RANK_WIDENING_PASSES if nbytes <= LOW_RANK_WIDENING_PASSES_MAX_BYTES else 1


def low_rank_draws(rank: int, num_draws: int | None = None) -> int:
    """Draws the low-rank widening keeps for a rank-``k`` root when ``num_draws`` are
    summed before the widening (see :data:`LOW_RANK_DRAWS_PER_RANK`)."""
    m = min(LOW_RANK_DRAWS_PER_RANK * int(rank), LOW_RANK_MAX_DRAWS)
    if num_draws is not None:
        m = min(m, int(num_draws) - WIDENING_MIN_EXTRA_DRAWS)
    return max(m, LOW_RANK_MIN_DRAWS)


class LowRankMoments(NamedTuple):
    """What the low-rank widening keeps of the draws: the last ``m`` positions, whitened
    (``R^{-1} (x - origin)``, flat; ``R`` is frozen while they are kept), and whitened
    gradients ``R^T g`` (rows written in turn, ``count`` so far), and over every draw the
    sums of ``|R^T g|^2`` and ``|R^T g|^4``."""

    origin: jax.Array
    draws: jax.Array
    grads: jax.Array
    sum_q: jax.Array
    sum_q2: jax.Array
    count: jax.Array


class Moments(NamedTuple):
    """Running sums over the draws: positions (flat, the target's coordinates, from
    ``origin``: no cancellation where the draws are far from 0 against their spread) and
    their whitened gradients ``R^T g``, their outer products, and ``|R^T g|^4``."""

    origin: jax.Array
    sum_x: jax.Array
    sum_xx: jax.Array
    sum_g: jax.Array
    sum_gg: jax.Array
    sum_q2: jax.Array


def widening_point(num_steps: int, dim: int, sqrt_precond, pooled: bool = False):
    """The step-size iteration after which the metric is widened (the phase's half), or
    ``None`` where it is not: pooled, ``d > WIDENING_MAX_DIM`` (dense or diagonal), or a
    half too short (``d + WIDENING_MIN_EXTRA_DRAWS`` draws; low-rank:
    ``LOW_RANK_MIN_DRAWS + WIDENING_MIN_EXTRA_DRAWS``)."""
    half = int(num_steps) // 2
    if pooled:
        return None
    if isinstance(sqrt_precond, LowRankSqrt):  # the last draws, kept: no d x d sums
        return half if half >= LOW_RANK_MIN_DRAWS + WIDENING_MIN_EXTRA_DRAWS else None
    if dim > WIDENING_MAX_DIM or half < dim + WIDENING_MIN_EXTRA_DRAWS:
        return None
    return half


def moments_init(state, num_draws: int | None = None):
    """Zero sums for the draws of the chain at ``state`` (their origin its position): a
    :class:`LowRankMoments` for a low-rank root (``num_draws``: the draws the phase sums
    before the widening), else :class:`Moments`."""
    g = state.whitened_grad
    dim = g.shape[-1]
    origin = ravel(state.position).astype(g.dtype)
    zero = jnp.zeros((), g.dtype)
    if isinstance(state.sqrt_precond, LowRankSqrt):
        rank = state.sqrt_precond.basis.shape[-1]
        rows = jnp.zeros((low_rank_draws(rank, num_draws), dim), g.dtype)
        return LowRankMoments(origin, rows, rows, zero, zero, jnp.zeros((), jnp.int32))
    vector, matrix = jnp.zeros((dim,), g.dtype), jnp.zeros((dim, dim), g.dtype)
    return Moments(origin, vector, matrix, vector, matrix, zero)


def moments_update(moments, state, active=True):
    """The sums with the state's position and whitened gradient added (where
    ``active``; a :class:`LowRankMoments` writes its row in place either way, so that no
    branch copies its buffers)."""
    if isinstance(moments, LowRankMoments):
        x = ravel(state.position).astype(moments.origin.dtype) - moments.origin
        x = _whitened(state.sqrt_precond, x)  # R is frozen while the draws are kept
        g = state.whitened_grad
        row = moments.count % moments.draws.shape[0]
        q = jnp.sum(g**2)
        keep = jnp.asarray(active)
        return LowRankMoments(
            moments.origin,
            moments.draws.at[row].set(jnp.where(keep, x, moments.draws[row])),
            moments.grads.at[row].set(jnp.where(keep, g, moments.grads[row])),
            moments.sum_q + jnp.where(keep, q, 0.0),
            moments.sum_q2 + jnp.where(keep, q**2, 0.0),
            moments.count + keep.astype(jnp.int32),
        )
    x = ravel(state.position).astype(moments.sum_x.dtype) - moments.origin
    g = state.whitened_grad
    return Moments(
        moments.origin,
        moments.sum_x + x,
        moments.sum_xx + jnp.outer(x, x),
        moments.sum_g + g,
        moments.sum_gg + jnp.outer(g, g),
        moments.sum_q2 + jnp.sum(g**2) ** 2,
    )


def _sqrt_and_inverse(cov, xp=jnp):
    """``(C^{1/2}, C^{-1/2})`` of a symmetric positive semi-definite ``C`` (eigenvalues
    floored at a tiny fraction of the largest); ``xp``: ``jax.numpy`` or ``numpy``."""
    w, v = xp.linalg.eigh(cov)
    w = xp.maximum(w, xp.finfo(cov.dtype).eps * xp.max(w))
    root = xp.sqrt(w)
    return (v * root) @ v.T, (v / root) @ v.T


def geometric_mean(cov_z, cov_g, xp=jnp):
    """The symmetric positive definite ``M`` with ``M C_g M = C_z``:
    ``C_g^{-1/2} (C_g^{1/2} C_z C_g^{1/2})^{1/2} C_g^{-1/2}`` (the geometric mean of
    ``C_z`` and ``C_g^{-1}``). For draws of a Gaussian (gradients ``-B z``), ``B^{-1}``
    itself, from any ``n > d`` distinct draws."""
    root_g, inverse_root_g = _sqrt_and_inverse(cov_g, xp)
    middle, _ = _sqrt_and_inverse(root_g @ cov_z @ root_g, xp)
    return inverse_root_g @ middle @ inverse_root_g


def _geometric_mean_of_rows(x, g, xp=jnp):
    """:func:`geometric_mean` of the covariances of the centred rows ``x`` and ``g`` ``(m,
    p)``, from their singular value decompositions rather than their products: with
    ``(G^T G)^{1/2} = V S V^T``, ``M = (G^T G)^{-1/2} ((G^T G)^{1/2} X^T X (G^T
    G)^{1/2})^{1/2} (G^T G)^{-1/2}``, the middle root from the singular values of ``X V S
    V^T``. Forming ``X^T X`` squares the condition number of the rows, and the low-rank
    widening's span holds directions that many rows share (their sample variance about
    ``d / m`` times the rest) next to directions that few do: in float32 the products' roots
    then made up variances of 2 to 11 where float64 measured 1.04."""
    _, s_g, vt_g = xp.linalg.svd(g, full_matrices=False)
    half = (vt_g.T * s_g) @ vt_g
    inverse_half = (vt_g.T / s_g) @ vt_g
    _, s_y, vt_y = xp.linalg.svd(x @ half, full_matrices=False)
    return inverse_half @ ((vt_y.T * s_y) @ vt_y) @ inverse_half


def _multipliers(ratio, allowed, xp=jnp):
    """``sqrt(ratio) - 1`` where ``ratio`` exceeds the threshold and ``allowed``, else 0
    (NaN: 0)."""
    widened = (ratio > WIDENING_THRESHOLD) & allowed
    return xp.where(widened, xp.sqrt(xp.where(widened, ratio, 1.0)) - 1.0, 0.0)


def gradient_kurtosis_ratio(moments: Moments, count, xp=jnp):
    """``E|R^T g|^4 / (E|R^T g|^2)^2`` over the draws, against its value for Gaussian
    gradients of the same second moments ``S`` (``1 + 2 tr(S^2) / tr(S)^2``): near 1
    where the curvature is about the same everywhere, far above where the gradient's size
    varies by orders of magnitude across the draws (a funnel's neck against its mouth)."""
    if isinstance(moments, LowRankMoments):  # tr(S^2) from the kept gradients' pairs
        n = xp.asarray(count, moments.sum_q.dtype)
        trace = moments.sum_q / n
        gram = moments.grads @ moments.grads.T
        m = gram.shape[0]
        pairs = (xp.sum(gram**2) - xp.sum(xp.diagonal(gram) ** 2)) / (m * (m - 1))
        return moments.sum_q2 / n / trace**2 / (1.0 + 2.0 * pairs / trace**2)
    n = xp.asarray(count, moments.sum_gg.dtype)
    second = moments.sum_gg / n
    trace = xp.trace(second)
    kurtosis = moments.sum_q2 / n / trace**2
    return kurtosis / (1.0 + 2.0 * xp.sum(second**2) / trace**2)


def widened_root(r, whitened_grad, moments: Moments, count, xp=jnp):
    """``(R', R'^T g, factor)``: ``R`` (dense, or a :class:`DiagonalSqrt`) widened along
    the directions where the draws' geometric-mean covariance exceeds the Fisher scale
    (module docstring), the whitened gradient with it, and the largest variance factor
    applied (1 for none). ``count``: the draws summed; ``xp``: ``jax.numpy``, or
    ``numpy`` on the host (:func:`widen_on_host`)."""
    if isinstance(r, LowRankSqrt):
        return _widened_low_rank(r, whitened_grad, moments, count, xp)
    n = xp.asarray(count, moments.sum_x.dtype)
    dim = moments.sum_x.shape[-1]
    mean_x, mean_g = moments.sum_x / n, moments.sum_g / n
    cov_x = moments.sum_xx / n - xp.outer(mean_x, mean_x)
    cov_g = moments.sum_gg / n - xp.outer(mean_g, mean_g)
    fisher_scale = dim * n / xp.trace(moments.sum_gg)  # d / E|R^T g|^2, as `normalize`
    allowed = gradient_kurtosis_ratio(moments, count, xp) <= WIDENING_MAX_KURTOSIS_RATIO
    if isinstance(r, DiagonalSqrt):  # one direction per coordinate
        ratio = xp.sqrt(xp.diag(cov_x) / r.scale**2 / xp.diag(cov_g)) / fisher_scale
        factor = 1.0 + _multipliers(ratio, allowed, xp)
        return DiagonalSqrt(r.scale * factor), whitened_grad * factor, xp.max(factor) ** 2
    cov_z = xp.linalg.solve(r, xp.linalg.solve(r, cov_x).T)  # R^{-1} C_x R^{-T}
    mean = geometric_mean(0.5 * (cov_z + cov_z.T), cov_g, xp)
    mu, vectors = xp.linalg.eigh(0.5 * (mean + mean.T))
    vectors = xp.where(xp.isfinite(vectors), vectors, 0.0)
    m = _multipliers(mu / fisher_scale, allowed, xp)
    # R (I + V diag(m) V^T), and (I + V diag(m) V^T) R^T g: exactly R and R^T g when m = 0
    widened = r + ((r @ vectors) * m) @ vectors.T
    return (
        widened,
        whitened_grad + vectors @ (m * (vectors.T @ whitened_grad)),
        (1.0 + xp.max(m)) ** 2,
    )


def _orthonormal(matrix, xp):
    return xp.linalg.qr(matrix)[0]


def _whitened(r: LowRankSqrt, x):
    """``R^{-1} x = (I + Q c' Q^T) D^{-1/2} x`` (``c' = 1 / (1 + c) - 1``) of a vector."""
    return _apply(r.basis, _inverse_factors(r), x / r.scale)


def _coordinate_ratios(draws, grads, xp):
    """``(ratio, measured, median)``: per coordinate of the kept rows, ``sqrt(Var z_i / Var
    psi_i)`` over its median (nutpie's diagonal, the geometric mean of the draws' variance
    and the inverse of the gradients'; for a Gaussian whose precision is diagonal in that
    coordinate, its variance from any two distinct draws), 1 where it is no measurement;
    where it is one (finite, within :data:`LOW_RANK_REMEASURE_BOUNDS` of the median: a
    coordinate the chain did not move along gives 0); and the median itself."""
    ratio = xp.sqrt(xp.var(draws, axis=0) / xp.var(grads, axis=0))
    low, high = LOW_RANK_REMEASURE_BOUNDS
    median = xp.nanmedian(xp.where(xp.isfinite(ratio) & (ratio > 0), ratio, xp.nan))
    measured = xp.isfinite(ratio) & (ratio > low * median) & (ratio < high * median)
    return xp.where(measured, ratio / median, 1.0), measured, median


def _residual_directions(draws, grads, weights, count: int, xp):
    """The ``count`` principal directions ``(d, count)`` of the kept rows' residuals
    ``z / w + psi * w`` (``w``: ``weights``, per coordinate), centred: for a Gaussian whose
    whitened precision is ``B``, ``psi = -B z`` and the residual ``(W^-1 - W B) z`` is zero
    along every direction ``W^-2`` whitens, whatever the chain's autocorrelation: its
    principal directions are those where ``R`` is wrong, loose or stiff. From the ``(m, m)``
    Gram matrix of the residual rows: no ``d x m`` basis."""
    residual = draws / weights + grads * weights
    residual = residual - xp.mean(residual, axis=0)
    gram = residual @ residual.T
    values, vectors = xp.linalg.eigh(0.5 * (gram + gram.T))
    values = xp.maximum(values[-count:], xp.finfo(values.dtype).tiny)
    return residual.T @ (vectors[:, -count:] / xp.sqrt(values))


def _measured_in(r: LowRankSqrt, span, along_x, along_g, level, whitened_grad, xp):
    """``(R', R'^T g, factor)``: ``R`` given, in ``span`` (``(d, p)`` orthonormal columns
    whose span holds ``R``'s directions ``Q``), the covariance the kept draws measure there
    (``along_x``, ``along_g`` ``(m, p)``: the kept whitened draws' and gradients'
    coordinates along ``span``), its ``k`` directions those farthest from the rest, and the
    largest factor by which a variance changed (1 where nothing did: then ``R`` and ``R^T
    g`` are returned unchanged, bit for bit).

    The measure is the ``p x p`` geometric mean ``M`` of the draws' and the gradients'
    covariances along ``span`` (``M C_g M = C_x``; exact for a Gaussian whose
    eigendirections ``span`` holds, whatever the draws' autocorrelation), over ``level``.
    Along each eigenvector ``w`` of ``M`` whose eigenvalue ``mu`` is past
    :data:`LOW_RANK_REMEASURE_THRESHOLD` either way, ``R`` takes that variance:
    ``R R^T <- R (I + V W diag(t^2 - 1) W^T V^T) R^T``, ``V`` = ``span``, ``t = sqrt(mu)``
    there, 1 elsewhere. Unlike the variance along each column alone, this also turns the
    directions within the span: a noisy estimate of a loose direction is a mixture of two
    of the posterior's, and only their covariance says how to unmix them.

    In ``D``-scaled coordinates ``R = D^(1/2) S``, ``S = I + Q diag(c) Q^T``; the new ``S'``
    is the symmetric root of ``S (I + V (T^2 - I) V^T) S``, ``T = W diag(t) W^T``, which is
    the identity outside the span: in the span's coordinates ``S_V T^2 S_V`` (``S_V = I +
    V^T Q diag(c) Q^T V``), whose eigenpairs give ``Q'`` and ``c'``, the ``k`` farthest
    from 1 (log scale) kept. ``O(d p^2)``."""
    m, p = along_x.shape
    centred_x = along_x - xp.mean(along_x, axis=0)
    centred_g = along_g - xp.mean(along_g, axis=0)
    cov_x, cov_g = centred_x.T @ centred_x / (m - 1), centred_g.T @ centred_g / (m - 1)
    # a direction whose own ratio is past the bounds (a chain that did not move along it:
    # 0 up to rounding) says nothing about the posterior: it is left out of M (identity)
    low, high = LOW_RANK_REMEASURE_BOUNDS
    own = xp.sqrt(xp.diagonal(cov_x) / xp.diagonal(cov_g)) / level
    measured = xp.isfinite(own) & (own > low) & (own < high)
    mean = _geometric_mean_of_rows(centred_x, centred_g, xp) / level
    identity = xp.eye(p, dtype=mean.dtype)
    mean = xp.where(measured[:, None] & measured[None], mean, identity)
    finite = xp.all(xp.isfinite(mean))
    mean = xp.where(finite, mean, identity)
    mu, w = xp.linalg.eigh(0.5 * (mean + mean.T))
    threshold = LOW_RANK_REMEASURE_THRESHOLD
    off = finite & (mu > low) & (mu < high) & ((mu > threshold) | (mu * threshold < 1.0))
    t = xp.where(off, xp.sqrt(xp.where(off, mu, 1.0)), 1.0)
    coordinates = span.T @ r.basis  # Q in the span's coordinates (p, k)
    local_root = identity + (coordinates * r.factors) @ coordinates.T  # S_V
    half_product = local_root @ (w * t)  # S_V W diag(t)
    lam, vectors = xp.linalg.eigh(half_product @ half_product.T)
    lam = xp.maximum(lam, xp.finfo(lam.dtype).tiny)
    keep = xp.argsort(-xp.abs(xp.log(lam)))[: r.basis.shape[-1]]
    basis = span @ vectors[:, keep]
    rows = None if r.rows is None else basis.swapaxes(-1, -2)  # as ``r`` has them
    measured_root = LowRankSqrt(r.scale, basis, xp.sqrt(lam[keep]) - 1.0, rows)
    # R'^T g = S' D^{1/2} g = S' S^{-1} R^T g
    g = _apply(basis, measured_root.factors, _apply(r.basis, _inverse_factors(r), whitened_grad))
    changed = xp.any(off)
    out = jax.tree.map(
        lambda new, old: xp.where(changed, new, old), (measured_root, g), (r, whitened_grad)
    )
    return (*out, xp.max(xp.maximum(t, 1.0 / t)) ** 2)


def _widened_low_rank(r: LowRankSqrt, whitened_grad, moments: LowRankMoments, count, xp):
    """:func:`widened_root` of a :class:`LowRankSqrt` from the ``m`` kept draws.

    With ``m`` draws in ``d >> m`` dimensions, the draws' own covariance is far from the
    posterior's (each draw's direction carries about ``d / m`` of variance), and their
    principal directions hold almost none of a loose direction 100 times the rest (at
    ``d = 10^5``: 0.02 to 0.05 of each of the race Gaussian's rank-8 directions, ``python
    -m benchmarks.widening_residuals``). The gradients fix that: for a Gaussian they are linear in
    the draws, so whatever the metric gets right cancels out of ``z + psi`` exactly. In
    three steps, each exact for a Gaussian:

    1. **The diagonal.** Per coordinate of the whitened draws, ``sqrt(Var z_i / Var
       psi_i)`` over its median (:func:`_coordinate_ratios`) rescales ``D``: the Fisher
       phase's diagonal is learned from few signals per coordinate when ``d`` is large,
       and every coordinate it leaves wrong adds to the residuals' noise. A
       uniform ``D`` (``low_rank_diagonal="unit"``) stays uniform;
    2. **Where ``R`` is wrong.** The principal directions of the residuals ``z / w + psi *
       w`` (``w^2``: the same ratio, so the residuals are those of the corrected ``D`` up to
       ``Q``'s turn; :func:`_residual_directions`), :data:`LOW_RANK_RESIDUAL_PER_RANK`
       ``k`` of them (fewer where ``m`` is short for them: ``k + p <= m / 2``);
    3. **How wrong.** In the span of those and ``R``'s own directions, the geometric mean
       of the draws' and gradients' covariances (:func:`_measured_in`) over the level the
       diagonal was scaled to, and ``R`` given it where it is off by
       :data:`LOW_RANK_REMEASURE_THRESHOLD` either way; the ``k`` directions farthest from
       the rest kept.

    The three steps run :data:`LOW_RANK_WIDENING_PASSES` times on the same kept rows
    (once where the rows are large: :func:`low_rank_widening_passes`),
    each pass on the rows whitened again by the root the last one gave: step 3 is exact
    only where the span holds eigendirections of the whitened posterior, and a direction
    coupled to the rest (a stiff direction the Fisher phase narrowed too much, next to
    coordinates whose ``D`` is a little off) is measured between its variance and its
    inverse curvature; measured again from the corrected root, the coupling is smaller.

    Memory: the kept rows (``2 m d`` numbers), one ``(m, d)`` array of residuals, products
    of rows ``(m, m)``, the span ``(d, k + p)`` and the rows whitened again (``2 m d``).
    """
    allowed = gradient_kurtosis_ratio(moments, count, xp) <= WIDENING_MAX_KURTOSIS_RATIO

    def one_pass(carry):
        root, g, draws, grads, factor = carry
        widened, g, pass_factor = _widening_pass(root, g, draws, grads, xp)
        draws, grads = _rewhitened(root, widened, draws, grads)
        return widened, g, draws, grads, xp.maximum(factor, pass_factor)

    carry = (r, whitened_grad, moments.draws, moments.grads, xp.ones((), whitened_grad.dtype))
    passes = low_rank_widening_passes(moments.draws)
    if xp is np or passes == 1:
        for _ in range(passes):
            carry = one_pass(carry)
    else:
        carry = jax.lax.fori_loop(0, passes, lambda _, c: one_pass(c), carry)
    widened, g, _, _, factor = carry
    out = jax.tree.map(
        lambda new, old: xp.where(allowed, new, old), (widened, g), (r, whitened_grad)
    )
    return (*out, xp.where(allowed, factor, 1.0))


def _rewhitened(old: LowRankSqrt, new: LowRankSqrt, draws, grads):
    """The kept rows ``z = R^{-1} y`` and ``psi = R^T h`` of root ``old`` whitened by root
    ``new`` instead: ``z' = S'^{-1} D'^{-1/2} D^{1/2} S z`` and ``psi' = S' D'^{1/2}
    D^{-1/2} S^{-1} psi``, ``O(m d k)``, row by row (``S`` symmetric: ``z S = z + ((z Q) c)
    Q^T``)."""
    ratio = old.scale / new.scale

    def times(rows, root, factors):  # rows (I + Q diag(c) Q^T)
        return rows + ((rows @ root.basis) * factors) @ root.basis.T

    z = times(times(draws, old, old.factors) * ratio, new, _inverse_factors(new))
    psi = times(times(grads, old, _inverse_factors(old)) / ratio, new, new.factors)
    return z, psi


def _widening_pass(r: LowRankSqrt, whitened_grad, draws, grads, xp):
    """One pass of :func:`_widened_low_rank`'s three steps on the rows ``draws`` and
    ``grads`` whitened by ``r``: ``(R', R'^T g, factor)``."""
    m = draws.shape[0]
    rank = r.basis.shape[-1]
    ratio, _, level = _coordinate_ratios(draws, grads, xp)
    # a uniform D (`low_rank_diagonal="unit"`, the user's choice) stays uniform
    uniform = xp.all(r.scale == r.scale[0])
    correction = xp.where(uniform, 1.0, ratio)
    root = xp.sqrt(correction)
    corrected = r._replace(scale=r.scale * root)
    # R1 = (D E)^(1/2) S: z1 = S^-1 E^(-1/2) S z, psi1 = S E^(1/2) S^-1 psi (rows)
    inverse = _inverse_factors(r)

    def draws_along(v):  # z1 v = z S E^(-1/2) S^-1 v
        return draws @ _apply(r.basis, r.factors, _apply(r.basis, inverse, v) / root[:, None])

    def grads_along(v):  # psi1 v = psi S^-1 E^(1/2) S v
        return grads @ _apply(r.basis, inverse, _apply(r.basis, r.factors, v) * root[:, None])

    g = _apply(r.basis, r.factors, _apply(r.basis, inverse, whitened_grad) * root)
    # the residuals in the corrected coordinates, up to Q's turn: z / sqrt(e) ~ z1
    weights = xp.sqrt(ratio * level)
    count_residual = min(LOW_RANK_RESIDUAL_PER_RANK * rank, max(m // 2 - rank, 0))
    columns = [r.basis]
    if count_residual:
        columns.append(_residual_directions(draws, grads, weights, count_residual, xp))
    span = _orthonormal(xp.concatenate(columns, axis=1), xp)
    widened, g, factor = _measured_in(
        corrected, span, draws_along(span), grads_along(span), level, g, xp
    )
    return widened, g, xp.maximum(factor, xp.max(xp.maximum(correction, 1.0 / correction)))


def widen(state, moments: Moments, count):
    """``(state, widened)``: the state with ``R`` widened along the directions where the
    draws' geometric-mean covariance exceeds the Fisher scale (module docstring), its
    whitened gradient with it; ``widened`` the largest variance factor applied (1 for
    none). ``count``: the draws summed."""
    r, grad, factor = widened_root(state.sqrt_precond, state.whitened_grad, moments, count)
    return state._replace(sqrt_precond=r, whitened_grad=grad), factor


def widen_on_host(state, moments: Moments, count):
    """:func:`widen` computed by NumPy in a host callback (``jax.pure_callback``): the same
    steps, on arrays of ``d x d`` at most, once per chain, and no compiled code of its
    own in the calling program. For drivers that compile the step-size phase's
    transition anew for every chain (NumPyro's ``MCMC`` with ``chain_method=
    "sequential"``), where the compiled widening (three eigendecompositions, two solves)
    would be compiled again each time."""
    r, grad = state.sqrt_precond, state.whitened_grad
    arguments = (r, grad, moments, jnp.asarray(count))
    argument_shapes = jax.tree.map(_shape_of, arguments)
    shapes = jax.tree.map(_shape_of, (r, grad, jnp.zeros((), grad.dtype)))

    def host(raw):
        r, grad, moments, count = jax.tree.map(_from_bytes, raw, argument_shapes)
        out = widened_root(r, grad, moments, int(count), np)
        return jax.tree.map(_as_bytes, out, shapes)

    # as bytes both ways: JAX casts what a callback takes and gives by the x64 setting of
    # the thread it runs on, which under `with jax.enable_x64(True)` need not be the
    # caller's (NumPyro's loop runs it on another: float64 would arrive as float32)
    raw = jax.tree.map(_to_bytes, arguments)
    out = jax.pure_callback(host, jax.tree.map(_byte_shape, shapes), raw, vmap_method="sequential")
    r, grad, factor = jax.tree.map(
        lambda b, s: jax.lax.bitcast_convert_type(b, s.dtype), out, shapes
    )
    return state._replace(sqrt_precond=r, whitened_grad=grad), factor


def _shape_of(value) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(jnp.shape(value), jnp.result_type(value))


def _byte_shape(shape: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((*shape.shape, shape.dtype.itemsize), jnp.uint8)


def _to_bytes(value):
    """``value`` as its bytes (a trailing axis of ``itemsize`` uint8), in the program."""
    return jax.lax.bitcast_convert_type(value, jnp.uint8)


def _from_bytes(raw, shape: jax.ShapeDtypeStruct):
    """The NumPy array whose bytes ``raw`` holds (on the host)."""
    return np.ascontiguousarray(raw, np.uint8).view(shape.dtype).reshape(shape.shape)


def _as_bytes(value, shape: jax.ShapeDtypeStruct):
    """A NumPy array of ``shape`` as its bytes (on the host)."""
    flat = np.asarray(value, shape.dtype).reshape(-1)
    return flat.view(np.uint8).reshape(*shape.shape, shape.dtype.itemsize)
