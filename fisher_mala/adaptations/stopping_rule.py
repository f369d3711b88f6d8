"""Looks at the learned ``R`` on the host: the stopping rule and the choice of metric.

Fisher NUTS / HMC learn ``R`` with FisherMALA iterations run in compiled blocks; between
blocks, on the host, two questions are asked of the learned square roots:

* **Has ``R`` settled?** (:func:`stopping_rule`, an ``(init, update, final)`` triple over
  the square roots seen at the ends of blocks): Proposition 4 learns the un-normalized
  Fisher matrix ``F_n = (R_n R_n^T)^{-1} = lambda I + sum_{i <= n} s_i s_i^T``, so the
  signals absorbed between two looks alone, whitened by the earlier ``R``, sum to
  ``M = X^T X - I`` with ``X = R_now^{-1} R_prev``. Were the earlier ``R`` already right,
  ``M``'s condition number would be sampling noise, about the Marchenko-Pastur ratio for
  that many signals (:func:`noise_condition_number`). The rule: within
  :data:`LEARNED_NOISE_FACTOR` of it on every chain.
* **Is a diagonal metric enough?** (:func:`diagonal_suffices`): the learned correlation
  matrix within :data:`DIAGONAL_NOISE_FACTOR` of what sampling noise alone gives.

Both are ``O(d^3)`` per chain in float64 on the host, and skipped above
:data:`AUTO_MAX_DIM`.
"""

from typing import NamedTuple

import numpy as np

from fisher_mala import validation
from fisher_mala.adaptations.base import Adaptation

__all__ = [
    "chains_behind",
    "chains_settled",
    "SETTLED_SPREAD_SDS",
    "AUTO_MAX_DIM",
    "DIAGONAL_NOISE_FACTOR",
    "LEARNED_NOISE_FACTOR",
    "PLATEAU_NOISE_FACTOR",
    "PLATEAU_SIGNALS_PER_DIM",
    "PROBE_SIGNALS_PER_DIM",
    "StoppingRuleState",
    "stopping_rule",
    "block_condition_number",
    "correlation_condition_number",
    "diagonal_suffices",
    "noise_condition_number",
    "prior_dominated",
    "PRIOR_SHARE_MAX",
]

#: ``metric="auto"`` picks a diagonal ``R`` when the learned correlation matrix's condition
#: number is at most this factor times the one sampling noise alone would give
#: (:func:`noise_condition_number`): when the correlations it learned are no larger than
#: noise. Any factor above 1 lets real correlations through as noise, and a diagonal then
#: loses them. Measured on the race's posteriors (d = 3 to 10, ``python -m
#: benchmarks.nutpie_race --inspect NAME --set "metric='dense'"``): with a factor of 2
#: the diagonal was picked on four of them, and the dense ``R`` drew 1.17 to 1.46 times
#: the min ESS per gradient on two of them (learned condition numbers 0.85 to 1.61 times
#: the noise's: ``python -m benchmarks.metric_choice --targets NAME --warmup 20000``),
#: 1.03 to 1.10 on a third, 0.85 to 0.88 on the fourth.
DIAGONAL_NOISE_FACTOR = 1.0
#: Above this dimension ``metric="auto"`` keeps the dense ``R`` without checking (the check
#: is one ``O(d^3)`` eigendecomposition on the host, less than the ``O(d^2)`` Fisher phase
#: costs below it).
AUTO_MAX_DIM = 4096
#: With ``metric="auto"`` the metric is first looked at after this many signals per
#: dimension (:meth:`FisherHMCWarmup.first_fisher_iterations`). With ``n = 16 d`` the noise
#: bound is ``2 ((1 + 1/4) / (1 - 1/4))^2 = 5.6`` (:func:`noise_condition_number`); the
#: scales of a diagonal ``A`` are learned to a relative error of about ``sqrt(2 / n)``,
#: under 5% with the at least 1000 signals of one block of the adaptive phase.
PROBE_SIGNALS_PER_DIM = 16
#: The stopping rule (:meth:`FisherHMCWarmup.learned`) ends the Fisher phase when the
#: newest block's whitened signals have a condition number within this factor of sampling
#: noise's. Measured on the race's targets (``python -m benchmarks.stopping_rule``): 0.9
#: to 1.7 once ``R`` has settled, 2.3 to ``10^7`` before.
LEARNED_NOISE_FACTOR = 2.0
#: Where the target's curvature changes with position (a funnel) no ``R`` whitens every
#: block's signals, and the rule above never fires: on the centred eight schools the ratio
#: stays between 1.3 and 9, never within 2 on every chain at once, for 16 000 iterations
#: (``python -m benchmarks.stopping_rule --targets eight_schools_centered --warmup 20000``).
#: The phase then also ends (a plateau, not settled) at the first look where the newest
#: block is within this factor of sampling noise on every chain ...
PLATEAU_NOISE_FACTOR = 10.0
#: ... once every chain has absorbed this many signals per dimension: the learned ``F``'s
#: sampling noise is then within ``(1 +- sqrt(1 / 400))^2``, a condition number of 1.22, so
#: more signals could make NUTS's trajectories at most ``sqrt(1.22) = 1.1`` times shorter.
PLATEAU_SIGNALS_PER_DIM = 400


