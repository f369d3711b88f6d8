"""The host's looks at the learned ``R`` between the compiled parts of the Fisher NUTS /
HMC warm-up (layer 4): whether the stopping rule ends the Fisher phase (settled, or on a
plateau), whether every chain is in the others' typical set, which metric NUTS uses, and
after a plateau the shape all chains share (:func:`shared_shape`).

A mixin of :class:`~fisher_mala.whitened_warmup.FisherHMCWarmup` (it reads the warm-up's
``pooled``, ``metric``, ``rule_applies``, ``fisher``, ``fisher_options`` and
``score_prior_weight``); :meth:`~fisher_mala.whitened_warmup.FisherHMCWarmup.staged_run`
and the checkpointed parts call these between compiled stages. Each is ``O(d^3)`` per
chain at most, in float64 on the host, and skipped above
:data:`~fisher_mala.adaptations.stopping_rule.AUTO_MAX_DIM`.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from fisher_mala import validation
from fisher_mala.adaptations.dual_averaging import dual_averaging
from fisher_mala.adaptations.stopping_rule import (
    AUTO_MAX_DIM,
    chains_behind,
    chains_settled,
    diagonal_suffices,
    prior_dominated,
    stopping_rule,
)
from fisher_mala.leapfrog_tuning import tune_step_size
from fisher_mala.pytree import ravel

__all__ = ["HostLooks", "shared_shape"]


class HostLooks:
    """The host-side decisions of the Fisher NUTS / HMC warm-up (module docstring)."""

    def settled(self, state) -> bool:
        """Whether every chain of ``state`` (all chains' Fisher states) is in the typical
        set of the best one (:func:`~fisher_mala.adaptations.stopping_rule.chains_settled`).
        One chain, or under ``jit`` (nothing to look at): ``True``."""
        if not validation.is_concrete(state.logdensity):
            return True
        return chains_settled(state.logdensity, np.shape(state.whitened_grad)[-1])

    def _rule_can_stop(self, state) -> bool:
        """Whether the stopping rule is on and a block has the ``4 d`` signals it needs."""
        signals = np.shape(state.whitened_grad)[0] if self.pooled else 1
        return self._rule_can_stop_at(np.shape(state.whitened_grad)[-1], signals)

    def _rule_can_stop_at(self, dim: int, signals_per_iteration: int) -> bool:
        if not self.rule_applies:
            return False
        return dim <= AUTO_MAX_DIM and 4 * dim <= self.fisher.block * signals_per_iteration

    def learned(self, previous, state) -> bool:
        """Whether :meth:`look` finds ``R`` settled."""
        return self.look(previous, state) == "settled"

    def look(self, previous, state) -> str:
        """Whether the Fisher phase may stop: ``"settled"``, ``"plateau"`` or ``""`` (go
        on), by the stopping rule (``stopping_rule=True``) of
        :func:`fisher_mala.adaptations.stopping_rule.stopping_rule`, looking at the ``R``
        of ``state`` against that of ``previous`` (the end of the block before). On a
        plateau no ``R`` whitens the newest block as well as sampling noise allows, and
        more signals would not change that (a funnel): the phase stops, and the step-size
        phase aims at :data:`~fisher_mala.whitened_warmup.PLATEAU_TARGET_ACCEPTANCE`.

        Chains far behind the others in log density (:func:`chains_behind`) are left out
        while others remain: their ``R`` says nothing of the posterior, and they are
        regrouped (:meth:`regroup`) or given the full step-size phase after the Fisher
        phase; one chain stuck at a log density of ``-1e30`` no longer holds the others'
        Fisher phase to its full length."""
        if not self.rule_applies:
            return ""
        per_update = np.shape(state.whitened_grad)[0] if self.pooled else 1  # rank-C
        rule = stopping_rule(per_update)
        arrays = (previous.sqrt_precond, previous.count, state.sqrt_precond, state.count)
        r_prev, n_prev, r_now, n_now = _without_chains_behind(state, self.pooled, *arrays)
        verdict = rule.update(rule.init(r_prev, n_prev), (r_now, n_now))
        return "settled" if rule.final(verdict) else "plateau" if verdict.plateau else ""

    def share_after(self, fisher_out, share: bool):
        """The Fisher phase's outcome, its chains given their mean shape of ``R``
        (:func:`shared_shape`) where ``share`` (after a phase that ended on a plateau, or
        :meth:`shares_unsettled`); otherwise, or pooled (one ``R`` already), unchanged."""
        return shared_shape(fisher_out) if share and not self.pooled else fisher_out

    def shares_unsettled(self, unsettled: bool) -> bool:
        """Whether NUTS's chains share their mean shape of ``R`` after a Fisher phase that
        the stopping rule looked at and never found settled (``unsettled``): each chain's
        ``R`` is then still noisy, or fits where its chain spent the phase. On the
        heteroscedastic latent GP ``mcycle_gp-accel_gp`` (``python -m benchmarks.held_out
        --later``), in seed 1, one chain kept an ``R`` that cost it 5 to 8 times the
        others' gradients per draw and had a min ESS of 17 in 2000 draws; shared, the
        run's min ESS per gradient was 8.9 and 17 times that with each chain's own ``R``
        in seeds 0 and 1 (the cells before and after, both retuned). Not for HMC,
        whose fixed trajectory length suits each chain's own ``R``: on the paper's GP target
        (``python -m benchmarks.versus_blackjax --targets gp``) Fisher HMC lost 28% of its
        min ESS per gradient with the shape shared, where Fisher NUTS gained 5%."""
        return unsettled and self.algorithm == "nuts"

    def after_tuning(self, call, warmup_out, plateau: bool, on_host=None, *call_args,
                     unsettled: bool = False):  # fmt: skip
        """The warm-up's outcome after its step-size phase: :meth:`regroup_after`, then
        after a ``plateau`` (with ``regroup=True``, NUTS, chains of their own) a short
        probe of every chain at its tuned step (``call("probe_stage", warmup_out,
        *call_args)``) and the chains stuck there restarted from another
        (:func:`restart_stuck`). After a Fisher phase that the stopping rule looked at and
        never found settled (``unsettled``: it ran its full length), a probe for divergent
        transitions at the tuned step (NUTS, chains of their own), and the step tuned
        again towards the plateau's target where they are common (:func:`retune_needed`).
        ``on_host(fn, *args)`` runs the host's choices (``fm.sample`` times them)."""
        on_host = on_host or (lambda fn, *args: fn(*args))
        warmup_out = on_host(self.regroup_after, warmup_out, plateau)
        own_chains = not self.pooled and self.algorithm == "nuts"
        if plateau and self.regroup_chains and own_chains:
            probed = call("probe_stage", warmup_out, *call_args)
            warmup_out = on_host(restart_stuck, warmup_out, probed)
        elif unsettled and own_chains:
            share, steps = call("divergence_probe_stage", warmup_out, *call_args)
            warmup_out = on_host(count_gradients, warmup_out, steps)
            if on_host(retune_needed, share):
                warmup_out = call("retune_stage", warmup_out, *call_args)
                self.used_target_acceptance = self.plateau_target_acceptance
        return warmup_out

    def probe_stage(self, rng_key, warmup_out, num_steps: int, progress=None, offset=None):
        """The compiled stage of :meth:`after_tuning`'s probe (:func:`probe`, with the
        plateau's kernel); a stage's arguments (the checkpointed parts pass ``offset``)."""
        del num_steps, progress, offset
        return probe(self.plateau_tuning, rng_key, warmup_out)

    def divergence_probe_stage(self, rng_key, warmup_out, num_steps: int, progress=None,
                               offset=None):  # fmt: skip
        """The compiled stage of :meth:`after_tuning`'s divergence probe
        (:func:`divergence_probe`, with the step-size phase's kernel)."""
        del num_steps, progress, offset
        return divergence_probe(self.tuning, rng_key, warmup_out)

    def retune_stage(self, rng_key, warmup_out, num_steps: int, progress=None, offset=None):
        """The compiled stage of :meth:`after_tuning`'s second step-size phase
        (:func:`retune`: the step-size phase's kernel, towards the plateau's target)."""
        del num_steps, progress, offset
        target = dual_averaging(self.plateau_target_acceptance)
        return retune(self.tuning._replace(dual_averaging=target), rng_key, warmup_out)

    def regroup_after(self, warmup_out, plateau: bool):
        """The warm-up's outcome with the chains whose step is far from the others'
        restarted from the chain nearest the median (:func:`regroup_steps`) after a
        ``plateau``; otherwise, or with ``regroup=False``, unchanged."""
        return regroup_steps(warmup_out) if plateau and self.regroup_chains else warmup_out

    def choose(self, fisher_state, learned: bool | None = None) -> str:
        """``"dense"`` or ``"diagonal"``, from the Fisher phase's final state (every chain's).

        With ``metric="auto"``: diagonal when, for every chain, the correlation matrix of
        the learned ``A = R R^T`` is as close to the identity as sampling noise allows
        (:func:`diagonal_suffices`): the posterior is then close to independent, and a
        dense ``R`` would only add ``O(d^2)`` per leapfrog step. Such an ``A`` is evidence
        only where the signals have taught every direction. ``learned`` says whether the
        stopping rule found the last block's signals in agreement with the ``R`` before
        them (a direction the signals have not reached breaks that agreement); ``None``
        where the rule does not look, and then, from Algorithm 1's isotropic start, the
        damping must not make most of the learned precision in any direction
        (:func:`prior_dominated`); from the fast start the correlations alone decide.
        Otherwise dense. Runs on the host (``O(d^3)`` eigendecompositions per chain,
        skipped above :data:`AUTO_MAX_DIM`).
        """
        if self.metric != "auto":
            return self.metric
        if self.score_prior_weight is not None:
            return "dense"  # the keep-learning update is the dense rank-one recursion
        r, count = fisher_state.sqrt_precond, fisher_state.count
        if not validation.is_concrete((r, count)):
            raise ValueError(
                "metric='auto' chooses between a dense and a diagonal R on the host after the "
                "Fisher phase; under jit pass metric='dense' or metric='diagonal'."
            )
        num_signals = np.asarray(count, np.float64)
        if self.pooled:  # one rank-C update per iteration
            num_signals = num_signals * np.shape(fisher_state.whitened_grad)[0]
        if not diagonal_suffices(r, num_signals):
            return "dense"
        if learned is not None or self.fisher_options.get("fast_start"):  # not Algorithm 1's
            return "dense" if learned is False else "diagonal"
        # no correlations learned yet where the damping still rules: not a diagonal target
        return "dense" if prior_dominated(r, self.fisher_options["damping"]) else "diagonal"


def _without_chains_behind(state, pooled: bool, *per_chain):
    """``per_chain`` arrays without the chains of ``state`` far behind the others in log
    density (:func:`chains_behind`), unless that would leave none (or ``state`` holds
    one chain, or one ``R`` for all: ``pooled``)."""
    if pooled or np.ndim(state.logdensity) != 1:
        return per_chain
    num_chains = np.shape(state.logdensity)[0]
    behind = chains_behind(state.logdensity, np.shape(state.whitened_grad)[-1])
    keep = np.setdiff1d(np.arange(num_chains), behind)
    if not 0 < keep.size < num_chains:
        return per_chain
    return tuple(np.asarray(x)[keep] for x in per_chain)


def shared_shape(fisher_out):
    """The Fisher phase's outcome with every chain's dense ``R`` replaced by one of the
    same trace and the chains' mean shape: ``A_c' = (tr A_c / d) mean_k (A_k / (tr A_k /
    d))``, ``R_c'`` its Cholesky factor, and the whitened gradients ``R_c'^T g`` to match.

    For a Fisher phase that the stopping rule ended on a plateau (a funnel): no one ``R``
    whitens the posterior, and each chain's ``R`` describes the region it spent the phase
    in; one learned in a funnel's neck is far too narrow elsewhere, and its chain stalls
    there (``docs/fisher_nuts.md`` has the measurements). Only the shape is shared: each
    chain keeps its trace, hence its initial step, and the step-size phase tunes its step
    to its own ``R``. One chain, a diagonal or low-rank ``R``, a non-finite one or under
    ``jit``: unchanged.
    """
    (state, params), info = fisher_out
    r = state.sqrt_precond
    if not (isinstance(r, jax.Array | np.ndarray) and np.ndim(r) == 3 and np.shape(r)[0] > 1):
        return fisher_out
    if not validation.is_concrete(r) or not np.all(np.isfinite(r)):
        return fisher_out
    r = np.asarray(r, np.float64)
    dim = r.shape[-1]
    a = r @ np.swapaxes(r, -1, -2)
    scales = np.trace(a, axis1=-2, axis2=-1) / dim
    mean = np.mean(a / scales[:, None, None], axis=0)
    try:
        root = np.linalg.cholesky(0.5 * (mean + mean.T))
    except np.linalg.LinAlgError:
        return fisher_out
    if not (np.all(np.isfinite(root)) and np.all(scales > 0)):
        return fisher_out
    roots = jnp.asarray(np.sqrt(scales)[:, None, None] * root, state.sqrt_precond.dtype)
    grads = jax.vmap(ravel)(state.logdensity_grad)
    whitened = jnp.einsum("cij,ci->cj", roots, grads.astype(roots.dtype))
    state = state._replace(sqrt_precond=roots, whitened_grad=whitened)
    return (state, params), info


#: After a plateau, a chain whose effective leapfrog step (its step times the root mean
#: square scale of its ``R``) is more than this factor from the chains' median restarts
#: the sampling phase from the state and parameters of the chain nearest the median. The
#: chains of one target tune steps within tens of percent of each other (the race's
#: plateau cell without a funnel, ``gp_pois_regr``: 0.52-0.54); on the centred eight
#: schools one chain ended 1600 times below the median (seed 7 of ``python -m
#: benchmarks.nutpie_race --funnel``), and with a factor of 4 another, at 0.4 of it,
#: spent 3.9 times the others' gradients per draw (the same seeds, this constant at 4).
STEP_OUTLIER_FACTOR = 2.0


def effective_steps(params) -> np.ndarray | None:
    """Each chain's leapfrog step in the target's own units, ``epsilon_c sqrt(tr(R_c
    R_c^T) / d)``; None for fewer than three chains, a diagonal or low-rank ``R``, or
    under ``jit``."""
    r, step = getattr(params, "sqrt_precond", None), getattr(params, "step_size", None)
    if not (isinstance(r, jax.Array | np.ndarray) and np.ndim(r) == 3 and np.shape(r)[0] > 2):
        return None
    if not validation.is_concrete((r, step)):
        return None
    r = np.asarray(r, np.float64)
    return np.asarray(step, np.float64) * np.sqrt(np.einsum("cij,cij->c", r, r) / r.shape[-1])


#: Transitions of the probe after a plateau's step-size phase (:func:`restart_stuck`).
PROBE_TRANSITIONS = 20
#: A chain whose mean acceptance over the probe is below this is stuck: a third of the
#: plateau's target (0.9). On the centred eight schools (seed 11 of ``python -m
#: benchmarks.nutpie_race --funnel``) one chain ended the warm-up in the funnel's neck with
#: a step 4 times too large there and accepted nothing in all 2000 draws (392 divergent
#: transitions; from its first draw: acceptance 0.00, 0.33 and 0.93 at 1, 1/2 and 1/4 of its
#: step: ``--inspect eight_schools_centered --seed 11 --stuck-acceptance 0``, the restart
#: off), where moving chains accept 0.8-0.95.
STUCK_ACCEPTANCE = 0.3


#: Folded into the warm-up's key for the probe (:func:`probe`): a stream of its own, so
#: that the stages' draws are those of a run without the probe.
PROBE_KEY = 0x70726F62  # "prob"


def _probe_transitions(tuning, rng_key, warmup_out, num=PROBE_TRANSITIONS):
    """``(acceptance, leapfrog steps, divergent)`` of one chain at each of ``num``
    transitions of ``tuning``'s kernel (a :class:`~fisher_mala.leapfrog_tuning.
    LeapfrogTuning`) from the end of its warm-up ``warmup_out``, at its tuned step, in a
    key stream of its own (:data:`PROBE_KEY`)."""
    (state, params), _ = warmup_out

    def transition(state, key):
        state, info = tuning.kernel(
            key, state, tuning.logdensity_fn, params.step_size,
            tuning.num_integration_steps, tuning.max_num_doublings,
        )  # fmt: skip
        return state, (info.acceptance_rate, info.num_integration_steps, info.is_divergent)

    keys = jax.random.split(jax.random.fold_in(rng_key, PROBE_KEY), num)
    return jax.lax.scan(transition, state, keys)[1]


def probe(tuning, rng_key, warmup_out):
    """``(mean acceptance, leapfrog steps)`` of one chain over :data:`PROBE_TRANSITIONS`
    transitions from the end of its warm-up (:func:`_probe_transitions`)."""
    acceptance, steps, _ = _probe_transitions(tuning, rng_key, warmup_out)
    return jnp.mean(acceptance), jnp.sum(steps)


def divergence_probe(tuning, rng_key, warmup_out):
    """``(share of divergent transitions, leapfrog steps)`` of one chain over
    :data:`DIVERGENCE_PROBE_TRANSITIONS` transitions from the end of its warm-up
    (:func:`_probe_transitions`)."""
    num = DIVERGENCE_PROBE_TRANSITIONS
    _, steps, divergent = _probe_transitions(tuning, rng_key, warmup_out, num)
    return jnp.mean(divergent.astype(jnp.float32)), jnp.sum(steps)


#: Transitions of each chain's divergence probe (:func:`divergence_probe`): 200 over four
#: chains. In seed 1 of ``mcycle_gp-accel_gp`` below, 20 per chain and a bar of 5% missed
#: a step whose draws then diverged in 9% of transitions; 50 per chain found 3.5% (the
#: divergences gather where the chains go later, not where the warm-up ends).
DIVERGENCE_PROBE_TRANSITIONS = 50
#: Divergent transitions at the tuned step, as a share of the divergence probe's (every
#: chain's together: 4 of 200), at or above which the step is tuned again towards the
#: plateau's target (Stan's advice for divergences, automated). After a Fisher phase that
#: never settled, the heteroscedastic latent-GP posterior ``mcycle_gp-accel_gp``
#: (posteriordb, d = 66; ``python -m benchmarks.held_out --later``) diverged in 21% (seed
#: 0, each chain's own R) and 9% (seed 1, the shared shape) of its 8000 draws at the
#: target 0.7 (seed 1's probe: 2-6% by chain). A
#: posterior diverging in 0.7% of transitions (the race's worst, the non-centred eight
#: schools, whose Fisher phase ends early and is never probed) would reach 4 of 200 with
#: a chance of about 5%, and the second phase then costs 200 iterations and a smaller step.
RETUNE_DIVERGENT_SHARE = 0.02
#: Iterations of that second step-size phase: as many as the step-size phase after a
#: Fisher phase the stopping rule ends early on the race's posteriors (about 200).
RETUNE_STEPS = 200
#: Folded into the warm-up's key for the second step-size phase (:func:`retune`).
RETUNE_KEY = 0x72657475  # "retu"


def retune_needed(share) -> bool:
    """Whether the divergence probe's shares (one per chain) call for :func:`retune`:
    their mean at least :data:`RETUNE_DIVERGENT_SHARE`; False under ``jit``."""
    if not validation.is_concrete(share):
        return False
    return bool(np.mean(np.asarray(share, np.float64)) >= RETUNE_DIVERGENT_SHARE)


def retune(tuning, rng_key, warmup_out, num_steps: int = RETUNE_STEPS):
    """One chain's warm-up outcome after ``num_steps`` more iterations of dual averaging of
    its leapfrog step (``tuning``, a :class:`~fisher_mala.leapfrog_tuning.LeapfrogTuning`,
    from its tuned step, ``R`` frozen), their gradients counted."""
    (state, params), info = warmup_out
    key = jax.random.fold_in(rng_key, RETUNE_KEY)
    state, step, more, _ = tune_step_size(tuning, key, state, params.step_size, num_steps, 0, None)
    evals = info.num_grad_evals + jnp.sum(more.num_integration_steps, -1)
    return (state, params._replace(step_size=step)), info._replace(num_grad_evals=evals)


def count_gradients(warmup_out, steps):
    """The warm-up's outcome with ``steps`` more gradient evaluations (a probe's; None:
    unchanged)."""
    if steps is None:
        return warmup_out
    (state, params), info = warmup_out
    return (state, params), info._replace(num_grad_evals=info.num_grad_evals + steps)


def restart_stuck(warmup_out, probed):
    """The warm-up's outcome with the probe's gradients counted and every chain whose
    probe accepted less than :data:`STUCK_ACCEPTANCE` on average given the state and
    parameters of a moving chain (the one whose effective step is nearest the moving
    chains' median; the most accepting where that is not defined), with a
    :class:`~fisher_mala.checks.SamplingWarning`. ``probed``: each chain's mean acceptance
    and leapfrog steps over :data:`PROBE_TRANSITIONS` transitions from the warm-up's end
    (:func:`probe`), whose draws are
    dropped: a chain that moves starts the sampling phase where the warm-up left it.
    Unchanged (but for the count) with one chain, when none or every chain is stuck, or
    under ``jit``."""
    acceptance, steps = probed
    out = count_gradients(warmup_out, steps)
    params = warmup_out[0][1]
    if np.ndim(acceptance) != 1 or not validation.is_concrete(acceptance):
        return out
    acceptance = np.asarray(acceptance, np.float64)
    stuck = np.flatnonzero(~(acceptance >= STUCK_ACCEPTANCE))  # NaN counts as stuck
    if stuck.size == 0 or stuck.size == acceptance.size:
        return out
    moving = np.setdiff1d(np.arange(acceptance.size), stuck)
    effective = effective_steps(params)
    if effective is None:
        donor = int(moving[np.argmax(acceptance[moving])])
    else:
        donor = int(moving[np.argmin(np.abs(np.log(_to_median(effective[moving]))))])
    index = np.arange(acceptance.size)
    index[stuck] = donor
    return restart_chains(
        out,
        index,
        f"After a plateau of the Fisher phase (a funnel), chain(s) {stuck.tolist()} were "
        f"stuck at the end of the warm-up (acceptance {np.round(acceptance[stuck], 2).tolist()}"
        f" over {PROBE_TRANSITIONS} transitions at their tuned step): they start the "
        f"sampling phase from chain {donor}'s state, step and R. A non-centred "
        "parameterization removes the funnel.",
    )


def _to_median(steps: np.ndarray) -> np.ndarray:
    """Each chain's effective step over the chains' median: the chain nearest the median
    (the smallest ``|log ratio|``) is the donor of :func:`regroup_steps` and
    :func:`restart_stuck`."""
    return steps / np.median(steps)


def regroup_steps(warmup_out):
    """The warm-up's outcome (every chain's, after a plateau) with every chain whose
    effective step (:func:`effective_steps`) is more than :data:`STEP_OUTLIER_FACTOR` from
    the chains' median given the state (position included) and parameters of the chain
    nearest the median, with a :class:`~fisher_mala.checks.SamplingWarning`.

    In a funnel no one step suits every region: a chain whose step-size phase ran in the
    neck ends with a step hundreds of times smaller than the others' and then spends
    hundreds of gradients per draw in the mouth (or one tuned in the mouth never enters
    the neck). The warm-up's draws are not the run's and the parameters are fixed before
    the sampling phase, so restarting a chain there changes no stationary distribution.
    """
    steps = effective_steps(warmup_out[0][1])
    if steps is None or not np.all(np.isfinite(steps) & (steps > 0)):
        return warmup_out
    ratio = _to_median(steps)
    outliers = np.flatnonzero((ratio > STEP_OUTLIER_FACTOR) | (ratio < 1 / STEP_OUTLIER_FACTOR))
    if outliers.size == 0:
        return warmup_out
    donor = int(np.argmin(np.abs(np.log(ratio))))
    index = np.arange(steps.size)
    index[outliers] = donor
    return restart_chains(
        warmup_out,
        index,
        f"After a plateau of the Fisher phase (a funnel), chain(s) {outliers.tolist()} "
        f"ended the warm-up with a leapfrog step {np.round(ratio[outliers], 3).tolist()} "
        f"times the chains' median (in the target's units): they start the sampling "
        f"phase from chain {donor}'s state, step and R. A non-centred parameterization "
        "removes the funnel.",
    )


def restart_chains(out, index, message: str):
    """``((state, params), info)`` with every chain ``c`` given chain ``index[c]``'s state
    and parameters, and a :class:`~fisher_mala.checks.SamplingWarning` saying ``message``
    (the warm-up's chains restarted from others': no stationary distribution changes)."""
    from fisher_mala.checks import SamplingWarning

    warnings.warn(SamplingWarning(message), stacklevel=4)
    (state, params), info = out
    state, params = jax.tree.map(lambda a: a[index], (state, params))
    return (state, params), info
