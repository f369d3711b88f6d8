"""Fisher NUTS and Fisher HMC: exact equivalence with BlackJAX's dense-metric kernels,
invariance, the warm-up, and correctness by MCSE z-scores."""

import importlib
import types
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import gaussian_logdensity, random_covariance
from test_baselines import _invariance_z_scores, quartic_logdensity

import fisher_mala as fm
from fisher_mala.square_roots import LowRankSqrt

blackjax = pytest.importorskip("blackjax")
whitened_hmc = importlib.import_module("fisher_mala.whitened_hmc")
robust_nuts = importlib.import_module("fisher_mala.robust_nuts")


@pytest.mark.parametrize("algorithm", ["hmc", "nuts"])
def test_whitened_kernel_is_blackjax_with_inverse_mass_matrix_r_rt(x64, algorithm):
    """x = x_n + R u with unit metric *is* BlackJAX's kernel with M^{-1} = R R^T.

    BlackJAX draws p = L^{-T} z with L = chol(M^{-1}); with R = L our whitened momentum z
    maps to exactly that p, so the two chains agree draw for draw (float64 rounding).
    """
    d = 5
    cov = random_covariance(d, seed=4)
    logdensity = gaussian_logdensity(jnp.arange(d) * 0.1, jnp.asarray(cov))
    inverse_mass = jnp.asarray(random_covariance(d, seed=9, jitter=0.3))
    r = jnp.linalg.cholesky(inverse_mass)
    np.testing.assert_allclose(r @ r.T, inverse_mass, rtol=1e-10)
    if algorithm == "hmc":
        ours = fm.fisher_hmc(logdensity, 0.3, r, num_integration_steps=7)
        theirs = blackjax.hmc(logdensity, 0.3, inverse_mass, num_integration_steps=7)
    else:  # BlackJAX's criterion (the checks across subtrees: tests/test_robust_nuts.py)
        ours = fm.fisher_nuts(logdensity, 0.3, r, robust_uturn=False)
        theirs = blackjax.nuts(logdensity, 0.3, inverse_mass)
    s_ours, s_theirs = ours.init(jnp.ones(d)), theirs.init(jnp.ones(d))
    step_ours, step_theirs = jax.jit(ours.step), jax.jit(theirs.step)
    moves = 0
    for key in jax.random.split(jax.random.key(0), 30):
        s_ours, info = step_ours(key, s_ours)
        s_theirs, info_theirs = step_theirs(key, s_theirs)
        np.testing.assert_allclose(s_ours.position, s_theirs.position, rtol=1e-8, atol=1e-10)
        assert int(info.num_integration_steps) == int(info_theirs.num_integration_steps)
        moves += int(info.is_accepted)
    assert moves > 20


@pytest.mark.parametrize("algorithm", ["hmc", "nuts"])
def test_diagonal_kernel_is_blackjax_with_a_diagonal_inverse_mass_matrix(x64, algorithm):
    """A DiagonalSqrt(scale) is the 1-D inverse_mass_matrix = scale**2 (BlackJAX's HMC, and
    NUTS with the checks across subtrees), draw for draw."""
    d = 6
    logdensity = gaussian_logdensity(jnp.zeros(d), jnp.asarray(random_covariance(d, seed=3)))
    scale = jnp.linspace(0.4, 1.6, d)
    diagonal = fm.DiagonalSqrt(scale)
    if algorithm == "hmc":
        ours = fm.fisher_hmc(logdensity, 0.3, diagonal, num_integration_steps=5)
        theirs = blackjax.hmc(logdensity, 0.3, scale**2, num_integration_steps=5)
    else:  # the robust kernel's checks take the metric's criterion, so: ours in x
        ours = fm.fisher_nuts(logdensity, 0.3, diagonal)
        theirs = blackjax.base.build_sampling_algorithm(
            robust_nuts.build_kernel(), blackjax.nuts.init, logdensity,
            kernel_args=(0.3, blackjax.mcmc.metrics.default_metric(scale**2), 10),
        )  # fmt: skip
    s_ours, s_theirs = ours.init(jnp.ones(d)), theirs.init(jnp.ones(d))
    np.testing.assert_allclose(s_ours.whitened_grad, s_theirs.logdensity_grad * scale)
    moves = 0
    for key in jax.random.split(jax.random.key(2), 30):
        s_ours, info = jax.jit(ours.step)(key, s_ours)
        s_theirs, info_theirs = jax.jit(theirs.step)(key, s_theirs)
        np.testing.assert_allclose(s_ours.position, s_theirs.position, rtol=1e-8, atol=1e-10)
        assert int(info.num_integration_steps) == int(info_theirs.num_integration_steps)
        moves += int(info.is_accepted)
    assert moves > 20
    with pytest.raises(ValueError, match=r"DiagonalSqrt.scale. must have shape \(6,\)"):
        ours = fm.fisher_nuts(logdensity, 0.3, fm.DiagonalSqrt(jnp.ones(5))).init(jnp.ones(d))
    with pytest.raises(ValueError, match="NaN or inf"):
        fm.fisher_nuts(logdensity, 0.3, fm.DiagonalSqrt(scale.at[0].set(jnp.nan))).init(jnp.ones(d))


def _low_rank_root(d, k, seed, orthonormal=True):
    rng = np.random.default_rng(seed)
    basis = rng.normal(size=(d, k))
    if orthonormal:
        basis = np.linalg.qr(basis)[0]
    return LowRankSqrt(
        jnp.asarray(np.exp(0.5 * rng.normal(size=d))),
        jnp.asarray(basis * (1.0 if orthonormal else 0.4)),
        jnp.asarray(rng.uniform(-0.6, 2.0, size=k)),
    )


