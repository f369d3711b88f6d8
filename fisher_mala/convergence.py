"""Convergence diagnostics as array programs over every coordinate at once (layer 6).

ArviZ 1.x (``arviz_stats``) computes the rank-normalized split R-hat and the bulk and tail
ESS of Vehtari et al. (2021) one coordinate at a time, with Geyer's initial sequences in a
Python loop: on the quickstart's 4 x 20000 x 100 draws that is seconds, and on a GPU run
minutes, of single-threaded Python after the sampler has finished. The same estimators
here, written once over arrays ``(chains, draws, D)``:

* ranks for all coordinates in one sort, the normal scores of Blom (1958);
* autocovariances of every chain and coordinate in one FFT;
* Geyer's initial positive sequence (its stopping pair found with one ``argmax``) and
  initial monotone sequence (a cumulative minimum over pair sums), vectorized.

Cost ``O(chains x draws x D log draws)``. Every function matches ArviZ 1.x to ``1e-6``
relative (``tests/test_convergence.py``: random draws, AR(1) chains with ``rho`` up to
0.999, constant and NaN coordinates, one chain, 4 draws), including its conventions: a
coordinate with a NaN gives NaN, fewer than 4 draws (or, for R-hat, 2 chains) give NaN, a
constant coordinate has ESS equal to its number of draws. ArviZ remains the export and
plotting path (:func:`fisher_mala.diagnostics.to_arviz`).
"""

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = [
    "split_chains",
    "average_ranks",
    "z_scale",
    "autocovariance",
    "rhat",
    "ess",
    "ess_bulk",
    "ess_tail",
    "ess_mean",
    "mcse_mean",
    "per_chain_ess_mean",
    "rhat_and_ess",
    "coordinate_blocks",
    "by_coordinate_blocks",
]

#: Blom's (1958) fractional offset of the normal scores of ranks.
BLOM_OFFSET = 3 / 8


def _invalid(x: np.ndarray, min_chains: int) -> np.ndarray:
    """``(D,)``: coordinates ArviZ declines (a NaN; too few chains or draws)."""
    num_chains, num_draws = x.shape[:2]
    nan = np.isnan(x).any(axis=(0, 1))
    return nan | (num_chains < min_chains) | (num_draws < 4)


def split_chains(x: np.ndarray) -> np.ndarray:
    """``(2 C, N // 2, D)``: each chain's first and last halves as chains (the middle draw
    of an odd ``N`` left out)."""
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, x.shape[1] - half :]], axis=0)


def _sorted_runs(rows: np.ndarray):
    """One sort of every row: ``(order, twice_rank, ordered)``, where ``order`` is the flat
    index of each value in sorted order, ``twice_rank[j] = 2 r - 2`` for the value ranked
    ``j``-th, ``r`` its 1-based average rank (ties share the mean of their ranks), and
    ``ordered`` the values in sorted order (flat)."""
    num_rows, size = rows.shape
    order = np.argsort(rows, axis=-1)  # ties get their average rank: any order will do
    order += (np.arange(num_rows) * size)[:, None]
    order = order.ravel()
    ordered = rows.ravel()[order]
    starts_run = np.empty(ordered.size, bool)  # a new value, or a new row
    np.not_equal(ordered[1:], ordered[:-1], out=starts_run[1:])
    starts_run[::size] = True
    run_starts = np.flatnonzero(starts_run)
    run_lengths = np.diff(np.append(run_starts, ordered.size))
    twice = np.repeat(2 * run_starts + run_lengths - 1, run_lengths).reshape(num_rows, size)
    twice -= (2 * size * np.arange(num_rows))[:, None]
    return order, twice.ravel(), ordered


def average_ranks(rows: np.ndarray) -> np.ndarray:
    """1-based ranks along the last axis, ties given their average rank (as
    ``scipy.stats.rankdata(method="average")``), from one sort of every row."""
    rows = np.asarray(rows)
    flat = rows.reshape(-1, rows.shape[-1])
    order, twice, _ = _sorted_runs(flat)
    ranks = np.empty(flat.size, np.float64)
    ranks[order] = twice / 2.0 + 1.0
    return ranks.reshape(rows.shape)


def _normal_scores_of_rows(rows: np.ndarray):
    """``(scores, ordered)``: Blom's normal scores of each row's average ranks, and each
    row sorted. ``ndtri`` is evaluated once per possible rank (half-integers
    ``1 .. size``) and looked up, not once per value."""
    from scipy.special import ndtri  # scipy comes with ArviZ; imported when first needed

    size = rows.shape[-1]
    order, twice, ordered = _sorted_runs(rows)
    ranks = np.arange(2 * size - 1) / 2.0 + 1.0  # every average rank there can be
    table = ndtri((ranks - BLOM_OFFSET) / (size - 2 * BLOM_OFFSET + 1))
    scores = np.empty(rows.size, np.float64)
    scores[order] = table[twice]
    return scores.reshape(rows.shape), ordered.reshape(rows.shape)


