"""ESS, summaries, run checks and ArviZ export (layer 6).

Two ESS estimators:

* ``method="paper"``: the estimator the paper used, TensorFlow Probability's
  ``tfp.mcmc.effective_sample_size`` with its default arguments, per chain::

      rho_k = (1 / (N - k)) sum_t w_t w_{t+k} / (1/N sum_t w_t^2),  w = x - mean(x)
      ESS   = N / (-1 + 2 sum_{k=0}^{M} (N - k) / N rho_k)

  where the sum stops before the first lag ``k`` with ``rho_k < 0``. It cannot
  exceed ``N`` by much (it is capped by the truncation at the first negative lag),
  which penalizes antithetic samplers such as NUTS. ArviZ has no such estimator, so
  it is written here (FFT autocorrelation, as TFP does).
* any method of ArviZ's ``az.ess`` (``"bulk"``, ``"tail"``, ...), the rank-normalized
  multi-chain estimators of Vehtari et al. (2021).
"""

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from fisher_mala import checks, convergence
from fisher_mala.checks import Diagnosis, SamplingWarning, diagnose, faults

__all__ = [
    "autocorrelation",
    "paper_ess",
    "ess",
    "Summary",
    "summary",
    "PaperSummary",
    "paper_summary",
    "diagnose",
    "Diagnosis",
    "SamplingWarning",
    "to_arviz",
    "faults",
]


