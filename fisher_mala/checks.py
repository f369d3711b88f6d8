"""Checks of a finished run that never flatter it (what ``fm.sample`` warns about).

:func:`diagnose` runs every check on a :class:`~fisher_mala.sampling.SamplingResult` and
returns the findings as data; ``fm.sample`` turns the findings into one
:class:`SamplingWarning` that names the variables, coordinates and chains concerned.

The checks and their thresholds:

* ``rhat``: rank-normalized split R-hat (ArviZ) above 1.01 (Vehtari et al. 2021, Sec. 4);
* ``ess``: bulk or tail ESS (ArviZ, multi-chain) below 100 per chain (ibid.);
* ``chains_disagree``: a chain's mean of a coordinate differs from the median of the other
  chains' means by more than ``z`` combined Monte Carlo standard errors, with ``z`` the
  Bonferroni bound for a family-wise false-alarm rate of 1% over chains x coordinates
  (a run whose chains share one preconditioner, ``pooled=True``, is checked the same way);
* ``acceptance``: sampling-phase acceptance rates of the chains more than 0.15 apart, or a
  chain more than 0.15 from the target of the step-size adaptation;
* ``rejection_streak`` (Metropolis-Hastings kernels, not NUTS): a chain that rejects a
  run of consecutive proposals so long that a chain accepting independently at its own
  average rate would produce one with probability below 10^-6, and that holds at least
  100 draws and 2% of the chain's draws at one point: the step was far too large there
  for the local scale (a funnel's neck, a wall). The finding names the point: the
  coordinates farthest, in posterior standard deviations, from the posterior mean. The
  length bounds keep the check quiet on heavy tails, where MALA rejects runs of up to 91
  proposals at far points without biasing the moments (the non-centred eight schools,
  ``benchmarks/run_checks.py``);
* ``divergences`` (HMC and NUTS): transitions whose energy error exceeded the divergence
  threshold in the sampling phase; as in Stan, a single one means the trajectories meet
  curvature the step size cannot follow (a neck), and the draws may be biased there;
* ``stuck`` and ``step_size_at_bound``: no proposal accepted in the sampling phase, or an
  adapted step size at the clipping bound of its dtype (:func:`faults`);
* ``nonfinite``: more than 1% of the sampling phase's proposals had a NaN or infinite log
  density or gradient. Each is rejected, so a region where the gradient (or the density)
  is not finite but the target has mass is never entered, and the draws miss it
  silently: on N(0, I) with a NaN gradient for ``x0 > 1`` no draw has ``x0 > 1``, where
  the target has mass 0.159 (``tests/reliability/test_faults.py``). The finding names
  where the region is: the coordinates of the failing proposals' mean position (MALA-type
  kernels report their proposals; for others, the chains' positions when proposals
  failed) farthest, in posterior standard deviations, from the posterior mean.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import jax
import numpy as np

from fisher_mala import convergence, convergence_pass
from fisher_mala.adaptations.step_size import step_size_bounds

__all__ = [
    "MAX_RHAT",
    "MIN_ESS_PER_CHAIN",
    "ACCEPTANCE_TOLERANCE",
    "DISAGREEMENT_ALPHA",
    "STREAK_ALPHA",
    "STREAK_MIN_SHARE",
    "STREAK_MIN_LENGTH",
    "NONFINITE_MAX_SHARE",
    "longest_rejection_streaks",
    "SamplingWarning",
    "Finding",
    "Diagnosis",
    "coordinate_names",
    "faults",
    "diagnose",
    "warn",
]

MAX_RHAT = 1.01  # Vehtari et al. (2021): rank-normalized R-hat below 1.01
MIN_ESS_PER_CHAIN = 100  # Vehtari et al. (2021): bulk and tail ESS above 100 per chain
ACCEPTANCE_TOLERANCE = 0.15  # spread between chains, or distance from the target
DISAGREEMENT_ALPHA = 0.01  # family-wise false-alarm rate of the chain-disagreement check
STREAK_ALPHA = 1e-6  # probability of the longest rejection streak under steady acceptance
STREAK_MIN_SHARE = 0.02  # ... and the share of a chain's draws that the streak holds
STREAK_MIN_LENGTH = 100  # ... and its length (healthy heavy tails: up to 91 measured)
NONFINITE_MAX_SHARE = 0.01  # share of sampling-phase proposals that may be non-finite
#: The checks work on blocks of coordinates whose working memory stays under an eighth of
#: the draws' bytes, or this floor.
WORKING_MEMORY_FLOOR = 32 << 20
_MAX_LISTED = 5


class SamplingWarning(RuntimeWarning):
    """A run's draws should not be trusted as they are (see :func:`diagnose`)."""