def z_scale(x: np.ndarray) -> np.ndarray:
    """Normal scores of the ranks of each coordinate over all chains and draws."""
    return _z_and_sorted(x)[0]


def _z_and_sorted(x: np.ndarray):
    """``(z_scale(x), sorted)``, ``sorted`` ``(D, C N)`` each coordinate's values in order."""
    rows = np.ascontiguousarray(x.reshape(-1, x.shape[-1]).T)  # (D, C N)
    scores, ordered = _normal_scores_of_rows(rows)
    return scores.T.reshape(x.shape), ordered


def _centred_spectra(x: np.ndarray):
    """``(power, size)``: the power spectrum ``(C, D, F)`` of each chain's centred draws,
    zero-padded to ``size >= 2 N`` so that its inverse is the linear (not circular)
    autocovariance."""
    from scipy import fft  # pocketfft, with the independent transforms over all cores

    n = x.shape[1]
    size = fft.next_fast_len(2 * n)
    # (C, D, N), contiguous for the FFTs: always a copy, centred in place below (with one
    # coordinate the moved axes of ``x`` are already contiguous, and a view would centre
    # the caller's draws, whose chain means the between-chain variance still needs).
    series = np.array(np.moveaxis(x, 1, -1), order="C", copy=True)
    series -= series.mean(axis=-1, keepdims=True)
    spectrum = fft.rfft(series, n=size, axis=-1, workers=os.cpu_count() or 1)
    del series
    power = np.square(spectrum.real)
    power += np.square(spectrum.imag)
    return power, size


def _inverse(power: np.ndarray, size: int, n: int) -> np.ndarray:
    """``(..., N)``: the autocovariances (``1/N`` normalized) of a power spectrum."""
    from scipy import fft

    return fft.irfft(power, n=size, axis=-1, workers=os.cpu_count() or 1)[..., :n] / n


def autocovariance(x: np.ndarray) -> np.ndarray:
    """``(C, N, D)``: each chain's autocovariance at every lag, ``1/N`` normalized (FFT)."""
    power, size = _centred_spectra(x)
    return np.moveaxis(_inverse(power, size, x.shape[1]), -1, 1)


def _rhat_basic(x: np.ndarray) -> np.ndarray:
    num_draws = x.shape[1]
    between = num_draws * np.var(x.mean(axis=1), axis=0, ddof=1)
    within = np.mean(np.var(x, axis=1, ddof=1), axis=0)
    return np.sqrt((between / within + num_draws - 1) / num_draws)


def _rank_rhat(split: np.ndarray, z: np.ndarray, median=None) -> np.ndarray:
    """R-hat of the split chains' normal scores ``z`` and of their folded ones (about
    ``median``, each coordinate's median of ``split``, computed when not given)."""
    median = np.median(split, axis=(0, 1)) if median is None else median
    folded = np.abs(split - median)
    return np.maximum(_rhat_basic(z), _rhat_basic(z_scale(folded)))


def _indicators(clean: np.ndarray, prob, ordered=None) -> np.ndarray:
    """``(C, N, 2 D)``: the indicators ``x <= q`` at the lower and the upper quantile;
    ``ordered`` ``(D, C N)``, when given, holds each coordinate's draws in sorted order (the
    quantiles are then read from it)."""
    if ordered is None:
        low, high = np.quantile(clean, sorted(prob), axis=(0, 1))
    else:  # the same order statistics and interpolation; a partition of sorted rows
        low, high = np.quantile(ordered, sorted(prob), axis=-1)
    return np.concatenate([clean <= low, clean <= high], axis=-1).astype(np.float64)


def _tail(clean: np.ndarray, prob, relative: bool) -> np.ndarray:
    """The smaller ESS of the indicators ``x <= q`` at the two quantiles of ``prob``."""
    low, high = np.split(ess(split_chains(_indicators(clean, prob)), relative), 2)
    return np.minimum(low, high)


