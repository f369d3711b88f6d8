"""The Fisher recursion as a triple: init, update and final against dense float64 algebra."""

import jax
import jax.numpy as jnp
import numpy as np

from fisher_mala.adaptations import fisher_preconditioner, whitened_signal


def test_updates_give_the_inverse_of_damping_plus_summed_signals(x64):
    """Proposition 4: after n signals, (R R^T)^{-1} = lambda I + sum_i s_i s_i^T, fed
    whitened (phi = R^T s with the R before each update)."""
    rng = np.random.default_rng(0)
    d, n, damping = 5, 30, 10.0
    signals = rng.normal(size=(n, d)) * np.geomspace(0.2, 3.0, d)
    fisher = fisher_preconditioner(damping)
    state = fisher.init(d, jnp.float64)
    update = jax.jit(fisher.update)
    for s in signals:
        state, _ = update(state, jnp.asarray(s) @ state.sqrt_precond)
    r = np.asarray(fisher.final(state))
    expected = damping * np.eye(d) + signals.T @ signals
    np.testing.assert_allclose(np.linalg.inv(r @ r.T), expected, rtol=1e-9)
    np.testing.assert_allclose(float(state.trace_precond), np.trace(r @ r.T), rtol=1e-12)
    assert int(state.count) == n


def test_a_block_of_signals_is_the_same_as_one_at_a_time(x64):
    rng = np.random.default_rng(1)
    d, c = 4, 3
    block = rng.normal(size=(c, d))
    fisher = fisher_preconditioner(1.0)
    start = fisher.init(d, jnp.float64)
    together, _ = fisher.update(start, jnp.asarray(block) @ start.sqrt_precond)
    r = np.asarray(together.sqrt_precond)
    np.testing.assert_allclose(np.linalg.inv(r @ r.T), np.eye(d) + block.T @ block, rtol=1e-10)


def test_signals_come_from_whitened_gradients_alone(x64):
    """Eq. (16) and (15) from u_x = R^T g_x, u_y = R^T g_y; a non-finite proposal gives none."""
    u_x, u_y = jnp.array([1.0, -2.0]), jnp.array([0.5, 1.0])
    rb = whitened_signal("rao_blackwell", u_x, u_y, jnp.asarray(0.25), True, True)
    np.testing.assert_allclose(rb, 0.5 * (u_y - u_x))
    inc = whitened_signal("increment", u_x, u_y, jnp.asarray(0.25), False, True)
    np.testing.assert_allclose(inc, 0.0)
    nonfinite = whitened_signal("rao_blackwell", u_x, u_y * jnp.nan, jnp.asarray(0.0), False, False)
    np.testing.assert_allclose(nonfinite, 0.0)
    np.testing.assert_allclose(whitened_signal("score", u_x, u_y, 1.0, True, True), u_x)
