"""Every per-coordinate diagnostic :func:`fisher_mala.diagnose` needs, in one pass (layer 6).

:mod:`fisher_mala.convergence` has ArviZ's estimators one at a time; the checks need
several of them on the same draws: the rank-normalized split R-hat, the bulk and tail ESS,
and for the chains-disagree check each chain's mean, variance and ESS of the mean. Here they
share their work, over a block of coordinates laid out ``(D, chains, draws)`` so that every
step runs over contiguous rows:

* one sort per coordinate, a radix sort of the draws' own bits (16 at a time), serves
  the ranks of the bulk, the median, both tail quantiles;
* the folded draws ``|x - median|`` of the R-hat's tail part are ordered by merging the two
  sorted runs either side of the median (a stable sort of two runs is a merge), not by a
  second full sort;
* one real FFT of the bulk's normal scores, both tail indicators and the raw split chains,
  written into one zero-padded buffer (no copy for the padding);
* one inverse transform per coordinate and group (the chains' spectra averaged first), and
  Geyer's initial monotone sequence vectorized over all of them at once;
* transforms only as long as the sums need: a first coordinate is transformed with every
  lag, and the others are zero-padded to ``N/2 + 2 L + 64``, ``L`` the lag its sums
  stopped at; a coordinate whose sums go past what that padding holds exactly is
  transformed again with every lag. A well-mixing chain's sums stop after tens of lags,
  and its transforms are about half as long.

The results equal those of :mod:`fisher_mala.convergence` (and so ArviZ 1.x) to rounding
(``tests/test_convergence_pass.py``).
"""

import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from fisher_mala import convergence

__all__ = ["CoordinateDiagnostics", "diagnostics_pass"]


class CoordinateDiagnostics(NamedTuple):
    """Per-coordinate diagnostics of ``(C, N, D)`` draws.

    Attributes
    ----------
    rhat, ess_bulk, ess_tail
        ``(D,)``: rank-normalized split R-hat (NaN with one chain), bulk and tail ESS.
    chain_mean, chain_var
        ``(C, D)``: each chain's mean and variance (``ddof=0``), NaN where it has a NaN.
    chain_ess_mean
        ``(C, D)``: each chain's ESS of the mean, its two halves as two chains.
    """

    rhat: np.ndarray
    ess_bulk: np.ndarray
    ess_tail: np.ndarray
    chain_mean: np.ndarray
    chain_var: np.ndarray
    chain_ess_mean: np.ndarray


#: The unsigned integer type of each float's width, for its order-preserving bits.
_UNSIGNED = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _sort_row(row: np.ndarray):
    """``(order, ordered)`` of one row: ``order`` the index of each value in sorted order
    (ties in index order), ``ordered`` the values sorted (float64).

    A least-significant-digit radix sort of the values' order-preserving bits, 16 at a
    time: NumPy's stable argsort of 16-bit keys is a radix sort, linear in the row where
    a comparison sort is not.
    """
    if row.dtype.itemsize not in _UNSIGNED or row.size >= 2**31:
        order = np.argsort(row, kind="stable")
        return order, row[order].astype(np.float64)
    unsigned = _UNSIGNED[row.dtype.itemsize]
    top = 8 * row.dtype.itemsize - 1
    bits = row.view(unsigned)
    # Order-preserving bits: flip every bit of a negative value, the sign of the others.
    keys = bits >> top
    keys *= unsigned((1 << top) - 1)
    keys ^= bits
    keys ^= unsigned(1 << top)
    digits = keys.view(np.uint16).reshape(row.size, -1)
    if not np.little_endian:
        digits = digits[:, ::-1]
    order = np.argsort(digits[:, 0], kind="stable")
    for k in range(1, digits.shape[1]):
        order = order[np.argsort(digits[order, k], kind="stable")]
    return order, row[order].astype(np.float64)