@pytest.mark.parametrize("orthonormal", [True, False])
def test_unexpanded_products_equal_dense_products(x64, orthonormal):
    """The fused leapfrog step's unexpanded vectors ``vec + Q coef``: the whitened gradient
    from one reduction over ``Q`` is ``R^T g``, the drift's ``R p`` from the unexpanded
    momentum is the dense product, and their dot products equal the expanded vectors', for
    any ``Q`` (the Gram matrix ``Q^T Q`` enters as computed)."""
    from fisher_mala.square_roots import dense

    d, k = 40, 5
    root = _low_rank_root(d, k, seed=1, orthonormal=orthonormal)
    rng = np.random.default_rng(2)
    grad, p = (jnp.asarray(rng.normal(size=d)) for _ in range(2))
    target = whitened_hmc._low_rank_target(None, None, root)
    r = np.asarray(dense(root))
    whitened = whitened_hmc._whitened_gradient(target, grad)
    expanded = whitened_hmc._expanded(target, whitened)
    np.testing.assert_allclose(expanded, r.T @ np.asarray(grad), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(whitened.proj, np.asarray(root.basis).T @ whitened.vec, rtol=1e-12)
    # a momentum after a kick: the drawn p plus a multiple of R^T g, still unexpanded
    momentum = jax.tree.map(lambda a, b: a + 0.3 * b, whitened_hmc._unexpanded(target, p), whitened)
    p_full = np.asarray(p) + 0.3 * np.asarray(expanded)
    np.testing.assert_allclose(whitened_hmc._expanded(target, momentum), p_full, rtol=1e-12)
    drift = whitened_hmc._colored(target, momentum)
    np.testing.assert_allclose(drift, r @ p_full, rtol=1e-12, atol=1e-12)
    dot = whitened_hmc._dot(target, momentum, whitened)
    np.testing.assert_allclose(dot, p_full @ np.asarray(expanded), rtol=1e-12)


@pytest.mark.parametrize(
    "algorithm, robust, matched",
    [("nuts", True, True), ("nuts", False, True), ("hmc", False, True), ("nuts", True, False)],
)
def test_fused_low_rank_kernel_is_the_whitened_kernel_to_rounding(x64, algorithm, robust, matched):
    """With a LowRankSqrt the default kernel carries ``R p`` and ``R R^T g`` through the
    leapfrog steps instead of multiplying by ``R`` twice per step: the same transitions as
    the whitened kernel (BlackJAX's velocity Verlet given explicitly, which takes the
    products), the same momenta, to float64 rounding, whether ``R R^T`` fits the target
    (``matched``) or not."""
    from fisher_mala.square_roots import dense

    d = 30
    root = _low_rank_root(d, 4, seed=3)
    r = dense(root)
    covariance = r @ r.T if matched else jnp.asarray(random_covariance(d, seed=5))
    logdensity = gaussian_logdensity(jnp.zeros(d), covariance)
    verlet = blackjax.mcmc.integrators.velocity_verlet
    options = {"robust_uturn": robust} if algorithm == "nuts" else {}
    fused = whitened_hmc.build_kernel(algorithm, **options)
    plain = whitened_hmc.build_kernel(algorithm, integrator=verlet, **options)
    step = 0.3 if matched else 0.1

    def run(kernel):
        def body(state, key):
            state, info = kernel(key, state, logdensity, step)
            return state, (state.position, info.num_integration_steps, info.is_accepted)

        start = whitened_hmc.init(jnp.ones(d) * 0.3, logdensity, root)
        keys = jax.random.split(jax.random.key(7), 25)
        return jax.jit(lambda s: jax.lax.scan(body, s, keys))(start)

    (state_f, (x_f, steps_f, moved_f)), (state_p, (x_p, steps_p, moved_p)) = run(fused), run(plain)
    np.testing.assert_allclose(x_f, x_p, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(state_f.whitened_grad, state_p.whitened_grad, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(steps_f, steps_p)
    np.testing.assert_array_equal(moved_f, moved_p)
    assert int(moved_f.sum()) > 15


def _state(sqrt_precond, count):
    return types.SimpleNamespace(
        sqrt_precond=sqrt_precond,
        count=np.asarray(count),
        whitened_grad=np.zeros(sqrt_precond.shape[:-1]),
        logdensity=np.zeros(sqrt_precond.shape[:-2]),  # one chain: never regrouped
    )


def test_stopping_rule_tells_a_settled_r_from_one_still_learning():
    """With independent Fisher signals of N(0, S^{-1}): an earlier R that already estimates
    S passes the rule after one block; the identity does not."""
    rng = np.random.default_rng(5)
    d, n_prev, block = 20, 3000, 1000
    sd = np.geomspace(0.2, 5.0, d)
    rule = fm.whitened_warmup.FisherHMCWarmup(lambda x: -jnp.sum(x**2), metric="dense")

    def look(r_prev):
        new = rng.normal(size=(block, d)) / sd  # scores of N(0, diag(sd^2))
        f_now = np.linalg.inv(r_prev @ r_prev.T) + new.T @ new
        r_now = np.linalg.cholesky(np.linalg.inv(f_now))
        return rule.learned(_state(r_prev, n_prev), _state(r_now, n_prev + block))

    settled = np.diag(sd) / np.sqrt(n_prev)  # F_prev = n_prev S^{-1}
    assert look(settled)
    assert not look(np.eye(d) / np.sqrt(n_prev))
    # a block of 1000 signals says nothing about d > 250: the phase then runs in one piece
    assert rule._rule_can_stop(_state(settled, n_prev))
    assert not rule._rule_can_stop(_state(np.eye(300), n_prev))
    assert not fm.whitened_warmup.FisherHMCWarmup(
        lambda x: -jnp.sum(x**2), metric="dense", stopping_rule=False
    ).learned(_state(settled, n_prev), _state(settled, n_prev + block))


def test_stopping_rule_leaves_out_a_chain_far_behind():
    """Three chains whose R has settled and one stuck far below them in log density (an
    ARMA chain thrown where its recursion explodes, log density -1e30): the rule looks
    at the three, and the stuck one is regrouped after the Fisher phase; were that chain
    not behind, its unsettled R would keep the phase going."""
    rng = np.random.default_rng(6)
    d, n_prev, block = 6, 3000, 1000
    sd = np.geomspace(0.5, 2.0, d)
    rule = fm.whitened_warmup.FisherHMCWarmup(lambda x: -jnp.sum(x**2), metric="dense")
    settled = np.diag(sd) / np.sqrt(n_prev)
    r_prev = np.stack([settled] * 3 + [np.eye(d) / np.sqrt(n_prev)])
    r_now = []
    for r in r_prev:
        new = rng.normal(size=(block, d)) / sd  # scores of N(0, diag(sd^2))
        r_now.append(np.linalg.cholesky(np.linalg.inv(np.linalg.inv(r @ r.T) + new.T @ new)))
    counts = np.full(4, n_prev)

    def look(logdensities):
        before = _state(r_prev, counts)
        after = _state(np.stack(r_now), counts + block)
        before.logdensity = after.logdensity = np.asarray(logdensities)
        return rule.learned(before, after)

    assert look([-10.0, -11.0, -9.0, -1e30])
    assert not look([-10.0, -11.0, -9.0, -12.0])


def _stand_in_stages(warm, num_fisher, dim, tuned, divergent_share=0.0):
    """``call`` for :meth:`staged_run` with stand-in stages: the Fisher phase's parts
    return identity ``R``s and empty infos; the step-size stage records its extra
    arguments in ``tuned`` and returns the Fisher phase's output; the probe after a
    plateau records ``"probe"`` and finds its one chain moving; the divergence probe after
    a phase that never settled records ``"divergences"`` and finds ``divergent_share``, and
    the second step-size phase records ``"retune"``."""

    def info(n):
        zeros = np.zeros(n)
        return fm.schedule.WarmupInfo(
            zeros, zeros > 0, zeros == 0, initial_step_size=0.1, num_grad_evals=n, trace=None
        )

    def call(method, argument, *extra):
        if method == "fisher_stage":
            first = warm.first_fisher_iterations(num_fisher, dim)
            return (_state(np.eye(dim), first), None), info(first)
        if method == "fisher_resume":
            (num_more,) = extra
            return (_state(np.eye(dim), argument[0].count + num_more), None), info(num_more)
        if method == "probe_stage":  # after a plateau: one chain, moving
            tuned.append("probe")
            return np.float64(1.0), 0
        if method == "divergence_probe_stage":  # after a phase that never settled
            tuned.append("divergences")
            return np.float64(divergent_share), 0
        if method == "retune_stage":
            tuned.append("retune")
            return argument
        tuned.append(extra)  # tuning_stage: (metric, settled, plateau)
        return argument

    return call


@pytest.mark.parametrize("dim,looks", [(10, 4), (300, 0)])
def test_staged_run_looks_after_each_block_only_where_the_rule_can_stop(dim, looks):
    """The stage driver, with stand-in stages: one look per block for small d; none (no
    O(d^3) solve on the host) where a block holds fewer than 4d signals."""
    warm = fm.whitened_warmup.FisherHMCWarmup(lambda x: -jnp.sum(x**2), metric="dense")
    num_steps = 5000
    num_fisher, _ = warm.split(num_steps)  # 4500: 875 (scout, restart windows) + 4 blocks
    seen = []

    def on_host(fn, *args):
        seen.append(fn.__name__)
        return "" if fn.__name__ == "look" else fn(*args)

    call = _stand_in_stages(warm, num_fisher, dim, [])
    out = warm.staged_run(call, None, num_steps, on_host)
    assert out[1].acceptance_rate.shape == (num_fisher,)  # the whole phase, never stopped
    assert seen.count("look") == looks


@pytest.mark.parametrize(
    "verdicts,given,stops_after,plateau,target",
    [
        (["", "settled"], None, 2, False, 0.7),  # settled: the default target
        (["", "plateau"], None, 2, True, 0.9),  # a plateau stops the phase
        ([""] * 4, None, 4, False, 0.7),  # still learning at the end: the default
        (["", "plateau"], 0.65, 2, True, 0.65),  # a target given is used either way
    ],
)
def test_a_phase_ended_on_a_plateau_tunes_towards_the_plateau_target(
    verdicts, given, stops_after, plateau, target
):
    warm = fm.whitened_warmup.FisherHMCWarmup(
        lambda x: -jnp.sum(x**2), metric="dense", hmc_target_acceptance_rate=given
    )
    num_steps, dim = 5000, 10
    num_fisher, _ = warm.split(num_steps)
    tuned, answers = [], iter(verdicts)

    def on_host(fn, *args):
        return next(answers) if fn.__name__ == "look" else fn(*args)

    out = warm.staged_run(call=_stand_in_stages(warm, num_fisher, dim, tuned), positions=None,
                          num_steps=num_steps, on_host=on_host)  # fmt: skip
    lead = warm.first_fisher_iterations(num_fisher, dim)
    done = min(lead + stops_after * warm.fisher.block, num_fisher)
    assert out[1].acceptance_rate.shape == (done,)
    # the probe after a plateau; the divergence probe after a phase that never settled
    unsettled = not plateau and verdicts[-1] == ""
    assert tuned == [("dense", True, plateau)] + ["probe"] * plateau + ["divergences"] * unsettled
    assert warm.used_target_acceptance == target
    # robust_uturn="auto": BlackJAX's U-turn criterion after a plateau (in the step-size
    # phase, and for the draws through the sampling options), the checks otherwise
    assert warm.sampling_options == {"robust_uturn": not plateau}
    assert warm.tuning_for(plateau).kernel is not warm.tuning_for(not plateau).kernel


@pytest.mark.parametrize("share,retuned", [(0.0, False), (0.015, False), (0.02, True)])
def test_divergences_after_a_phase_that_never_settled_retune_the_step(share, retuned):
    """After a Fisher phase the stopping rule looked at and never found settled, NUTS's
    chains share their mean shape of ``R`` and the divergence probe runs; a divergent share
    at or above ``RETUNE_DIVERGENT_SHARE`` runs a second step-size phase and records the
    plateau's target as the one used."""
    from fisher_mala.whitened_warmup_looks import RETUNE_DIVERGENT_SHARE

    assert RETUNE_DIVERGENT_SHARE == 0.02
    warm = fm.whitened_warmup.FisherHMCWarmup(lambda x: -jnp.sum(x**2), metric="dense")
    num_steps, dim, tuned, shared = 5000, 10, [], []

    def on_host(fn, *args):
        if fn.__name__ == "share_after":
            shared.append(args[1])
        return "" if fn.__name__ == "look" else fn(*args)

    num_fisher, _ = warm.split(num_steps)
    call = _stand_in_stages(warm, num_fisher, dim, tuned, divergent_share=share)
    warm.staged_run(call, None, num_steps, on_host)
    assert shared == [True]
    assert tuned == [("dense", True, False), "divergences"] + ["retune"] * retuned
    target = fm.whitened_warmup.PLATEAU_TARGET_ACCEPTANCE if retuned else 0.7
    assert warm.used_target_acceptance == target
    assert warm.sampling_options == {"robust_uturn": True}  # the draws keep the checks


def test_retune_tunes_the_step_towards_its_target_and_counts_the_gradients(x64):
    """``retune`` from a step far too large for a whitened N(0, I_20): dual averaging
    towards 0.9 shrinks it to where 100 transitions accept at least 0.8 on average, its
    leapfrog steps added to the gradient count; ``R`` and the position's shape are kept."""
    from fisher_mala.adaptations.dual_averaging import dual_averaging
    from fisher_mala.whitened_warmup_looks import retune

    dim = 20
    warm = fm.whitened_warmup.FisherHMCWarmup(
        gaussian_logdensity(np.zeros(dim), np.eye(dim)), metric="dense"
    )
    tuning = warm.tuning._replace(dual_averaging=dual_averaging(0.9))
    state = fm.whitened_hmc.init(jnp.zeros(dim), tuning.logdensity_fn, jnp.eye(dim))
    params = fm.schedule.WarmupParameters(jnp.asarray(3.0), jnp.eye(dim))
    zeros = jnp.zeros(5)
    info = fm.schedule.WarmupInfo(zeros, zeros > 0, zeros == 0, 0.1, jnp.asarray(5), None)
    (new_state, new_params), new_info = retune(tuning, jax.random.key(0), ((state, params), info))
    assert 0.1 < float(new_params.step_size) < 1.5
    assert int(new_info.num_grad_evals) >= 5 + 200  # one leapfrog step at least per iteration
    np.testing.assert_array_equal(new_state.sqrt_precond, np.eye(dim))
    acceptance = []
    for key in jax.random.split(jax.random.key(1), 100):
        new_state, step_info = tuning.kernel(
            key, new_state, tuning.logdensity_fn, new_params.step_size,
            tuning.num_integration_steps, tuning.max_num_doublings,
        )  # fmt: skip
        acceptance.append(float(step_info.acceptance_rate))
    assert np.mean(acceptance) > 0.8


def test_a_retuned_run_is_the_same_through_checkpointed_parts(monkeypatch, tmp_path):
    """Through ``fm.sample``, with the stopping rule's verdict held at "still learning"
    (the Fisher phase runs its length) and every divergent share calling for the second
    step-size phase: the run reports the plateau's target, costs more gradients than with
    the second phase off, and its checkpointed parts give the same draws, bit for bit."""
    from fisher_mala import whitened_warmup_looks

    monkeypatch.setattr(
        fm.whitened_warmup.FisherHMCWarmup, "look", lambda self, previous, state: ""
    )
    target = fm.targets.gaussian("scaled4", np.zeros(4), np.diag([0.1, 1.0, 3.0, 10.0]))
    x0 = target.initial_positions(jax.random.key(0), 2)

    def run(**options):
        return fm.sample(jax.random.key(1), "fisher_nuts", target.logdensity_fn, x0,
                         num_warmup=1500, num_samples=100, diagnose=False,
                         **options)  # fmt: skip

    monkeypatch.setattr(whitened_warmup_looks, "RETUNE_DIVERGENT_SHARE", 0.0)
    retuned = run()
    assert retuned.target_acceptance == fm.whitened_warmup.PLATEAU_TARGET_ACCEPTANCE
    parts = run(checkpoint=tmp_path / "run", checkpoint_every=400)
    np.testing.assert_array_equal(np.asarray(parts.samples), np.asarray(retuned.samples))
    monkeypatch.setattr(whitened_warmup_looks, "RETUNE_DIVERGENT_SHARE", 2.0)  # never
    probed = run()
    assert probed.target_acceptance == 0.7
    extra = np.asarray(retuned.num_grad_evals) - np.asarray(probed.num_grad_evals)
    assert np.all(extra >= whitened_warmup_looks.RETUNE_STEPS), extra


@pytest.mark.parametrize("algorithm,verdicts,share", [
    ("nuts", [""] * 4, True),  # never settled: NUTS's chains share the shape
    ("hmc", [""] * 4, False),  # not HMC's: a fixed length suits each chain's own R
    ("nuts", ["", "settled"], False),
    ("hmc", ["", "plateau"], True),  # after a plateau, both
])  # fmt: skip
def test_chains_share_their_shape_after_a_plateau_or_for_nuts_a_phase_never_settled(
    algorithm, verdicts, share
):
    warm = fm.whitened_warmup.FisherHMCWarmup(lambda x: -jnp.sum(x**2), algorithm, metric="dense")
    num_steps, dim, shared, answers = 5000, 10, [], iter(verdicts)

    def on_host(fn, *args):
        if fn.__name__ == "share_after":
            shared.append(args[1])
        return next(answers) if fn.__name__ == "look" else fn(*args)

    num_fisher, _ = warm.split(num_steps)
    warm.staged_run(_stand_in_stages(warm, num_fisher, dim, []), None, num_steps, on_host)
    assert shared == [share]


@pytest.mark.parametrize("given", [True, False])
def test_a_robust_uturn_given_holds_after_a_plateau(given):
    warm = fm.whitened_warmup.FisherHMCWarmup(
        lambda x: -jnp.sum(x**2), metric="dense", robust_uturn=given
    )
    assert warm.robust_for(True) is given and warm.robust_for(False) is given
    warm.chose_after(True)
    assert warm.sampling_options == {"robust_uturn": given}


def _after_a_stand_in_plateau(monkeypatch, chains: int, num_samples: int):
    """``run(**options)``: ``fm.sample``'s Fisher NUTS on a scaled 4-d Gaussian, with the
    stopping rule's verdict replaced by ``"plateau"`` at its first look."""
    monkeypatch.setattr(
        fm.whitened_warmup.FisherHMCWarmup, "look", lambda self, previous, state: "plateau"
    )
    target = fm.targets.gaussian("scaled4", np.zeros(4), np.diag([0.1, 1.0, 3.0, 10.0]))
    x0 = target.initial_positions(jax.random.key(0), chains)

    def run(**options):
        return fm.sample(jax.random.key(1), "fisher_nuts", target.logdensity_fn, x0,
                         num_warmup=1500, num_samples=num_samples, diagnose=False,
                         **options)  # fmt: skip

    return run


def test_after_a_plateau_fisher_nuts_draws_with_blackjax_uturn_criterion(monkeypatch):
    """fm.sample's draws after a Fisher phase the stopping rule ended on a plateau (a
    stand-in verdict here) are those of ``robust_uturn=False``, bit for bit: the step-size
    phase and the draws both use BlackJAX's criterion."""
    run = _after_a_stand_in_plateau(monkeypatch, chains=2, num_samples=200)
    auto, blackjax = run(), run(robust_uturn=False)
    assert auto.target_acceptance == fm.whitened_warmup.PLATEAU_TARGET_ACCEPTANCE
    np.testing.assert_array_equal(np.asarray(auto.samples), np.asarray(blackjax.samples))


def test_after_a_plateau_fm_sample_probes_every_chain_and_drops_its_draws(monkeypatch):
    """Through ``fm.sample`` (the staged warm-up, per chain): after a plateau (a stand-in
    verdict) the probe runs and its leapfrog steps are counted, at least one per transition
    and chain; no chain is stuck on a Gaussian, and with the probe's draws dropped the
    draws are those of ``regroup=False``, which skips it, bit for bit."""
    from fisher_mala.whitened_warmup_looks import PROBE_TRANSITIONS

    run = _after_a_stand_in_plateau(monkeypatch, chains=3, num_samples=100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", fm.SamplingWarning)
        probed = run()
    assert not [w for w in caught if "stuck" in str(w.message)]  # silent on a healthy run
    skipped = run(regroup=False)
    np.testing.assert_array_equal(np.asarray(probed.samples), np.asarray(skipped.samples))
    extra = np.asarray(probed.num_grad_evals) - np.asarray(skipped.num_grad_evals)
    assert np.all(extra >= PROBE_TRANSITIONS), extra


def test_after_a_plateau_every_chain_takes_the_chains_mean_shape_and_keeps_its_trace(x64):
    """``shared_shape``: ``A_c' = (tr A_c / d) mean_k A_k / (tr A_k / d)`` against dense
    linear algebra, ``R_c'`` its lower Cholesky factor, ``R_c'^T g_c`` the whitened
    gradient; one chain or a diagonal ``R`` unchanged."""
    from fisher_mala.fisher import FisherMALAState
    from fisher_mala.whitened_warmup_looks import shared_shape

    rng = np.random.default_rng(4)
    chains, d = 3, 4
    scales = rng.uniform(0.2, 5.0, (chains, 1, 1))  # traces far apart
    r = np.tril(rng.normal(size=(chains, d, d))) + 3.0 * np.eye(d) * scales
    g = rng.normal(size=(chains, d))
    zeros = jnp.zeros((chains, d))
    state = FisherMALAState(zeros, jnp.zeros(chains), jnp.asarray(g), jnp.asarray(r),
                            jnp.ones(chains), jnp.ones(chains), zeros, zeros,
                            jnp.zeros(chains, jnp.int32))  # fmt: skip
    (shared, params), info = shared_shape(((state, "params"), "info"))
    assert (params, info) == ("params", "info")
    a = r @ np.swapaxes(r, 1, 2)
    traces = np.trace(a, axis1=1, axis2=2)
    mean = np.mean(a / traces[:, None, None], axis=0)
    new = np.asarray(shared.sqrt_precond)
    for c in range(chains):
        np.testing.assert_allclose(new[c] @ new[c].T, traces[c] * mean, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(new[c], np.tril(new[c]))
        np.testing.assert_allclose(shared.whitened_grad[c], new[c].T @ g[c], rtol=1e-12)
    one = state._replace(sqrt_precond=state.sqrt_precond[:1])
    assert shared_shape(((one, None), None))[0][0] is one
    diagonal = state._replace(sqrt_precond=fm.square_roots.DiagonalSqrt(jnp.ones((chains, d))))
    assert shared_shape(((diagonal, None), None))[0][0] is diagonal


def test_after_a_plateau_a_chain_whose_step_is_far_from_the_others_restarts_from_one(x64):
    """``regroup_steps``: effective steps ``epsilon_c sqrt(tr(R_c R_c^T) / d)`` against
    dense linear algebra; a chain more than ``STEP_OUTLIER_FACTOR`` from their median (too
    small or too large) takes the whole state and parameters of the chain nearest the
    median, with a warning naming it; within the factor, with two chains, a diagonal
    ``R`` or ``regroup=False``: unchanged."""
    from fisher_mala.leapfrog_tuning import WarmupParameters
    from fisher_mala.whitened_warmup_looks import (
        STEP_OUTLIER_FACTOR,
        effective_steps,
        regroup_steps,
    )

    rng = np.random.default_rng(5)
    chains, d = 5, 3
    r = np.tril(rng.normal(size=(chains, d, d))) + 2.0 * np.eye(d)
    rms = np.sqrt(np.trace(r @ np.swapaxes(r, 1, 2), axis1=1, axis2=2) / d)
    factor = STEP_OUTLIER_FACTOR
    wanted = np.array([1.0, 1.1, 0.9 / factor - 0.05, 0.95, 1.05 * factor])
    steps = wanted / rms  # effective steps: the median 1.0 (chain 0), chains 2 and 4 outside
    params = WarmupParameters(jnp.asarray(steps), jnp.asarray(r))
    np.testing.assert_allclose(effective_steps(params), wanted, rtol=1e-12)
    state = {"position": jnp.arange(chains * d, dtype=float).reshape(chains, d)}
    with pytest.warns(fm.SamplingWarning, match=r"chain\(s\) \[2, 4\].*chain 0's state"):
        (new_state, new_params), info = regroup_steps(((state, params), "info"))
    assert info == "info"
    index = np.array([0, 1, 0, 3, 0])
    np.testing.assert_array_equal(new_state["position"], np.asarray(state["position"])[index])
    np.testing.assert_array_equal(new_params.step_size, steps[index])
    np.testing.assert_array_equal(new_params.sqrt_precond, r[index])
    inside = WarmupParameters(jnp.asarray(np.array([1.0, 1.9, 0.6, 1.0, 1.2]) / rms), r)
    assert regroup_steps(((state, inside), None))[0][1] is inside
    two = WarmupParameters(params.step_size[:2], params.sqrt_precond[:2])
    assert effective_steps(two) is None
    diagonal_root = fm.square_roots.DiagonalSqrt(jnp.ones((chains, d)))
    diagonal = WarmupParameters(params.step_size, diagonal_root)
    assert regroup_steps(((state, diagonal), None))[0][1] is diagonal

    def logdensity(x):
        return -0.5 * jnp.sum(x**2)

    out = ((state, params), None)
    warmup = fm.whitened_warmup.FisherHMCWarmup(logdensity, regroup=False)
    assert warmup.regroup_after(out, plateau=True) is out
    assert fm.whitened_warmup.FisherHMCWarmup(logdensity).regroup_after(out, False) is out


def test_after_a_plateau_a_chain_stuck_at_its_tuned_step_restarts_from_a_moving_one(x64):
    """``restart_stuck``: the probe's leapfrog steps are added to every chain's gradient
    count; a chain whose probe accepted less than ``STUCK_ACCEPTANCE`` (NaN too) takes the
    state and parameters of the moving chain whose effective step is nearest the moving
    chains' median (the most accepting one where effective steps are not defined), with a
    warning; nothing stuck, everything stuck, or one chain: only the count changes."""
    from fisher_mala.leapfrog_tuning import WarmupParameters
    from fisher_mala.schedule import WarmupInfo
    from fisher_mala.whitened_warmup_looks import STUCK_ACCEPTANCE, restart_stuck

    chains, d = 5, 2
    r = np.broadcast_to(np.eye(d), (chains, d, d))
    steps = np.array([1.0, 4.0, 1.2, 2.0, 0.3])  # moving chains 0, 2, 3: median 1.2
    params = WarmupParameters(jnp.asarray(steps), jnp.asarray(r))
    state = {"position": jnp.arange(chains * d, dtype=float).reshape(chains, d)}
    info = WarmupInfo(*[None] * 4, num_grad_evals=np.full(chains, 100), trace=None)
    low = STUCK_ACCEPTANCE - 0.01
    acceptance = np.array([0.9, low, 0.85, 0.8, np.nan])
    probe = (acceptance, np.array([10, 20, 30, 40, 50]))
    with pytest.warns(fm.SamplingWarning, match=r"chain\(s\) \[1, 4\] were stuck.*chain 2's"):
        (new_state, new_params), new_info = restart_stuck(((state, params), info), probe)
    index = np.array([0, 2, 2, 3, 2])
    np.testing.assert_array_equal(new_state["position"], np.asarray(state["position"])[index])
    np.testing.assert_array_equal(new_params.step_size, steps[index])
    np.testing.assert_array_equal(new_info.num_grad_evals, [110, 120, 130, 140, 150])
    diagonal = WarmupParameters(params.step_size, fm.square_roots.DiagonalSqrt(jnp.ones((5, d))))
    with pytest.warns(fm.SamplingWarning, match=r"\[1, 4\].*chain 0's"):  # most accepting
        restart_stuck(((state, diagonal), info), probe)
    for rates in ([0.9, 0.8, 0.85, 0.8, 0.9], [low] * chains):
        (same_state, same_params), counted = restart_stuck(
            ((state, params), info), (np.array(rates), np.ones(chains, int))
        )
        assert same_state is state and same_params is params
        np.testing.assert_array_equal(counted.num_grad_evals, np.full(chains, 101))
    one = restart_stuck(((state, params), info), (np.float64(0.0), np.int64(7)))
    assert one[0][0] is state


def test_stopping_rule_ends_the_fisher_phase_early_and_samples_correctly():
    d = 10
    c = random_covariance(d, seed=11, jitter=0.5)
    target = fm.targets.gaussian("corr10", np.zeros(d), c)
    x0 = target.initial_positions(jax.random.key(0), 4)
    result = fm.sample(
        jax.random.key(1),
        "fisher_nuts",
        target.logdensity_fn,
        x0,
        num_warmup=10000,
        num_samples=1000,
        metric="dense",
    )
    warm = fm.whitened_warmup.FisherHMCWarmup(target.logdensity_fn, metric="dense")
    num_fisher, _ = warm.split(10000)
    # ended by the rule after a whole number of blocks, the step-size phase shrunk with it
    stops = [
        n
        for n in range(warm.fisher.num_lead_steps, num_fisher, warm.fisher.block)
        if n + warm.tuning_steps(10000, n) == result.warmup_info.acceptance_rate.shape[-1]
    ]
    assert stops, result.warmup_info.acceptance_rate.shape
    z = _z_scores(result.samples, np.zeros(d), np.sqrt(np.diag(c)))
    assert np.all(np.abs(z) < 4.5), z


@pytest.mark.parametrize("pooled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_auto_metric_is_diagonal_exactly_when_the_posterior_is_independent(pooled):
    """An independent Gaussian gets a DiagonalSqrt (and correct moments), chosen at the first
    look, which ends the Fisher phase; a correlated one keeps R (the test below)."""
    d = 20
    sd = np.geomspace(0.1, 10.0, d)
    independent = fm.targets.gaussian("diag20", np.zeros(d), np.diag(sd**2))
    x0 = independent.initial_positions(jax.random.key(0), 4)
    result = fm.sample(
        jax.random.key(1),
        "fisher_nuts",
        independent.logdensity_fn,
        x0,
        num_warmup=3000,
        num_samples=1000,
        pooled=pooled,
    )
    assert isinstance(result.parameters.sqrt_precond, fm.DiagonalSqrt)
    # the diagonal was chosen early, which ended the Fisher phase there: after the first
    # block where the stopping rule looks or at the first look at the metric; pooled (one
    # rank-4 update per iteration, no restart windows), after a whole block where the rule
    # looks, before the phase's end (the second here: 2500 of 2700 iterations)
    warm = fm.whitened_warmup.FisherHMCWarmup(independent.logdensity_fn, pooled=pooled)
    num_fisher, num_tune = warm.split(3000)
    first = warm.first_fisher_iterations(num_fisher, d, 4 if pooled else 1)
    ended = first + (warm.fisher.block if first == warm.fisher.num_lead_steps else 0)
    if pooled:
        length = result.warmup_info.acceptance_rate.shape[-1]
        ends = range(ended, num_fisher, warm.fisher.block)
        ended = next((n for n in ends if n + warm.tuning_steps(3000, n) == length), num_fisher)
    assert ended < num_fisher
    assert num_tune > warm.tuning_steps(3000, ended)  # shrunk with the Fisher phase
    assert result.warmup_info.acceptance_rate.shape[-1] == ended + warm.tuning_steps(3000, ended)
    learned = np.asarray(result.parameters.sqrt_precond.scale).reshape(-1, d)
    assert np.all(np.abs(learned / sd - 1) < 0.3), learned / sd
    z = _z_scores(result.samples, np.zeros(d), sd)
    assert np.all(np.abs(z) < 4.5), z
    # a correlated posterior stays dense: test_auto_metric_on_a_correlated_posterior_...


@pytest.mark.slow  # 35-48 s; the split Fisher phase is the same chain: test_sampling's
# test_a_warmup_stopped_and_resumed_is_the_same_chain, in CI
@pytest.mark.parametrize("pooled", [False, True])
def test_auto_metric_on_a_correlated_posterior_is_the_dense_chain(pooled):
    """The look at the metric part-way through the Fisher phase changes nothing when R stays
    dense: the phase run in two parts is the same chain as in one (``metric="dense"``)."""
    d = 20
    target = fm.targets.gaussian("corr20", np.zeros(d), random_covariance(d, seed=11, jitter=0.5))
    x0 = target.initial_positions(jax.random.key(0), 4)
    warm = fm.whitened_warmup.FisherHMCWarmup(target.logdensity_fn, pooled=pooled)
    num_fisher, _ = warm.split(2000)
    assert warm.first_fisher_iterations(num_fisher, d, 4 if pooled else 1) < num_fisher
    auto, dense = (
        fm.sample(
            jax.random.key(1),
            "fisher_nuts",
            target.logdensity_fn,
            x0,
            num_warmup=2000,
            num_samples=200,
            pooled=pooled,
            metric=metric,
            stopping_rule=False,
            diagnose=False,
        )
        for metric in ("auto", "dense")
    )
    assert not isinstance(auto.parameters.sqrt_precond, fm.DiagonalSqrt)
    chex.assert_trees_all_equal(auto.samples, dense.samples)
    chex.assert_trees_all_equal(auto.warmup_info, dense.warmup_info)
    np.testing.assert_array_equal(auto.num_grad_evals, dense.num_grad_evals)


def test_auto_metric_needs_concrete_values_under_jit():
    warm = fm.whitened_warmup.FisherHMCWarmup(lambda x: -jnp.sum(x**2))
    with pytest.raises(ValueError, match="under jit pass metric="):
        jax.jit(lambda x: warm.run(jax.random.key(0), x, 100)[0][0].position)(jnp.ones(3))
    with pytest.raises(ValueError, match="under jit pass stopping_rule=False"):
        jax.jit(
            lambda x: (
                fm.whitened_warmup.FisherHMCWarmup(lambda x: -jnp.sum(x**2), metric="dense")
                .run(jax.random.key(0), x, 2000)[0][0]
                .position
            )
        )(jnp.ones(3))
    dense = fm.whitened_warmup.FisherHMCWarmup(
        lambda x: -jnp.sum(x**2), metric="dense", stopping_rule=False
    )
    out = jax.jit(lambda x: dense.run(jax.random.key(0), x, 100)[0][0].position)(jnp.ones(3))
    assert np.all(np.isfinite(np.asarray(out)))


@pytest.mark.parametrize("algorithm", ["nuts", "hmc"])
def test_frozen_whitened_kernels_leave_a_non_gaussian_target_invariant(algorithm):
    r = jnp.asarray([[0.8, 0.0], [0.3, 0.4]])
    alg = whitened_hmc.as_top_level_api(quartic_logdensity, 0.5, r, algorithm)
    z, rate = _invariance_z_scores(alg.init, alg.step)
    assert 0.5 < rate <= 1.0, rate
    assert np.all(np.abs(z) < 4.5), z


def test_invariance_check_detects_a_wrong_whitening():
    """A whitened gradient inconsistent with the position breaks invariance, and is caught."""
    r = jnp.asarray([[0.8, 0.0], [0.3, 0.4]])
    alg = fm.fisher_nuts(quartic_logdensity, 0.5, r)

    def wrong_step(key, state):  # a cached gradient of the wrong sign: an inconsistent state
        return alg.step(key, state._replace(whitened_grad=-state.whitened_grad))

    z, _ = _invariance_z_scores(alg.init, wrong_step)
    assert np.max(np.abs(z)) > 4.5, z


def _z_scores(samples, mean, sd):
    """MCSE z-scores of the means and variances, with ArviZ's multi-chain ESS."""
    x = np.asarray(samples, np.float64)  # (chains, draws, d)
    ess_mean = fm.ess(x, method="bulk", per_chain=False)
    ess_sq = fm.ess((x - mean) ** 2, method="bulk", per_chain=False)
    flat = x.reshape(-1, x.shape[-1])
    z_mean = (flat.mean(0) - mean) / (sd / np.sqrt(ess_mean))
    sq = (flat - mean) ** 2
    z_var = (sq.mean(0) - sd**2) / (sq.std(0) / np.sqrt(ess_sq))
    return np.concatenate([z_mean, z_var])


@pytest.mark.parametrize(
    "sampler,options",
    [
        ("fisher_nuts", {}),
        ("fisher_hmc", {}),
        ("fisher_nuts", {"pooled": True, "hmc_target_acceptance_rate": 0.65}),
        pytest.param("fisher_nuts", {"score_prior_weight": 1.0}, marks=pytest.mark.slow),
    ],
)
def test_fm_sample_is_correct_on_a_correlated_gaussian(sampler, options):
    d = 8
    sd = np.geomspace(0.2, 5.0, d)
    c = random_covariance(d, seed=11, jitter=0.5)
    cov = c / np.sqrt(np.outer(np.diag(c), np.diag(c))) * np.outer(sd, sd)
    mean = np.linspace(-1.0, 1.0, d)
    target = fm.targets.gaussian("corr8", mean, cov)
    x0 = target.initial_positions(jax.random.key(0), 4)
    result = fm.sample(
        jax.random.key(1),
        sampler,
        target.logdensity_fn,
        x0,
        num_warmup=2000,
        num_samples=2000,
        **options,
    )
    z = _z_scores(result.samples, mean, sd)
    assert np.all(np.abs(z) < 4.5), z
    # every leapfrog gradient is counted: NUTS takes several per draw
    assert np.all(result.num_grad_evals > 2000 + 2 * 2000)
    assert result.sample_stats["is_divergent"].shape == (4, 2000)
    # the step-size phase reaches the target a user sets (the docs' step-size table sends
    # users to it); dual averaging's averaged step ends on the cautious side of it
    # (the result says which target: the default or, after a Fisher phase the stopping
    # rule ended on a plateau, the plateau one)
    warmup = fm.whitened_warmup
    defaults = (warmup.FISHER_NUTS_TARGET_ACCEPTANCE, warmup.PLATEAU_TARGET_ACCEPTANCE)
    goal = options.get("hmc_target_acceptance_rate", result.target_acceptance)
    assert result.target_acceptance == goal
    assert "hmc_target_acceptance_rate" in options or goal in defaults
    accept = float(np.mean(result.sample_stats["acceptance_rate"]))
    # (the default target 0.7 realizes about 0.8: FISHER_NUTS_TARGET_ACCEPTANCE's comment)
    assert goal - 0.05 < accept < goal + 0.15, (goal, accept)


@pytest.mark.slow  # 40 s; Fisher NUTS is checked against posteriordb reference draws in CI
def test_fisher_nuts_on_a_logistic_regression_matches_a_long_reference_run():
    rng = np.random.default_rng(3)
    n, d = 200, 5
    features = rng.normal(size=(n, d)) * np.linspace(0.3, 3.0, d)
    features[:, 1] += 0.9 * features[:, 0]  # correlated coefficients
    labels = (rng.uniform(size=n) < 1 / (1 + np.exp(-features @ rng.normal(size=d)))).astype(
        np.float32
    )
    z_data, y = jnp.asarray(features, jnp.float32), jnp.asarray(labels)

    def logdensity(beta):
        logits = z_data @ beta
        return jnp.sum(y * logits - jnp.logaddexp(0.0, logits)) - 0.5 * jnp.sum(beta**2)

    x0 = jnp.zeros((4, d))
    # Reference: BlackJAX's own NUTS with its dense window adaptation, 4 x 6000 draws.
    tuned = blackjax.window_adaptation(blackjax.nuts, logdensity, is_mass_matrix_diagonal=False)
    (state, params), _ = tuned.run(jax.random.key(6), jnp.zeros(d), 1000)
    nuts = blackjax.nuts(logdensity, **params)
    keys = jax.random.split(jax.random.key(7), 4)
    _, (states, _) = jax.vmap(
        lambda k: blackjax.util.run_inference_algorithm(k, nuts, 6000, initial_state=state)
    )(keys)
    reference = np.asarray(states.position, np.float64)
    ref_mean, ref_sd = reference.reshape(-1, d).mean(0), reference.reshape(-1, d).std(0)
    ref_mcse = ref_sd / np.sqrt(fm.ess(reference, method="bulk", per_chain=False))

    result = fm.sample(
        jax.random.key(8), "fisher_nuts", logdensity, x0, num_warmup=2000, num_samples=3000
    )
    x = np.asarray(result.samples, np.float64)
    mcse = x.reshape(-1, d).std(0) / np.sqrt(fm.ess(x, method="bulk", per_chain=False))
    z = (x.reshape(-1, d).mean(0) - ref_mean) / np.sqrt(mcse**2 + ref_mcse**2)
    assert np.all(np.abs(z) < 4.5), z
    ratio = x.reshape(-1, d).std(0) / ref_sd
    assert np.all(np.abs(ratio - 1) < 0.1), ratio


def test_divergences_are_reported_and_never_enter_the_state():
    """A wall (log density -inf beyond x_0 = 1.5) makes trajectories diverge there."""

    def walled(x):
        return jnp.where(x[0] < 1.5, -0.5 * jnp.sum(x**2), -jnp.inf)

    result = fm.sample(
        jax.random.key(0),
        "fisher_nuts",
        walled,
        jnp.zeros((2, 3)),
        num_warmup=1000,
        num_samples=1000,
    )
    x = np.asarray(result.samples)
    assert np.all(np.isfinite(x)) and np.all(x[..., 0] < 1.5)
    assert np.asarray(result.sample_stats["is_divergent"]).sum() > 0
    idata = fm.to_arviz(result)
    assert int(idata.sample_stats["diverging"].sum()) > 0


@pytest.mark.parametrize(
    "options,match",
    [
        ({"num_step_size_steps": -1}, "num_step_size_steps"),
        ({"hmc_target_acceptance_rate": 1.5}, "hmc_target_acceptance_rate"),
        ({"max_num_doublings": 0}, "max_num_doublings"),
        ({"score_prior_weight": -1.0}, "score_prior_weight"),
        ({"score_prior_weight": 1.0, "pooled": True}, "score_prior_weight"),
        ({"bogus": 1}, "Invalid option"),
        ({"metric": "full"}, "metric"),
        ({"metric": "diagonal", "score_prior_weight": 1.0}, "score_prior_weight"),
        ({"robust_uturn": "yes"}, "robust_uturn"),
    ],
)
def test_bad_options_fail_before_compilation(options, match, monkeypatch):
    def no_compile(*args, **kwargs):
        raise AssertionError("compiled before validating")

    monkeypatch.setattr(fm.sampling, "_compile_and_run", no_compile)
    with pytest.raises((ValueError, TypeError), match=match):
        fm.sample(
            jax.random.key(0), "fisher_nuts", lambda x: -jnp.sum(x**2), jnp.zeros((2, 3)), **options
        )


def test_fisher_adaptation_hands_blackjax_nuts_its_parameters(x64):
    cov = jnp.asarray(random_covariance(4, seed=2))
    logdensity = gaussian_logdensity(jnp.zeros(4), cov)
    warmup = fm.fisher_adaptation(blackjax.nuts, logdensity)
    (state, params), _ = warmup.run(jax.random.key(0), jnp.ones(4), 1500)
    assert set(params) == {"step_size", "inverse_mass_matrix"}
    r = params.sqrt_precond
    np.testing.assert_allclose(params["inverse_mass_matrix"], r @ r.T, rtol=1e-12)
    # After the scale normalization R R^T estimates the covariance itself.
    rel = np.linalg.norm(r @ r.T - cov) / np.linalg.norm(cov)
    assert rel < 0.35, rel
    nuts = blackjax.nuts(logdensity, **params)
    state, _ = nuts.step(jax.random.key(1), state)
    assert np.all(np.isfinite(np.asarray(state.position)))
    with pytest.raises(ValueError, match=r"blackjax\.nuts or blackjax\.hmc"):
        fm.fisher_adaptation(blackjax.mala, logdensity)


def test_fisher_phase_damping_lets_r_learn_a_wide_ridge(x64):
    # A ridge of variance 900 and one of 0.01 (kilpisjarvi's shape, milder). From Algorithm
    # 1's isotropic start, after n Fisher iterations a variance v is learned as
    # v / (1 + v lambda / n), so lambda = 10 leaves the wide direction about six times too
    # narrow in whitened coordinates, and the Fisher NUTS damping
    # (whitened_warmup.FISHER_NUTS_DAMPING) does not. Fisher NUTS's default start (the
    # secant scales and restart windows) does not depend on it.
    rotation = np.array([[1.0, 1.0], [1.0, -1.0]]) / np.sqrt(2.0)
    cov = jnp.asarray(rotation @ np.diag([900.0, 0.01]) @ rotation.T)
    logdensity = gaussian_logdensity(jnp.zeros(2), cov)
    algorithm_1 = {"fast_start": False, "restart_windows": (), "step_size_learning_rate": 0.015}

    def whitened_condition_number(**options):
        # The Fisher phase of the warm-up (the step-size phase leaves R as it is, up to scale).
        fisher = warmup_module.FisherHMCWarmup(logdensity, **options).fisher
        run = jax.jit(lambda key, x: fisher.run(key, x, 1800)[0][0].sqrt_precond)
        r = np.asarray(run(jax.random.key(3), jnp.ones(2)))
        whitened = np.linalg.solve(r, np.linalg.solve(r, np.asarray(cov)).T)
        eig = np.linalg.eigvalsh((whitened + whitened.T) / 2)
        return eig[-1] / eig[0]

    warmup_module = importlib.import_module("fisher_mala.whitened_warmup")
    assert warmup_module.FISHER_NUTS_DAMPING == 0.1
    assert whitened_condition_number(**algorithm_1) < 1.5
    assert whitened_condition_number(damping=10.0, **algorithm_1) > 3.0
    assert whitened_condition_number() < 1.5
    assert whitened_condition_number(damping=10.0) < 1.5


def test_whiten_runs_any_blackjax_kernel_in_whitened_coordinates(x64):
    cov = jnp.asarray(random_covariance(3, seed=5))
    logdensity = gaussian_logdensity(jnp.ones(3), cov)
    r = jnp.linalg.cholesky(cov)
    white = fm.whiten(logdensity, r, jnp.zeros(3))
    mala = blackjax.mala(white.logdensity_fn, 0.5)
    _, (states, _) = blackjax.util.run_inference_algorithm(
        jax.random.key(0), mala, 20000, initial_position=jnp.zeros(3)
    )
    x = np.asarray(jax.vmap(white.to_position)(states.position))
    np.testing.assert_allclose(np.cov(x[2000:].T), cov, atol=0.25)


def test_chains_behind_are_those_far_below_the_best_in_log_density():
    from fisher_mala.adaptations.stopping_rule import chains_behind, chains_settled

    margin = 8.0 * np.sqrt(4 / 2.0) + 10.0  # SETTLED_SPREAD_SDS * sqrt(d / 2) + SETTLED_SLACK
    values = np.array([-10.0, -10.0 - margin + 0.1, -10.0 - margin - 0.1, np.nan])
    np.testing.assert_array_equal(chains_behind(values, 4), [2, 3])
    assert chains_settled(values[:2], 4) and not chains_settled(values, 4)
    assert chains_settled(np.array([-5.0]), 4)  # one chain


def _minor_mode_logdensity(x):
    # N(0, I) and, 40 nats lighter, a narrow mode at (20, 0) behind a barrier MALA never
    # crosses
    main = -0.5 * jnp.sum(x**2)
    minor = -40.0 - 0.5 * jnp.sum((x - jnp.array([20.0, 0.0])) ** 2) / 0.01 - 2 * jnp.log(0.1)
    return jnp.logaddexp(main, minor)


def test_a_chain_left_in_a_minor_mode_is_regrouped_with_a_warning(tmp_path):
    """A chain that ends the Fisher phase in a far minor mode (where MALA's local moves
    keep it) restarts the step-size phase from another chain's state, with a warning; the
    checkpointed run takes the same steps, bit for bit."""
    x0 = jnp.array([[0.5, 0.0], [-0.5, 0.3], [0.0, -0.4], [20.0, 0.0]])

    def run(**kwargs):
        return fm.sample(jax.random.key(3), "fisher_nuts", _minor_mode_logdensity, x0,
                         num_warmup=1500, num_samples=1000, diagnose=False, **kwargs)  # fmt: skip

    with pytest.warns(fm.SamplingWarning, match=r"chain\(s\) \[3\] were far below"):
        result = run()
    draws = np.asarray(result.samples)
    assert np.all(np.abs(draws[3].mean(0)) < 0.5)  # in the main mode, N(0, I)
    assert np.all(np.abs(draws[..., 0]) < 8.0)  # no chain left in the minor mode
    with pytest.warns(fm.SamplingWarning, match="far below"):
        again = run(checkpoint=tmp_path / "run.npz", checkpoint_every=500)
    np.testing.assert_array_equal(np.asarray(again.samples), draws)


def test_auto_metric_stays_dense_where_the_damping_still_rules():
    """An ``A`` whose correlations are none only because the signals have not reached some
    direction yet (the damping's isotropic guess there) is no evidence for a diagonal
    metric; the same correlations learned from the signals are."""
    from fisher_mala.adaptations.stopping_rule import prior_dominated

    damping = fm.whitened_warmup.FISHER_NUTS_DAMPING
    # F = (R R^T)^-1 = damping I + signals: 100x the damping in one direction, 0.05x in the
    # other (damping share 0.95 there), then 100x in both
    untaught = np.linalg.cholesky(np.linalg.inv(np.diag([101.0, 1.05]) * damping))[None]
    taught = np.linalg.cholesky(np.linalg.inv(np.diag([101.0, 101.0]) * damping))[None]
    assert prior_dominated(untaught, damping) and not prior_dominated(taught, damping)
    # Algorithm 1's start, no stopping rule looking: the damping's share decides
    warm = fm.whitened_warmup.FisherHMCWarmup(lambda x: -jnp.sum(x**2), fast_start=False)
    assert warm.choose(_state(untaught, 10_000)) == "dense"
    assert warm.choose(_state(taught, 10_000)) == "diagonal"
    # where the rule looks, its verdict on the last block decides: an untaught direction
    # breaks the agreement of the block's signals with the R before them
    warm = fm.whitened_warmup.FisherHMCWarmup(lambda x: -jnp.sum(x**2))
    assert warm.choose(_state(untaught, 10_000), learned=False) == "dense"
    assert warm.choose(_state(taught, 10_000), learned=True) == "diagonal"
