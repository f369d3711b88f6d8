"""fm.diagnose and fm.sample's warning: each check on a run that should trigger it and on
one that should not (synthetic runs with known faults, then real runs)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fisher_mala as fm
from fisher_mala.sampling import SamplingResult
from fisher_mala.schedule import WarmupInfo, WarmupParameters

CHAINS, DRAWS, DIM = 4, 2000, 3


def fake_run(
    samples=None,
    acceptance=0.57,
    sampler="fisher_mala",
    is_accepted=None,
    is_divergent=None,
    seed=0,
):
    """A SamplingResult with i.i.d. N(0, 1) draws (or ``samples``) and Bernoulli accepts."""
    rng = np.random.default_rng(seed)
    if samples is None:
        samples = rng.normal(size=(CHAINS, DRAWS, DIM))
    chains, draws = jax.tree.leaves(samples)[0].shape[:2]
    rates = np.broadcast_to(np.asarray(acceptance, float).reshape(-1, 1), (chains, draws))
    if is_accepted is None:
        is_accepted = rng.random((chains, draws)) < rates
    if is_divergent is None:
        is_divergent = np.zeros((chains, draws), bool)
    stats = {
        "logdensity": np.zeros((chains, draws)),
        "acceptance_rate": np.array(rates),
        "is_accepted": np.asarray(is_accepted),
        "proposal_is_finite": np.ones((chains, draws), bool),
        "is_divergent": np.asarray(is_divergent),
    }
    info = WarmupInfo(
        np.zeros((chains, 1)),
        np.ones((chains, 1), bool),
        np.ones((chains, 1), bool),
        np.full(chains, 0.1),
        np.zeros(chains),
        None,
    )
    return SamplingResult(
        sampler=sampler,
        samples=samples,
        sample_stats=stats,
        parameters=WarmupParameters(np.full(chains, 0.1), None),
        warmup_info=info,
        final_state=None,
        num_grad_evals=np.full(chains, draws),
        compile_seconds=0.0,
        warmup_seconds=1.0,
        sampling_seconds=1.0,
        num_warmup=0,
        num_samples=draws,
        thinning=1,
        target_acceptance=0.574 if sampler != "fisher_nuts" else 0.8,
        rejects_whole_proposals=sampler != "fisher_nuts",
        reports_divergences=sampler == "fisher_nuts",
    )


def checks(result):
    return [f.check for f in fm.diagnose(result).findings]


def test_a_healthy_run_passes_every_check():
    d = fm.diagnose(fake_run())
    assert d.ok, str(d)
    assert d.names == ["x[0]", "x[1]", "x[2]"]
    assert np.all(d.rhat < 1.01) and np.all(d.ess_bulk > 400)
    assert str(d) == "All checks passed."


def test_rhat_names_the_coordinates_of_a_shifted_chain():
    x = np.random.default_rng(1).normal(size=(CHAINS, DRAWS, DIM))
    x[0, :, 1] += 1.0
    d = fm.diagnose(fake_run(x))
    assert d["rhat"] is not None and d["rhat"].details["coordinates"] == ["x[1]"]
    assert "x[1]" in d["rhat"].message
    assert d["chains_disagree"].details["chains"].tolist() == [0]


def test_ess_flags_autocorrelated_draws_only():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(CHAINS, DRAWS, DIM))
    for t in range(1, DRAWS):  # AR(1) with rho = 0.995 in coordinate 2
        x[:, t, 2] = 0.995 * x[:, t - 1, 2] + np.sqrt(1 - 0.995**2) * x[:, t, 2]
    d = fm.diagnose(fake_run(x))
    assert d["ess"].details["coordinates"][0] == "x[2]"
    assert "x[0]" not in d["ess"].details["coordinates"]


def test_chains_disagree_where_rhat_is_still_below_its_bound():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(CHAINS, 20000, 1))
    x[2] += 0.1  # 0.1 sd: R-hat ~1.004, but 14 Monte Carlo standard errors
    d = fm.diagnose(fake_run(x))
    assert d["rhat"] is None
    assert d["chains_disagree"].details["chains"].tolist() == [2]
    assert "chain 2, x" in d["chains_disagree"].message


def test_acceptance_spread_and_distance_from_target():
    assert "acceptance" in checks(fake_run(acceptance=[0.31, 0.71, 0.55, 0.57]))
    assert "acceptance" in checks(fake_run(acceptance=[0.95, 0.93, 0.94, 0.95]))
    assert "acceptance" not in checks(fake_run(acceptance=[0.52, 0.60, 0.57, 0.58]))


def test_a_long_rejection_streak_is_located():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(CHAINS, DRAWS, DIM))
    accepted = rng.random((CHAINS, DRAWS)) < 0.57
    accepted[1, 500:800] = False  # stuck for 300 draws at one point, far out in x[2]
    x[1, 500:800] = [0.0, 0.1, -3.0]
    d = fm.diagnose(fake_run(x, is_accepted=accepted))
    streak = d["rejection_streak"]
    assert streak.details["chains"] == [1] and streak.details["lengths"] == [300]
    assert streak.details["where"][0][0][0] == "x[2]"
    assert d.longest_rejection_streak[1] == 300
    # 60 rejections in a row (3% of the draws) at one point: shorter than 100, no finding
    short = rng.random((CHAINS, DRAWS)) < 0.57
    short[1, 500:560] = False
    assert "rejection_streak" not in checks(fake_run(x, is_accepted=short))
    # the same streak is no finding for NUTS, which does not reject whole proposals
    assert "rejection_streak" not in checks(
        fake_run(x, is_accepted=accepted, sampler="fisher_nuts", acceptance=0.8)
    )


def test_short_rejection_streaks_of_a_healthy_chain_pass():
    d = fm.diagnose(fake_run(acceptance=0.3))  # many streaks, all of independent length
    assert d["rejection_streak"] is None
    assert d.longest_rejection_streak.max() > 5


def test_divergences_are_reported_for_nuts_only():
    divergent = np.zeros((CHAINS, DRAWS), bool)
    divergent[3, 10] = True
    nuts = fake_run(sampler="fisher_nuts", acceptance=0.8, is_divergent=divergent)
    assert fm.diagnose(nuts)["divergences"].details["counts"].tolist() == [0, 0, 0, 1]
    assert "divergences" not in checks(fake_run(sampler="fisher_nuts", acceptance=0.8))
    assert "divergences" not in checks(fake_run(is_divergent=divergent))  # MALA: non-finite


def test_a_chain_that_never_moved_is_stuck():
    accepted = np.random.default_rng(5).random((CHAINS, DRAWS)) < 0.57
    accepted[0] = False
    assert "stuck" in checks(fake_run(is_accepted=accepted))
    assert "stuck" not in checks(fake_run())


def test_pytree_draws_are_named_by_their_paths():
    rng = np.random.default_rng(6)
    samples = {"mu": rng.normal(size=(CHAINS, DRAWS)), "theta": rng.normal(size=(CHAINS, DRAWS, 2))}
    d = fm.diagnose(fake_run(samples))
    assert d.names == ["mu", "theta[0]", "theta[1]"] and d.ok


def test_summary_is_multi_chain_where_the_paper_table_adds_up_chains():
    x = np.random.default_rng(7).normal(size=(CHAINS, DRAWS, DIM))
    x[0] += 2.0  # one chain elsewhere: no per-chain estimate can see it
    run = fake_run(x)
    headline, paper = fm.summary(run), fm.paper_summary(run)
    assert headline.ess_bulk_min < 0.1 * CHAINS * paper.ess_min[0]
    assert headline.max_rhat > 1.1
    assert headline.worst.startswith("x[")
    assert "bulk ESS min" in str(headline) and "R-hat" in str(headline)
    assert "with compilation" in str(headline)  # says what the ESS/s divides by
    seconds = run.warmup_seconds + run.sampling_seconds
    np.testing.assert_allclose(headline.min_ess_per_second * seconds,
                               headline.min_ess_per_second_with_compile
                               * (seconds + run.compile_seconds))  # fmt: skip
    np.testing.assert_allclose(fm.ess(run), np.asarray(fm.diagnose(run).ess_bulk))


def test_sample_warns_once_naming_the_problem_and_not_on_a_healthy_run():
    cov = np.diag([1.0, 0.5, 2.0])
    logdensity = fm.targets.gaussian("g", np.zeros(3), cov).logdensity_fn
    x0 = jax.random.normal(jax.random.key(0), (4, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", fm.SamplingWarning)
        fm.sample(
            jax.random.key(1), "fisher_mala", logdensity, x0, num_warmup=2000, num_samples=3000
        )

    def badly_scaled(x):  # sd 1 and 300: plain MALA cannot cross the long axis in time
        return -0.5 * (x[0] ** 2 + (x[1] / 300.0) ** 2)

    with pytest.warns(fm.SamplingWarning) as caught:
        fm.sample(
            jax.random.key(2),
            "mala",
            badly_scaled,
            jnp.zeros((4, 2)) + 50.0 * jnp.arange(4.0)[:, None],
            num_warmup=200,
            num_samples=500,
        )
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "R-hat" in message and "x[1]" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error", fm.SamplingWarning)
        fm.sample(
            jax.random.key(2),
            "mala",
            badly_scaled,
            jnp.zeros((4, 2)),
            num_warmup=50,
            num_samples=50,
            diagnose=False,
        )