def autocorrelation(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """TFP's ``auto_correlation``: ``rho_k`` with the unbiased ``1/(N - k)`` lag sums."""
    x = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    n = x.shape[-1]
    w = x - x.mean(axis=-1, keepdims=True)
    size = 1 << int(np.ceil(np.log2(2 * n)))
    spectrum = np.fft.rfft(w, n=size, axis=-1)
    lag_sums = np.fft.irfft(spectrum * np.conj(spectrum), n=size, axis=-1)[..., :n]
    cov = lag_sums / (n - np.arange(n))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = cov / cov[..., :1]
    return np.moveaxis(rho, -1, axis)


def paper_ess(x: np.ndarray, axis: int = 0) -> np.ndarray:
    """ESS of each series along ``axis`` with TFP's default estimator (see module doc)."""
    x = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    n = x.shape[-1]
    rho = autocorrelation(x, axis=-1)
    keep = np.cumsum(rho < 0.0, axis=-1) == 0  # up to (excluding) the first negative lag
    weighted = np.where(keep, (n - np.arange(n)) / n * rho, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return n / (-1.0 + 2.0 * weighted.sum(axis=-1))


def _as_chain_draw_dim(samples) -> np.ndarray:
    """Flatten a pytree of ``(chains, draws, ...)`` leaves into ``(chains, draws, D)``."""
    samples = getattr(samples, "samples", samples)
    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(samples)]
    if not leaves or leaves[0].ndim < 2:
        raise ValueError("`samples` must have leading (chains, draws) axes.")
    flat = [leaf.reshape(*leaf.shape[:2], -1) for leaf in leaves]
    return flat[0] if len(flat) == 1 else np.concatenate(flat, axis=-1)  # one leaf: no copy


#: Working memory of TFP's estimator per draw, relative to the multi-chain estimators'
#: ``convergence.WORKING_BYTES_PER_VALUE``: its transforms pad to a power of two, up to
#: four times the draws (a float64 copy, the spectrum, the lag sums, the correlations).
_PAPER_WORKING_FACTOR = 2


def _by_blocks(fn, x: np.ndarray, factor: int = 1) -> np.ndarray:
    """``fn`` over blocks of coordinates whose working memory stays under an eighth of the
    draws' bytes or ``checks.WORKING_MEMORY_FLOOR``, as :func:`diagnose`'s: the estimators
    hold several copies of the draws, which a large run cannot afford at once."""
    budget = max(x.nbytes // 8, checks.WORKING_MEMORY_FLOOR) // factor
    return convergence.by_coordinate_blocks(fn, x, budget)


#: ESS methods computed by :mod:`fisher_mala.convergence` (vectorized, equal to ArviZ's).
_VECTORIZED = {
    "bulk": convergence.ess_bulk,
    "tail": convergence.ess_tail,
    "mean": convergence.ess_mean,
}


def ess(samples, method: str = "bulk", per_chain: bool = False) -> np.ndarray:
    """Per-dimension effective sample size.

    Parameters
    ----------
    samples
        A :class:`~fisher_mala.sampling.SamplingResult` or a pytree of
        ``(chains, draws, ...)`` arrays (flattened into ``D`` dimensions).
    method
        ``"bulk"`` (the default), ``"tail"`` (quantiles 0.05 and 0.95) or ``"mean"``
        (:mod:`fisher_mala.convergence`, equal to ArviZ's), another ``az.ess`` method
        (``"sd"``, ``"median"``, ``"quantile"`` at 0.5, ...), or ``"paper"``: TFP's
        per-chain estimator, as the paper's tables.
    per_chain
        ``False`` (default): one value per dimension, shape ``(D,)``: ArviZ's
        multi-chain estimator, which chains that disagree pull down; for ``"paper"``, the
        sum of the chain-wise values (it cannot see chains that disagree). ``True``: one
        ESS per chain, shape ``(chains, D)`` (the paper's tables use chain-wise values).
    """
    x = _as_chain_draw_dim(samples)
    if method == "paper":
        per = _by_blocks(lambda block: paper_ess(block, axis=1), x, _PAPER_WORKING_FACTOR)
        return per if per_chain else per.sum(axis=0)
    if method in _VECTORIZED:
        estimator = _VECTORIZED[method]
        if per_chain:
            return np.stack([_by_blocks(estimator, x[c : c + 1]) for c in range(len(x))])
        return _by_blocks(estimator, x)
    import arviz as az

    options = {"prob": 0.5} if method == "quantile" else {}
    if per_chain:
        return np.stack(
            [np.asarray(az.ess(x[c : c + 1], method=method, **options)) for c in range(len(x))]
        )
    return np.asarray(az.ess(x, method=method, **options))


@dataclass
class Summary:
    """Headline summary of a run: multi-chain diagnostics (see :func:`summary`)."""

    sampler: str
    num_chains: int
    ess_bulk_min: float
    ess_bulk_median: float
    ess_bulk_max: float
    ess_tail_min: float
    max_rhat: float
    min_ess_per_second: float
    min_ess_per_grad_eval: float
    acceptance_rate: float
    acceptance_range: tuple[float, float]
    worst: str
    min_ess_per_second_with_compile: float = float("nan")

    def __str__(self) -> str:
        low, high = self.acceptance_range
        return (
            f"{self.sampler:<12} bulk ESS min {self.ess_bulk_min:9.1f} ({self.worst}) | "
            f"median {self.ess_bulk_median:9.1f} | max {self.ess_bulk_max:9.1f} | "
            f"tail ESS min {self.ess_tail_min:9.1f} | max R-hat {self.max_rhat:.3f} | "
            f"min ESS/s {self.min_ess_per_second:9.1f} (warm-up + sampling; "
            f"{self.min_ess_per_second_with_compile:.1f} with compilation) | min ESS/grad "
            f"{self.min_ess_per_grad_eval:.2e} | acc {self.acceptance_rate:.3f} "
            f"({low:.2f}-{high:.2f} over {self.num_chains} chains)"
        )


def summary(result) -> Summary:
    """Headline diagnostics of a run, all multi-chain (ArviZ, Vehtari et al. 2021).

    Min / median / max over coordinates of the rank-normalized bulk ESS of all chains
    together, the min tail ESS and the max rank-normalized R-hat: chains that disagree
    lower the ESS and raise R-hat, where adding up per-chain ESS would hide them. ESS per
    second divides by the warm-up and sampling time; ``min_ess_per_second_with_compile``
    adds the compilation (what a first call costs by the clock); ESS per gradient evaluation
    counts every evaluation of the run, all chains. For the paper's per-chain table use
    :func:`paper_summary`; for the checks behind ``fm.sample``'s warnings, :func:`diagnose`.
    """
    d = getattr(result, "diagnosis", None) or diagnose(result)  # fm.sample's, if it ran
    seconds = result.warmup_seconds + result.sampling_seconds
    worst = int(np.argmin(d.ess_bulk))
    low = float(d.ess_bulk[worst])
    rates = d.chain_acceptance
    return Summary(
        sampler=result.sampler,
        num_chains=len(rates),
        ess_bulk_min=low,
        ess_bulk_median=float(np.median(d.ess_bulk)),
        ess_bulk_max=float(np.max(d.ess_bulk)),
        ess_tail_min=float(np.min(d.ess_tail)),
        max_rhat=float(np.max(d.rhat)) if len(rates) > 1 else float("nan"),
        min_ess_per_second=low / seconds if seconds > 0 else float("nan"),
        min_ess_per_grad_eval=low / float(np.sum(result.num_grad_evals)),
        acceptance_rate=float(np.mean(rates)),
        acceptance_range=(float(np.min(rates)), float(np.max(rates))),
        worst=d.names[worst],
        min_ess_per_second_with_compile=low / (seconds + result.compile_seconds),
    )


@dataclass
class PaperSummary:
    """The paper's Table 1 summary of a run, per chain (see :func:`paper_summary`)."""

    sampler: str
    ess_min: tuple[float, float]
    ess_median: tuple[float, float]
    ess_max: tuple[float, float]
    min_ess_per_second: float
    min_ess_per_grad_eval: float
    acceptance_rate: float
    max_rhat: float
    method: str

    def __str__(self) -> str:
        def cell(v):
            return f"{v[0]:10.1f} +- {v[1]:7.1f}"

        return (
            f"{self.sampler:<12} max {cell(self.ess_max)} | median {cell(self.ess_median)} | "
            f"min {cell(self.ess_min)} | min ESS/s {self.min_ess_per_second:9.1f} | "
            f"min ESS/grad {self.min_ess_per_grad_eval:.2e} | acc {self.acceptance_rate:.3f}"
            f" | max R-hat {self.max_rhat:.3f}"
        )


def paper_summary(result, method: str = "paper") -> PaperSummary:
    """The paper's Table 1 summary: min / median / max ESS, mean +- sd over chains.

    Each chain's ESS is computed alone (``method="paper"``: TFP's estimator, as the
    paper), so the table cannot see chains that disagree: it is for comparison with the
    paper, not for judging a run (:func:`summary` and :func:`diagnose` do that). ESS per
    second and per gradient add up the chains' min ESS. R-hat is ArviZ's rank-normalized
    split R-hat.
    """
    import arviz as az

    per_chain = ess(result, method=method, per_chain=True)  # (chains, D)
    stats = {
        k: np.array([f(row) for row in per_chain])
        for k, f in (("min", np.min), ("median", np.median), ("max", np.max))
    }

    def ms(v):
        return float(np.mean(v)), float(np.std(v))

    x = _as_chain_draw_dim(result)
    rhat = float(np.max(np.asarray(az.rhat(x)))) if x.shape[0] > 1 else float("nan")
    seconds = result.warmup_seconds + result.sampling_seconds
    total_min = float(stats["min"].sum())
    return PaperSummary(
        sampler=result.sampler,
        ess_min=ms(stats["min"]),
        ess_median=ms(stats["median"]),
        ess_max=ms(stats["max"]),
        min_ess_per_second=total_min / seconds if seconds > 0 else float("nan"),
        min_ess_per_grad_eval=total_min / float(np.sum(result.num_grad_evals)),
        acceptance_rate=float(np.mean(result.sample_stats["acceptance_rate"])),
        max_rhat=rhat,
        method=method,
    )


def _posterior_dict(samples) -> dict[str, Any]:
    if isinstance(samples, dict):
        return {str(k): np.asarray(v) for k, v in samples.items()}
    leaves, _ = jax.tree.flatten(samples)
    if len(leaves) == 1:
        return {"x": np.asarray(leaves[0])}
    paths = jax.tree_util.tree_flatten_with_path(samples)[0]
    return {
        jax.tree_util.keystr(p).strip("[]'.") or f"x{i}": np.asarray(v)
        for i, (p, v) in enumerate(paths)
    }


def to_arviz(result):
    """An ArviZ 1.x ``DataTree`` with ``posterior``, ``sample_stats`` and, for NumPyro
    and PyMC models (:func:`fm.sample_numpyro`, :func:`fm.sample_pymc`), ``log_likelihood``
    groups.

    ``sample_stats`` uses ArviZ's names: ``lp`` (log density), ``acceptance_rate``,
    ``step_size`` (the frozen ``sigma^2`` per chain, repeated over draws), ``diverging``
    (a non-finite proposal, or a divergent NUTS / HMC trajectory), ``is_accepted``,
    ``n_steps`` (gradient evaluations per draw) and, for Fisher NUTS / HMC, ``energy``
    and ``tree_depth`` (so ``az.plot_energy`` and ``az.bfmi`` apply). The
    ``log_likelihood`` group holds each observed site's pointwise log-likelihood at every
    draw, as ``az.from_numpyro`` builds it, so ``az.loo`` and ``az.compare`` apply. The
    model's coordinates and dimension names label the posterior when the result carries
    them (:func:`fm.sample_pymc`).
    """
    import arviz as az

    stats = result.sample_stats
    shape = np.shape(stats["logdensity"])
    step = np.broadcast_to(np.asarray(result.parameters.step_size)[:, None], shape)
    sample_stats = {
        "lp": np.asarray(stats["logdensity"]),
        "acceptance_rate": np.asarray(stats["acceptance_rate"]),
        "is_accepted": np.asarray(stats["is_accepted"]),
        "diverging": np.asarray(
            stats.get("is_divergent", ~np.asarray(stats["proposal_is_finite"]))
        ),
        "step_size": np.asarray(step),
    }
    if "num_grad_evals" in stats:
        sample_stats["n_steps"] = np.asarray(stats["num_grad_evals"])
    for name in ("energy", "tree_depth"):
        if name in stats:
            sample_stats[name] = np.asarray(stats[name])
    groups = {"posterior": _posterior_dict(result.samples), "sample_stats": sample_stats}
    log_likelihood = getattr(result, "log_likelihood", None)
    if log_likelihood:
        groups["log_likelihood"] = {k: np.asarray(v) for k, v in log_likelihood.items()}
    return az.from_dict(
        groups,
        coords=getattr(result, "coords", None),
        dims=getattr(result, "dims", None),
    )
