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
the half's last draws instead of ``d x d`` sums (:class:`LowRankMoments`): half of them
choose the directions, half measure them (:func:`_widened_low_rank`); before that, ``R``
is measured on all of them in the span of its own ``k`` directions and given the
covariance they show there, either way, where it is far from what ``R`` says
(:func:`_remeasured`), and after it, the widened root once more, toward looser only.
Nothing is widened
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
    "LOW_RANK_MIN_AGREEMENT",
    "LOW_RANK_REMEASURE_THRESHOLD",
    "LOW_RANK_REMEASURE_BOUNDS",
    "LowRankMoments",
    "low_rank_draws",
    "low_rank_widened",
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
#: to ``LOW_RANK_MIN_DRAWS``). Half of them choose the directions and half measure them,
#: so ``m`` sets how loose a direction must be to stand out of the noise of ``d / m``: on
#: ``benchmarks.low_rank_race``'s Gaussian (``d = 1000``, four directions 20 to 100 times
#: looser than the diagonal) rank-8 Fisher NUTS's min ESS per gradient was 3.3e-3
#: without the widening, 2.4e-2 with m = 64, 4.0e-2 with 128 and 6.5e-2 with 192 (dense
#: Fisher NUTS: 8.0e-2), before the halves' agreement check (:data:`LOW_RANK_MIN_AGREEMENT`);
#: with the check, 6.2e-2 with 192 and 7.0e-2 with 234 (the race's step-size phase holds
#: 250 draws before the widening), and on its latent Gaussian process 1.3e-2 and 2.2e-2.
LOW_RANK_DRAWS_PER_RANK = 32
LOW_RANK_MAX_DRAWS = 256
LOW_RANK_MIN_DRAWS = 32
#: Share of a chosen direction that the directions the other half of the kept draws
#: finds loose must hold for it to be widened (``|P v|^2``; for two noisy estimates of a
#: direction ``u`` it is about the square of each one's overlap with ``u``). Widening a
#: direction ``v`` that holds a share ``a^2`` of a loose ``u`` (variance ``l`` times the
#: rest) to its variance along ``v`` widens the ordinary part of ``v`` too: in two
#: dimensions that worsens the condition number unless ``a^2`` is about 0.7 or more (for
#: ``l`` from 5 to 100). In ``d`` dimensions the other directions the widening spares
#: make up for part of it: on ``benchmarks.low_rank_race``'s latent Gaussian process,
#: rank-8 Fisher NUTS's min ESS per gradient was 1.44e-2 with no such check, 1.33e-2 with
#: 0.4 and 1.03e-2 with 0.7. The check is for large ``d``, where the halves' estimates
#: hold little of the loose directions (a Gaussian of ``d = 10^4`` with four directions
#: 20 to 100 times looser: overlaps of 0.1 to 0.9, and agreements that follow them; at
#: ``d = 1000``, 0.98 to 0.99).
LOW_RANK_MIN_AGREEMENT = 0.4
#: The learned directions ``Q`` of a low-rank root are measured again on all kept draws
#: (no choice is made from them, so no half is set aside): in their span, the ``k x k``
#: geometric mean of the whitened draws' and gradients' covariances (exact for a Gaussian
#: whose eigendirections ``Q`` spans, as ``M`` above) over the Fisher scale; along each of
#: its eigenvectors whose eigenvalue is above this, or below its inverse, ``R`` takes that
#: variance. The recursion's
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


def _inverse_root(matrix, xp):
    """``M^{-1/2}`` of a symmetric positive semi-definite ``M`` on its eigenvalues above
    ``sqrt(eps)`` times the largest (zero on the others): the directions below are where
    two kinds of rows nearly cancel, about ``eps^(1/4)`` of their size (a few percent in
    float32), and carry no widening."""
    w, v = xp.linalg.eigh(0.5 * (matrix + matrix.T))
    kept = w > xp.sqrt(xp.finfo(w.dtype).eps) * xp.max(w)
    return v * xp.where(kept, 1.0 / xp.sqrt(xp.where(kept, w, 1.0)), 0.0)


def _centred(gram, half: int, xp):
    """``P G P`` for ``G`` the Gram matrix of two blocks of ``half`` rows (draws, then
    gradients), ``P`` centring each block: the Gram matrix of the centred rows."""
    blocks = xp.repeat(xp.arange(2), half)
    same = (blocks[:, None] == blocks[None]).astype(gram.dtype)
    centring = xp.eye(2 * half, dtype=gram.dtype) - same / half
    return centring @ gram @ centring, centring


