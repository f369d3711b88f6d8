"""The one-pass diagnostics against the estimators one at a time (and so ArviZ 1.x)."""

import numpy as np
import pytest

from fisher_mala import convergence, convergence_pass
from tests.test_convergence import CASES, RNG, ar1


def _expected(x):
    rhat, bulk, tail = convergence.rhat_and_ess(x)
    x64 = np.asarray(x, np.float64)
    return {
        "rhat": rhat,
        "ess_bulk": bulk,
        "ess_tail": tail,
        "chain_mean": x64.mean(axis=1),
        "chain_var": x64.var(axis=1),
        "chain_ess_mean": convergence.per_chain_ess_mean(x),
    }


def _float32_rejections():
    x = CASES["rejections"]().astype(np.float32)
    x[:, :7, 0] = -0.0  # signed zeros tie with the zeros
    x[:, 7:14, 0] = 0.0
    return x


PASS_CASES = {
    **CASES,
    "float32": lambda: ar1(4, 1000, 5, 0.8).astype(np.float32),
    "float32_ties": _float32_rejections,
    "float32_odd_draws": lambda: ar1(3, 301, 3, 0.5).astype(np.float32),
    "nan_in_one_chain": lambda: np.where(
        np.arange(3)[:, None, None] == 1, np.nan, ar1(3, 401, 2, 0.6)
    )
    * np.array([1.0, 0.0])
    + ar1(3, 401, 2, 0.6) * np.array([0.0, 1.0]),
}


@pytest.mark.parametrize("case", sorted(PASS_CASES))
@pytest.mark.parametrize("plan", ["whole", "blocks", "threads"])
def test_the_pass_equals_the_estimators_one_at_a_time(case, plan, monkeypatch):
    x = PASS_CASES[case]()
    budget = 1 if plan == "blocks" else None  # "blocks": one coordinate per block
    if plan == "threads":  # blocks of one coordinate on two threads, however few the draws
        monkeypatch.setattr(convergence_pass, "MIN_BLOCK_VALUES", 1)
        monkeypatch.setattr(convergence_pass.os, "cpu_count", lambda: 2)
    got = convergence_pass.diagnostics_pass(x, budget_bytes=budget)
    for name, expected in _expected(x).items():
        np.testing.assert_allclose(
            getattr(got, name), expected, rtol=1e-9, atol=0, equal_nan=True, err_msg=name
        )


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_radix_sort_orders_as_a_stable_argsort(dtype):
    rows = RNG.normal(size=(3, 999)).astype(dtype)
    rows[0, :50] = rows[0, 50:100]  # ties
    tiny = np.finfo(dtype).smallest_subnormal
    rows[1, :6] = [np.inf, -np.inf, -0.0, 0.0, tiny, -tiny]
    rows[2, ::3] = 1.0  # a run of ties across the row
    for row in rows:
        order, ordered = convergence_pass._sort_row(row)
        assert ordered.dtype == np.float64
        np.testing.assert_array_equal(ordered, np.sort(row.astype(np.float64)))
        np.testing.assert_array_equal(row[order], ordered)
        # Ties in index order (the radix sort puts -0.0 before 0.0, a tie to a comparison
        # sort: the row holds them in that order).
        np.testing.assert_array_equal(order, np.argsort(row, kind="stable"))


@pytest.mark.parametrize("max_lag", [1, 8, 64])
def test_transforms_shorter_than_every_lag_give_the_same_values(max_lag):
    """A short transform serves the coordinates whose sums stop early; the others are
    redone with every lag (an AR(1) chain with rho = 0.99 looks far)."""
    x = np.concatenate([RNG.normal(size=(4, 1000, 3)), ar1(4, 1000, 2, 0.99)], axis=-1)
    full, looked = convergence_pass._block(x, (0.05, 0.95))
    short, _ = convergence_pass._block(x, (0.05, 0.95), max_lag)
    assert looked > 64  # the AR(1) coordinates need more than the shortest transforms
    for name in full._fields:
        np.testing.assert_allclose(getattr(short, name), getattr(full, name), rtol=1e-12)


def test_transform_lengths_are_scipys_fast_lengths():
    from scipy.fft import next_fast_len

    for n in [*range(1, 3000), 19_999, 20_000, 20_001, 10**6 + 1]:
        assert convergence_pass._next_fast_len(n) == next_fast_len(n, real=True), n


