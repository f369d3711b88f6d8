"""Algorithm 1's step-size rule as a triple, against its equation."""

import jax.numpy as jnp
import numpy as np
import pytest

from fisher_mala.adaptations.step_size import robbins_monro, step_size_bounds


@pytest.mark.parametrize("target,rho", [(0.574, 0.015), (0.651, 0.1), (0.8, 1.2)])
def test_each_update_is_the_multiplicative_rule(target, rho):
    rule = robbins_monro(target, rho)
    state = rule.init(jnp.asarray(0.3))
    expected = 0.3
    for alpha in np.random.default_rng(0).uniform(size=50):
        state = rule.update(state, jnp.asarray(alpha, jnp.float32))
        expected *= 1.0 + rho * (alpha - target)
        assert float(rule.final(state)) == pytest.approx(expected, rel=1e-5)


def test_the_step_is_clipped_to_the_floating_point_range():
    rule = robbins_monro(0.574, 1.0)
    low, high = step_size_bounds(jnp.float32)
    state = rule.init(jnp.asarray(2 * low, jnp.float32))
    for _ in range(10):
        state = rule.update(state, 0.0)
    assert float(rule.final(state)) == pytest.approx(low)
    state = rule.init(jnp.asarray(high / 1.1, jnp.float32))
    for _ in range(10):
        state = rule.update(state, 1.0)
    assert float(rule.final(state)) == pytest.approx(high)
