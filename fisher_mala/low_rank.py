"""A diagonal-plus-low-rank Fisher preconditioner in ``O(d k)`` time and memory.

The paper's dense ``R`` costs ``O(d^2)`` memory and time per step; its Section 7 names
low-rank approximations as the way past that. This module learns, from the same signals
(Eq. (16), one gradient per MALA step) and the chain's positions, a square root of the form
:class:`~fisher_mala.square_roots.LowRankSqrt`, ``R = D^(1/2) (I + Q diag(c) Q^T)``:

* ``D``: a diagonal (``D = I / lambda`` at the start, as the dense ``R_0 = I /
  sqrt(lambda)``). By default (``diagonal="whitened"``) ``D`` is held for the first
  :data:`WHITENED_DELAY_CYCLES` cycles, then moved a quarter of the way per cycle
  (:data:`WHITENED_STEP`, log scale; both counted in the cycles of ``k = 8``,
  :func:`whitened_pace`) toward the diagonal that whitens what the whole
  ``R`` leaves, read off the whitened signals' and positions' second moments as the
  cycle's own low-rank update leaves them (:func:`_moments_after`,
  :func:`_whitened_correction`): it corrects only what ``Q`` does not explain. With
  ``diagonal="learned"``, ``sqrt(Var x / F_ii)`` from the positions' running variances
  and the signals' running Fisher diagonal ``F_ii = (lambda + sum_n s_ni^2) / (1 + n)``
  (the diagonal of Seyboldt et al.'s Fisher HMC): it reads the target's marginals
  whatever ``Q`` explains, so where the data inform a few directions of coordinates whose
  prior is ``N(0, I)`` (a non-centred model, a whitened Gaussian process) it shrinks the
  informed coordinates, which turns each stiff direction into a stiff and a loose one,
  and loose ones are found late (below). With ``diagonal="unit"``, the identity times
  the learned level;
* ``Q`` and ``c``: the ``k`` directions in which, seen through the current ``R``, the
  target is farthest from what ``R`` assumes, **at both ends** (on a log scale): loose
  directions of strong posterior correlation (a hierarchical model's population
  direction, the large variance a diagonal misses) and stiff ones. A sketch of the
  signals' largest directions (Frequent Directions, streaming PCA) finds only the stiff
  kind, since the gradients carry the least signal along a loose direction.

**Whitened signals, and the fixed point.** The kernel gives ``psi = R^T s`` for free. For a
Gaussian target and small steps, ``E[psi psi^T] = B^2`` with ``B = R^T F R``: the signal of
Eq. (16) is biased by the ``A`` that made the proposals (``docs/signal_bias.md``), and the
fixed point of ``A^(-1) = E[s s^T]`` is ``A = R B^(-1) R^T``. So the eigenvalues ``mu`` of the
whitened second moment are taken by their square root, ``beta = sqrt(mu)``, relative to the
rest of the space, and ``R`` is updated as ``R (I + V (beta^(-1/2) - 1) V^T)``, re-expressed
in the form above by an eigendecomposition in the span of the old and new directions (at
most ``2k`` columns), keeping the ``k`` farthest from 1.

**Finding the directions.** A stochastic block Rayleigh-Ritz (Davidson) iteration: a search
basis ``W`` of ``3k`` orthonormal columns accumulates, over a cycle of ``T`` signals,
``G = sum (W^T psi)(W^T psi)^T``, ``Z = sum psi (W^T psi)^T`` (``B^2 W`` times ``T``) and the
same products of the whitened positions ``zeta = R^(-1) (x - xbar)``, whose covariance is
``B^(-1)``. At the end of a cycle the Ritz pairs of ``G / T`` give the directions; the next
basis holds them, their residuals under ``B^2`` (a Krylov step toward the stiff end) and
under ``B^(-1)`` (toward the loose end: shift-and-invert for free, once the chain moves along
those directions). A Ritz value within the cycle's noise band (Marchenko-Pastur's edges for
``3k`` columns and ``T`` signals, widened by :data:`NOISE_MARGIN`) changes nothing, so ``k``
is an upper bound and the rank that acts is learned. Cycles grow with the signals
(:data:`CYCLE_GROWTH`).

**The level of the rest.** Directions are judged against the level of the rest of the
space. The trace minus the kept Ritz values is the rest's mean only when every stiff
direction is already kept: in the first cycles one unfound direction can carry most of the
trace (its Ritz value is the square of ``B``'s), and every ordinary direction then looks
loose and is widened. So the level is the median Ritz value of :data:`PROBE_BLOCKS` ``k``
random directions outside the basis, drawn again each cycle: the compression of ``m``
unfound directions onto them has rank ``m``, so the median stays in the rest while fewer
than ``k`` are unfound.

**Cost.** Per signal: a few ``O(d k)`` products, and one row written into each of two
buffers of :data:`BUFFER` signals, absorbed into the accumulators by two matrix products
per buffer (:func:`end_of_block`). Per cycle: eigendecompositions of ``3k x 3k`` and
``2k x 2k`` and QR factorizations of ``d x 3k`` and ``d x 2k`` (``O(d k^2)``). Memory: ``W``,
``Z`` and the positions' products (``d x 3k`` each), the probes (``d x 2k``), ``Q`` and the
buffers: ``O(d k)``.
Nothing ``O(d^2)``.

With ``3k >= d`` the basis spans everything and ``A`` is the full fixed point, estimated
from the last cycle's signals, where the dense recursion (Proposition 4) averages every
signal (``tests/test_low_rank.py``).
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from fisher_mala import mala
from fisher_mala.adaptations.fisher import DAMPING, whitened_signal
from fisher_mala.adaptations.step_size import RobbinsMonroState
from fisher_mala.mala import kernel_view
from fisher_mala.pytree import ravel
from fisher_mala.square_roots import LowRankSqrt, _low_rank_apply, with_rows, without_rows

__all__ = [
    "LowRankFisherState",
    "CYCLE_SIGNALS_PER_RANK",
    "MIN_CYCLE",
    "THETA_BOUNDS",
    "cycle_length",
    "init",
    "update",
    "adaptive_step",
    "check_rank",
    "check_diagonal",
    "resolve_rank",
    "AUTO_DENSE_MAX_DIM",
    "AUTO_RANK",
    "fisher_state",
    "end_of_block",
    "finish_block",
    "scan_adaptive",
    "BUFFER",
    "PROBE_BLOCKS",
    "DIAGONALS",
    "DEFAULT_DIAGONAL",
    "WHITENED_STEP",
    "WHITENED_DELAY_CYCLES",
    "WHITENED_REFERENCE_RANK",
    "WHITENED_MAX_STEP",
    "whitened_pace",
]

#: Blocks of ``k`` columns in the search basis: the kept directions, the residuals of the
#: signals (toward stiff directions) and those of the positions (toward loose ones).
SEARCH_BLOCKS = 3
#: Signals per cycle: ``T = max(MIN_CYCLE, CYCLE_SIGNALS_PER_RANK * 3 k)``, enough for the
#: ``2k x 2k`` Rayleigh quotient matrix ``G / T`` to be estimated well (relative error
#: about ``sqrt(2 / T)`` per entry) while the basis still turns every few hundred signals.
CYCLE_SIGNALS_PER_RANK = 10
MIN_CYCLE = 100
#: How far outside the noise band of a cycle's Ritz values (``(1 +- sqrt(3k / T))^2``) a
#: direction must lie to be kept: 1.5 times as far, on a log scale.
NOISE_MARGIN = 1.5
#: ``rank="auto"`` (:func:`resolve_rank`): the dense ``R`` up to this ``d`` (an adaptive
#: dense iteration costs 1.3 ms at d = 1000 and 19 ms at d = 4000 on 2 CPU cores,
#: ``docs/large_problems.md``), the low-rank one with ``k = AUTO_RANK`` above it.
AUTO_DENSE_MAX_DIM = 2000
AUTO_RANK = 32
#: Signals buffered between two absorptions into the accumulators (a cycle is a whole
#: number of buffers): the accumulators' traffic is ``2 d 3k`` numbers per ``BUFFER``
#: signals instead of per signal.
BUFFER = 32
#: Later cycles are longer: at least ``1 / CYCLE_GROWTH`` of the signals so far, so that
#: the residuals that turn the basis get more precise as the directions converge (the
#: noise of ``F~ W`` estimated from ``T`` signals is about ``sqrt(d / T)``).
CYCLE_GROWTH = 8
#: Eigenvalues of the scaled Fisher matrix kept within these bounds (a direction ``10^4``
#: times stiffer or looser than the diagonal says is taken as that far, no farther): an
#: estimate from one cycle's signals must not make ``R`` singular.
THETA_BOUNDS = (1e-4, 1e4)
#: Random probe directions per cycle, in blocks of ``k`` (the level of the rest of the
#: space, module docstring): their median Ritz value is unmoved by fewer than ``k``
#: directions that are not yet found.
PROBE_BLOCKS = 2
#: The ``diagonal`` of ``fm.sample(..., rank=k)`` unless ``low_rank_diagonal`` says
#: otherwise (``benchmarks/low_rank_diagonal.py``, ``docs/large_problems.md`` has the
#: figures): on a whitened latent Gaussian process about three times ``"learned"`` per
#: gradient, level with it or ahead on the race's hierarchical regressions and on a
#: Gaussian whose diagonal spans e^-2 .. e^2.
DEFAULT_DIAGONAL = "whitened"
#: ``diagonal="whitened"``: the fraction of the correction (log scale) applied per cycle.
#: A whole step is exact on a diagonal target but, before ``Q`` has the stiff directions of
#: a prior-whitened model, turns them into a diagonal that ``Q`` then fights, and the two
#: diverge (``python -m benchmarks.low_rank_diagonal --synthetic``: relative Frobenius error
#: 0.64 to 1.19 with a whole step on a prior plus four informed directions, 0.16 to 0.20
#: with a half, 0.04 with a quarter after :data:`WHITENED_DELAY_CYCLES`); 0.3 of a step
#: moved the low-rank race's Gaussian by less than its spread between keys.
WHITENED_STEP = 0.25
#: ``diagonal="whitened"``: cycles with ``D`` held (at its start), for ``Q`` to find the
#: stiffest directions first.
WHITENED_DELAY_CYCLES = 4
#: ``diagonal="whitened"``: the rank whose cycles :data:`WHITENED_STEP` and
#: :data:`WHITENED_DELAY_CYCLES` count (:func:`whitened_pace`). A larger ``k`` has longer
#: cycles (``30 k`` signals), so at a quarter step per cycle after four cycles ``D`` would
#: not move before 3840 signals with ``k = 32`` (``rank="auto"``): on the low-rank race's
#: Gaussian 0.17 of the dense ``R`` per gradient, against 0.63 and 0.67 (two keys) at the
#: pace of ``k = 8`` in signals with the step capped, both before the step-size phase's
#: widening measured its widened root again (``benchmarks/low_rank_diagonal.py``,
#: ``docs/large_problems.md``).
WHITENED_REFERENCE_RANK = 8
#: ``diagonal="whitened"``: the largest fraction of the correction applied in one cycle,
#: whatever its length: with ``k = 32`` the pace of ``k = 8`` uncapped (0.68 of the way
#: per cycle) took the race's latent Gaussian process from 0.91 of the dense ``R`` per
#: gradient to 0.65 (with the earlier widening, as above).
WHITENED_MAX_STEP = 0.5
#: ``diagonal`` choices: ``D`` from the positions and signals, the identity, or the
#: correction the whitened signals and positions ask for (:func:`_whitened_correction`).
DIAGONALS = ("learned", "unit", "whitened")


class LowRankFisherState(NamedTuple):
    """State of the low-rank Fisher learner.

    Attributes
    ----------
    sqrt_precond
        The :class:`~fisher_mala.square_roots.LowRankSqrt` in use (refreshed each cycle).
    sum_squares
        ``(d,)``, ``sum_n s_n^2``: the Fisher diagonal's running sum (``diagonal=
        "learned"`` only; zeros otherwise, as ``position_squares``).
    count
        Signals absorbed.
    basis
        ``(d, 3k)``, the search basis ``W`` of the current cycle.
    gram
        ``(3k, 3k)``, ``sum (W^T phi)(W^T phi)^T`` over the current cycle.
    products
        ``(d, 3k)``, ``sum phi (W^T phi)^T`` over the current cycle (``F~ W`` times ``T``).
    position_products
        ``(d, 3k)``, ``sum xi (W^T xi)^T`` over the current cycle, ``xi = D^(-1/2) (x -
        xbar)`` the scaled deviation of the chain's position from its running mean
        (``F~^(-1) W`` times ``T`` for a Gaussian target, up to the chain's
        autocorrelation).
    position_sum
        ``(d,)``, the sum of the positions (for ``xbar``).
    whitened_moments
        ``(3, d)``, ``sum psi^2``, ``sum zeta^2`` and ``sum zeta`` over the current cycle:
        the diagonals of the whitened signals' second moment and of the whitened
        positions' variance within the cycle (``diagonal="whitened"``,
        :func:`_cycle_moments`).
    trace_sum
        ``sum ||phi||^2`` over the current cycle (``tr F~`` times ``T``).
    probes
        ``(d, 2k)``, random orthonormal directions outside the basis (drawn each cycle).
    probe_gram
        ``(2k, 2k)``, ``sum (P^T phi)(P^T phi)^T`` over the current cycle: the level of the
        rest of the space (module docstring).
    cycle
        Signals absorbed in the current cycle.
    signal_buffer, position_buffer
        ``(B, d)``: the last signals and scaled positions, not yet in ``gram`` and the
        products (:data:`BUFFER`); absorbed ``B`` at a time by two matrix products, so
        that the ``d x 3k`` accumulators are read and written once per ``B`` signals
        rather than at every one.
    """

    sqrt_precond: LowRankSqrt
    sum_squares: Array
    count: Array
    basis: Array
    gram: Array
    products: Array
    position_products: Array
    position_sum: Array
    position_squares: Array
    whitened_moments: Array
    trace_sum: Array
    probes: Array
    probe_gram: Array
    cycle: Array
    signal_buffer: Array
    position_buffer: Array


def cycle_length(rank: int) -> int:
    """``T``, the signals of one cycle (:data:`CYCLE_SIGNALS_PER_RANK`)."""
    return max(MIN_CYCLE, CYCLE_SIGNALS_PER_RANK * SEARCH_BLOCKS * int(rank))


def whitened_pace(rank: int) -> tuple[float, int]:
    """``(step, delay)`` of ``diagonal="whitened"`` for rank ``k``: the fraction of the
    correction per cycle and the signals before the first. The pace per signal is that of
    :data:`WHITENED_STEP` and :data:`WHITENED_DELAY_CYCLES` over the cycles of
    :data:`WHITENED_REFERENCE_RANK` (``1 - (1 - s)^(T_k / T_ref)`` per cycle of ``T_k``
    signals, at most :data:`WHITENED_MAX_STEP`): the same for ``k = 8``, not four times
    slower for ``k = 32``."""
    reference = cycle_length(WHITENED_REFERENCE_RANK)
    step = 1.0 - (1.0 - WHITENED_STEP) ** (cycle_length(rank) / reference)
    return min(step, WHITENED_MAX_STEP), WHITENED_DELAY_CYCLES * reference


def _orthonormal(matrix: Array) -> Array:
    return jnp.linalg.qr(matrix)[0]


def _probes(rng_key, basis: Array, count: int) -> Array:
    """``count`` random orthonormal directions orthogonal to ``basis``."""
    probes = jax.random.normal(rng_key, (basis.shape[0], count), basis.dtype)
    for _ in range(2):  # twice is enough (Kahan's rule for Gram-Schmidt)
        probes = probes - basis @ (basis.T @ probes)
    return _orthonormal(probes) if count else probes


def init(rng_key, dim: int, dtype, rank: int, damping=DAMPING) -> LowRankFisherState:
    """The learner before any signal: ``D = I / lambda``, ``c = 0`` (``A = I / lambda``,
    the dense ``R_0``), a random orthonormal search basis of ``min(3k, d)`` columns and
    the probes outside it."""
    width = min(SEARCH_BLOCKS * int(rank), int(dim))
    key_basis, key_probes = jax.random.split(rng_key)
    basis = _orthonormal(jax.random.normal(key_basis, (dim, width), dtype))
    probes = _probes(key_probes, basis, min(PROBE_BLOCKS * int(rank), int(dim) - width))
    scale = jnp.full((dim,), 1.0 / jnp.sqrt(jnp.asarray(damping, dtype)), dtype)
    kept = min(int(rank), width)
    return LowRankFisherState(
        sqrt_precond=LowRankSqrt(scale, basis[:, :kept], jnp.zeros((kept,), dtype)),
        sum_squares=jnp.zeros((dim,), dtype),
        count=jnp.zeros((), jnp.int32),
        basis=basis,
        gram=jnp.zeros((width, width), dtype),
        products=jnp.zeros((dim, width), dtype),
        position_products=jnp.zeros((dim, width), dtype),
        position_sum=jnp.zeros((dim,), dtype),
        position_squares=jnp.zeros((dim,), dtype),
        whitened_moments=jnp.zeros((3, dim), dtype),
        trace_sum=jnp.zeros((), dtype),
        probes=probes,
        probe_gram=jnp.zeros((probes.shape[1],) * 2, dtype),
        cycle=jnp.zeros((), jnp.int32),
        signal_buffer=jnp.zeros((BUFFER, dim), dtype),
        position_buffer=jnp.zeros((BUFFER, dim), dtype),
    )


def _inverse_factors(root: LowRankSqrt) -> Array:
    """``c'`` with ``(I + Q diag(c) Q^T)^(-1) = I + Q diag(c') Q^T``."""
    return 1.0 / (1.0 + root.factors) - 1.0


def _apply(basis: Array, factors: Array, v: Array) -> Array:
    """``(I + Q diag(c) Q^T) v``, ``v`` a vector or the columns of a matrix."""
    projected = jnp.einsum("dk,d...->k...", basis, v)  # Q^T v, no copy of Q^T (square_roots)
    return v + basis @ (factors.reshape(factors.shape + (1,) * (v.ndim - 1)) * projected)


def _ritz(state: LowRankFisherState, rank: int):
    """Rayleigh-Ritz of the whitened signals' second moment ``E[psi psi^T]`` on the basis:
    the ``rank`` pairs farthest from the rest of the space (log scale, both ends), and the
    level of the rest: the probes' median Ritz value (module docstring), or where there
    are no probes (``3k >= d``) the mean ``(tr - sum kept) / (d - k)``."""
    signals = state.cycle.astype(state.gram.dtype)
    quotient = state.gram / signals
    mu, vectors = jnp.linalg.eigh(0.5 * (quotient + quotient.T))
    mu = jnp.clip(mu, *THETA_BOUNDS)
    dim = state.basis.shape[0]
    trace = state.trace_sum / signals

    if state.probes.shape[1]:
        probed = state.probe_gram / signals
        level = jnp.median(jnp.linalg.eigvalsh(0.5 * (probed + probed.T)))
        level = jnp.clip(level, *THETA_BOUNDS)
        order = jnp.argsort(-jnp.abs(jnp.log(mu / level)))[:rank]
        return mu[order], vectors[:, order], level

    def kept_and_bulk(level):
        order = jnp.argsort(-jnp.abs(jnp.log(mu / level)))[:rank]
        rest = (trace - jnp.sum(mu[order])) / max(dim - rank, 1)
        return order, jnp.clip(rest, *THETA_BOUNDS) if dim > rank else jnp.ones_like(rest)

    order, bulk = kept_and_bulk(jnp.ones((), mu.dtype))
    order, bulk = kept_and_bulk(bulk)  # again, from the level of the rest of the space
    return mu[order], vectors[:, order], bulk


def _cycle_moments(state: LowRankFisherState) -> Array:
    """``(2, d)``: the cycle's ``E[psi^2]`` and the variance of ``zeta`` about the cycle's
    own mean, for :func:`_whitened_correction`.

    ``zeta = R^(-1) (x - xbar)`` is centred on the running mean of every position since
    the start, which lags a chain still drifting toward the bulk (the first thousands of
    iterations at ``d = 10^4``): about that mean, the coordinates still on the move look
    loose, ``D`` widens them, and ``Q`` takes stiff directions to make up for it, the two
    pulling apart cycle after cycle. Taken about the cycle's own mean, the drift between
    cycles is left out (``python -m benchmarks.low_rank_race --probe
    hierarchical_logistic_10k --diagonal whitened --chains 4``; ``docs/large_problems.md``).
    """
    signals = state.cycle.astype(state.gram.dtype)
    psi2, zeta2, zeta = state.whitened_moments / signals
    return jnp.stack([psi2, zeta2 - zeta**2])


def _moments_after(state: LowRankFisherState, moments: Array, vectors: Array, beta: Array):
    """``(2, d)``: the cycle's diagonal moments (:func:`_cycle_moments`) as the cycle's own
    low-rank update will leave them, for :func:`_whitened_correction`.

    At the end of a cycle the low-rank part changes the whitening by ``M = I + V diag(a)
    V^T``, ``V = W vectors`` the Ritz directions (whitened coordinates) and ``a =
    beta^(-1/2) - 1`` (module docstring): the whitened signals become ``M psi`` and the
    whitened positions ``M^(-1) zeta``, ``M^(-1) = I + V diag(beta^(1/2) - 1) V^T``. A
    correction of ``D`` read off the moments before that update corrects again what the
    update corrects (a stiff direction spread over many coordinates shows on each of their
    diagonals): the two overshoot together, which is what held ``"whitened"`` to a quarter
    step and slowed it. Read off the moments after it, ``D`` corrects only what the update
    leaves. Exact for the cycle's own moments (the products hold ``Psi W`` and ``Z W``,
    and ``V`` lies in ``W``'s span): ``diag(M X M) = diag(X) + 2 rowsum(V diag(a) * X V)
    + rowsum((V diag(a) (V^T X V)) * V diag(a))``, ``O(d k^2)``. The refreshed ``R``'s
    whitened coordinates are ``M``'s up to a rotation within the span of the old and new
    directions (the symmetric square root), which this leaves out.
    """
    signals = state.cycle.astype(state.gram.dtype)
    directions = state.basis @ vectors  # V
    mean_zeta = state.whitened_moments[2] / signals  # the cycle's mean of zeta
    projected_mean = vectors.T @ (state.basis.T @ mean_zeta)  # V^T zbar
    signal_cross = (state.products / signals) @ vectors  # Psi V
    signal_gram = vectors.T @ (state.gram / signals) @ vectors  # V^T Psi V
    # Z V and V^T Z V about the cycle's mean: the products are about the running mean
    position_cross = (state.position_products / signals) @ vectors
    position_cross = position_cross - jnp.outer(mean_zeta, projected_mean)
    position_gram = vectors.T @ (state.basis.T @ position_cross)
    position_gram = 0.5 * (position_gram + position_gram.T)

    def after(diagonal, cross, gram, coefficients):
        weighted = directions * coefficients  # V diag(coefficients)
        return (
            diagonal
            + 2.0 * jnp.sum(weighted * cross, axis=1)
            + jnp.sum((weighted @ gram) * weighted, axis=1)
        )

    psi2, zeta2 = moments
    return jnp.stack(
        [
            after(psi2, signal_cross, signal_gram, beta**-0.5 - 1.0),
            after(zeta2, position_cross, position_gram, jnp.sqrt(beta) - 1.0),
        ]
    )


def _whitened_correction(moments: Array, step) -> Array:
    """``diagonal="whitened"``: the factor on ``D^(1/2)`` that moves the diagonal of the
    whitened target toward isotropy, from one cycle's ``E[psi^2]`` and ``Var zeta`` (rows
    of ``moments``, :func:`_cycle_moments`), its geometric mean 1 (the level is the
    rest's, set after).

    Seen through the current ``R``, a Gaussian target is ``B = R^T F R``; the whitened
    signal's second moment is ``B^2`` (``docs/signal_bias.md``) and the whitened
    positions' is ``B^(-1)``. On the diagonal, ``b_i = E[psi_i^2]^(1/4) E[zeta_i^2]^(-1/2)``
    (the geometric mean of the two estimates of ``B_ii``), and ``D_ii^(1/2) / sqrt(b_i)``
    whitens coordinate ``i`` of a diagonal target in one cycle; ``step`` takes that
    fraction of the way on a log scale (:data:`WHITENED_STEP`). Unlike ``"learned"``'s
    rule, which reads the target's marginal variances and Fisher diagonal whatever ``Q``
    already explains, this one corrects what ``R`` as a whole leaves: where the low-rank
    part has the stiff directions of a prior-whitened model, ``D`` stays near the
    identity.
    """
    psi2, zeta2 = moments
    usable = (psi2 > 0) & (zeta2 > 0) & jnp.isfinite(psi2) & jnp.isfinite(zeta2)
    log_factor = step * (
        0.25 * jnp.log(jnp.where(usable, zeta2, 1.0))
        - 0.125 * jnp.log(jnp.where(usable, psi2, 1.0))
    )
    log_factor = jnp.where(usable, log_factor, 0.0)
    return jnp.exp(log_factor - jnp.mean(log_factor))


def _refresh(state: LowRankFisherState, rank: int, damping, diagonal) -> LowRankFisherState:
    """End of a cycle (module docstring): the fixed point of the whitened second moment,
    the new ``R`` truncated to ``rank`` directions, ``D``, the next search basis and
    probes."""
    signals = state.cycle.astype(state.gram.dtype)
    root = state.sqrt_precond
    mu, vectors, bulk = _ritz(state, rank)
    # E[psi psi^T] = B^2 with B = R^T F R (a Gaussian, small steps): the fixed point of
    # A^(-1) = E[s s^T] is A = R B^(-1) R^T, so B's eigenvalues are the square roots.
    # A Ritz value within the sampling noise of the rest of the space changes nothing:
    # the effective rank is learned, up to k (the edges of Marchenko-Pastur's law for a
    # 3k-column basis seen through T signals, widened by NOISE_MARGIN).
    noise = 2.0 * NOISE_MARGIN * jnp.log1p(jnp.sqrt(state.basis.shape[1] / signals))
    beta = jnp.where(jnp.abs(jnp.log(mu / bulk)) > noise, jnp.sqrt(mu / bulk), 1.0)
    directions = state.basis @ vectors  # (d, k) in the whitened coordinates
    stiff = (state.products / signals) @ vectors - directions * mu  # B^2 Q - Q mu
    loose = (state.position_products / signals) @ vectors - directions / jnp.sqrt(mu)
    candidates = jnp.concatenate([stiff, loose], axis=1)
    candidates = candidates - directions @ (directions.T @ candidates)
    width = state.basis.shape[1]
    basis = _orthonormal(jnp.concatenate([directions, candidates], axis=1)[:, :width])
    # The new operator in D-scaled coordinates, (I + QCQ^T)(I + V (1/beta - 1) V^T)(I + QCQ^T),
    # is the identity outside span[Q, V]: its eigenpairs there, the k farthest from 1 kept.
    span = _orthonormal(jnp.concatenate([root.basis, directions], axis=1))
    image = _apply(root.basis, root.factors, span)
    image = _apply(directions, 1.0 / beta - 1.0, image)
    image = _apply(root.basis, root.factors, image)
    local = span.T @ image
    lam, local_vectors = jnp.linalg.eigh(0.5 * (local + local.T))
    lam = jnp.clip(lam, *THETA_BOUNDS)
    keep = jnp.argsort(-jnp.abs(jnp.log(lam)))[:rank]
    new_basis = span @ local_vectors[:, keep]
    # D = sqrt(Var x / F_ii) (the diagonal of Seyboldt et al.'s Fisher HMC, a fixed point
    # of the biased Fisher diagonal as the low-rank part is of B), the bulk folded into it.
    if diagonal == "learned":  # the only reader of the sums of s^2 and x^2 (`update`)
        fisher_diagonal = (damping + state.sum_squares) / (1.0 + state.count)
        count = state.count.astype(fisher_diagonal.dtype)
        mean = state.position_sum / count
        variance = jnp.maximum(state.position_squares / count - mean**2, 0.0)
        variance = jnp.where(variance > 0, variance, 1.0 / fisher_diagonal)
        scale = jnp.sqrt(jnp.sqrt(variance / fisher_diagonal))
    elif diagonal == "unit":
        scale = root.scale  # the identity, at the level it has
    elif diagonal == "whitened":  # after the first cycles, a step toward the correction
        moments = _moments_after(state, _cycle_moments(state), vectors, beta)
        step, delay = whitened_pace(rank)
        factor = _whitened_correction(moments, step)
        started = state.count >= delay
        scale = root.scale * jnp.where(started, factor, 1.0)
    scale = scale * jnp.sqrt(jnp.exp(jnp.mean(jnp.log(root.scale**2 / scale**2))))
    scale = scale / jnp.sqrt(jnp.sqrt(bulk))
    key = jax.random.fold_in(jax.random.key(0), state.count)  # the probes: any fresh draw
    return state._replace(
        sqrt_precond=LowRankSqrt(scale, new_basis, jnp.sqrt(lam[keep]) - 1.0),
        basis=basis,
        gram=jnp.zeros_like(state.gram),
        products=jnp.zeros_like(state.products),
        position_products=jnp.zeros_like(state.position_products),
        trace_sum=jnp.zeros_like(state.trace_sum),
        whitened_moments=jnp.zeros_like(state.whitened_moments),
        probes=_probes(key, basis, state.probes.shape[1]),
        probe_gram=jnp.zeros_like(state.probe_gram),
        cycle=jnp.zeros_like(state.cycle),
    )


def _absorb(state: LowRankFisherState) -> LowRankFisherState:
    """The buffered signals and positions into ``gram`` and the products (two matrix
    products; unused buffer rows are zeros and add nothing)."""
    projected = state.signal_buffer @ state.basis  # (B, 3k)
    positions = state.position_buffer @ state.basis
    probed = state.signal_buffer @ state.probes
    return state._replace(
        probe_gram=state.probe_gram + probed.T @ probed,
        gram=state.gram + projected.T @ projected,
        products=state.products + jnp.einsum("bd,bk->dk", state.signal_buffer, projected),
        position_products=state.position_products
        + jnp.einsum("bd,bk->dk", state.position_buffer, positions),
        signal_buffer=jnp.zeros_like(state.signal_buffer),
        position_buffer=jnp.zeros_like(state.position_buffer),
    )


def update(
    state: LowRankFisherState, whitened_signal: Array, position: Array, rank: int,
    damping=DAMPING, diagonal=DEFAULT_DIAGONAL,
):  # fmt: skip
    """Buffer one whitened signal ``psi = R^T s`` and the chain's position ``x`` (both
    ``(d,)``). Call :func:`end_of_block` after every :data:`BUFFER` of them: it absorbs
    the buffers and refreshes ``R`` at the end of a cycle. The sums of ``s^2`` and ``x^2``
    that only ``diagonal="learned"`` reads are left at zero for the other diagonals."""
    root = state.sqrt_precond
    inverse = root._replace(factors=_inverse_factors(root))  # (I + Q C Q^T)^(-1)
    signal = _low_rank_apply(inverse, whitened_signal) / root.scale  # R^(-T) psi
    position_sum = state.position_sum + position
    deviation = (position - position_sum / (state.count + 1)) / root.scale
    zeta = _low_rank_apply(inverse, deviation)  # R^(-1) (x - xbar)
    slot = state.cycle % BUFFER
    learned = diagonal == "learned"
    return state._replace(
        sum_squares=state.sum_squares + signal**2 if learned else state.sum_squares,
        count=state.count + 1,
        position_sum=position_sum,
        position_squares=state.position_squares + position**2
        if learned
        else state.position_squares,
        whitened_moments=state.whitened_moments + jnp.stack([whitened_signal**2, zeta**2, zeta]),
        trace_sum=state.trace_sum + whitened_signal @ whitened_signal,
        cycle=state.cycle + 1,
        signal_buffer=state.signal_buffer.at[slot].set(whitened_signal),
        position_buffer=state.position_buffer.at[slot].set(zeta),
    )


def end_of_block(
    state: LowRankFisherState, rank: int, damping=DAMPING, diagonal=DEFAULT_DIAGONAL
) -> LowRankFisherState:
    """After every :data:`BUFFER` updates (and after the last): absorb the buffers, and
    end the cycle (:func:`_refresh`) once it has its length.

    Outside the per-signal loop on purpose: XLA:CPU copies the ``d x 3k`` accumulators
    into a conditional whose branch rewrites them, at every evaluation of the condition
    (measured: 10 ms per signal at ``d = 10^5``, ``k = 8``); once per block it is
    amortized.
    """
    state = _absorb(state)
    rank = min(int(rank), state.basis.shape[1])
    length = jnp.maximum(cycle_length(rank), state.count // CYCLE_GROWTH)
    return jax.lax.cond(
        state.cycle >= length,
        lambda s: _refresh(s, rank, damping, diagonal),
        lambda s: s,
        state,
    )


def fisher_state(position, logdensity, logdensity_grad, step_size, root: LowRankSqrt):
    """A :class:`~fisher_mala.fisher.FisherMALAState` whose ``R`` is ``root`` (built
    directly: :func:`fisher_mala.fisher.state_from` would make a dense ``R_0``)."""
    from fisher_mala import square_roots
    from fisher_mala.fisher import FisherMALAState

    flat = ravel(logdensity_grad)
    return FisherMALAState(
        position=position,
        logdensity=logdensity,
        logdensity_grad=logdensity_grad,
        sqrt_precond=root,
        step_size=jnp.asarray(step_size, flat.dtype),
        trace_precond=square_roots.trace(root),
        whitened_grad=square_roots.whiten(root, flat),
        whitened_mean_score=jnp.zeros_like(flat),
        count=jnp.zeros((), jnp.int32),
    )


def adaptive_step(
    step_size_rule, rank: int, damping=DAMPING, diagonal=DEFAULT_DIAGONAL
) -> Callable:
    """One FisherMALA iteration with the low-rank learner: preconditioned MALA with the
    learner's ``R``, the Rao-Blackwellized signal of Eq. (16), the learner's update, the
    step-size rule of Algorithm 1.

    ``step(rng_key, (fisher_state, learner), logdensity_fn) -> ((fisher_state, learner),
    info)``; ``fisher_state`` is a :class:`~fisher_mala.fisher.FisherMALAState` whose
    ``sqrt_precond`` is the learner's :class:`~fisher_mala.square_roots.LowRankSqrt`. Run
    it in blocks of :data:`BUFFER` iterations, each followed by :func:`finish_block`
    (:func:`scan_adaptive`; the warm-up's phase does it with its ``block``).
    """
    mala_kernel = mala.build_kernel()

    def step(rng_key, carry, logdensity_fn):
        state, learner = carry
        moved, info = mala_kernel(rng_key, kernel_view(state), logdensity_fn, state.step_size)
        psi = whitened_signal(  # R^T s of Eq. (16), free from the whitened gradients
            "rao_blackwell", info.whitened_grad, info.proposal_whitened_grad,
            info.acceptance_rate, info.is_accepted, info.proposal_is_finite,
        )  # fmt: skip
        learner = update(learner, psi, ravel(moved.position), rank, damping, diagonal)
        step_size = step_size_rule.update(RobbinsMonroState(state.step_size), info.acceptance_rate)
        state = state._replace(  # R changes only at the end of a block (finish_block)
            position=moved.position,
            logdensity=moved.logdensity,
            logdensity_grad=moved.logdensity_grad,
            whitened_grad=moved.whitened_grad,
            step_size=step_size_rule.final(step_size),
            count=learner.count,
        )
        return (state, learner), info

    return step


def start_block(carry):
    """``carry -> carry``: before a block of iterations, ``R``'s ``rows`` (``Q^T`` stored
    ``(k, d)``) for the block's products with ``Q``, which then run at about twice the
    speed at large ``d`` (:class:`~fisher_mala.square_roots.LowRankSqrt`); one transpose
    per block, in which ``R`` does not change. :func:`finish_block` drops them again."""
    state, learner = carry
    root = with_rows(learner.sqrt_precond)
    return state._replace(sqrt_precond=root), learner._replace(sqrt_precond=root)


def finish_block(rank: int, damping=DAMPING, diagonal=DEFAULT_DIAGONAL) -> Callable:
    """``carry -> carry``: :func:`end_of_block` on ``(fisher_state, learner)``, the new
    ``R`` carried into the FisherMALA state (its trace and whitened gradient); the
    block's ``rows`` dropped (:func:`start_block`)."""
    from fisher_mala import square_roots

    def finish(carry):
        state, learner = carry
        learner = learner._replace(sqrt_precond=without_rows(learner.sqrt_precond))
        learner = end_of_block(learner, rank, damping, diagonal)
        root = learner.sqrt_precond
        state = state._replace(
            sqrt_precond=root,
            trace_precond=square_roots.trace(root),
            whitened_grad=square_roots.whiten(root, ravel(state.logdensity_grad)),
        )
        return state, learner

    return finish