def test_the_working_memory_stays_within_its_bound():
    import tracemalloc

    x = ar1(4, 20_000, 9, 0.9).astype(np.float32)
    values = 4 * 20_000
    convergence_pass._block(x[..., :1], (0.05, 0.95))  # the normal-score table, cached
    for width in (1, 2, 4, 8):
        tracemalloc.start()
        convergence_pass._block(x[..., :width], (0.05, 0.95))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak <= convergence_pass._block_bytes(width, values), width
    budget = 2 * convergence_pass._block_bytes(2, values)
    tracemalloc.start()
    convergence_pass.diagnostics_pass(x, budget_bytes=budget)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak <= budget


@pytest.mark.parametrize("cores", [1, 2, 16, 64])
@pytest.mark.parametrize("shape", [(4, 2000, 785), (4, 20_000, 100), (4, 100, 10), (1, 10, 2)])
def test_more_cores_get_fewer_workers_not_blocks_below_the_minimum(cores, shape, monkeypatch):
    """The plan's blocks cover every coordinate once; each has ``MIN_BLOCK_VALUES`` draws
    or more unless the coordinates run out or one coordinate's work already fills the
    budget; the blocks in flight fit the budget."""
    from fisher_mala.checks import WORKING_MEMORY_FLOOR

    monkeypatch.setattr(convergence_pass.os, "cpu_count", lambda: cores)
    x = np.broadcast_to(np.float32(0), shape)  # the plan reads only the shape
    values = shape[0] * shape[1]
    for budget in (None, WORKING_MEMORY_FLOOR):
        workers, blocks = convergence_pass._plan(x, budget)
        assert blocks[0] == slice(0, 1)
        covered = np.concatenate([np.arange(shape[-1])[b] for b in blocks])
        np.testing.assert_array_equal(covered, np.arange(shape[-1]))
        widths = [b.stop - b.start for b in blocks[1:]]
        assert 1 <= workers <= max(1, min(cores, len(widths)))
        reachable = min(convergence_pass.MIN_BLOCK_VALUES, (shape[-1] - 1) * values)
        if budget is not None:
            assert workers * convergence_pass._block_bytes(max(widths), values) <= budget
            fits = budget // convergence_pass._block_bytes(1, values)
            reachable = min(reachable, fits * values)
        assert all(w * values >= reachable for w in widths[:-1]), (workers, widths)
    if shape == (4, 2000, 785) and cores >= 16:  # mnist56's draws on a 16-core host
        assert convergence_pass._plan(x, WORKING_MEMORY_FLOOR)[0] == 4


def test_quantiles_of_sorted_values_equal_numpys_to_the_last_bit():
    rng = np.random.default_rng(3)
    probs = [(0.05, 0.95), (0.0, 1.0), (0.5, 0.25), (1 / 3, 0.999)]
    for size in (1, 2, 3, 4, 7, 80_000, 80_001):
        for values in (rng.normal(size=size), rng.integers(0, 3, size).astype(float)):
            ordered = np.sort(values)
            for prob in probs:
                got = convergence_pass._sorted_quantiles(ordered, prob)
                np.testing.assert_array_equal(got, np.quantile(values, prob))


def test_passes_share_one_pool_and_a_forked_child_starts_its_own(monkeypatch):
    """The pass's threads outlive it (their malloc arenas keep their pages); each pass's
    transform buffers go with it; after a fork the pools are forgotten and made anew."""
    monkeypatch.setattr(convergence_pass.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(convergence_pass, "MIN_BLOCK_VALUES", 1)  # threads for few draws
    x = ar1(4, 400, 5, 0.7)
    first = convergence_pass.diagnostics_pass(x)
    pool = convergence_pass._POOLS[2]
    threads = set(pool._threads)
    second = convergence_pass.diagnostics_pass(x)
    assert convergence_pass._POOLS[2] is pool and set(pool._threads) == threads
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    convergence_pass._forget_pools()  # what a forked child runs (os.register_at_fork)
    assert convergence_pass._POOLS == {}
    third = convergence_pass.diagnostics_pass(x)
    assert convergence_pass._POOLS[2] is not pool
    for a, b in zip(first, third, strict=True):
        np.testing.assert_array_equal(a, b)