#: A chain is behind the others at the end of the Fisher phase when its log density is
#: more than this many of the stationary standard deviations of ``log pi`` (``sqrt(d / 2)``
#: on a Gaussian, where ``-log pi`` is ``chi^2_d / 2`` up to a constant), plus
#: :data:`SETTLED_SLACK` nats, below the highest chain's (:func:`chains_behind`). At
#: stationarity four Gaussian chains are never that far apart (the range of four draws
#: exceeds 4 standard deviations about once in 300 looks, 8 essentially never); a chain in
#: a minor mode that MALA's local moves do not leave, or still on its way, is tens of nats
#: below. Heavy tails and funnels spread ``log pi`` wider, hence the generous margin.
SETTLED_SPREAD_SDS = 8.0
#: Nats added to the margin of :data:`SETTLED_SPREAD_SDS` (small ``d``).
SETTLED_SLACK = 10.0


def chains_behind(logdensities, dim: int) -> np.ndarray:
    """Indices of the chains whose log density is more than ``SETTLED_SPREAD_SDS *
    sqrt(d / 2) + SETTLED_SLACK`` below the highest chain's, or not finite."""
    values = np.ravel(np.asarray(logdensities, np.float64))
    if values.size < 2:
        return np.zeros(0, int)
    best = np.max(values[np.isfinite(values)], initial=-np.inf)
    margin = SETTLED_SPREAD_SDS * np.sqrt(dim / 2.0) + SETTLED_SLACK
    return np.nonzero(~(values >= best - margin))[0]


def chains_settled(logdensities, dim: int) -> bool:
    """Whether no chain is behind the others (:func:`chains_behind`)."""
    return chains_behind(logdensities, dim).size == 0


def noise_condition_number(dim: int, num_signals) -> np.ndarray:
    """Condition number that sampling noise alone gives a learned correlation matrix.

    The sample correlation matrix of ``n`` independent draws of ``N(0, I_d)`` has its
    eigenvalues between the Marchenko-Pastur edges ``(1 -+ sqrt(d / n))^2``, so its
    condition number is about ``((1 + q) / (1 - q))^2`` with ``q = sqrt(d / n)``. Infinite
    for ``n < 4 d`` (``q > 1/2``), where the learned correlations say little.
    """
    q = np.sqrt(dim / np.maximum(np.asarray(num_signals, np.float64), 1.0))
    with np.errstate(divide="ignore"):
        return np.where(q <= 0.5, ((1 + q) / (1 - q)) ** 2, np.inf)


def diagonal_suffices(sqrt_precond, num_signals) -> bool:
    """Whether a diagonal metric loses nothing measurable against the learned dense ``R``.

    True when every chain's learned correlation matrix has a condition number within
    :data:`DIAGONAL_NOISE_FACTOR` of what ``num_signals`` signals give an independent
    target (:func:`noise_condition_number`), and ``d <= AUTO_MAX_DIM``.
    """
    dim = np.shape(sqrt_precond)[-1]
    if dim > AUTO_MAX_DIM:
        return False
    kappa = correlation_condition_number(sqrt_precond)
    bound = DIAGONAL_NOISE_FACTOR * noise_condition_number(dim, num_signals)
    return bool(np.all(kappa <= bound))


#: ``metric="auto"`` keeps the dense ``R`` while the damping still makes more than this
#: share of the learned precision in some direction. Proposition 4 accumulates
#: ``F = (R R^T)^{-1} = lambda I + sum_i s_i s_i^T``, so ``lambda * lambda_max(R R^T)`` is
#: the damping's share in the direction the signals have taught least. Where it is large,
#: ``A`` there is the damping's isotropic guess, and its correlations (none) say nothing
#: about the posterior's.
PRIOR_SHARE_MAX = 0.1


def prior_dominated(sqrt_precond, damping) -> bool:
    """Whether, for some chain, the damping makes more than :data:`PRIOR_SHARE_MAX` of the
    learned precision in some direction (``damping * lambda_max(R R^T)``)."""
    r = np.asarray(sqrt_precond, np.float64)
    top = np.linalg.eigvalsh(r @ np.swapaxes(r, -1, -2))[..., -1]
    return bool(np.any(float(damping) * top > PRIOR_SHARE_MAX))


