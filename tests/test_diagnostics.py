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