@functools.lru_cache(maxsize=8)
def _score_table(size: int) -> np.ndarray:
    """Blom's normal score of every average rank ``1, 1.5, ..., size`` of ``size`` values,
    indexed by ``2 r - 2``."""
    from scipy.special import ndtri

    ranks = np.arange(2 * size - 1) / 2.0 + 1.0
    offset = convergence.BLOM_OFFSET
    table = ndtri((ranks - offset) / (size - 2 * offset + 1))
    table.flags.writeable = False
    return table


def _scores_in_order(ordered: np.ndarray) -> np.ndarray:
    """Blom's normal scores of the average ranks of the sorted values ``ordered`` (ties
    share the mean of their ranks), in that order."""
    size = ordered.size
    table = _score_table(size)
    starts_run = np.empty(size, bool)  # a new value
    np.not_equal(ordered[1:], ordered[:-1], out=starts_run[1:])
    starts_run[0] = True
    run_starts = np.flatnonzero(starts_run)
    if run_starts.size == size:  # no ties: the ranks are the positions
        return table[::2].copy()
    twice = np.empty_like(run_starts)  # 2 r - 2 of each run, r its average rank
    twice[:-1] = run_starts[1:]
    twice[-1] = size
    twice += run_starts
    twice -= 1
    del run_starts
    per_run = table[twice]
    del twice
    run = np.cumsum(starts_run, dtype=np.intp)  # 1 + each value's run (np.repeat holds
    del starts_run  # the GIL; these release it for the other threads)
    run -= 1
    return per_run[run]


def _ranked(row: np.ndarray):
    """``(z, z_folded, ordered)``: the normal scores of one coordinate's split draws
    ``row`` (flat), those of ``|row - median|``, and the draws sorted."""
    order, ordered = _sort_row(row)
    z = np.empty(row.size)
    z[order] = _scores_in_order(ordered)
    middle = row.size // 2  # the median, as np.median reads it off the sorted values
    median = ordered[middle] if row.size % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    below = np.searchsorted(ordered, median)
    # |x - median| in sorted order: the two runs either side of the median, merged (a
    # stable sort of two sorted runs is one merge).
    folded = np.empty(row.size)
    np.subtract(median, ordered[:below][::-1], out=folded[:below])
    np.subtract(ordered[below:], median, out=folded[below:])
    merge = np.argsort(folded, kind="stable")
    positions = np.empty_like(order)
    positions[:below], positions[below:] = order[:below][::-1], order[below:]
    del order
    positions, folded = positions[merge], folded[merge]
    del merge
    z_folded = np.empty(row.size)
    z_folded[positions] = _scores_in_order(folded)
    return z, z_folded, ordered


def _sorted_quantiles(ordered: np.ndarray, prob) -> np.ndarray:
    """``np.quantile(ordered, prob)`` (its default, linear interpolation, to the last bit)
    of sorted values: read off the two order statistics around each, no partition."""
    virtual = np.asarray(prob, np.float64) * (ordered.size - 1)
    below = np.floor(virtual).astype(np.intp)
    gamma = virtual - below
    low, high = ordered[below], ordered[np.minimum(below + 1, ordered.size - 1)]
    diff = high - low
    # NumPy's lerp: from the nearer end (exact at both ends, monotone in gamma).
    return np.where(gamma >= 0.5, high - diff * (1 - gamma), low + diff * gamma)


def _split(rows: np.ndarray) -> np.ndarray:
    """``(D, 2 C, N // 2)``: chain ``c``'s first half is split chain ``2 c``, its last
    half ``2 c + 1`` (the middle draw of an odd ``N`` left out)."""
    num, chains, n = rows.shape
    half = n // 2
    if n % 2 == 0:
        return rows.reshape(num, 2 * chains, half)
    return np.stack([rows[..., :half], rows[..., n - half :]], axis=2).reshape(
        num, 2 * chains, half
    )


def _first_stop(rho: np.ndarray) -> np.ndarray:
    """``(R,)``: the lag up to which Geyer's initial positive sequence looks, from the
    autocorrelations ``rho`` ``(R, K)`` (``K`` when no pair sum before it is non-positive)."""
    num_pairs = rho.shape[1] // 2
    pairs = rho[:, 0 : 2 * num_pairs : 2] + rho[:, 1 : 2 * num_pairs : 2]
    not_positive = ~(pairs > 0)
    found = not_positive.any(axis=1)
    return np.where(found, 2 * np.argmax(not_positive, axis=1) + 1, rho.shape[1])