def block_condition_number(sqrt_prev, sqrt_now) -> np.ndarray:
    """Condition number of ``M = R_prev^T (F_now - F_prev) R_prev`` per leading index.

    ``F = (R R^T)^{-1}``; ``M = X^T X - I`` with ``X = R_now^{-1} R_prev`` (one solve), in
    float64 on the host. Infinite where ``M`` is not positive definite.
    """
    r_prev, r_now = (np.asarray(r, np.float64) for r in (sqrt_prev, sqrt_now))
    x = np.linalg.solve(r_now, r_prev)
    m = np.swapaxes(x, -1, -2) @ x - np.eye(r_prev.shape[-1])
    eigenvalues = np.linalg.eigvalsh(m)
    smallest, largest = eigenvalues[..., 0], eigenvalues[..., -1]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(smallest > 0, largest / smallest, np.inf)


def correlation_condition_number(sqrt_precond) -> np.ndarray:
    """Condition number of the correlation matrix of ``A = R R^T`` (per leading index).

    Computed on the host in float64. It is 1 for a diagonal ``A``; a diagonal metric
    makes NUTS's whitened target have this condition number instead of about 1.
    """
    r = np.asarray(sqrt_precond, np.float64)
    a = r @ np.swapaxes(r, -1, -2)
    sd = np.sqrt(np.diagonal(a, axis1=-2, axis2=-1))
    eigenvalues = np.linalg.eigvalsh(a / sd[..., :, None] / sd[..., None, :])
    smallest, largest = eigenvalues[..., 0], eigenvalues[..., -1]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(smallest > 0, largest / smallest, np.inf)


class StoppingRuleState(NamedTuple):
    """State of :func:`stopping_rule` (host arrays).

    Attributes
    ----------
    sqrt_precond
        ``R`` at the last look (a leading chain axis allowed).
    count
        Signals absorbed by then, per chain.
    learned
        Whether the last look found ``R`` settled.
    plateau
        Whether, not settled, the last look found it on a plateau
        (:data:`PLATEAU_NOISE_FACTOR`, :data:`PLATEAU_SIGNALS_PER_DIM`): the phase may
        stop, with an ``R`` that no more signals would make whiten the posterior.
    """

    sqrt_precond: np.ndarray
    count: np.ndarray
    learned: bool
    plateau: bool = False


def stopping_rule(signals_per_update: int = 1) -> Adaptation:
    """The stopping rule of the Fisher phase (module docstring), on the host.

    Parameters
    ----------
    signals_per_update
        Signals one update absorbs (the number of chains for the pooled rank-C update).

    Returns
    -------
    Adaptation
        ``init(sqrt_precond, count) -> StoppingRuleState``; ``update(state,
        (sqrt_precond, count)) -> state``, a look at the ``R`` learned since;
        ``final(state) -> bool``, whether the last look found it settled.
    """

    def concrete(*values):
        if not validation.is_concrete(values):
            raise ValueError(
                "The stopping rule looks at R on the host between compiled parts of the "
                "Fisher phase; under jit pass stopping_rule=False."
            )

    def init(sqrt_precond, count) -> StoppingRuleState:
        concrete(sqrt_precond, count)
        return StoppingRuleState(sqrt_precond, np.asarray(count), False)

    def update(state: StoppingRuleState, now) -> StoppingRuleState:
        sqrt_now, count = now
        concrete(sqrt_now, count)
        num_signals = np.asarray(count, np.float64) - np.asarray(state.count)
        num_signals = num_signals * signals_per_update
        dim = np.shape(sqrt_now)[-1]
        learned = plateau = False
        if dim <= AUTO_MAX_DIM:
            noise = noise_condition_number(dim, np.min(num_signals))
            kappa = block_condition_number(state.sqrt_precond, sqrt_now)
            learned = bool(np.isfinite(noise) and np.all(kappa <= LEARNED_NOISE_FACTOR * noise))
            absorbed = np.min(np.asarray(count, np.float64)) * signals_per_update
            plateau = bool(
                not learned
                and np.isfinite(noise)
                and np.all(kappa <= PLATEAU_NOISE_FACTOR * noise)
                and absorbed >= PLATEAU_SIGNALS_PER_DIM * dim
            )
        return StoppingRuleState(sqrt_now, np.asarray(count), learned, plateau)

    def final(state: StoppingRuleState) -> bool:
        return state.learned

    return Adaptation(init, update, final)
