"""The bracketing step-size search as a triple, on acceptance curves with known crossings."""

import jax.numpy as jnp
import pytest

from fisher_mala.adaptations.step_size_search import (
    bracket_step_size,
    search_continues,
    step_size_search,
    trial_step_size,
)


def acceptance(step):
    return jnp.exp(-step)  # crosses 1/2 at log 2 = 0.693


@pytest.mark.parametrize(
    "start,expected,count",
    [
        (1.0, 0.5, 1),  # rejected at 1: halve once to 0.5 (accepted)
        (0.01, 0.64, 7),  # accepted: double up to 0.64; 1.28 is rejected
        (1e6, 1e6 / 2**21, 21),  # halve until accepted (0.477)
    ],
)
def test_last_step_on_the_accepting_side(start, expected, count):
    step, made = bracket_step_size(acceptance, jnp.asarray(start), 0.5)
    assert float(step) == pytest.approx(expected, rel=1e-6)
    assert int(made) == count


def test_the_triple_step_by_step_equals_the_loop():
    search = step_size_search(0.5)
    state = search.init(jnp.asarray(0.01), acceptance(0.01))
    tried = []
    while bool(search_continues(state)):
        trial = trial_step_size(state)
        tried.append(float(trial))
        state = search.update(state, acceptance(trial))
    assert tried == pytest.approx([0.01 * 2**k for k in range(1, 8)])
    assert float(search.final(state)) == pytest.approx(0.64)


def test_never_accepting_returns_the_smallest_step_tried():
    step, made = bracket_step_size(lambda s: jnp.zeros(()), jnp.asarray(1.0), 0.5, 10)
    assert int(made) == 10 and float(step) == pytest.approx(2.0**-10)