def scan_adaptive(rng_key, carry, logdensity_fn, num_steps: int, rank: int, step_size_rule,
                  damping=DAMPING, diagonal=DEFAULT_DIAGONAL):  # fmt: skip
    """``num_steps`` adaptive iterations in blocks of :data:`BUFFER` (as the warm-up runs
    them): ``(carry, acceptance rates)``."""
    step = adaptive_step(step_size_rule, rank, damping, diagonal)
    finish = finish_block(rank, damping, diagonal)

    def one(carry, i):
        carry, info = step(jax.random.fold_in(rng_key, i), carry, logdensity_fn)
        return carry, info.acceptance_rate

    def block(carry, b):
        carry, rates = jax.lax.scan(one, start_block(carry), b * BUFFER + jnp.arange(BUFFER))
        return finish(carry), rates

    num_blocks, remainder = divmod(int(num_steps), BUFFER)
    carry, rates = jax.lax.scan(block, carry, jnp.arange(num_blocks))
    rates = rates.reshape(-1)
    if remainder:
        indices = num_blocks * BUFFER + jnp.arange(remainder)
        carry, tail = jax.lax.scan(one, start_block(carry), indices)
        carry, rates = finish(carry), jnp.concatenate([rates, tail])
    return carry, rates


def check_rank(rank) -> int:
    """``rank`` as a positive int (a clear error otherwise)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"`rank` must be a positive integer or 'auto', got {rank!r}.")
    return rank


def check_diagonal(diagonal) -> str:
    """``diagonal`` as one of :data:`DIAGONALS` (a clear error otherwise)."""
    if diagonal not in DIAGONALS:
        raise ValueError(
            f"`low_rank_diagonal` must be one of {DIAGONALS}, got {diagonal!r}: 'unit' holds "
            "D at the identity (coordinates whose prior is N(0, I)), 'learned' learns it from "
            "the draws and signals, 'whitened' from what the whole R leaves unexplained."
        )
    return diagonal


def resolve_rank(rank, dim: int):
    """``rank="auto"``: ``None`` (the dense ``R``) up to :data:`AUTO_DENSE_MAX_DIM`,
    :data:`AUTO_RANK` above it (directions within the noise are dropped at every cycle, so
    the rank that acts is learned); anything else is checked and returned."""
    if rank is None:
        return None
    if rank == "auto":
        return None if dim <= AUTO_DENSE_MAX_DIM else AUTO_RANK
    return check_rank(rank)
