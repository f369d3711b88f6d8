"""Long runs in float32 stay finite, SPD and close to float64 (benchmarks/long_run.py)."""

import pytest

from benchmarks.long_run import long_run


def _check(figures, tolerance_a, tolerance_trace):
    assert figures["finite"]
    assert figures["min_eigenvalue_over_max"] > 0  # R R^T positive definite
    assert figures["symmetry_error"] < 1e-6
    assert figures["relative_error_A"] < tolerance_a, figures
    assert figures["trace_error_anchored_worst"] < tolerance_trace, figures


def test_twenty_thousand_float32_updates_track_float64():
    # 2 x 10^4 updates: the paper's burn-in length.
    _check(long_run(20_000, 50), tolerance_a=1e-3, tolerance_trace=1e-3)


@pytest.mark.slow
def test_a_million_float32_updates_track_float64():
    _check(long_run(1_000_000, 50), tolerance_a=1e-2, tolerance_trace=1e-3)
