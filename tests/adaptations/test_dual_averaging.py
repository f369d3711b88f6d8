"""Dual averaging as a triple, against Hoffman and Gelman (2014), Eq. (6) and Algorithm 5.

BlackJAX (whose arithmetic the library keeps) averages the iterate *before* each update,
``log eps_bar_t = t^-kappa log eps_{t-1} + (1 - t^-kappa) log eps_bar_{t-1}`` with
``eps_0`` the initial step, where Algorithm 5 averages ``log eps_t``: the final step lags
one update behind, which the test spells out.
"""

import math

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("blackjax")

from fisher_mala.adaptations.dual_averaging import dual_averaging


def test_updates_follow_hoffman_and_gelman():
    target, t0, gamma, kappa = 0.8, 10.0, 0.05, 0.75  # Stan's and BlackJAX's defaults
    da = dual_averaging(target)
    eps0 = 0.7
    state = da.init(jnp.asarray(eps0))
    mu, h_bar, log_eps_bar = math.log(10 * eps0), 0.0, 0.0
    log_eps = math.log(eps0)
    for t, alpha in enumerate(np.random.default_rng(1).uniform(size=40), start=1):
        state = da.update(state, jnp.asarray(alpha))
        eta = 1.0 / (t + t0)
        h_bar = (1 - eta) * h_bar + eta * (target - alpha)
        weight = t**-kappa
        log_eps_bar = weight * log_eps + (1 - weight) * log_eps_bar  # the previous iterate
        log_eps = mu - math.sqrt(t) / gamma * h_bar
        assert float(state.log_step_size) == pytest.approx(log_eps, rel=1e-5, abs=1e-5)
    assert float(da.final(state)) == pytest.approx(math.exp(log_eps_bar), rel=1e-5)