@dataclass(frozen=True)
class Finding:
    """One failed check: its name, a sentence for people, and the values for code."""

    check: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Diagnosis:
    """Every check of one run (:func:`diagnose`).

    Attributes
    ----------
    names
        The coordinate names (``"x[3]"``, ``"theta[1, 0]"``), in the order of the arrays.
    rhat, ess_bulk, ess_tail
        ArviZ's rank-normalized R-hat (NaN with one chain) and multi-chain ESS, per
        coordinate.
    chain_acceptance
        Mean acceptance rate of each chain in the sampling phase.
    longest_rejection_streak
        Each chain's longest run of consecutive rejections (Metropolis-Hastings kernels
        without thinning; ``None`` otherwise).
    findings
        The checks that failed; empty for a run that passed them all.
    """

    names: list[str]
    rhat: np.ndarray
    ess_bulk: np.ndarray
    ess_tail: np.ndarray
    chain_acceptance: np.ndarray
    longest_rejection_streak: np.ndarray | None
    findings: list[Finding]

    @property
    def ok(self) -> bool:
        return not self.findings

    def __getitem__(self, check: str) -> Finding | None:
        return next((f for f in self.findings if f.check == check), None)

    def __str__(self) -> str:
        if self.ok:
            return "All checks passed."
        return "\n".join(f"- {f.message}" for f in self.findings)


def coordinate_names(samples) -> tuple[list[str], np.ndarray]:
    """``(names, draws)``: a name per coordinate and the draws as ``(chains, draws, D)``
    (in their floating-point type: the checks convert blocks of coordinates to float64).

    Leaves of a dict or other pytree are named by their key path; a single array is ``x``.
    """
    samples = getattr(samples, "samples", samples)
    paths = jax.tree_util.tree_flatten_with_path(samples)[0]
    names, columns = [], []
    for i, (path, leaf) in enumerate(paths):
        leaf = np.asarray(leaf)
        if not np.issubdtype(leaf.dtype, np.floating):
            leaf = leaf.astype(np.float64)
        base = jax.tree_util.keystr(path).strip("[]'.") or (f"x{i}" if len(paths) > 1 else "x")
        shape = leaf.shape[2:]
        columns.append(leaf.reshape(*leaf.shape[:2], -1))
        if not shape:
            names.append(base)
        else:
            names += [f"{base}[{', '.join(map(str, idx))}]" for idx in np.ndindex(*shape)]
    if len(columns) == 1:
        return names, columns[0]  # no copy (a memory map stays one)
    return names, np.concatenate(columns, axis=-1)


def _listed(names, values, fmt) -> str:
    items = [f"{names[i]} ({fmt(values[i])})" for i in range(min(len(names), _MAX_LISTED))]
    more = f" and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else ""
    return ", ".join(items) + more


def _check_rhat(names, rhat, max_rhat):
    bad = np.flatnonzero(~(rhat <= max_rhat) & ~np.isnan(rhat))
    if not bad.size:
        return None
    order = bad[np.argsort(-rhat[bad])]
    return Finding(
        "rhat",
        f"R-hat above {max_rhat} for {len(order)} of {len(names)} coordinates: "
        + _listed([names[i] for i in order], rhat[order], lambda v: f"{v:.3f}")
        + ". The chains have not mixed: run longer, or start the chains elsewhere.",
        {"coordinates": [names[i] for i in order], "rhat": rhat[order]},
    )


def _check_ess(names, bulk, tail, num_chains, min_per_chain):
    low = np.minimum(bulk, tail)
    bound = min_per_chain * num_chains
    bad = np.flatnonzero(~(low >= bound))
    if not bad.size:
        return None
    order = bad[np.argsort(low[bad])]
    return Finding(
        "ess",
        f"Bulk or tail ESS below {min_per_chain} per chain ({bound:g} for {num_chains} "
        f"chains) for {len(order)} of {len(names)} coordinates: "
        + _listed(
            [names[i] for i in order],
            np.stack([bulk[order], tail[order]], -1),
            lambda v: f"bulk {v[0]:.0f}, tail {v[1]:.0f}",
        )
        + ". Estimates of these are unreliable: draw more.",
        {"coordinates": [names[i] for i in order], "bulk": bulk[order], "tail": tail[order]},
    )