def _group_ess(mean_power, size, n, chain_means, constant, out=None):
    """``(ess, complete, looked)``: Geyer's ESS of groups of ``K`` chains of ``n`` draws
    each, from each group's mean power spectrum ``(R, F)`` of the draws zero-padded to
    ``size``, its chains' means ``(R, K)`` and whether all its draws are one value,
    ``constant`` ``(R,)`` (as :func:`fisher_mala.convergence._ess_of_spectra`: a range
    under the float64 resolution). ``out``: a buffer of ``R`` rows of ``size`` for the
    autocovariances (a new one when None).

    A ``size`` under ``2 n - 1`` gives the exact autocovariances up to lag ``size - n``
    only: a group whose sum stops well inside them is ``complete`` (the same ESS as from
    all of them); the others are NaN here. ``looked``: the largest lag looked at.
    """
    from numpy import fft

    num_chains = chain_means.shape[-1]
    total = num_chains * n
    known = min(n, size - n + 1)  # the lags of the linear (not circular) autocovariance
    acov = np.empty((*mean_power.shape[:-1], size)) if out is None else out
    fft.irfft(mean_power, n=size, axis=-1, out=acov)
    acov = acov[..., :known]
    acov /= n
    mean_var = acov[:, 0] * n / (n - 1.0)
    var_plus = mean_var * (n - 1.0) / n
    if num_chains > 1:
        var_plus = var_plus + np.var(chain_means, axis=-1, ddof=1)
    # rho = 1 - (mean_var - acov) / var_plus, in the autocovariances' place
    rho = np.subtract(mean_var[:, None], acov, out=acov)
    rho /= var_plus[:, None]
    np.subtract(1.0, rho, out=rho)
    rho[:, 0] = 1.0
    stops = _first_stop(rho)
    # Geyer's sum looks one pair past the first non-positive pair sum: a margin of 4 lags
    # inside the exact ones leaves it the same as with every lag (its limit included).
    complete = (known == n) | constant | (stops + 4 <= known - 1)
    value = np.full(rho.shape[0], np.nan)
    if complete.all():  # no copy of the autocorrelations
        value = convergence._geyer(rho, total, False)
    elif complete.any():
        value[complete] = convergence._geyer(rho[complete], total, False)
    value = np.where(constant, float(total), value)
    return value, complete, int(np.max(np.where(complete, stops, 0), initial=0))


def _count(coords) -> int:
    """How many coordinates ``coords`` (a slice with a stop, or indices) selects."""
    return coords.stop - coords.start if isinstance(coords, slice) else len(coords)


def _mean_power(fill, coords, half: int, padded, spectrum, pairs: int):
    """``(power, means)`` of one kind of series of the coordinates
    ``coords``: ``fill(coords, out)`` writes them, ``(len(coords), 2 C, half)``, into the
    first ``half`` values of ``padded``'s rows (whose others are zero); ``spectrum`` their
    transform. ``power`` ``(len(coords), 2 C // pairs, F)``: their centred power spectra
    averaged over consecutive groups of ``pairs`` chains (a view of ``spectrum``: read it
    before the next kind is written there); each series' mean ``(len(coords), 2 C)``."""
    from numpy import fft

    num = _count(coords)
    series = padded[:num, :, :half]
    fill(coords, series)
    means = series.mean(axis=-1)
    series -= means[..., None]
    fft.rfft(padded[:num], axis=-1, out=spectrum[:num])
    squares = spectrum[:num].view(np.float64)  # (..., 2 F): real, imaginary
    squares *= squares
    summed = squares[:, ::pairs]  # each group's sum, in place (no more working memory)
    for k in range(1, pairs):
        summed += squares[:, k::pairs]
    # The power, as complex numbers with a zero imaginary part, in the spectrum's place: the
    # inverse transform of a real array would first convert it, at more than its own cost.
    summed[..., ::2] += summed[..., 1::2]
    summed[..., ::2] /= pairs
    summed[..., 1::2] = 0.0
    return spectrum[:num, ::pairs], means