def _low_rank_candidates(gram, cross, xp):
    """``(coefficients, variance)`` of one half of the kept draws: the eigenvectors of the
    geometric mean of its draws' and gradients' covariances, in the span of both, as
    coefficients ``C`` of its rows (``Y^T P C`` are the directions, orthonormal; ``Y`` the
    half's draws above its gradients, ``P`` the centring), and the variance of the other
    half's draws along each.

    ``gram``: ``Y Y^T`` ``(2 h, 2 h)``; ``cross``: ``X Y^T``, ``X`` the other half's draws
    ``(h, d)``. Only these products of rows are formed (``O(h^2 d)``, no ``d x h`` basis):
    the span's orthonormal basis is ``Y^T P G_c^{-1/2}`` (``G_c = P Y Y^T P``),
    re-orthonormalized once in its coordinates."""
    half = gram.shape[0] // 2
    centred, centring = _centred(gram, half, xp)
    basis = _inverse_root(centred, xp)
    basis = basis @ _inverse_root(basis.T @ centred @ basis, xp)  # the first pass's rounding
    coordinates = centred @ basis  # the centred rows in the orthonormal basis
    a, b = coordinates[:half], coordinates[half:]
    # where neither the draws nor the gradients reach: a tiny ridge, in place of the zero
    # eigenvalues of the chosen draws' covariances
    ridge = xp.eye(2 * half, dtype=a.dtype) * xp.sqrt(xp.finfo(a.dtype).eps)
    mean = geometric_mean(a.T @ a / half + ridge, b.T @ b / half + ridge, xp)
    _, vectors = xp.linalg.eigh(0.5 * (mean + mean.T))
    vectors = xp.where(xp.isfinite(vectors), vectors, 0.0)
    coefficients = centring @ basis @ vectors
    return coefficients, xp.var(cross @ coefficients, axis=0, ddof=1)


def _remeasured(
    r: LowRankSqrt, whitened_grad, along_x, along_g, fisher_scale, allowed, xp, shrink=True
):
    """``(R', R'^T g, factor)``: ``R`` given, in the span of its own directions ``Q``, the
    covariance the kept draws measure there (``along_x``, ``along_g`` ``(m, k)``: the kept
    whitened draws' and gradients' coordinates along ``Q``), and the largest factor by
    which a variance changed (1 where nothing did: then ``R`` and ``R^T g`` are returned
    unchanged, bit for bit).

    The measure is the ``k x k`` geometric mean ``M`` of the draws' and the gradients'
    covariances along ``Q`` (``M C_g M = C_x``; exact for a Gaussian whatever the draws'
    autocorrelation, where ``Q`` spans whole eigendirections), over the Fisher scale. Along
    each eigenvector ``w`` of ``M`` whose eigenvalue ``mu`` is past
    :data:`LOW_RANK_REMEASURE_THRESHOLD` either way, ``R`` takes that variance:
    ``R R^T <- R (I + Q W diag(t^2 - 1) W^T Q^T) R^T``, ``t = sqrt(mu)`` there, 1 elsewhere.
    Unlike the variance along each ``q`` alone, this also turns ``Q`` within its span: a
    noisy estimate of a loose direction is a mixture of two of the posterior's, and only
    their ``k x k`` covariance says how to unmix them.

    In ``D``-scaled coordinates ``R = D^(1/2) S``, ``S = I + Q diag(c) Q^T``; the new ``S'``
    is the symmetric root of ``S (I + Q (T^2 - I) Q^T) S``, ``T = W diag(t) W^T``: in the span
    of ``Q`` that is ``diag(1 + c) T^2 diag(1 + c)``, whose eigenpairs give ``Q'`` and
    ``c'``. ``O(d k^2)``. ``shrink=False``: only the eigenvalues above the threshold are
    taken (the widened root's second measure, :func:`_widened_low_rank`)."""
    m, k = along_x.shape
    centred_x = along_x - xp.mean(along_x, axis=0)
    centred_g = along_g - xp.mean(along_g, axis=0)
    cov_x, cov_g = centred_x.T @ centred_x / (m - 1), centred_g.T @ centred_g / (m - 1)
    # a direction q whose own ratio is past the bounds (a chain that did not move along it:
    # 0 up to rounding) says nothing about the posterior: it is left out of M (identity)
    low, high = LOW_RANK_REMEASURE_BOUNDS
    own = xp.sqrt(xp.diagonal(cov_x) / xp.diagonal(cov_g)) / fisher_scale
    measured = xp.isfinite(own) & (own > low) & (own < high)
    mean = geometric_mean(cov_x, cov_g, xp) / fisher_scale
    identity = xp.eye(k, dtype=mean.dtype)
    mean = xp.where(measured[:, None] & measured[None], mean, identity)
    finite = xp.all(xp.isfinite(mean))
    mean = xp.where(finite, mean, identity)
    mu, w = xp.linalg.eigh(0.5 * (mean + mean.T))
    threshold = LOW_RANK_REMEASURE_THRESHOLD
    off = (
        allowed
        & finite
        & (mu > low)
        & (mu < high)
        & ((mu > threshold) | (shrink & (mu * threshold < 1.0)))
    )
    t = xp.where(off, xp.sqrt(xp.where(off, mu, 1.0)), 1.0)
    half_product = (1.0 + r.factors)[:, None] * (w * t)  # diag(1 + c) W diag(t)
    lam, vectors = xp.linalg.eigh(half_product @ half_product.T)
    lam = xp.maximum(lam, xp.finfo(lam.dtype).tiny)
    basis = r.basis @ vectors
    remeasured = LowRankSqrt(r.scale, basis, xp.sqrt(lam) - 1.0)
    # R'^T g = S' D^{1/2} g = S' S^{-1} R^T g
    g = _apply(basis, remeasured.factors, _apply(r.basis, _inverse_factors(r), whitened_grad))
    changed = xp.any(off)
    out = jax.tree.map(
        lambda new, old: xp.where(changed, new, old), (remeasured, g), (r, whitened_grad)
    )
    return (*out, xp.max(xp.maximum(t, 1.0 / t)) ** 2)


