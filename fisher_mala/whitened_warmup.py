"""Warm-up of Fisher NUTS and Fisher HMC: learn ``R``, then tune the leapfrog step (layer 4).

Compiled phases and choices on the host between them, within the user's ``num_warmup``:

1. **Fisher phase** (at most ``num_warmup - num_step_size_steps`` iterations):
   :func:`~fisher_mala.warmups.fisher_mala_warmup` with a fast start (a MALA phase with
   dual averaging of ``sigma^2`` and the secant scales of its proposals, which start
   ``R``: :mod:`~fisher_mala.adaptations.secant_scale`) and restart windows of 25, 50,
   100 and 200 iterations (the recursion restarts from its estimate after each), or the
   pooled one (one ``R`` for all chains, Algorithm 1's start,
   :func:`~fisher_mala.warmups.pooled_fisher_mala_warmup`) with ``pooled=True``. One
   gradient per iteration, ``O(d^2)`` per iteration. It runs in compiled blocks of 1000
   iterations, and the stopping rule (:meth:`FisherHMCWarmup.learned`) ends it at the
   first block whose signals agree with the ``R`` they were drawn with.
2. **Metric** (on the host, between the compiled phases): ``metric="auto"`` keeps the
   dense ``R``, or only its diagonal (:class:`~fisher_mala.whitened_hmc.DiagonalSqrt`,
   ``O(d)`` per leapfrog step) when the learned correlations are within sampling noise
   of none and the stopping rule found them taught by the signals
   (:meth:`FisherHMCWarmup.choose`). All chains get the same choice. Where the stopping
   rule cannot look, the metric is first looked at part-way through the Fisher phase,
   once ``16 d`` signals are in (:meth:`FisherHMCWarmup.first_fisher_iterations`); a
   diagonal there ends the Fisher phase, since the diagonal needs only the learned
   scales. Otherwise the phase runs to its end (the same chain as without the look) and
   the metric is chosen again.
3. **Step-size phase** (``num_step_size_steps``, default a tenth of the warm-up, shrunk
   in proportion when the Fisher phase ended early): ``R`` frozen, NUTS (or HMC) in
   whitened coordinates with the leapfrog step tuned by dual averaging (Hoffman and
   Gelman, 2014; BlackJAX's implementation) towards acceptance 0.8. It starts from
   FisherMALA's normalized step: one leapfrog step of size ``epsilon`` is MALA with
   ``sigma_R^2 = epsilon^2``. Halfway, ``R`` is widened along the directions where NUTS's
   draws show the posterior wider than its Fisher metric (a skewed or heavy-tailed
   direction; :mod:`~fisher_mala.geometric_widening`), and the step is tuned again; not
   in a funnel or after a plateau, nor pooled, low-rank, with ``score_prior_weight``, or
   where the half holds too few draws for ``d``.

The hand-over point matters: NUTS is only as good as ``R``, and ``R`` improves with the
number of Fisher iterations until it settles, which the stopping rule detects (the Fisher
NUTS page of the documentation has the measurements).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fisher_mala import validation
from fisher_mala.adaptations.dual_averaging import dual_averaging
from fisher_mala.adaptations.stopping_rule import PROBE_SIGNALS_PER_DIM, chains_behind
from fisher_mala.geometric_widening import widening_point
from fisher_mala.leapfrog_tuning import LeapfrogTuning, tuning_stage
from fisher_mala.progress import ProgressBar
from fisher_mala.pytree import ravel
from fisher_mala.schedule import extend_info
from fisher_mala.warmups import fisher_mala_warmup, pooled_fisher_mala_warmup
from fisher_mala.whitened_hmc import (
    TRAJECTORY_LENGTH,
    build_kernel,
    check_robust_uturn,
    inverse_mass_matrix,
    require_blackjax,
)
from fisher_mala.whitened_warmup_looks import HostLooks, restart_chains
from fisher_mala.whitened_warmup_parts import WarmupInParts

__all__ = [
    "FISHER_NUTS_DAMPING",
    "FISHER_NUTS_TARGET_ACCEPTANCE",
    "PLATEAU_TARGET_ACCEPTANCE",
    "FISHER_STEP_SIZE_LEARNING_RATE",
    "METRICS",
    "RESTART_WINDOWS",
    "FisherHMCWarmup",
    "FisherParameters",
    "fisher_adaptation",
    "regroup_chains",
    "robust_uturn_after",
    "STEP_SIZE_FRACTION",
]

#: Default share of the warm-up spent tuning the leapfrog step with ``R`` frozen.
STEP_SIZE_FRACTION = 0.1
#: Damping ``lambda`` of the Fisher phase (Algorithm 1 uses 10). The recursion estimates
#: ``A^{-1} = (1/n) (lambda I + sum_i s_i s_i^T)``, so after ``n`` iterations a direction of
#: posterior variance ``v`` is learned as ``v / (1 + v lambda / n)``: with ``lambda = 10``
#: and ``n = 4500`` a variance of 900 (``kilpisjarvi``'s slope-intercept ridge) comes out
#: three times too narrow, and NUTS pays for it in every trajectory. MALA is invariant to
#: the scale of ``A`` (Eq. (7)), NUTS is not, hence the smaller default here.
FISHER_NUTS_DAMPING = 0.1
#: Target of the step-size phase's dual averaging. Its final step is the average of the
#: iterates (Hoffman and Gelman; BlackJAX), and the acceptance rate falls faster above it
#: than it rises below, so the average realizes a higher acceptance than the target,
#: the more so the shorter the phase: 0.85 for a target of 0.8 after the 200 iterations
#: that follow a Fisher phase ended by the stopping rule. 0.7 realizes about 0.8, the
#: acceptance of Stan's and nutpie's samples (the signal-bias page has the measurements).
FISHER_NUTS_TARGET_ACCEPTANCE = 0.7
#: Target of the step-size phase after a Fisher phase that the stopping rule ended on a
#: plateau (:meth:`FisherHMCWarmup.look`): no one ``R`` whitens such a posterior
#: everywhere (a funnel, curvature that changes with position), and a step tuned to the
#: average acceptance overshoots where the curvature is highest, so that the trajectories
#: rarely enter the funnel's neck and the draws overestimate its scale. On the centred
#: eight schools 0.7 realizes 0.57 with 110 divergent transitions; 0.8 realizes 0.74 to
#: 0.77 with 8 in each of two seeds, and the draws miss the reference (max |z| 5.1 and
#: 7.1, tau too large); 0.9 realizes 0.85 with 4 and 3 and matches it (max |z| 2.4 and
#: 1.6), at 1.4 and 0.8 times nutpie's min ESS per gradient (``python -m
#: benchmarks.nutpie_race --inspect eight_schools_centered [--seed 1]``, with ``--set
#: hmc_target_acceptance_rate=0.8`` against the default). Stan's advice for funnels.
#: Not after a phase that ended still learning (``R`` not settled, too few signals for a
#: plateau): there 0.8 halves the min ESS per gradient of the paper's GP target (d = 100).
PLATEAU_TARGET_ACCEPTANCE = 0.9
#: Restart windows of the Fisher phase (doubling, as Stan's windows).
RESTART_WINDOWS = (25, 50, 100, 200)
#: ``rho`` of the Fisher phase's step-size rule: ``R`` changes by orders of magnitude in
#: the restart windows, and a chain thrown into a region where every proposal is rejected
#: (no signal, so ``R`` cannot help) waits for ``sigma^2`` to shrink: Algorithm 1's 0.015
#: (1% per iteration) makes that hundreds of iterations, 0.1 tens.
FISHER_STEP_SIZE_LEARNING_RATE = 0.1
#: ``metric`` of the warm-up: ``"auto"`` chooses after the Fisher phase (see
#: :meth:`FisherHMCWarmup.choose`).
METRICS = ("auto", "dense", "diagonal")


class FisherHMCWarmup(HostLooks, WarmupInParts):
    """Fisher phase, then dual averaging of the leapfrog step (module docstring).

    Parameters
    ----------
    logdensity_fn
        ``position -> log pi(position)``.
    algorithm
        ``"nuts"`` or ``"hmc"``.
    pooled
        Learn one ``R`` from all chains' signals (the warm-up is then run for all chains
        at once: ``run`` takes every chain).
    num_step_size_steps
        Iterations of the step-size phase (default ``STEP_SIZE_FRACTION`` of the
        warm-up).
    hmc_target_acceptance_rate
        Dual-averaging target. Default: :data:`FISHER_NUTS_TARGET_ACCEPTANCE` (0.7:
        realizes about 0.8 in the samples), or :data:`PLATEAU_TARGET_ACCEPTANCE` (0.9)
        when the stopping rule ended the Fisher phase on a plateau. A value given is used
        either way.
    max_num_doublings, num_integration_steps, divergence_threshold
        As in :func:`fisher_mala.whitened_hmc.as_top_level_api`.
    stopping_rule
        ``True`` (default): the Fisher phase ends early, at the first block of
        :attr:`block` iterations whose signals agree with the ``R`` learned before them
        within sampling noise (:meth:`learned`); ``num_warmup`` is then an upper bound.
        ``False``: the Fisher phase has its full length. Looks on the host, like
        ``metric="auto"``: under ``jit`` pass ``False`` (and a forced metric). The rule
        reads Proposition 4's running sum, so it does not apply (the phase runs in full)
        with a ``learning_rate`` schedule, the centred signal or ``score_prior_weight``.
    metric
        ``"auto"`` (default): after the Fisher phase, a diagonal ``R`` (the learned ``A``'s
        diagonal, ``O(d)`` per leapfrog step) when the learned correlations are within
        sampling noise of none (:meth:`choose`), else the dense ``R``; all chains get the
        same choice. ``"dense"`` or
        ``"diagonal"`` force the choice.
    regroup
        ``True`` (default): at the end of the Fisher phase of ``fm.sample``, a chain far
        below the others in log density (in a minor mode that MALA's local moves do not
        leave, or still on its way) restarts from another chain's state and ``R``, with a
        warning (:meth:`regroup`); after a Fisher phase that ended on a plateau (a
        funnel), a chain whose tuned step is far from the others'
        (:func:`~fisher_mala.whitened_warmup_looks.regroup_steps`) or that is stuck at it
        (:func:`~fisher_mala.whitened_warmup_looks.restart_stuck`) starts the sampling
        phase from another chain's. ``False``: every chain goes on from where it is (to
        let R-hat see a chain left in a minor mode).
    robust_uturn
        NUTS: ``True`` checks the U-turn criterion across subtrees too
        (:mod:`fisher_mala.robust_nuts`), in the step-size phase and the draws;
        ``False``: BlackJAX's criterion. ``"auto"`` (default): the checks, except after a
        Fisher phase the stopping rule ended on a plateau (:meth:`robust_for`).
    score_prior_weight
        ``None``: ``R`` is frozen after the Fisher phase. A number ``n0 > 0``: in the
        second half of the step-size phase ``R`` keeps learning from the scores at NUTS's
        draws (Eq. (11)'s signal, nearly independent draws), averaged with the Fisher
        phase's estimate weighted as ``n0 * d`` draws (Appendix B with
        ``gamma_k = 1 / (n0 d + k)``, after rescaling ``R`` to the target's scale).
    **fisher_options
        Options of the Fisher phase (``num_mala_steps``, ``damping`` (default
        :data:`FISHER_NUTS_DAMPING`), ``signal``, ``learning_rate``, ``initial_step_size``,
        ``rank``, ...). One ``R`` per chain, dense, starts fast by default
        (``fast_start=True``, ``restart_windows=``:data:`RESTART_WINDOWS`,
        ``step_size_learning_rate=``:data:`FISHER_STEP_SIZE_LEARNING_RATE`; pass
        ``fast_start=False, restart_windows=(), step_size_learning_rate=0.015`` for
        Algorithm 1's warm-up). With ``rank=k`` the Fisher phase learns the diagonal-plus-rank-k
        ``R`` of :mod:`fisher_mala.low_rank` and NUTS uses it as it is: the Fisher phase
        runs in full (no stopping rule) and ``metric`` is that ``R``.
    """

    def __init__(
        self,
        logdensity_fn: Callable,
        algorithm: str = "nuts",
        pooled: bool = False,
        num_step_size_steps: int | None = None,
        hmc_target_acceptance_rate=None,
        max_num_doublings: int = 10,
        num_integration_steps: int | None = None,
        divergence_threshold: float = 1000.0,
        score_prior_weight: float | None = None,
        metric: str = "auto",
        stopping_rule: bool = True,
        regroup: bool = True,
        robust_uturn: bool | str = "auto",
        **fisher_options,
    ):
        require_blackjax()
        check_robust_uturn(robust_uturn)
        validation.check_choice("metric", metric, METRICS)
        if score_prior_weight is not None and metric == "diagonal":
            raise ValueError("`score_prior_weight` learns a dense R; use metric='dense' or 'auto'.")
        if score_prior_weight is not None:
            validation.check_positive("score_prior_weight", score_prior_weight)
            if pooled:
                raise ValueError("`score_prior_weight` needs one R per chain (pooled=False).")
        if hmc_target_acceptance_rate is not None:
            validation.check_probability("hmc_target_acceptance_rate", hmc_target_acceptance_rate)
        if num_step_size_steps is not None and int(num_step_size_steps) < 0:
            raise ValueError(f"`num_step_size_steps` must be >= 0, got {num_step_size_steps}.")
        if num_integration_steps is not None and int(num_integration_steps) < 1:
            raise ValueError(f"`num_integration_steps` must be >= 1, got {num_integration_steps}.")
        if int(max_num_doublings) < 1:
            raise ValueError(f"`max_num_doublings` must be >= 1, got {max_num_doublings}.")
        if fisher_options.get("rank") is not None:
            # the low-rank R: no Proposition 4 running sum for the stopping rule to read,
            # no dense R for metric="auto" to look at, no pooled or keep-learning update
            for name, given in (("pooled", pooled), ("score_prior_weight", score_prior_weight),
                                ("metric='diagonal'", metric == "diagonal")):  # fmt: skip
                if given:
                    raise ValueError(f"`{name}` is not available with `rank`; drop one.")
            metric, stopping_rule = "dense", False
        self.logdensity_fn = logdensity_fn
        fisher_options.setdefault("damping", FISHER_NUTS_DAMPING)
        self.pooled = bool(pooled)
        self.batched = self.pooled
        # After the pooled Fisher phase every chain has its own state (with the shared R):
        # the step-size phase and the draws run per chain.
        self.per_chain_sampling = True
        self.fisher = _fisher_phase(logdensity_fn, self.pooled, fisher_options)
        self.num_step_size_steps = num_step_size_steps
        self.max_num_doublings = int(max_num_doublings)
        self.num_integration_steps = num_integration_steps
        self.algorithm = algorithm
        self.score_prior_weight = score_prior_weight
        self.metric = metric
        self.stopping_rule = bool(stopping_rule)
        self.regroup_chains = bool(regroup)
        self.fisher_options = fisher_options
        given = hmc_target_acceptance_rate
        self.target_acceptance = FISHER_NUTS_TARGET_ACCEPTANCE if given is None else float(given)
        self.plateau_target_acceptance = (
            PLATEAU_TARGET_ACCEPTANCE if given is None else float(given)
        )

        self.robust_uturn = robust_uturn

        def tuning(target, plateau):
            robust = self.robust_for(plateau)
            return LeapfrogTuning(
                build_kernel(
                    algorithm, divergence_threshold=divergence_threshold, robust_uturn=robust
                ),
                logdensity_fn,
                algorithm,
                dual_averaging(target),
                self.max_num_doublings,
                num_integration_steps,
                score_prior_weight,
            )

        self.tuning = tuning(self.target_acceptance, plateau=False)
        self.plateau_tuning = tuning(self.plateau_target_acceptance, plateau=True)
        #: The target the last warm-up run by this object aimed at (set by ``staged_run``
        #: and ``segmented_run``, read by ``fm.sample`` for its acceptance check).
        self.used_target_acceptance = self.target_acceptance
        #: Options of the sampling kernel the last warm-up chose (``fm.sample`` builds the
        #: draws' kernel with them): the U-turn criterion of its step-size phase.
        self.sampling_options = {"robust_uturn": self.robust_for(False)}

    @property
    def staged(self) -> bool:
        """Whether the warm-up runs in compiled parts with choices on the host between
        them (``metric="auto"`` or the stopping rule)."""
        return self.score_prior_weight is None and (self.metric == "auto" or self.rule_applies)

    @property
    def rule_applies(self) -> bool:
        """Whether the stopping rule is on (it needs Proposition 4's running sum)."""
        return (
            self.stopping_rule
            and self.score_prior_weight is None
            and self.fisher_options.get("learning_rate") is None
            and self.fisher_options.get("signal", "rao_blackwell") != "centered"
        )

    def split(self, num_steps: int) -> tuple[int, int]:
        """``(Fisher iterations, step-size iterations)`` of a warm-up of ``num_steps``."""
        tune = self.num_step_size_steps
        if tune is None:
            tune = round(STEP_SIZE_FRACTION * num_steps)
        tune = min(int(tune), num_steps)
        return num_steps - tune, tune

    def tuning_steps(self, num_steps: int, num_fisher_done: int, settled: bool = True) -> int:
        """Step-size iterations after a Fisher phase of ``num_fisher_done`` iterations.

        The planned share of the warm-up (:meth:`split`), shrunk in proportion when the
        Fisher phase ended early (``num_step_size_steps``, when given, is kept). Not shrunk
        when the chains have not ``settled`` (:meth:`settled`): a chain far below the others
        at the end of the Fisher phase is in a minor mode that MALA's local moves do not
        leave, or still on its way; NUTS's moves take it to the others, and the step size
        is then tuned where it samples.
        """
        num_fisher, num_tune = self.split(num_steps)
        if self.num_step_size_steps is not None or num_fisher_done >= num_fisher or not settled:
            return num_tune
        return round(num_tune * num_fisher_done / num_fisher)

    # The stages: the Fisher phase (compiled; with metric="auto" in two parts, with a
    # look at the metric in between), the choice of metric (on the host, from the learned
    # R of every chain, so that all chains sample with the same structure), and the
    # step-size phase (compiled for that structure). ``staged_run`` calls them in turn,
    # for ``run`` (one chain) and for ``fm.sample`` (each stage compiled for all chains).

    def first_fisher_iterations(self, num_fisher: int, dim: int, signals_per_iteration=1):
        """Iterations of the first part of a Fisher phase of ``num_fisher`` iterations.

        Where the stopping rule looks (:meth:`_rule_can_stop_at`): the phase's lead (the
        MALA phase and the restart windows), so that the first block's signals are
        compared with the ``R`` they were drawn with. Otherwise, with ``metric="auto"``,
        the metric is first looked at once the adaptive phase has absorbed
        :data:`PROBE_SIGNALS_PER_DIM` ``* d`` signals (rounded up to whole blocks of the
        adaptive phase, so that a phase run in two parts is the same chain as one run in
        one); a diagonal choice then ends the Fisher phase early. Otherwise, or when that
        point is not before the end, the whole phase.
        """
        if not self.staged:
            return num_fisher
        lead = min(self.fisher.num_lead_steps, num_fisher)
        if self._rule_can_stop_at(dim, signals_per_iteration):
            return lead
        if self.metric != "auto":
            return num_fisher
        block = self.fisher.block
        needed = -(-PROBE_SIGNALS_PER_DIM * dim // signals_per_iteration)
        return min(lead + block * -(-needed // block), num_fisher)

    def fisher_stage(self, rng_key, positions, num_steps: int, progress=None, evaluated=None):
        """The (first part of the) Fisher phase: ``((state, parameters), info)``, of one
        chain, or of all chains (one ``R``) when pooled. ``evaluated``: see
        :func:`~fisher_mala.schedule.run_schedule` (one chain)."""
        num_fisher, _ = self.split(num_steps)
        key_fisher, _ = jax.random.split(rng_key)
        flat = jax.vmap(ravel)(positions) if self.pooled else ravel(positions)[None]
        first = self.first_fisher_iterations(num_fisher, flat.shape[-1], flat.shape[0])
        return self.fisher.run(
            key_fisher, positions, num_fisher, progress, stop_after=first, evaluated=evaluated
        )

    def fisher_resume(self, rng_key, carry, num_steps: int, progress=None, num_more=0):
        """``num_more`` more Fisher iterations after :meth:`fisher_stage` (``carry`` is its
        ``(state, parameters)``; the info returned covers them only)."""
        num_fisher, _ = self.split(num_steps)
        key_fisher, _ = jax.random.split(rng_key)
        return self.fisher.resume(key_fisher, carry, num_fisher, progress, num_more)

    def fisher_complete(self, fisher_out, num_steps: int) -> bool:
        """Whether ``fisher_out`` has run the whole Fisher phase of the warm-up."""
        return fisher_out[1].acceptance_rate.shape[-1] >= self.split(num_steps)[0]

    def staged_run(self, call, positions, num_steps: int, on_host=None):
        """Run the stages in turn; ``call(method, argument, *extra)`` runs one stage.

        ``on_host(fn, *args)`` runs the host's choices (default: ``fn(*args)``; ``fm.sample``
        times them).

        The Fisher phase's first part, then the metric (:meth:`choose`). A diagonal
        metric ends the Fisher phase there: it needs only the learned scales, which many
        fewer signals than the dense ``R`` give. Otherwise the Fisher phase goes on one
        block at a time until the stopping rule (:meth:`look`) or its full length, then
        the metric again, and the step-size phase, in full when a chain is not yet in the
        typical set of the others (:meth:`tuning_steps`), towards the target of
        :meth:`tuning_target`.
        """
        on_host = on_host or (lambda fn, *args: fn(*args))
        out = call("fisher_stage", positions)
        looks = self._rule_can_stop(out[0][0])
        metric, learned, plateau = None, False, False
        if not looks:  # the metric's first look, where no stopping rule looks
            metric = on_host(self.choose, out[0][0])
        if looks or not (metric == "diagonal" and self.metric == "auto"):
            num_fisher, _ = self.split(num_steps)
            while not self.fisher_complete(out, num_steps):
                num_more = num_fisher - out[1].acceptance_rate.shape[-1]
                if looks:  # one block at a time, each looked at
                    num_more = min(self.fisher.block, num_more)
                carry, more = call("fisher_resume", out[0], num_more)
                verdict = looks and on_host(self.look, out[0][0], carry[0])
                learned, plateau = verdict == "settled", verdict == "plateau"
                out = (carry, extend_info(out[1], more))
                if verdict:
                    break
            metric = on_host(self.choose, out[0][0], learned if looks else None)
        out = on_host(self.regroup, out)
        unsettled = looks and not (learned or plateau)  # the Fisher phase ran its length
        out = on_host(self.share_after, out, plateau or self.shares_unsettled(unsettled))
        settled = on_host(self.settled, out[0][0])
        self.chose_after(plateau)
        out = call("tuning_stage", out, metric, settled, plateau)
        return self.after_tuning(call, out, plateau, on_host, unsettled=unsettled)

    def regroup(self, fisher_out):
        """The Fisher phase's outcome with the chains left behind restarted from others'
        states (:func:`regroup_chains`); unchanged with ``regroup=False`` or pooled."""
        if not self.regroup_chains or self.pooled:
            return fisher_out
        return regroup_chains(fisher_out)

    def robust_for(self, plateau: bool) -> bool:
        """:func:`robust_uturn_after` with this warm-up's ``robust_uturn``."""
        return robust_uturn_after(self.robust_uturn, plateau)

    def chose_after(self, plateau: bool) -> None:
        """Record what the step-size phase and the draws use after a Fisher phase that
        ended on a plateau or not (:attr:`used_target_acceptance`,
        :attr:`sampling_options`)."""
        self.used_target_acceptance = self.tuning_target(plateau)
        self.sampling_options = {"robust_uturn": self.robust_for(plateau)}

    def tuning_target(self, plateau: bool = False) -> float:
        """The step-size phase's target acceptance (see :meth:`tuning_for`)."""
        return self.plateau_target_acceptance if plateau else self.target_acceptance

    def tuning_for(self, plateau: bool = False):
        """The step-size phase's tuning: towards :attr:`target_acceptance`, or
        :attr:`plateau_target_acceptance` after a Fisher phase the stopping rule ended on
        a plateau (``plateau``)."""
        return self.plateau_tuning if plateau else self.tuning

    def tuning_stage(
        self,
        rng_key,
        fisher_out,
        num_steps: int,
        progress=None,
        metric="dense",
        settled=True,
        plateau=False,
    ):
        """The step-size phase after the Fisher phase, with ``metric``, of one chain or
        (pooled) of every chain (:func:`fisher_mala.leapfrog_tuning.tuning_stage`);
        ``settled``: see :meth:`tuning_steps`; ``plateau``: see :meth:`tuning_for`."""
        validation.check_choice("metric", metric, ("dense", "diagonal"))
        _, key_tune = jax.random.split(rng_key)
        num_fisher = fisher_out[1].acceptance_rate.shape[-1]
        num_tune = self.tuning_steps(num_steps, num_fisher, settled)
        tuning = self.tuning_for(plateau)
        widen_at = self.widen_at(num_tune, fisher_out[0][0], plateau)
        return tuning_stage(
            tuning, key_tune, fisher_out, num_tune, progress, metric, self.pooled, widen_at
        )

    def widen_at(self, num_tune: int, fisher_state, plateau: bool = False):
        """The step-size iteration after which ``R`` is widened
        (:mod:`~fisher_mala.geometric_widening`), or None: not after a plateau (no one
        ``R`` fits it, and widening would starve its narrow end), nor with
        ``score_prior_weight``, nor where :func:`~fisher_mala.geometric_widening.
        widening_point` says no (pooled, low-rank, large ``d``, a short phase)."""
        if plateau or self.score_prior_weight is not None:
            return None
        dim = fisher_state.whitened_grad.shape[-1]
        return widening_point(num_tune, dim, fisher_state.sqrt_precond, self.pooled)

    def run(self, rng_key, positions, num_steps: int, progress: ProgressBar | None = None):
        """Warm up one chain (or, pooled, all chains: leading axis of ``positions``);
        returns ``(state, parameters), info``.

        With ``metric="auto"`` or the stopping rule (the defaults) the looks at ``R`` need
        concrete values: call it outside ``jit``, as BlackJAX's
        ``window_adaptation(...).run``, or pass a forced ``metric`` and
        ``stopping_rule=False``.
        """

        def call(method, argument, *extra):
            return getattr(self, method)(rng_key, argument, num_steps, progress, *extra)

        return self.staged_run(call, positions, num_steps)


def robust_uturn_after(robust_uturn, plateau: bool) -> bool:
    """Whether NUTS checks the U-turn criterion across subtrees after a Fisher phase that
    ended on a plateau (``plateau``) or not: ``robust_uturn`` itself, or for ``"auto"``,
    not after a plateau. There the curvature changes with position (a funnel) and no ``R``
    whitens the posterior everywhere: in the neck the stiff coordinates oscillate many
    times per move of the slow one, the checks across subtrees see those turns and stop
    trajectories that BlackJAX's criterion lets run on along the slow direction (the
    centred eight schools, three seeds: 0.84, 0.53 and 0.20 of nutpie's min ESS per
    gradient with the checks, 1.40, 0.79 and 0.79 without, ``docs/signal_bias.md``).
    Elsewhere the checks cut the resonances of BlackJAX's criterion
    (``docs/fisher_nuts.md``)."""
    if robust_uturn == "auto":
        return not plateau
    return bool(robust_uturn)


def _fisher_phase(logdensity_fn, pooled: bool, fisher_options: dict):
    """The Fisher phase's warm-up, with Fisher NUTS's defaults filled into
    ``fisher_options``: the fast start and restart windows (one ``R`` per chain, dense),
    and the step-size rule's ``rho``."""
    if pooled or fisher_options.get("rank") is not None:
        for name in ("fast_start", "restart_windows"):
            if fisher_options.get(name):
                raise ValueError(f"`{name}` is not available with `pooled` or `rank`.")
            fisher_options.pop(name, None)
    if pooled:
        return pooled_fisher_mala_warmup(logdensity_fn, **fisher_options)
    if fisher_options.get("rank") is None:
        fisher_options.setdefault("fast_start", True)
        fisher_options.setdefault("restart_windows", RESTART_WINDOWS)
        fisher_options.setdefault("step_size_learning_rate", FISHER_STEP_SIZE_LEARNING_RATE)
    return fisher_mala_warmup(logdensity_fn, **fisher_options)


def regroup_chains(fisher_out):
    """The Fisher phase's outcome (every chain's) with every chain that is behind the
    others (:func:`~fisher_mala.adaptations.stopping_rule.chains_behind`: in a minor mode
    that MALA's local moves do not leave, or still on its way) restarted from the state and
    ``R`` of a chain that is not, with a :class:`~fisher_mala.checks.SamplingWarning`
    naming them. The warm-up's draws are not the run's, so this changes no stationary
    distribution; the sampling phase's chains are independent again after the step-size
    phase. One chain or under ``jit``: unchanged."""
    state = fisher_out[0][0]
    logdensity = state.logdensity
    if np.ndim(logdensity) != 1 or not validation.is_concrete(logdensity):
        return fisher_out
    behind = chains_behind(logdensity, np.shape(state.whitened_grad)[-1])
    if behind.size == 0 or behind.size == np.size(logdensity):
        return fisher_out
    values = np.asarray(logdensity, np.float64)
    donors = [c for c in np.argsort(-values) if c not in set(behind)]
    index = np.arange(values.size)
    index[behind] = [donors[k % len(donors)] for k in range(behind.size)]
    return restart_chains(
        fisher_out,
        index,
        f"At the end of the Fisher phase chain(s) {behind.tolist()} were far below the "
        f"others in log density ({np.round(values[behind], 1).tolist()} against "
        f"{values.max():.1f}): a minor mode or a slow start. They restart the "
        f"step-size phase from chain(s) {index[behind].tolist()}'s state and R; if "
        "the target has separate modes of real mass, sample them with separate runs.",
    )


class FisherParameters(dict):
    """The keyword arguments of a BlackJAX kernel, plus the learned square root.

    ``blackjax.nuts(logdensity_fn, **parameters)`` receives ``step_size`` and
    ``inverse_mass_matrix = R R^T`` (and any extra parameters given to
    :func:`fisher_adaptation`); ``parameters.sqrt_precond`` is ``R`` itself, an attribute
    so that ``**parameters`` stays what BlackJAX's kernels accept.
    """

    def __init__(self, sqrt_precond, **kwargs):
        super().__init__(**kwargs)
        self.sqrt_precond = sqrt_precond


def fisher_adaptation(
    algorithm,
    logdensity_fn: Callable,
    pooled: bool = False,
    **options,
):
    """Fisher warm-up for BlackJAX's NUTS or HMC, in the shape of ``window_adaptation``.

    ::

        (state, parameters), info = fm.fisher_adaptation(blackjax.nuts, logdensity_fn).run(
            key, x0, 3000)
        nuts = blackjax.nuts(logdensity_fn, **parameters)     # inverse_mass_matrix = R R^T
        fast = fm.fisher_nuts(logdensity_fn, parameters["step_size"], parameters.sqrt_precond)

    The warm-up is :class:`FisherHMCWarmup` (Fisher phase, then dual averaging of the
    leapfrog step in whitened coordinates, which is the same step as BlackJAX's with
    ``inverse_mass_matrix = R R^T``). ``blackjax.nuts`` with that dense matrix factorizes
    it once (``O(d^3)``) and solves with it at every momentum draw;
    :func:`fisher_mala.fisher_nuts` with ``parameters.sqrt_precond`` never does.

    Parameters
    ----------
    algorithm
        ``blackjax.nuts`` or ``blackjax.hmc``.
    logdensity_fn
        ``position -> log pi(position)``.
    pooled
        Not available here (one chain per ``run``); use ``fm.sample(..., pooled=True)``.
    **options
        Options of :class:`FisherHMCWarmup` (e.g. ``num_step_size_steps``,
        ``num_mala_steps``); for ``blackjax.hmc``, ``num_integration_steps`` is also
        returned in ``parameters``.

    Returns
    -------
    AdaptationAlgorithm
        ``run(rng_key, position, num_steps) -> ((state, parameters), info)``: ``state``
        is the BlackJAX kernel's state at the last warm-up position, ``parameters`` a
        :class:`FisherParameters`, ``info`` the :class:`~fisher_mala.schedule.WarmupInfo`.
    """
    from fisher_mala.base import AdaptationAlgorithm

    blackjax = require_blackjax()
    names = {id(blackjax.nuts): "nuts", id(blackjax.hmc): "hmc"}
    if id(algorithm) not in names:
        raise ValueError(
            "`fisher_adaptation` tunes blackjax.nuts or blackjax.hmc; for another BlackJAX "
            "kernel, sample in whitened coordinates with fm.whiten (see the Fisher NUTS page)."
        )
    if pooled:
        raise ValueError("Use fm.sample(..., pooled=True) to pool R over chains.")
    kind = names[id(algorithm)]
    warmup = FisherHMCWarmup(logdensity_fn, kind, **options)

    def run(rng_key, position, num_steps: int = 1000):
        if isinstance(num_steps, bool) or not isinstance(num_steps, int | np.integer):
            raise TypeError(f"`num_steps` must be an integer, got {num_steps!r}.")
        if num_steps < 1:
            raise ValueError(
                f"`num_steps` must be >= 1, got {num_steps}: the warm-up needs iterations to "
                "learn R and the step size (BlackJAX's window_adaptation uses 1000)."
            )
        (state, params), info = warmup.run(rng_key, position, num_steps)
        r = params.sqrt_precond
        extra = {}
        if kind == "hmc":
            steps = warmup.num_integration_steps
            if steps is None:
                steps = int(jnp.maximum(jnp.ceil(TRAJECTORY_LENGTH / params.step_size), 1))
            extra["num_integration_steps"] = steps
        parameters = FisherParameters(
            r, step_size=params.step_size, inverse_mass_matrix=inverse_mass_matrix(r), **extra
        )
        bj_state = algorithm.init(state.position, logdensity_fn)
        return (bj_state, parameters), info

    return AdaptationAlgorithm(run)


def __getattr__(name):
    """``DAMPING``, the old name of :data:`FISHER_NUTS_DAMPING` (one release)."""
    if name == "DAMPING":
        import warnings

        warnings.warn(
            "`whitened_warmup.DAMPING` is now `FISHER_NUTS_DAMPING` (Algorithm 1's damping, "
            "10, is `fisher_mala.adaptations.fisher.DAMPING`).",
            DeprecationWarning,
            stacklevel=2,
        )
        return FISHER_NUTS_DAMPING
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
