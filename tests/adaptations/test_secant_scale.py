"""The secant scales of MALA's proposals, against dense linear algebra in float64."""

import jax.numpy as jnp
import numpy as np

from fisher_mala.adaptations.secant_scale import MAX_SCALE_RATIO, secant_scale


def _absorb(moves, changes, keep):
    scales = secant_scale()
    sums = scales.init(moves.shape[1], jnp.float64)
    for move, change, k in zip(moves, changes, keep, strict=True):
        sums = scales.update(sums, jnp.asarray(move), jnp.asarray(change), k)
    return np.asarray(scales.final(sums))


def test_secant_scales_are_root_mean_square_ratios_of_moves_and_gradient_changes(x64):
    """On N(mu, P^{-1}), dg = -P dx wherever the moves start: the scale of x_j is
    ||dx_j|| / ||(P dx)_j|| over the kept moves; exactly 1 / P_jj for a diagonal P."""
    rng = np.random.default_rng(0)
    d, n = 5, 300
    b = rng.normal(size=(d, d))
    precision = b @ b.T + np.diag(np.geomspace(1e-3, 1e3, d))
    moves = rng.normal(size=(n, d)) * rng.uniform(0.1, 2.0, size=(n, 1))
    keep = rng.uniform(size=n) > 0.2  # e.g. non-finite proposals: not absorbed
    got = _absorb(moves, -moves @ precision, keep)
    kept = moves[keep]
    expected = np.sqrt(np.sum(kept**2, 0) / np.sum((kept @ precision) ** 2, 0))
    np.testing.assert_allclose(got, expected, rtol=1e-12)

    diagonal = np.diag(np.geomspace(1e-4, 1e4, d))
    got = _absorb(moves, -moves @ diagonal, np.ones(n, bool))
    np.testing.assert_allclose(got, 1.0 / np.diag(diagonal), rtol=1e-12)


def test_secant_scales_without_information(x64):
    """No move absorbed: all ones. A coordinate whose gradient never changed (flat, or
    lost to rounding): the largest learned scale. Scales are kept within MAX_SCALE_RATIO."""
    moves = np.ones((4, 3))
    assert np.all(_absorb(moves, moves, np.zeros(4, bool)) == 1.0)
    changes = -moves * np.array([2.0, 0.0, 1e20])
    got = _absorb(moves, changes, np.ones(4, bool))
    np.testing.assert_allclose(got, [0.5, 0.5, 0.5 / MAX_SCALE_RATIO], rtol=1e-12)