class _KeptRows(NamedTuple):
    """The kept rows as the root ``r0`` that whitened them sees them (``draws`` ``Z``,
    ``grads`` ``G``, ``(m, d)``), their coordinates along its directions ``Q_0``, and their
    products ``(Z Z^T, Z G^T, G G^T)``: what any other root of the same ``D`` sees of them
    follows in ``O(m d k)`` (:func:`_through`)."""

    r0: LowRankSqrt
    draws: jax.Array
    grads: jax.Array
    along_x: jax.Array
    along_g: jax.Array
    products: tuple


def _through(kept: _KeptRows, r: LowRankSqrt, xp):
    """``(products, along_x, along_g, scaled)``: the kept rows as the root ``r`` (the same
    ``D``) sees them: their products ``(Z' Z'^T, Z' G'^T, G' G'^T)``, their coordinates
    along ``r``'s directions ``Q`` ``(m, k)``, and ``(Y Q, H Q)``, ``Y`` the draws and
    ``H`` the gradients in ``D``-scaled coordinates (``D^(-1/2) (x - origin) = S_0 z``,
    ``D^(1/2) g = S_0^{-1} psi``).

    ``Z' = Y S^{-1}``, ``G' = H S``, and ``(I + Q diag(e) Q^T)^2 = I + Q diag(2 e + e^2)
    Q^T``: every product is the old one plus rank-``k`` terms (``Z' G'^T = Z G^T``: ``S`` and
    ``S^{-1}`` cancel), from the rows' coordinates along ``Q_0`` and ``Q``; no new ``(m, d)``
    rows."""
    r0 = kept.r0
    xx, xg, gg = kept.products
    c0, inverse0 = r0.factors, _inverse_factors(r0)
    overlap = r0.basis.T @ r.basis
    y = kept.draws @ r.basis + (kept.along_x * c0) @ overlap  # Y Q
    h = kept.grads @ r.basis + (kept.along_g * inverse0) @ overlap  # H Q
    yy = xx + (kept.along_x * (2.0 * c0 + c0**2)) @ kept.along_x.T
    hh = gg + (kept.along_g * (2.0 * inverse0 + inverse0**2)) @ kept.along_g.T
    c, inverse = r.factors, _inverse_factors(r)
    products = (
        yy + (y * (2.0 * inverse + inverse**2)) @ y.T,
        xg,
        hh + (h * (2.0 * c + c**2)) @ h.T,
    )
    return products, y / (1.0 + c), h * (1.0 + c), (y, h)