def rhat(x: np.ndarray) -> np.ndarray:
    """Rank-normalized split R-hat: the larger of the bulk and the folded (tail) values."""
    x = np.asarray(x, np.float64)
    bad = _invalid(x, min_chains=2)
    split = split_chains(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = _rank_rhat(split, z_scale(split))
    return np.where(bad, np.nan, value)


def ess(x: np.ndarray, relative: bool = False) -> np.ndarray:
    """Geyer's ESS of ``(C, N, D)`` draws as they are (ArviZ's ``_ess``), per coordinate.

    The autocorrelations are combined over chains as in Stan; the sum stops at the first
    pair ``rho_{2k} + rho_{2k+1}`` that is not positive (initial positive sequence), the
    pair sums before it are made non-increasing (initial monotone sequence), and the last
    even lag is kept when positive. The chains' autocovariances are averaged as spectra,
    so that one inverse transform per coordinate serves all chains.
    """
    x = np.asarray(x, np.float64)
    if x.shape[1] < 2:
        return np.full(x.shape[-1], np.nan)
    power, size = _centred_spectra(x)
    return _ess_of_spectra(x, power.mean(axis=0), size, relative)


def _ess_of_spectra(x: np.ndarray, mean_power: np.ndarray, size: int, relative: bool):
    """:func:`ess` of the draws ``x`` ``(C, N, D)`` from their chains' mean power
    spectrum ``(D, F)``."""
    num_chains, n, _ = x.shape
    total = num_chains * n
    constant = (x.max(axis=(0, 1)) - x.min(axis=(0, 1))) < np.finfo(float).resolution
    with np.errstate(invalid="ignore", divide="ignore"):
        acov = _inverse(mean_power, size, n)  # (D, N): the chains' mean autocovariance
        mean_var = acov[:, 0] * n / (n - 1.0)
        var_plus = mean_var * (n - 1.0) / n
        if num_chains > 1:
            var_plus = var_plus + np.var(x.mean(axis=1), axis=0, ddof=1)
        rho = 1.0 - (mean_var[:, None] - acov) / var_plus[:, None]  # (D, N)
    rho[:, 0] = 1.0
    return np.where(constant, 1.0 if relative else float(total), _geyer(rho, total, relative))


def _geyer(rho: np.ndarray, total: int, relative: bool) -> np.ndarray:
    """ESS from the combined autocorrelations ``rho`` ``(D, N)`` (lag 0 equal to 1)."""
    n = rho.shape[1]
    num_pairs = n // 2
    pairs = rho[:, 0 : 2 * num_pairs : 2] + rho[:, 1 : 2 * num_pairs : 2]  # (D, K)
    # Pair k >= 1 is looked at while 2k - 1 < n - 3 and every earlier pair sum is positive.
    limit = int(np.sum(2 * np.arange(1, num_pairs) - 1 < n - 3))
    stop = np.full(rho.shape[0], limit)
    if limit:
        not_positive = ~(pairs[:, 1 : limit + 1] > 0)
        stop = np.where(not_positive.any(axis=1), np.argmax(not_positive, axis=1) + 1, limit)
    last = np.where(pairs[:, 0] > 0, stop, 0)  # the last pair looked at
    # Only the pairs up to the last one looked at (of any coordinate) matter from here on.
    width = int(last.max(initial=0)) + 1
    pairs, rho = pairs[:, :width], rho[:, : min(n, 2 * width)]
    kept_last = (last >= 1) & (np.take_along_axis(pairs, last[:, None], 1)[:, 0] >= 0)
    even = np.take_along_axis(rho, np.minimum(2 * last, rho.shape[1] - 1)[:, None], 1)[:, 0]
    even = np.where(last >= 1, even, 1.0)
    tail = np.where(last == 0, 1.0, np.where((even > 0) | kept_last, even, 0.0))
    monotone = np.minimum.accumulate(pairs, axis=1)
    used = np.arange(width)[None] < last[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        tau = -1.0 + 2.0 * np.sum(np.where(used, monotone, 0.0), axis=1) + tail
        tau = np.maximum(tau, 1.0 / np.log10(total))
        value = (1.0 if relative else total) / tau
    looked = np.arange(rho.shape[1])[None] <= 2 * last[:, None] + 1
    nan = np.isnan(np.where(looked, rho, 0.0)).any(axis=1) | np.isnan(tau)
    return np.where(nan, np.nan, value)


def ess_bulk(x: np.ndarray, relative: bool = False) -> np.ndarray:
    """Bulk ESS: Geyer's ESS of the normal scores of the split chains' ranks."""
    x = np.asarray(x, np.float64)
    bad = _invalid(x, min_chains=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = ess(z_scale(split_chains(np.where(bad, 0.0, x))), relative)
    return np.where(bad, np.nan, value)


def ess_tail(x: np.ndarray, prob=(0.05, 0.95), relative: bool = False) -> np.ndarray:
    """Tail ESS: the smaller ESS of the indicators ``x <= q`` at the two quantiles."""
    x = np.asarray(x, np.float64)
    bad = _invalid(x, min_chains=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = _tail(np.where(bad, 0.0, x), prob, relative)
    return np.where(bad, np.nan, value)


def ess_mean(x: np.ndarray, relative: bool = False) -> np.ndarray:
    """ESS of the mean: Geyer's ESS of the split chains (no rank normalization)."""
    x = np.asarray(x, np.float64)
    bad = _invalid(x, min_chains=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = ess(split_chains(np.where(bad, 0.0, x)), relative)
    return np.where(bad, np.nan, value)


def mcse_mean(x: np.ndarray) -> np.ndarray:
    """Monte Carlo standard error of the mean: ``sd / sqrt(ESS_mean)``."""
    x = np.asarray(x, np.float64)
    flat = x.reshape(-1, x.shape[-1])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.std(flat, axis=0, ddof=1) / np.sqrt(ess_mean(x))


def per_chain_ess_mean(x: np.ndarray) -> np.ndarray:
    """``(C, D)``: each chain's ESS of the mean, alone (its two halves as two chains),
    from one transform of all the split chains."""
    x = np.asarray(x, np.float64)
    num_chains = x.shape[0]
    out = np.full(x.shape[::2], np.nan)
    if x.shape[1] // 2 < 2:
        return out
    split = split_chains(np.where(np.isnan(x), 0.0, x))
    power, size = _centred_spectra(split)  # (2 C, D, F): chain c's halves are c and C + c
    with np.errstate(invalid="ignore", divide="ignore"):
        for c in range(num_chains):
            halves = split[[c, num_chains + c]]
            mean_power = (power[c] + power[num_chains + c]) / 2
            nan = np.isnan(x[c]).any(axis=0)
            out[c] = np.where(nan, np.nan, _ess_of_spectra(halves, mean_power, size, False))
    return out


def rhat_and_ess(x: np.ndarray, prob=(0.05, 0.95)):
    """``(rhat, bulk, tail)`` per coordinate, sharing the work between them (one rank
    normalization of the split chains serves R-hat's bulk part and the bulk ESS).

    R-hat is NaN with one chain, as ArviZ's.
    """
    x = np.asarray(x, np.float64)
    num_chains = x.shape[0]
    bad = _invalid(x, min_chains=1)
    clean = np.where(bad, 0.0, x)
    split = split_chains(clean)
    with np.errstate(invalid="ignore", divide="ignore"):
        z, split_sorted = _z_and_sorted(split)
        # The quantiles are of all draws: an odd number of draws leaves the middle ones
        # out of the split chains.
        ordered = split_sorted if split.size == clean.size else None
        # One ESS call for the bulk and both tails: one batch of transforms.
        bulk, low, high = np.split(
            ess(np.concatenate([z, split_chains(_indicators(clean, prob, ordered))], axis=-1)), 3
        )
        tail = np.minimum(low, high)
        nan = np.full(x.shape[-1], np.nan)
        median = np.median(split_sorted, axis=-1)
        rhat_value = _rank_rhat(split, z, median) if num_chains >= 2 else nan
    return np.where(bad, nan, rhat_value), np.where(bad, nan, bulk), np.where(bad, nan, tail)


#: Bytes of working memory per draw and coordinate of :func:`rhat_and_ess` (float64 copies,
#: ranks, normal scores, the FFT's padded complex spectra).
WORKING_BYTES_PER_VALUE = 96


def coordinate_blocks(x: np.ndarray, budget_bytes: int):
    """Slices of the last axis of ``x`` whose diagnostics fit in ``budget_bytes`` of
    working memory (at least one coordinate each)."""
    per_coordinate = WORKING_BYTES_PER_VALUE * x.shape[0] * max(x.shape[1], 1)
    width = max(1, int(budget_bytes // per_coordinate))
    return [slice(i, i + width) for i in range(0, x.shape[-1], width)]


def by_coordinate_blocks(fn, x: np.ndarray, budget_bytes: int):
    """``fn(x[..., block])`` over :func:`coordinate_blocks`, outputs joined on their last
    axis (``fn`` returns an array or a tuple of arrays).

    The blocks run on a thread per core (NumPy's sorts, FFTs and reductions release the
    GIL), the budget shared between the blocks in flight.
    """
    workers = max(1, min(os.cpu_count() or 1, x.shape[-1]))
    blocks = coordinate_blocks(x, budget_bytes // workers)
    if len(blocks) < workers:  # small enough to fit in one block: still use every core
        width = -(-x.shape[-1] // workers)
        blocks = [slice(i, i + width) for i in range(0, x.shape[-1], width)]
    if len(blocks) == 1:
        outs = [fn(x[..., blocks[0]])]
    else:
        with ThreadPoolExecutor(min(workers, len(blocks))) as pool:
            outs = list(pool.map(lambda block: fn(x[..., block]), blocks))
    if isinstance(outs[0], tuple):
        return tuple(np.concatenate(parts, axis=-1) for parts in zip(*outs, strict=True))
    return np.concatenate(outs, axis=-1)
