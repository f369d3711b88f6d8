"""The paper's ESS estimator against an independent NumPy loop and AR(1) processes."""

import numpy as np
import pytest

import fisher_mala as fm
from fisher_mala.diagnostics import paper_ess


def _reference_ess(x):
    """TFP's effective_sample_size, default arguments, written as a plain loop."""
    n = len(x)
    w = x - x.mean()
    var = np.dot(w, w) / n
    total = 0.0
    for k in range(n):
        rho = np.dot(w[: n - k], w[k:]) / (n - k) / var
        if rho < 0:
            break
        total += (n - k) / n * rho
    return n / (-1.0 + 2.0 * total)


@pytest.mark.parametrize("phi", [0.0, 0.5, 0.9, -0.3])
def test_paper_ess_matches_reference_loop(phi):
    x = _ar1(phi, 3000, seed=1)
    assert paper_ess(x) == pytest.approx(_reference_ess(x), rel=1e-9)


def _ar1(phi, n, seed):
    rng = np.random.default_rng(seed)
    eps = rng.normal(size=n)
    x = np.empty(n)
    x[0] = eps[0] / np.sqrt(1 - phi**2)
    for t in range(1, n):
        x[t] = phi * x[t - 1] + eps[t]
    return x


@pytest.mark.parametrize("phi", [0.5, 0.9, 0.97])
def test_paper_ess_recovers_ar1_ess(phi):
    """For AR(1), ESS / N -> (1 - phi) / (1 + phi); average over 20 series."""
    n = 20_000
    values = [paper_ess(_ar1(phi, n, seed)) for seed in range(20)]
    expected = n * (1 - phi) / (1 + phi)
    assert np.mean(values) == pytest.approx(expected, rel=0.08)


def test_ess_shapes_and_methods():
    rng = np.random.default_rng(0)
    samples = {"a": rng.normal(size=(3, 500, 2)), "b": rng.normal(size=(3, 500))}
    bulk = fm.ess(samples)  # the default: ArviZ's multi-chain bulk ESS
    assert bulk.shape == (3,) and np.all(bulk > 800)  # iid draws: about 1500
    np.testing.assert_array_equal(bulk, fm.ess(samples, method="bulk", per_chain=False))
    assert fm.ess(samples, method="paper", per_chain=True).shape == (3, 3)
    assert fm.ess(samples, method="paper").shape == (3,)
    assert fm.ess(samples, per_chain=True).shape == (3, 3)


def test_ess_works_on_blocks_of_coordinates_within_a_memory_bound(monkeypatch):
    """``fm.ess`` holds an eighth of the draws' bytes of working memory (or
    ``checks.WORKING_MEMORY_FLOOR``), not the estimators' several copies of all the draws
    at once, and its values are those of the estimators on all coordinates."""
    import tracemalloc

    from fisher_mala import checks, convergence

    rng = np.random.default_rng(5)
    x = np.cumsum(rng.normal(size=(4, 500, 300)), axis=1) * 0.1 + rng.normal(size=(4, 500, 300))
    monkeypatch.setattr(checks, "WORKING_MEMORY_FLOOR", 0)
    budget = x.nbytes // 8  # 0.6 MB; the estimators on all of x hold over 20 MB
    for method in ("bulk", "tail", "mean", "paper"):  # imports and caches, not counted
        fm.ess(x[..., :1], method=method)
    for method, direct in (("bulk", convergence.ess_bulk), ("tail", convergence.ess_tail),
                           ("mean", convergence.ess_mean)):  # fmt: skip
        tracemalloc.start()
        values = fm.ess(x, method=method)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak <= 2 * budget, (method, peak)
        np.testing.assert_allclose(values, direct(x), rtol=1e-12)  # last bits: blocks
    tracemalloc.start()
    per = fm.ess(x, method="paper", per_chain=True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak <= 2 * budget, peak
    np.testing.assert_allclose(per, fm.diagnostics.paper_ess(x, axis=1), rtol=1e-12)
