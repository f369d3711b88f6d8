"""The draws of every built-in sampler for fixed keys, against a recording.

Recorded by ``python tests/golden_cases.py`` before a restructuring; a change that keeps
the arithmetic keeps them bit-identical with the jax version that recorded them. Under
another jax version XLA may round differently, so there the draws must agree to 1e-8
relative (float64; 1e-4 for float32) instead of bit for bit.
"""

import jax
import numpy as np
import pytest
from golden_cases import CASES, PATH, run_case

_RECORDED = np.load(PATH)
_SAME_JAX = str(_RECORDED["jax_version"]) == jax.__version__


@pytest.mark.parametrize("name", sorted(CASES))
def test_draws_match_the_recording(name):
    out = run_case(name)
    float32 = CASES[name][2] == "float32"
    for field, value in out.items():
        expected = _RECORDED[f"{name}/{field}"]
        assert value.shape == expected.shape, (name, field)
        if _SAME_JAX:
            np.testing.assert_array_equal(value, expected, err_msg=f"{name}/{field}")
        else:
            rtol = 1e-4 if float32 else 1e-8
            np.testing.assert_allclose(value, expected, rtol=rtol, atol=rtol, err_msg=name)