def _centre_of_others(means, var_of_mean):
    """Each chain's reference: the other chains' mean (two or three chains) or median.

    The median keeps one stray chain from dragging the others' reference along (with a
    mean, one chain 14 standard errors away put every other chain about 4 away). Its squared
    standard error is taken as ``pi / 2`` times that of the mean (normal samples).
    """
    num_chains = means.shape[0]
    k = num_chains - 1
    centre, var = np.empty_like(means), np.empty_like(means)
    for c in range(num_chains):
        others = np.delete(means, c, axis=0)
        others_var = np.delete(var_of_mean, c, axis=0).mean(axis=0) / k
        if k <= 2:
            centre[c], var[c] = others.mean(axis=0), others_var
        else:
            centre[c], var[c] = np.median(others, axis=0), np.pi / 2 * others_var
    return centre, var


def _moments(x, axis):
    """Mean and variance along ``axis`` in float64, for one block of coordinates."""
    block = np.asarray(x, np.float64)
    return block.mean(axis=axis), block.var(axis=axis)


def _pooled_moments(x):
    """Each coordinate's mean and standard deviation over all chains and draws, in blocks
    of coordinates (no float64 copy of all the draws at once)."""
    budget = max(x.nbytes // 8, WORKING_MEMORY_FLOOR)
    mean, var = convergence.by_coordinate_blocks(
        lambda b: _moments(b.reshape(-1, b.shape[-1]), axis=0), x, budget
    )
    return mean, np.sqrt(var)


def _check_disagreement(names, moments, alpha):
    """``moments``: the :class:`~fisher_mala.convergence_pass.CoordinateDiagnostics` of
    the draws (each chain's mean, variance and ESS of the mean)."""
    num_chains, dim = moments.chain_mean.shape
    if num_chains < 2:
        return None
    means = moments.chain_mean
    with np.errstate(invalid="ignore", divide="ignore"):
        var_of_mean = moments.chain_var / moments.chain_ess_mean  # squared MCSE, (C, D)
        others, others_var = _centre_of_others(means, var_of_mean)
        z = (means - others) / np.sqrt(var_of_mean + others_var)
    bound = NormalDist().inv_cdf(1.0 - alpha / (2 * num_chains * dim))
    bad = np.argwhere(np.abs(z) > bound)  # NaN (a constant coordinate) compares False
    if not bad.size:
        return None
    order = bad[np.argsort(-np.abs(z[bad[:, 0], bad[:, 1]]))]
    labels = [f"chain {c}, {names[d]}" for c, d in order]
    return Finding(
        "chains_disagree",
        f"Chains disagree: a chain's mean lies more than {bound:.1f} Monte Carlo standard "
        f"errors from the median of the other chains' means ({len(order)} chain-coordinate "
        "pairs): "
        + _listed(labels, z[order[:, 0], order[:, 1]], lambda v: f"z = {v:+.1f}")
        + ". The chains explore different regions (several modes, a chain stuck, or "
        "chains that share one preconditioner and agree on the wrong region).",
        {
            "chains": order[:, 0],
            "coordinates": [names[d] for d in order[:, 1]],
            "z": z[order[:, 0], order[:, 1]],
            "bound": bound,
        },
    )


def _check_acceptance(rates, target, tolerance):
    if not np.all(np.isfinite(rates)) or rates.size == 0:
        return None
    spread = float(rates.max() - rates.min())
    off = [] if target is None else np.flatnonzero(np.abs(rates - target) > tolerance).tolist()
    if spread <= tolerance and not off:
        return None
    text = ", ".join(f"{a:.2f}" for a in rates)
    parts = []
    if spread > tolerance:
        parts.append(f"differs by {spread:.2f} between chains")
    if off:
        parts.append(f"is more than {tolerance} from the target {target} in chains {off}")
    return Finding(
        "acceptance",
        f"Sampling-phase acceptance ({text}) "
        + " and ".join(parts)
        + ": the warm-up ended before the chains reached the typical set or the step-size "
        "adaptation settled; lengthen the warm-up.",
        {"rates": rates, "target": target, "spread": spread, "chains_off_target": off},
    )


def _longest_run(rejected: np.ndarray) -> tuple[int, int]:
    """``(length, start)`` of the longest run of ``True`` in a 1-d boolean array."""
    padded = np.concatenate([[0], rejected.astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(padded))
    starts, ends = edges[::2], edges[1::2]
    if not starts.size:
        return 0, -1
    k = int(np.argmax(ends - starts))
    return int(ends[k] - starts[k]), int(starts[k])


def longest_rejection_streaks(is_accepted) -> tuple[np.ndarray, np.ndarray]:
    """``(lengths, starts)``: each chain's longest run of consecutive rejections."""
    runs = [_longest_run(~np.asarray(row, bool)) for row in np.asarray(is_accepted)]
    return np.array([r[0] for r in runs]), np.array([r[1] for r in runs])


def _check_streaks(names, x, is_accepted, alpha, min_share):
    num_chains, num_draws, _ = x.shape
    lengths, starts = longest_rejection_streaks(is_accepted)
    hits = []
    for c in range(num_chains):
        rate = float(np.mean(is_accepted[c]))
        length, start = int(lengths[c]), int(starts[c])
        if length == 0 or rate == 0.0:
            continue  # a chain that never moved is the `stuck` check's
        # Expected number of rejection runs of length >= L that start after an acceptance
        # when each proposal is accepted independently with probability `rate`.
        expected = num_draws * rate * (1.0 - rate) ** length
        if expected < alpha and length >= max(min_share * num_draws, STREAK_MIN_LENGTH):
            if not hits:
                centre, scale = _pooled_moments(x)
            with np.errstate(invalid="ignore", divide="ignore"):
                z = (x[c, start] - centre) / scale
            z = np.where(np.isfinite(z), z, 0.0)
            far = np.argsort(-np.abs(z))[:3]
            hits.append((c, start, length, rate, [(names[i], float(z[i])) for i in far]))
    if not hits:
        return None
    text = "; ".join(
        f"chain {c} rejected {n} proposals in a row from draw {s} (acceptance {a:.2f}), at "
        + ", ".join(f"{name} {z:+.1f} sd" for name, z in where)
        for c, s, n, a, where in hits
    )
    return Finding(
        "rejection_streak",
        f"Rejections cluster in one region: {text}. The step size is far too large there "
        "for the local scale (a funnel's neck or a wall), so the chain under-samples it; "
        "reparameterize (e.g. non-centred).",
        {
            "chains": [h[0] for h in hits],
            "starts": [h[1] for h in hits],
            "lengths": [h[2] for h in hits],
            "where": [h[4] for h in hits],
        },
    )


def _check_divergences(is_divergent):
    counts = np.asarray(is_divergent, bool).sum(axis=-1)
    if not counts.any():
        return None
    return Finding(
        "divergences",
        f"{int(counts.sum())} divergent transitions in the sampling phase (by chain: "
        f"{counts.tolist()}): the trajectories meet curvature that the step size cannot "
        "follow (a funnel's neck), and the draws may be biased there; reparameterize "
        "(e.g. non-centred) or raise the target acceptance rate.",
        {"counts": counts},
    )


def faults(result) -> dict[str, np.ndarray]:
    """Per-chain counts of what went wrong numerically in a :func:`fm.sample` run.

    Returns
    -------
    dict
        ``nonfinite_warmup`` / ``nonfinite_sampling``: proposals whose log density or
        gradient was NaN or inf (all rejected); ``step_size_at_bound``: the adapted step
        size sits at the clipping bound ``[sqrt(tiny), sqrt(max)]`` of its dtype (the
        adaptation wanted to go further); ``accepted_sampling``: accepted proposals in the
        sampling phase (0 means the chain never moved).
    """
    step = np.asarray(result.parameters.step_size)
    low, high = (
        step_size_bounds(step.dtype) if np.issubdtype(step.dtype, np.floating) else (0.0, np.inf)
    )
    return {
        "nonfinite_warmup": (~np.asarray(result.warmup_info.proposal_is_finite)).sum(-1),
        "nonfinite_sampling": (~np.asarray(result.sample_stats["proposal_is_finite"])).sum(-1),
        "step_size_at_bound": (step <= low * (1 + 1e-6)) | (step >= high * (1 - 1e-6)),
        "accepted_sampling": np.asarray(result.sample_stats["is_accepted"]).sum(-1),
    }


def _check_nonfinite(names, x, finite, proposals):
    """The ``nonfinite`` check (module docstring): where the failing proposals were (their
    mean position, when the kernel reports proposals; else the chains' positions then)."""
    failed = ~np.asarray(finite, bool)
    share = failed.mean()
    if share <= NONFINITE_MAX_SHARE:
        return None
    centre, scale = _pooled_moments(x)
    if proposals is not None and np.shape(proposals["mean"])[-1] == x.shape[-1]:
        count = np.asarray(proposals["count"], np.float64)
        mean = np.nansum(np.asarray(proposals["mean"]) * count[:, None], 0) / count.sum()
        seen = "The failing proposals were at"
    else:
        mean = np.nanmean(x[failed], axis=0)
        seen = "The chains were at"
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (mean - centre) / scale
    z = np.where(np.isfinite(z), z, 0.0)
    far = np.argsort(-np.abs(z))[:3]
    where = [(names[i], float(mean[i]), float(z[i])) for i in far]
    return Finding(
        "nonfinite",
        f"{share:.1%} of the sampling phase's proposals had a NaN or infinite log density "
        f"or gradient ({int(failed.sum())} of {failed.size}; by chain: "
        f"{failed.sum(axis=-1).tolist()}). They are rejected, so a region where the target "
        "has mass but its gradient or density is not finite is never entered and the draws "
        f"miss it. {seen} "
        + ", ".join(f"{n} = {v:.3g} ({z:+.1f} sd)" for n, v, z in where)
        + ": check the log density there (e.g. a sqrt or log of a quantity that can be "
        "negative, or a jnp.where whose untaken branch is NaN).",
        {"share": share, "counts": failed.sum(axis=-1), "where": where},
    )


def _check_faults(result):
    report = faults(result)
    found = []
    stuck = np.flatnonzero(report["accepted_sampling"] == 0)
    if stuck.size:
        found.append(
            Finding(
                "stuck",
                f"Chains {stuck.tolist()} accepted no proposal in the sampling phase: their "
                "draws are a single point. Check the log density (NaN/inf regions: "
                "fm.diagnostics.faults) or lengthen the warm-up.",
                {"chains": stuck},
            )
        )
    bound = np.flatnonzero(report["step_size_at_bound"])
    if bound.size:
        found.append(
            Finding(
                "step_size_at_bound",
                f"The adapted step size of chains {bound.tolist()} reached the clipping bound "
                "of its dtype: the target may be improper or flat in some direction.",
                {"chains": bound},
            )
        )
    return found


def diagnose(
    result,
    *,
    max_rhat: float = MAX_RHAT,
    min_ess_per_chain: float = MIN_ESS_PER_CHAIN,
    acceptance_tolerance: float = ACCEPTANCE_TOLERANCE,
    disagreement_alpha: float = DISAGREEMENT_ALPHA,
    streak_alpha: float = STREAK_ALPHA,
    streak_min_share: float = STREAK_MIN_SHARE,
) -> Diagnosis:
    """Run every check (module docstring) on a :func:`fm.sample` result.

    Parameters
    ----------
    result
        A :class:`~fisher_mala.sampling.SamplingResult`.
    max_rhat, min_ess_per_chain, acceptance_tolerance, disagreement_alpha, streak_alpha,
    streak_min_share
        The thresholds (defaults: the module constants).

    Returns
    -------
    Diagnosis
        The per-coordinate diagnostics and the failed checks, as data.
    """
    names, x = coordinate_names(result)
    num_chains = x.shape[0]
    budget = max(x.nbytes // 8, WORKING_MEMORY_FLOOR)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        per_coordinate = convergence_pass.diagnostics_pass(x, budget_bytes=budget)
        rhat, bulk, tail = per_coordinate.rhat, per_coordinate.ess_bulk, per_coordinate.ess_tail
        stats = result.sample_stats
        rates = np.asarray(stats["acceptance_rate"], np.float64).mean(axis=-1)
        streaks = None
        findings = [
            _check_rhat(names, rhat, max_rhat),
            _check_ess(names, bulk, tail, num_chains, min_ess_per_chain),
            _check_disagreement(names, per_coordinate, disagreement_alpha),
            _check_acceptance(
                rates, getattr(result, "target_acceptance", None), acceptance_tolerance
            ),
        ]
        if getattr(result, "reports_divergences", False) and "is_divergent" in stats:
            findings.append(_check_divergences(stats["is_divergent"]))
        if getattr(result, "rejects_whole_proposals", False) and result.thinning == 1:
            findings.append(
                _check_streaks(names, x, stats["is_accepted"], streak_alpha, streak_min_share)
            )
            streaks = longest_rejection_streaks(stats["is_accepted"])[0]
    if getattr(result, "tuned", True):
        findings += _check_faults(result)
    if "proposal_is_finite" in stats:
        proposals = getattr(result, "nonfinite_proposals", None)
        findings.append(_check_nonfinite(names, x, stats["proposal_is_finite"], proposals))
    return Diagnosis(
        names, rhat, bulk, tail, rates, streaks, [f for f in findings if f is not None]
    )


def warn(diagnosis: Diagnosis, stacklevel: int = 3) -> None:
    """One :class:`SamplingWarning` listing every failed check, if any."""
    if diagnosis.ok:
        return
    warnings.warn(
        f"{len(diagnosis.findings)} check(s) failed (fm.diagnose(result) has them as "
        f"data):\n{diagnosis}",
        SamplingWarning,
        stacklevel=stacklevel,
    )
