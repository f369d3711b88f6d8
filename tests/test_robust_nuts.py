"""NUTS with the U-turn checks across subtrees: the same kernel as BlackJAX's without them,
the iterative checks equal to a brute force over every subtree merge, the resonance they
remove, and the chain's invariance."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import gaussian_logdensity, random_covariance

from fisher_mala import robust_nuts

blackjax = pytest.importorskip("blackjax")


def _identity_turning(left, right, total):
    """BlackJAX's Euclidean criterion with the unit metric."""
    return blackjax.mcmc.metrics.default_metric(jnp.ones(left.shape[0])).check_turning(
        left, right, total
    )


def test_without_the_checks_it_is_blackjax_nuts_draw_for_draw(x64):
    d = 4
    logdensity = gaussian_logdensity(jnp.arange(d) * 0.2, jnp.asarray(random_covariance(d, 2)))
    inverse_mass = jnp.linspace(0.5, 2.0, d)
    ours = jax.jit(robust_nuts.build_kernel(robust=False), static_argnums=2)
    theirs = jax.jit(blackjax.nuts.build_kernel(), static_argnums=2)
    a = b = blackjax.nuts.init(jnp.ones(d), logdensity)
    for key in jax.random.split(jax.random.key(3), 40):
        a, info_a = ours(key, a, logdensity, 0.4, inverse_mass)
        b, info_b = theirs(key, b, logdensity, 0.4, inverse_mass)
        np.testing.assert_array_equal(a.position, b.position)
        assert int(info_a.num_integration_steps) == int(info_b.num_integration_steps)
        assert float(info_a.acceptance_rate) == float(info_b.acceptance_rate)


def _brute_force(momenta, n, robust):
    """Whether a subtree ending at leaf ``n`` of a doubling (leaves ``0 .. n``) turns:
    every aligned subtree ``[n - 2^j + 1, n]`` (``j >= 1``) as a whole, and with
    ``robust`` its left half with the first state of its right half, and the last state
    of its left half with its right half (``j >= 2``)."""
    size = 2
    while (n + 1) % size == 0:
        start, middle = n - size + 1, n - size // 2 + 1

        def turns(first, last):  # the states first .. last
            total = momenta[first : last + 1].sum(0)
            return bool(_identity_turning(momenta[first], momenta[last], total))

        if turns(start, n):
            return True
        if robust and size >= 4 and (turns(start, middle) or turns(middle - 1, n)):
            return True
        size *= 2
    return False


@pytest.mark.parametrize("robust", [True, False])
def test_the_iterative_checks_equal_a_brute_force_over_every_subtree_merge(x64, robust):
    """Momenta that rotate slowly (so that subtrees grow before they turn) plus noise:
    after each leaf, the checkpoints' verdict equals the brute force; without the checks
    across halves it also equals BlackJAX's (NumPyro's) iterative criterion."""
    new_state, update, turning = robust_nuts.robust_iterative_uturn(_identity_turning, robust)
    update, turning = jax.jit(update), jax.jit(turning)
    theirs = blackjax.mcmc.termination.iterative_uturn_numpyro(_identity_turning)
    theirs = (theirs[0], jax.jit(theirs[1]), jax.jit(theirs[2]))
    rng = np.random.default_rng(0)
    found = differ = 0
    for trial, omega in itertools.product(range(12), (0.05, 0.1, 0.2, 0.35)):
        t = np.arange(64)
        momenta = np.stack([np.cos(omega * t), np.sin(omega * t), np.zeros_like(t, float)], 1)
        momenta = jnp.asarray(momenta + 0.3 * rng.normal(size=momenta.shape))
        start = blackjax.mcmc.integrators.IntegratorState(momenta[0], momenta[0], None, None)
        state, their_state = new_state(start, 7), theirs[0](start, 7)
        for n in range(64):
            total = momenta[: n + 1].sum(0)
            state = update(state, total, momenta[n], n)
            verdict = bool(turning(state, total, momenta[n]))
            assert verdict == _brute_force(np.asarray(momenta), n, robust), (trial, omega, n)
            their_state = theirs[1](their_state, total, momenta[n], n)
            their_verdict = bool(theirs[2](their_state, total, momenta[n]))
            if not robust:
                assert verdict == their_verdict
            found += verdict
            differ += verdict != their_verdict
            if verdict:  # a doubling stops at its first U-turn
                break
    assert found > 20
    assert (differ > 0) == robust  # the extra checks do find U-turns BlackJAX's miss


def test_on_an_isotropic_gaussian_the_checks_remove_a_resonance(x64):
    """d = 100, unit metric, step 0.9: BlackJAX's criterion misses the U-turn and builds
    trees of 24.5 gradients on average; with the checks, 6.7 (thirty transitions from the
    same start and keys)."""
    d = 100

    def logdensity(x):
        return -0.5 * jnp.sum(x**2)

    steps = {}
    for robust in (True, False):
        kernel = jax.jit(robust_nuts.build_kernel(robust=robust), static_argnums=2)
        state = blackjax.nuts.init(jax.random.normal(jax.random.key(1), (d,)), logdensity)
        counts = []
        for i in range(30):
            state, info = kernel(jax.random.key(i), state, logdensity, 0.9, jnp.ones(d))
            counts.append(int(info.num_integration_steps))
        steps[robust] = np.mean(counts)
    assert steps[False] > 3 * steps[True], steps


def test_the_robust_kernel_samples_a_correlated_gaussian(x64):
    """Four chains of 2000 draws from a correlated 3-d Gaussian: every mean within 4.5
    Monte Carlo standard errors (ESS from ArviZ's estimator) and every variance within 15%."""
    import fisher_mala as fm

    cov = random_covariance(3, seed=5)
    mean = jnp.asarray([0.5, -1.0, 2.0])
    logdensity = gaussian_logdensity(mean, jnp.asarray(cov))
    kernel = robust_nuts.build_kernel()
    inverse_mass = jnp.asarray(np.diag(cov))

    def chain(key):
        state = blackjax.nuts.init(mean + 1.0, logdensity)

        def one(state, key):
            state, _ = kernel(key, state, logdensity, 0.5, inverse_mass)
            return state, state.position

        return jax.lax.scan(one, state, jax.random.split(key, 2000))[1]

    draws = np.asarray(jax.jit(jax.vmap(chain))(jax.random.split(jax.random.key(7), 4)))
    ess = fm.ess(draws, method="mean")
    mcse = np.sqrt(np.diag(cov) / ess)
    z = (draws.mean(axis=(0, 1)) - np.asarray(mean)) / mcse
    assert np.all(np.abs(z) < 4.5), z
    np.testing.assert_allclose(draws.reshape(-1, 3).var(0), np.diag(cov), rtol=0.15)