def _combined(kept: _KeptRows, r: LowRankSqrt, scaled, of_draws, of_grads):
    """``Z'^T a + G'^T b`` ``(d, p)``: combinations of the kept rows as ``r`` sees them
    (:func:`_through`; ``scaled``: its ``(Y Q, H Q)``), ``a`` and ``b`` ``(m, p)``."""
    r0 = kept.r0
    y_a = kept.draws.T @ of_draws + r0.basis @ (r0.factors[:, None] * (kept.along_x.T @ of_draws))
    h_b = kept.grads.T @ of_grads + r0.basis @ (
        _inverse_factors(r0)[:, None] * (kept.along_g.T @ of_grads)
    )
    y, h = scaled
    return (
        y_a
        + r.basis @ (_inverse_factors(r)[:, None] * (y.T @ of_draws))
        + h_b
        + r.basis @ (r.factors[:, None] * (h.T @ of_grads))
    )


def _remeasured_through(kept: _KeptRows, r, whitened_grad, sum_q, dim, n, allowed, xp):
    """:func:`_remeasured` of the root ``r`` on the kept rows as it sees them; ``sum_q``:
    the sum of ``|R_0^T g|^2`` over the draws, the Fisher scale's, rescaled to ``r`` by the
    kept gradients' share of the change."""
    products, along_x, along_g, _ = _through(kept, r, xp)
    scale = dim * n / (sum_q * xp.trace(products[2]) / xp.trace(kept.products[2]))
    return _remeasured(r, whitened_grad, along_x, along_g, scale, allowed, xp, shrink=False)


def _widened_low_rank(r: LowRankSqrt, whitened_grad, moments: LowRankMoments, count, xp):
    """:func:`widened_root` of a :class:`LowRankSqrt` from the ``m`` kept draws.

    With ``m`` draws in ``d >> m`` dimensions, the draws' own covariance is far from the
    posterior's in their span (each draw's direction carries about ``d / m`` of variance),
    and the geometric mean in the span of the draws and gradients (Seyboldt et al.'s
    low-rank estimate, nutpie's) finds the loose directions but not their sizes. So the
    first half of the kept draws chooses the directions (that geometric mean's
    eigenvectors), and the other half, independent of the choice, measures the variance
    along each: where it exceeds the Fisher scale by :data:`WIDENING_THRESHOLD`, ``R`` is
    widened to it, if the second half, choosing in turn, agrees on the direction
    (:data:`LOW_RANK_MIN_AGREEMENT`). Of the directions widened, the ``k`` widened most are
    combined with ``R``'s own, and the ``k`` farthest from the rest kept (the form of
    :mod:`fisher_mala.low_rank`: a widening weaker than a kept direction's stiffness or
    looseness gives way to it).

    Before that, ``R`` is measured on all the kept draws in the span of its own directions
    (:func:`_remeasured`), and the draws are seen through the root that gives them their
    measured covariance there. After it, the widened root is measured again in the span of
    its directions, now holding the loose ones found, and widened where that measure is
    looser still: the draws of a half are a short stretch of a chain that has not yet
    moved far along a loose direction, and their variance along it falls short of the
    posterior's (``docs/large_problems.md``, the race's Gaussian), where the geometric
    mean, which the gradients make
    exact for a Gaussian's eigendirections however short the stretch, does not. It only
    widens: along a direction that mixes a loose one with others the geometric mean falls
    short instead (the precision there is the others'), and where the draws mix well their
    variance was right (``tests/test_geometric_widening.py``, independent draws).

    Memory: the kept rows (``2 m d`` numbers), products of them ``(m, m)`` and the ``k``
    directions ``(d, k)``: no ``d x m`` basis is formed.
    """
    allowed = gradient_kurtosis_ratio(moments, count, xp) <= WIDENING_MAX_KURTOSIS_RATIO
    m = moments.draws.shape[0]
    half = m // 2
    dim = moments.draws.shape[-1]
    draws, grads = moments.draws, moments.grads  # the draws whitened
    n = xp.asarray(count, moments.sum_q.dtype)
    # every product of two kept rows, from three products of the whole buffers (slices of
    # the (m, m) results, not of the (m, d) rows: no copy of the rows)
    products = (draws @ draws.T, draws @ grads.T, grads @ grads.T)
    kept = _KeptRows(r, draws, grads, draws @ r.basis, grads @ r.basis, products)
    r, whitened_grad, remeasured = _remeasured(
        r, whitened_grad, kept.along_x, kept.along_g, dim * n / moments.sum_q, allowed, xp
    )
    (xx, xg, gg), _, _, scaled = _through(kept, r, xp)  # seen through R'
    # the Fisher scale through R': the kept gradients' share of the change
    sum_q = moments.sum_q * (xp.trace(gg) / xp.trace(products[2]))
    one, two = slice(0, half), slice(half, 2 * half)

    def gram(a, b):  # [X_a; G_a] [X_b; G_b]^T, X_a the draws of half a, G_a their gradients
        return xp.concatenate(
            [
                xp.concatenate([xx[a, b], xg[a, b]], axis=1),
                xp.concatenate([xg[b, a].T, gg[a, b]], axis=1),
            ],
            axis=0,
        )

    chosen, variance = _low_rank_candidates(gram(one, one), gram(two, one)[:half], xp)
    others, other_variance = _low_rank_candidates(gram(two, two), gram(one, two)[:half], xp)
    fisher_scale = dim * n / sum_q
    # A measured variance is a chi-square of half - 1 degrees of freedom: a direction
    # counts only where even its lower two-sigma bound is above the Fisher scale.
    spread = 2.0 * np.sqrt(2.0 / (half - 1))

    def loose(variance):
        ratio = variance / fisher_scale
        return ratio, (ratio > WIDENING_THRESHOLD) & (ratio * (1.0 - spread) > 1.0)

    ratio, found = loose(variance)
    _, found_again = loose(other_variance)
    # the overlap of the two halves' directions: (Y2^T P c2)^T (Y1^T P c1)
    overlap = others.T @ gram(two, one) @ chosen
    agreement = xp.sum(overlap**2 * found_again[:, None], axis=0)
    widen = allowed & found & (agreement >= LOW_RANK_MIN_AGREEMENT)
    extra = _multipliers(ratio, widen, xp)
    top = xp.argsort(-extra)[: r.basis.shape[-1]]  # the k widened most (0: not widened)
    top_chosen = chosen[:, top]
    rest = xp.zeros((m - half, top_chosen.shape[1]), top_chosen.dtype)  # the other half
    of_draws = xp.concatenate([top_chosen[:half], rest], axis=0)
    of_grads = xp.concatenate([top_chosen[half:], rest], axis=0)
    directions = _combined(kept, r, scaled, of_draws, of_grads)  # X'^T a + G'^T b
    widened, g = low_rank_widened(r, directions, extra[top], whitened_grad, xp)
    widened, g, again = _remeasured_through(kept, widened, g, moments.sum_q, dim, n, allowed, xp)
    return widened, g, xp.maximum((1.0 + xp.max(extra)) ** 2, xp.maximum(remeasured, again))