def _transform_buffers(workspace: dict, dim: int, num_split: int, half: int, size: int):
    """``(padded, spectrum)``: a buffer ``(dim, num_split, size)`` whose values past
    ``half`` are zero, and a spectrum, for the four kinds of series in turn. ``workspace``
    is the pass's: the calling thread's next block of the same shape reuses them (a fresh
    large array is fresh pages, a page fault each: a tenth of the pass when every block
    took new ones), and they go with the pass."""
    key = (threading.get_ident(), dim, num_split, size)
    if key not in workspace:
        for old in [k for k in workspace if k[0] == key[0]]:  # the old go before the new come
            del workspace[old]
        padded = np.empty((dim, num_split, size))
        spectrum = np.empty((dim, num_split, size // 2 + 1), np.complex128)
        workspace[key] = (padded, spectrum)
    padded, spectrum = workspace[key]
    padded[..., half:] = 0.0  # (np.zeros of a large array would hold the GIL to zero it)
    return padded, spectrum


def _spectra_ess(workspace, fills, constants, coords, shape, size):
    """``(pooled, per_chain, complete, looked)`` of the coordinates ``coords`` from their
    four kinds of series ``(2 C, h)`` (``fills``: bulk scores, the two tail indicators,
    the raw split chains; ``constants``: whether each kind's groups are one value,
    ``(D,)`` for the first three, ``(D, C)`` for the last), each zero-padded to ``size``
    and transformed in turn (the transforms' memory is that of one kind): ``pooled``
    ``(D, 3)`` the ESS of the first three over all split chains, ``per_chain`` ``(D, C)``
    each chain's ESS of the mean, ``complete`` ``(D,)`` whether every one of a
    coordinate's values is (see :func:`_group_ess`)."""
    num_split, half = shape
    dim, chains = _count(coords), num_split // 2
    padded, spectrum = _transform_buffers(workspace, dim, num_split, half, size)
    buffers = (half, padded, spectrum)
    pooled, pooled_complete, pooled_looked = [], [], 0
    for fill, constant in zip(fills[:3], constants[:3], strict=True):
        power, means = _mean_power(fill, coords, *buffers, num_split)
        value, complete, looked = _group_ess(power[:, 0], size, half, means, constant[coords])
        pooled.append(value)
        pooled_complete.append(complete)
        pooled_looked = max(pooled_looked, looked)
    power, means = _mean_power(fills[3], coords, *buffers, 2)
    per_chain, chain_complete, chain_looked = _group_ess(
        power.reshape(dim * chains, -1), size, half, means.reshape(dim * chains, 2),
        constants[3][coords].reshape(-1),
        out=padded.reshape(dim * num_split, size)[: dim * chains],  # read: free to write
    )  # fmt: skip
    complete = np.all(pooled_complete, axis=0) & chain_complete.reshape(dim, -1).all(1)
    return (
        np.stack(pooled, axis=1),
        per_chain.reshape(dim, chains),
        complete,
        max(pooled_looked, chain_looked),
    )


def _block(x: np.ndarray, prob, max_lag=None, workspace=None):
    """:func:`diagnostics_pass` of one block of coordinates ``(C, N, D)``, its transform
    buffers in the pass's ``workspace`` (a dict; the block's own when None). NaN, constant
    coordinates and zero variances give NaN or the conventions above, silently: the error
    state is per thread, so it is set here."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return _block_values({} if workspace is None else workspace, x, prob, max_lag)


def _next_fast_len(n: int) -> int:
    """The smallest ``2^a 3^b 5^c >= n`` (``scipy.fft.next_fast_len``'s lengths for real
    transforms, without importing ``scipy.fft``: half a second on a first call)."""
    best = 1 << max(int(n) - 1, 0).bit_length()
    power5 = 1
    while power5 < best:
        power35 = power5
        while power35 < best:
            length = power35
            while length < n:
                length *= 2
            best = min(best, length)
            power35 *= 3
        power5 *= 5
    return best


def _block_values(workspace: dict, x: np.ndarray, prob, max_lag):
    chains, n, dim = x.shape
    rows = np.ascontiguousarray(np.moveaxis(x, -1, 0))  # (D, C, N), the draws' dtype
    chain_mean = rows.mean(axis=-1, dtype=np.float64)
    chain_var = rows.var(axis=-1, dtype=np.float64)
    nan_in_chain = np.isnan(chain_mean)
    nan = np.full(dim, np.nan)
    half = n // 2
    if half < 2:
        nans = np.full((chains, dim), np.nan)
        return CoordinateDiagnostics(nan, nan, nan, chain_mean.T, chain_var.T, nans), 0
    bad = nan_in_chain.any(axis=-1) | (n < 4)
    if nan_in_chain.any():
        rows = np.where(np.isnan(rows), 0, rows)
    split = _split(rows)  # (D, 2 C, half), the draws' dtype
    z = np.empty(split.shape)  # the bulk's normal scores
    quantiles = np.empty((dim, 2))
    # Whether every split draw is one value; whether none or all are below each quantile.
    bulk_constant, tail_constant = np.empty(dim, bool), np.empty((dim, 2), bool)
    rhat = np.empty(dim)
    for j in range(dim):  # a few coordinates per block: the loop costs nothing
        z_j, z_folded, ordered = _ranked(split[j].reshape(-1))
        z[j] = z_j.reshape(split.shape[1:])
        z_folded = z_folded.reshape(split.shape[1:])
        rhat[j] = max(convergence._rhat_basic(z[j][..., None])[0],
                      convergence._rhat_basic(z_folded[..., None])[0])  # fmt: skip
        # The quantiles are of all draws: read from the sorted split draws when N is even.
        quantiles[j] = (
            _sorted_quantiles(ordered, prob)
            if 2 * half == n
            else np.quantile(rows[j].astype(float), prob)
        )
        bulk_constant[j] = ordered[0] == ordered[-1]
        below = np.searchsorted(ordered, np.sort(quantiles[j]), side="right")
        tail_constant[j] = (below == 0) | (below == ordered.size)
        del z_j, z_folded, ordered
    if chains < 2:
        rhat = nan
    low, high = np.sort(quantiles, axis=-1).T
    # Each chain's range (its two halves), in the draws' dtype: exact in float64.
    by_chain = split.reshape(dim, chains, -1)
    chain_range = by_chain.max(axis=-1).astype(np.float64) - by_chain.min(axis=-1)
    constants = (bulk_constant, tail_constant[:, 0], tail_constant[:, 1],
                 chain_range < np.finfo(np.float64).resolution)  # fmt: skip
    fills = [  # the four kinds of series, written into the transforms' buffers in turn
        lambda c, out: np.copyto(out, z[c]),
        lambda c, out: np.less_equal(split[c], low[c, None, None], out=out),
        lambda c, out: np.less_equal(split[c], high[c, None, None], out=out),
        lambda c, out: np.copyto(out, split[c]),
    ]
    full = _next_fast_len(2 * half)
    # Padding to `half + lag` gives the autocovariances up to `lag`: enough when the sums
    # stop early (a mixing chain), at about half the cost of the transform of 2 `half`.
    size = full if max_lag is None else min(full, _next_fast_len(half + 2 * max_lag + 64))
    # A slice, not indices: the fills then read the block's rows without copying them.
    every = slice(0, dim)
    pooled, per_chain, complete, looked = _spectra_ess(
        workspace, fills, constants, every, split.shape[1:], size
    )
    if not complete.all():  # the sums of these coordinates go on: every lag
        redo = np.flatnonzero(~complete)
        pooled[redo], per_chain[redo], _, looked_redo = _spectra_ess(
            workspace, fills, constants, redo, split.shape[1:], full
        )
        looked = max(looked, looked_redo)
    bulk, tail_low, tail_high = pooled.T
    chain_ess = np.where(nan_in_chain, np.nan, per_chain)
    values = CoordinateDiagnostics(
        np.where(bad, np.nan, rhat),
        np.where(bad, np.nan, bulk),
        np.where(bad, np.nan, np.minimum(tail_low, tail_high)),
        chain_mean.T,
        chain_var.T,
        chain_ess.T,
    )
    return values, looked


#: Peak working memory of a block of ``W`` coordinates, in bytes per draw of one coordinate:
#: ``max(RANKING + (KEPT + BUFFERS) W, TRANSFORMS W)``. Ranking one coordinate at a time
#: (sort keys, orders, both normal scores) holds ``RANKING``; each coordinate keeps its
#: draws and bulk scores (``KEPT``), and the thread keeps the previous block's zero-padded
#: buffer and spectrum (``BUFFERS``, :func:`_transform_buffers`); the transforms of one
#: kind of series hold those buffers and the autocorrelations (``TRANSFORMS``). Measured
#: with ``tracemalloc`` (``tests/test_convergence_pass.py`` checks the bound).
RANKING_BYTES, KEPT_BYTES, BUFFERS_BYTES, TRANSFORMS_BYTES = 72, 12, 33, 52


def _block_bytes(width: int, values: int) -> int:
    """Peak working memory of a block of ``width`` coordinates of ``values`` draws each."""
    kept = (KEPT_BYTES + BUFFERS_BYTES) * width
    return values * max(RANKING_BYTES + kept, TRANSFORMS_BYTES * width)


#: Draws (chains x draws x coordinates) of one block, at most: a thread reuses its
#: transform buffers from block to block, and blocks of this size keep those buffers in
#: a few tens of MB (a block's first touch of fresh pages is a page fault each) while
#: each transform call still covers enough series to amortize NumPy's per-call cost
#: (``python -m benchmarks.diagnostics_cost --block-values`` times the pass per size).
BLOCK_VALUES = 2**20
#: Draws of one block, at least (where the coordinates and the budget allow): a block of
#: fewer spends more in NumPy's per-call cost than it gains from another thread. On
#: ``mnist56``'s draws (4 x 2000 x 785) with 32 MB, the pass on 2 threads took 1.6 s in
#: blocks of 16 000 draws, 0.75 s of 128 000 and 0.56-0.64 s of 256 000 to 10^6; planned
#: for 16 cores without this floor (16 workers of 4 coordinates: 32 000 draws a block) it
#: took 2.9 s on the same 2 cores, 1.0 s with it (4 workers of 20), 0.85 s planned for 2
#: (``python -m benchmarks.diagnostics_cost --plans``). More cores then get fewer workers,
#: not narrower blocks.
MIN_BLOCK_VALUES = 2**17


def _plan(x: np.ndarray, budget_bytes):
    """``(workers, blocks)``: threads, and slices of the coordinates: a first one of one
    coordinate (its autocorrelations' length sets the transforms' length of the others),
    then blocks of the others of at most :data:`BLOCK_VALUES` draws whose working memory,
    ``workers`` of them in flight, fits ``budget_bytes`` (one coordinate at a time on one
    thread when even that does not); no more workers than keep the blocks at
    :data:`MIN_BLOCK_VALUES` draws or more."""
    dim, values = x.shape[-1], x.shape[0] * max(x.shape[1], 1)
    min_width = max(1, min(-(-MIN_BLOCK_VALUES // values), dim - 1))
    workers = max(1, min(os.cpu_count() or 1, (dim - 1) // min_width))
    if budget_bytes is None:
        width = dim
    else:
        workers = max(1, min(workers, budget_bytes // _block_bytes(min_width, values)))
        per_value = budget_bytes / workers / values
        width = int(
            min(
                per_value / TRANSFORMS_BYTES,
                (per_value - RANKING_BYTES) / (KEPT_BYTES + BUFFERS_BYTES),
            )
        )
    width = max(1, min(width, -(-(dim - 1) // workers), BLOCK_VALUES // values))
    blocks = [slice(i, min(i + width, dim)) for i in range(1, dim, width)]
    return max(1, min(workers, len(blocks))), [slice(0, 1), *blocks]


#: Bytes of the block :func:`_prime_heap` allocates and frees before a pass: above the pass's
#: largest array (a block's :data:`BLOCK_VALUES` values in float64, 8 MB) and below glibc's
#: cap on its dynamic mmap threshold (32 MB on 64-bit systems; a larger block leaves it).
HEAP_PRIMER_BYTES = 16 << 20
#: Whether :func:`diagnostics_pass` primes the heap (``benchmarks/diagnostics_cost.py
#: --page-faults`` turns it off in a fresh process to measure what it saves).
PRIME_HEAP = True


def _prime_heap() -> None:
    """Allocate and free one block of :data:`HEAP_PRIMER_BYTES`, never touched.

    glibc's malloc serves a request above its mmap threshold (128 KB until told otherwise)
    with a fresh mapping, unmapped again when freed: each of the pass's arrays of hundreds
    of KB to a few MB is then fresh pages, a page fault each (about 100 000 in a first pass
    over the quickstart's draws, and 50 000 in each later one, whose threads are new). Its
    own rule raises the threshold to the size of a mapped block when that block is freed
    (and the heap's trim threshold to twice that): after this block, every array of the
    pass comes from the heap and reuses its pages. Any program that frees a large array
    sets the rule off the same way; with another C library this costs one allocation.
    """
    np.empty(HEAP_PRIMER_BYTES, np.uint8)


#: The process's thread pools of the pass, one per number of workers (a pass runs at most
#: its planned number of blocks at once). The threads outlive a pass, and so do the pages
#: of their malloc arenas (up to glibc's trim threshold, the pass's working memory): a new
#: thread's arena is fresh pages, a page fault on each first touch of the pass's working
#: memory (about 8 000 at the quickstart's shape), which after a JAX run cost a fifth of
#: the pass on the machine measured (``python -m benchmarks.diagnostics_cost --pool``).
_POOLS: dict[int, ThreadPoolExecutor] = {}


def _pool(workers: int) -> ThreadPoolExecutor:
    if workers not in _POOLS:
        _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="fisher_mala_checks")
    return _POOLS[workers]


def _forget_pools() -> None:
    """A forked child has none of its parent's threads: it starts pools of its own."""
    _POOLS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def diagnostics_pass(x, prob=(0.05, 0.95), budget_bytes=None) -> CoordinateDiagnostics:
    """Every diagnostic of :class:`CoordinateDiagnostics` of draws ``x`` ``(C, N, D)``.

    Parameters
    ----------
    x
        The draws, any float dtype (float32 draws are sorted as float32).
    prob
        The tail ESS's two quantiles.
    budget_bytes
        Working memory of the blocks of coordinates in flight (no bound when None). The
        blocks run on a thread per core (NumPy's sorts, transforms and reductions release
        the GIL), fewer when one coordinate's work per thread would not fit.

    Returns
    -------
    CoordinateDiagnostics
        The same values as ``convergence.rhat_and_ess``, ``per_chain_ess_mean`` and each
        chain's moments, with ArviZ's conventions (NaN for a coordinate with a NaN, for
        fewer than 4 draws; R-hat NaN with one chain).
    """
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    if x.shape[-1] == 0:
        return _block(x, prob)[0]
    workers, (first, *rest) = _plan(x, budget_bytes)
    if PRIME_HEAP:
        _prime_heap()
    workspace = {}  # each thread's transform buffers, for this pass only
    if workers == 1 or not rest:
        values, looked = _block(x[..., first], prob, None, workspace)
        parts = [values] + [_block(x[..., b], prob, looked, workspace)[0] for b in rest]
    else:
        pool = _pool(workers)
        values, looked = pool.submit(_block, x[..., first], prob, None, workspace).result()
        parts = [values]
        parts += [
            v for v, _ in pool.map(lambda b: _block(x[..., b], prob, looked, workspace), rest)
        ]
    return CoordinateDiagnostics(*(np.concatenate(p, axis=-1) for p in zip(*parts, strict=True)))
