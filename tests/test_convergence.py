"""The vectorized convergence diagnostics against ArviZ 1.x, to 1e-6 relative."""

import warnings

import arviz as az
import numpy as np
import pytest

import fisher_mala as fm
from fisher_mala import convergence

RNG = np.random.default_rng(20261127)


def ar1(chains, draws, dim, rho, rng=RNG):
    x = np.zeros((chains, draws, dim))
    noise = rng.normal(size=(chains, draws, dim))
    for t in range(1, draws):
        x[:, t] = rho * x[:, t - 1] + noise[:, t]
    return x


def _with_constant_and_nan():
    x = RNG.normal(size=(4, 100, 4))
    x[:, :, 1] = 3.0  # constant: ESS = number of draws, R-hat NaN
    x[0, 5, 2] = np.nan  # a NaN: NaN everywhere for that coordinate
    return x


def _rejections():
    """MALA-like draws: long runs of repeated values (ties in the ranks)."""
    x = ar1(4, 600, 3, 0.5)
    keep = RNG.uniform(size=(4, 600)) < 0.3
    for t in range(1, 600):
        x[:, t] = np.where(keep[:, t, None], x[:, t - 1], x[:, t])
    return x


CASES = {
    "normal": lambda: RNG.normal(size=(4, 500, 6)),
    "ar1_0.9": lambda: ar1(4, 1000, 4, 0.9),
    "ar1_0.99": lambda: ar1(4, 2000, 3, 0.99),
    "ar1_0.999": lambda: ar1(4, 2000, 3, 0.999),
    "antithetic": lambda: ar1(4, 400, 3, -0.7),
    "one_chain": lambda: RNG.normal(size=(1, 300, 3)),
    "four_draws": lambda: RNG.normal(size=(3, 4, 3)),
    "three_draws": lambda: RNG.normal(size=(3, 3, 2)),
    "odd_draws": lambda: RNG.normal(size=(2, 101, 3)),
    "ties": lambda: RNG.integers(0, 3, size=(4, 200, 3)).astype(float),
    "rejections": _rejections,
    "constant_and_nan": _with_constant_and_nan,
    # one coordinate, chains that disagree: the between-chain variance matters
    "one_coordinate": lambda: ar1(4, 500, 1, 0.9) + np.arange(4.0)[:, None, None],
}


def _arviz(x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "rhat": np.asarray(az.rhat(x), float),
            "bulk": np.asarray(az.ess(x, method="bulk"), float),
            "tail": np.asarray(az.ess(x, method="tail", prob=(0.05, 0.95)), float),
            "mean": np.asarray(az.ess(x, method="mean"), float),
            "mcse": np.asarray(az.mcse(x, method="mean"), float),
        }


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_estimator_equals_arviz(case):
    x = CASES[case]()
    expected = _arviz(x)
    rhat, bulk, tail = convergence.rhat_and_ess(x)
    mine = {
        "rhat": rhat,
        "bulk": bulk,
        "tail": tail,
        "mean": convergence.ess_mean(x),
        "mcse": convergence.mcse_mean(x),
    }
    np.testing.assert_allclose(convergence.rhat(x), expected["rhat"], rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose(convergence.ess_bulk(x), bulk, rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(convergence.ess_tail(x), tail, rtol=1e-12, equal_nan=True)
    for name, value in mine.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-6, err_msg=name, equal_nan=True)


def test_ranks_average_ties_as_scipy():
    from scipy.stats import rankdata

    rows = RNG.integers(0, 5, size=(3, 50)).astype(float)
    np.testing.assert_array_equal(convergence.average_ranks(rows), rankdata(rows, axis=-1))


def test_per_chain_ess_and_fm_ess_methods():
    x = ar1(3, 401, 2, 0.6)  # an odd number of draws
    x[1, 7, 0] = np.nan  # NaN for chain 1's coordinate 0 only, as ArviZ per chain
    per_chain = convergence.per_chain_ess_mean(x)
    assert np.isnan(per_chain[1, 0]) and np.isfinite(per_chain[[0, 2], 0]).all()
    for c in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = az.ess(x[c : c + 1], method="mean")
        np.testing.assert_allclose(per_chain[c], expected, rtol=1e-6, equal_nan=True)
    x = x[:, :400]
    x[1, 7, 0] = 0.0
    tail = fm.ess(x, method="tail")  # ArviZ 1.3 needs `prob`; fm.ess gives 0.05 and 0.95
    np.testing.assert_allclose(tail, az.ess(x, method="tail", prob=(0.05, 0.95)), rtol=1e-6)
    np.testing.assert_allclose(
        fm.ess(x, method="bulk", per_chain=True)[1], az.ess(x[1:2], method="bulk"), rtol=1e-6
    )
    np.testing.assert_allclose(fm.ess(x, method="sd"), az.ess(x, method="sd"), rtol=1e-12)


def test_one_coordinate_is_not_centred_in_the_callers_array():
    """With one coordinate the chains' series are already contiguous: the estimators
    centre a copy, never the caller's draws, and one chain's halves keep their means."""
    x = ar1(3, 400, 1, 0.9) + np.arange(3.0)[:, None, None]
    x[:, 200:] += 2.0  # each chain's halves disagree
    before = x.copy()
    ess = convergence.ess(x)
    np.testing.assert_array_equal(x, before)
    np.testing.assert_allclose(ess, convergence.ess(np.concatenate([x, x], axis=-1))[:1])
    per_chain = convergence.per_chain_ess_mean(x)
    for c in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = az.ess(x[c : c + 1], method="mean")
        np.testing.assert_allclose(per_chain[c], expected, rtol=1e-6)