def low_rank_widened(r: LowRankSqrt, directions, extra, whitened_grad, xp=jnp):
    """``(R', R'^T g)``: a rank-``k`` :class:`LowRankSqrt` ``R'`` with ``R' R'^T = R (I + V
    diag(m) V^T)^2 R^T`` (``V`` = ``directions``, orthonormal columns; ``m`` = ``extra``)
    where that has at most ``k`` directions away from the rest, else its ``k`` farthest
    from it (log scale), and the whitened gradient ``R'^T g`` of the state whose ``R^T g``
    is ``whitened_grad``.

    In ``D``-scaled coordinates ``R R^T = S^2``, ``S = I + Q diag(c) Q^T``, and the widened
    operator ``S (I + V diag((1 + m)^2 - 1) V^T) S`` is the identity outside ``span[Q,
    V]``: its eigenpairs there give ``Q'`` and ``c'``.
    """
    basis, factors = r.basis, r.factors
    around = _orthonormal(xp.concatenate([basis, directions], axis=1), xp)
    image = _apply(basis, factors, around)
    image = _apply(directions, (1.0 + extra) ** 2 - 1.0, image)
    image = _apply(basis, factors, image)
    local = around.T @ image
    lam, local_vectors = xp.linalg.eigh(0.5 * (local + local.T))
    lam = xp.maximum(lam, xp.finfo(lam.dtype).tiny)
    keep = xp.argsort(-xp.abs(xp.log(lam)))[: basis.shape[-1]]
    new_basis = around @ local_vectors[:, keep]
    new_factors = xp.sqrt(lam[keep]) - 1.0
    # R'^T g = S' D^{1/2} g and g = D^{-1/2} S^{-1} R^T g: S' S^{-1} applied to R^T g
    g = _apply(basis, _inverse_factors(r), whitened_grad)
    g = _apply(new_basis, new_factors, g)
    return LowRankSqrt(r.scale, new_basis, new_factors), g


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
