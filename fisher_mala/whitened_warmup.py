"""Warm-up of Fisher NUTS and Fisher HMC: learn ``R``, then tune the leapfrog step (layer 4).

Compiled phases and choices on the host between them, within the user's ``num_warmup``:

1. **Fisher phase** (at most ``num_warmup - num_step_size_steps`` iterations): Algorithm
   1's warm-up (:class:`~fisher_mala.adaptation.FisherMALAWarmup`: step-size search, MALA
   phase, adaptive FisherMALA), or the pooled one (one ``R`` for all chains,
   :class:`~fisher_mala.baseline_warmups.PooledFisherMALAWarmup`) with ``pooled=True``.
   One gradient per iteration, ``O(d^2)`` per iteration. It runs in compiled blocks of
   1000 iterations, and the stopping rule (:meth:`FisherHMCWarmup.learned`) ends it at
   the first block whose signals agree with the ``R`` learned before them.
2. **Metric** (on the host, between the compiled phases): ``metric="auto"`` keeps the
   dense ``R``, or only its diagonal (:class:`~fisher_mala.whitened_hmc.DiagonalSqrt`,
   ``O(d)`` per leapfrog step) when the learned correlations are within sampling noise
   of none (:meth:`FisherHMCWarmup.choose`). All chains get the same choice. It is first
   looked at part-way through the Fisher phase, once ``16 d`` signals are in
   (:meth:`FisherHMCWarmup.first_fisher_iterations`); a diagonal there ends the Fisher
   phase, since the diagonal needs only the learned scales. Otherwise the phase runs to
   its end (the same chain as without the look) and the metric is chosen again.
3. **Step-size phase** (``num_step_size_steps``, default a tenth of the warm-up, shrunk
   in proportion when the Fisher phase ended early): ``R`` frozen, NUTS (or HMC) in
   whitened coordinates with the leapfrog step tuned by dual averaging (Hoffman and
   Gelman, 2014; BlackJAX's implementation) towards acceptance 0.8. It starts from
   FisherMALA's normalized step: one leapfrog step of size ``epsilon`` is MALA with
   ``sigma_R^2 = epsilon^2``.

The hand-over point matters: NUTS is only as good as ``R``, and ``R`` improves with the
number of Fisher iterations until it settles, which the stopping rule detects (the Fisher
NUTS page of the documentation has the measurements).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fisher_mala import validation
from fisher_mala.adaptation import FisherMALAWarmup, WarmupInfo, WarmupParameters, extend_info
from fisher_mala.baseline_warmups import PooledFisherMALAWarmup
from fisher_mala.progress import ProgressBar, scan_with_progress
from fisher_mala.pytree import ravel
from fisher_mala.sqrt_precond import rank_one_update, whitened_product
from fisher_mala.whitened_hmc import (
    NUTS_TARGET_ACCEPTANCE,
    TRAJECTORY_LENGTH,
    DiagonalSqrt,
    FisherHMCState,
    build_kernel,
    inverse_mass_matrix,
    require_blackjax,
    whiten_gradient,
)

__all__ = [
    "AUTO_MAX_DIM",
    "DAMPING",
    "DIAGONAL_NOISE_FACTOR",
    "METRICS",
    "PROBE_SIGNALS_PER_DIM",
    "LEARNED_NOISE_FACTOR",
    "block_condition_number",
    "correlation_condition_number",
    "diagonal_suffices",
    "noise_condition_number",
    "FisherHMCWarmup",
    "FisherParameters",
    "fisher_adaptation",
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
DAMPING = 0.1
#: ``metric`` of the warm-up: ``"auto"`` chooses after the Fisher phase (see
#: :meth:`FisherHMCWarmup.choose`).
METRICS = ("auto", "dense", "diagonal")
#: ``metric="auto"`` picks a diagonal ``R`` when the learned correlation matrix's condition
#: number is at most this factor times the one sampling noise alone would give
#: (:func:`noise_condition_number`). The dense ``R`` carries the same noise, so below the
#: bound the diagonal metric is as good; NUTS's cost grows like the square root of the
#: whitened target's condition number, so at the bound it would cost at most
#: ``sqrt(2) = 1.4`` times more leapfrog steps, each ``O(d)`` instead of ``O(d^2)``.
DIAGONAL_NOISE_FACTOR = 2.0
#: Above this dimension ``metric="auto"`` keeps the dense ``R`` without checking (the check
#: is one ``O(d^3)`` eigendecomposition on the host, less than the ``O(d^2)`` Fisher phase
#: costs below it).
AUTO_MAX_DIM = 4096
#: With ``metric="auto"`` the metric is first looked at after this many signals per
#: dimension (:meth:`FisherHMCWarmup.first_fisher_iterations`). With ``n = 16 d`` the noise
#: bound is ``2 ((1 + 1/4) / (1 - 1/4))^2 = 5.6`` (:func:`noise_condition_number`); the
#: scales of a diagonal ``A`` are learned to a relative error of about ``sqrt(2 / n)``,
#: under 5% with the at least 1000 signals of one block of the adaptive phase.
PROBE_SIGNALS_PER_DIM = 16
#: The stopping rule (:meth:`FisherHMCWarmup.learned`) ends the Fisher phase when the
#: newest block's whitened signals have a condition number within this factor of sampling
#: noise's. Measured on the race's targets (``python -m benchmarks.stopping_rule``): 0.9
#: to 1.7 once ``R`` has settled, 2.3 to ``10^7`` before.
LEARNED_NOISE_FACTOR = 2.0


class FisherHMCWarmup:
    """Fisher phase, then dual averaging of the leapfrog step (module docstring).

    Parameters
    ----------
    logdensity_fn
        ``position -> log pi(position)``.
    algorithm
        ``"nuts"`` or ``"hmc"``.
    pooled
        Learn one ``R`` from all chains' signals (the warm-up is then run for all chains
        at once: ``run_batch``).
    num_step_size_steps
        Iterations of the step-size phase (default ``STEP_SIZE_FRACTION`` of the
        warm-up).
    hmc_target_acceptance_rate
        Dual-averaging target (0.8).
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
    score_prior_weight
        ``None``: ``R`` is frozen after the Fisher phase. A number ``n0 > 0``: in the
        second half of the step-size phase ``R`` keeps learning from the scores at NUTS's
        draws (Eq. (11)'s signal, nearly independent draws), averaged with the Fisher
        phase's estimate weighted as ``n0 * d`` draws (Appendix B with
        ``gamma_k = 1 / (n0 d + k)``, after rescaling ``R`` to the target's scale).
    **fisher_options
        Options of the Fisher phase (``num_mala_steps``, ``damping`` (default
        :data:`DAMPING`), ``signal``, ``learning_rate``, ``initial_step_size``, ...).
    """

    def __init__(
        self,
        logdensity_fn: Callable,
        algorithm: str = "nuts",
        pooled: bool = False,
        num_step_size_steps: int | None = None,
        hmc_target_acceptance_rate=NUTS_TARGET_ACCEPTANCE,
        max_num_doublings: int = 10,
        num_integration_steps: int | None = None,
        divergence_threshold: float = 1000.0,
        score_prior_weight: float | None = None,
        metric: str = "auto",
        stopping_rule: bool = True,
        **fisher_options,
    ):
        require_blackjax()
        validation.check_choice("metric", metric, METRICS)
        if score_prior_weight is not None and metric == "diagonal":
            raise ValueError("`score_prior_weight` learns a dense R; use metric='dense' or 'auto'.")
        if score_prior_weight is not None:
            validation.check_positive("score_prior_weight", score_prior_weight)
            if pooled:
                raise ValueError("`score_prior_weight` needs one R per chain (pooled=False).")
        validation.check_probability("hmc_target_acceptance_rate", hmc_target_acceptance_rate)
        if num_step_size_steps is not None and int(num_step_size_steps) < 0:
            raise ValueError(f"`num_step_size_steps` must be >= 0, got {num_step_size_steps}.")
        if num_integration_steps is not None and int(num_integration_steps) < 1:
            raise ValueError(f"`num_integration_steps` must be >= 1, got {num_integration_steps}.")
        if int(max_num_doublings) < 1:
            raise ValueError(f"`max_num_doublings` must be >= 1, got {max_num_doublings}.")
        self.logdensity_fn = logdensity_fn
        fisher_options.setdefault("damping", DAMPING)
        self.pooled = bool(pooled)
        self.batched = self.pooled
        # After the pooled Fisher phase every chain has its own state (with the shared R):
        # the step-size phase and the draws run per chain.
        self.per_chain_sampling = True
        if self.pooled:
            self.fisher = PooledFisherMALAWarmup(logdensity_fn, **fisher_options)
        else:
            self.fisher = FisherMALAWarmup(logdensity_fn, **fisher_options)
        self.num_step_size_steps = num_step_size_steps
        self.max_num_doublings = int(max_num_doublings)
        self.num_integration_steps = num_integration_steps
        self.algorithm = algorithm
        self.score_prior_weight = score_prior_weight
        self.metric = metric
        self.stopping_rule = bool(stopping_rule)
        self.fisher_options = fisher_options
        blackjax = require_blackjax()
        self.target_acceptance = float(hmc_target_acceptance_rate)
        self.dual_averaging = blackjax.adaptation.step_size.dual_averaging_adaptation(
            hmc_target_acceptance_rate
        )
        self.kernel = build_kernel(algorithm, divergence_threshold=divergence_threshold)

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

    def tuning_steps(self, num_steps: int, num_fisher_done: int) -> int:
        """Step-size iterations after a Fisher phase of ``num_fisher_done`` iterations.

        The planned share of the warm-up (:meth:`split`), shrunk in proportion when the
        Fisher phase ended early (``num_step_size_steps``, when given, is kept).
        """
        num_fisher, num_tune = self.split(num_steps)
        if self.num_step_size_steps is not None or num_fisher_done >= num_fisher:
            return num_tune
        return round(num_tune * num_fisher_done / num_fisher)

    def _tune_step_size(self, rng_key, state, initial_step, num_steps, offset, progress):
        """Dual averaging of the leapfrog step for one chain (and, optionally, more learning).

        Returns the state, the tuned step, the per-iteration info and the mean of
        ``|R^T g|^2`` over the last visited states, which gives the scale of the whitened
        target (:meth:`_normalize`).
        """
        da_init, _, da_final = self.dual_averaging
        da = da_init(initial_step)
        if self.score_prior_weight is None or num_steps < 2:
            state, da, info, mean_sq = self._dual_averaging(
                rng_key, state, da, num_steps, offset, progress, None
            )
        else:
            first = num_steps // 2
            key_first, key_second = jax.random.split(rng_key)
            state, da, info_first, mean_sq = self._dual_averaging(
                key_first, state, da, first, offset, progress, None
            )
            state, k = self._normalize(state, mean_sq)
            shift = jnp.log(k).astype(da.log_step_size.dtype)
            da = da._replace(
                log_step_size=da.log_step_size - shift,
                log_step_size_avg=da.log_step_size_avg - shift,
                mu=da.mu - shift,
            )
            prior = self.score_prior_weight * state.whitened_grad.shape[-1]
            state, da, info_second, mean_sq = self._dual_averaging(
                key_second, state, da, num_steps - first, offset + first, progress, prior
            )
            info = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), info_first, info_second)
        step = da_final(da) if num_steps else initial_step
        return state, jnp.asarray(step, initial_step.dtype), info, mean_sq

    def _dual_averaging(self, rng_key, state, da, num_steps, offset, progress, prior_weight):
        """``num_steps`` NUTS / HMC transitions with dual averaging of the leapfrog step.

        HMC's number of leapfrog steps follows the running estimate of the whitened
        target's scale, so that its trajectories last ``TRAJECTORY_LENGTH`` in units of the
        target's spread. With ``prior_weight``, ``R`` also absorbs the score at every draw
        (:class:`FisherHMCWarmup`'s ``score_prior_weight``).
        """
        _, da_update, _ = self.dual_averaging
        dim = state.whitened_grad.shape[-1]
        dtype = state.whitened_grad.dtype

        def learn(state, k):
            # A_k^{-1} = (1 - gamma) A_{k-1}^{-1} + gamma s s^T, gamma = 1 / (prior + k)
            gamma = (1.0 / (prior_weight + k)).astype(dtype)
            made = rank_one_update(
                state.sqrt_precond,
                jnp.zeros((), dtype),  # the trace is not used by NUTS
                state.whitened_grad,
                1.0 / jnp.sqrt(1.0 - gamma),
                (1.0 - gamma) / gamma,
            )
            return state._replace(
                sqrt_precond=made.sqrt_precond,
                whitened_grad=whitened_product(made, state.whitened_grad),
            )

        def body(carry, iteration):
            state, da, sum_sq, count = carry
            step = jnp.exp(da.log_step_size).astype(dtype)
            steps = self.num_integration_steps
            if steps is None and self.algorithm == "hmc":
                length = TRAJECTORY_LENGTH * jnp.sqrt(dim * count / sum_sq)
                steps = jnp.clip(jnp.ceil(length / step), 1, 2**self.max_num_doublings)
                steps = steps.astype(jnp.int32)
            key = jax.random.fold_in(rng_key, iteration)
            state, info = self.kernel(
                key, state, self.logdensity_fn, step, steps, self.max_num_doublings
            )
            sum_sq = sum_sq + jnp.sum(state.whitened_grad**2)
            if prior_weight is not None:
                state = learn(state, count)
            return (state, da_update(da, info.acceptance_rate), sum_sq, count + 1), info

        start = (state, da, jnp.sum(state.whitened_grad**2), jnp.ones((), dtype))
        (state, da, sum_sq, count), info = scan_with_progress(
            body, start, num_steps, offset, progress
        )
        return state, da, info, sum_sq / count

    @staticmethod
    def _initial_leapfrog_step(fstate, dim):
        # MALA with normalized step sigma_R^2 is one leapfrog step of size sqrt(sigma_R^2)
        return jnp.sqrt(fstate.step_size * dim / fstate.trace_precond)

    @staticmethod
    def _normalize(state, mean_sq_grad):
        """Rescale ``R`` so that the whitened target has unit scale.

        For a target with covariance ``c I`` in whitened coordinates,
        ``E |grad_u log pi|^2 = d / c`` (Fisher's identity), so ``R <- sqrt(c) R`` makes
        ``A = R R^T`` an estimate of the covariance itself rather than of the
        un-normalized Eq. (11) matrix. Returns the state (its whitened gradient multiplied by
        ``k = sqrt(c)`` too) and ``k``; the caller divides the leapfrog step by ``k``, so the
        chain is unchanged.
        """
        dim = state.whitened_grad.shape[-1]
        k = jnp.sqrt(dim / mean_sq_grad)
        state = state._replace(
            sqrt_precond=_scale_sqrt(state.sqrt_precond, k),
            whitened_grad=state.whitened_grad * k[..., None],
        )
        return state, k

    def _finish(self, finfo, info, step, sqrt_precond):
        merged = WarmupInfo(
            acceptance_rate=jnp.concatenate([finfo.acceptance_rate, info.acceptance_rate], -1),
            is_accepted=jnp.concatenate([finfo.is_accepted, info.is_accepted], -1),
            proposal_is_finite=jnp.concatenate(
                [finfo.proposal_is_finite, info.proposal_is_finite], -1
            ),
            initial_step_size=finfo.initial_step_size,
            num_grad_evals=finfo.num_grad_evals + jnp.sum(info.num_integration_steps, -1),
            trace=finfo.trace,
        )
        return WarmupParameters(step, sqrt_precond), merged

    # The stages: the Fisher phase (compiled; with metric="auto" in two parts, with a
    # look at the metric in between), the choice of metric (on the host, from the learned
    # R of every chain, so that all chains sample with the same structure), and the
    # step-size phase (compiled for that structure). ``staged_run`` calls them in turn,
    # for ``run`` (one chain) and for ``fm.sample`` (each stage compiled for all chains).

    def first_fisher_iterations(self, num_fisher: int, dim: int, signals_per_iteration=1):
        """Iterations of the first part of a Fisher phase of ``num_fisher`` iterations.

        With ``metric="auto"`` the metric is first looked at once the adaptive phase has
        absorbed :data:`PROBE_SIGNALS_PER_DIM` ``* d`` signals (rounded up to whole blocks
        of the adaptive phase, so that a phase run in two parts is the same chain as one
        run in one); a diagonal choice then ends the Fisher phase early. Otherwise, or
        when that point is not before the end, the whole phase.
        """
        if not self.staged:
            return num_fisher
        num_mala = min(self.fisher.num_mala_steps, num_fisher)
        if self.metric != "auto":  # only the stopping rule: its first look after one block
            return min(num_mala + self.fisher.block, num_fisher)
        block = self.fisher.block
        needed = -(-PROBE_SIGNALS_PER_DIM * dim // signals_per_iteration)
        return min(num_mala + block * -(-needed // block), num_fisher)

    def fisher_stage(self, rng_key, position, num_steps: int, progress=None):
        """The (first part of the) Fisher phase of one chain: ``((state, parameters), info)``."""
        num_fisher, _ = self.split(num_steps)
        key_fisher, _ = jax.random.split(rng_key)
        first = self.first_fisher_iterations(num_fisher, ravel(position).shape[-1])
        return self.fisher.run(key_fisher, position, num_fisher, progress, stop_after=first)

    def fisher_stage_batch(self, rng_key, positions, num_steps: int, progress=None):
        """The pooled Fisher phase of all chains (one ``R``), or its first part."""
        num_fisher, _ = self.split(num_steps)
        key_fisher, _ = jax.random.split(rng_key)
        num_chains, dim = jax.vmap(ravel)(positions).shape
        first = self.first_fisher_iterations(num_fisher, dim, num_chains)
        return self.fisher.run_batch(key_fisher, positions, num_fisher, progress, first)

    def fisher_resume(self, rng_key, carry, num_steps: int, progress=None, num_more=0):
        """``num_more`` more Fisher iterations of one chain after :meth:`fisher_stage`
        (``carry`` is its ``(state, parameters)``; the info returned covers them only)."""
        num_fisher, _ = self.split(num_steps)
        key_fisher, _ = jax.random.split(rng_key)
        return self.fisher.resume(key_fisher, carry, num_fisher, progress, num_more)

    def fisher_resume_batch(self, rng_key, carry, num_steps: int, progress=None, num_more=0):
        """``num_more`` more pooled Fisher iterations after :meth:`fisher_stage_batch`."""
        num_fisher, _ = self.split(num_steps)
        key_fisher, _ = jax.random.split(rng_key)
        return self.fisher.resume_batch(key_fisher, carry, num_fisher, progress, num_more)

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
        block at a time until the stopping rule (:meth:`learned`) or its full length, then
        the metric again, and the step-size phase.
        """
        on_host = on_host or (lambda fn, *args: fn(*args))
        out = call("fisher_stage", positions)
        metric = on_host(self.choose, out[0][0])
        if metric == "diagonal" and self.metric == "auto":
            return call("tuning_stage", out, metric)
        num_fisher, _ = self.split(num_steps)
        looks = self._rule_can_stop(out[0][0])
        while not self.fisher_complete(out, num_steps):
            num_more = num_fisher - out[1].acceptance_rate.shape[-1]
            if looks:  # one block at a time, each looked at
                num_more = min(self.fisher.block, num_more)
            carry, more = call("fisher_resume", out[0], num_more)
            learned = looks and on_host(self.learned, out[0][0], carry[0])
            out = (carry, extend_info(out[1], more))
            if learned:
                break
        metric = on_host(self.choose, out[0][0])
        return call("tuning_stage", out, metric)

    def _rule_can_stop(self, state) -> bool:
        """Whether the stopping rule is on and a block has the ``4 d`` signals it needs."""
        dim = np.shape(state.sqrt_precond)[-1]
        per_block = self.fisher.block * (np.shape(state.whitened_grad)[0] if self.pooled else 1)
        return self.rule_applies and dim <= AUTO_MAX_DIM and 4 * dim <= per_block

    def learned(self, previous, state) -> bool:
        """Whether the Fisher phase may stop: the stopping rule (``stopping_rule=True``).

        Proposition 4 learns the un-normalized Fisher matrix
        ``F_n = (R_n R_n^T)^{-1} = lambda I + sum_{i <= n} s_i s_i^T``, so the signals
        absorbed between ``previous`` and ``state`` alone, whitened by the earlier ``R``,
        sum to ``M = X^T X - I`` with ``X = R_now^{-1} R_prev``. Were the earlier ``R``
        already right, ``M``'s condition number would be sampling noise, about the
        Marchenko-Pastur ratio for that many signals (:func:`noise_condition_number`). The
        rule: within :data:`LEARNED_NOISE_FACTOR` of it on every chain. Unlike the change
        of the running average, which shrinks with the iteration count whether or not
        ``R`` is right, ``M`` compares the newest signals with the estimate before them.
        Runs on the host, ``O(d^3)`` per chain.
        """
        if not self.rule_applies:
            return False
        r_prev, r_now = previous.sqrt_precond, state.sqrt_precond
        if not validation.is_concrete((r_prev, r_now)):
            raise ValueError(
                "The stopping rule looks at R on the host between compiled parts of the "
                "Fisher phase; under jit pass stopping_rule=False."
            )
        num_signals = np.asarray(state.count, np.float64) - np.asarray(previous.count)
        if self.pooled:  # one rank-C update per iteration
            num_signals = num_signals * np.shape(state.whitened_grad)[0]
        dim = np.shape(r_now)[-1]
        if dim > AUTO_MAX_DIM:
            return False
        noise = noise_condition_number(dim, np.min(num_signals))
        kappa = block_condition_number(r_prev, r_now)
        return bool(np.isfinite(noise) and np.all(kappa <= LEARNED_NOISE_FACTOR * noise))

    def choose(self, fisher_state) -> str:
        """``"dense"`` or ``"diagonal"``, from the Fisher phase's final state (every chain's).

        With ``metric="auto"``: diagonal when, for every chain, the correlation matrix of
        the learned ``A = R R^T`` is as close to the identity as sampling noise allows
        (:func:`diagonal_suffices`): the posterior is then close to independent, and a
        dense ``R`` would only add ``O(d^2)`` per leapfrog step. Otherwise dense. Runs on
        the host (one ``O(d^3)`` eigendecomposition per chain, skipped above
        :data:`AUTO_MAX_DIM`).
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
        return "diagonal" if diagonal_suffices(r, num_signals) else "dense"

    def tuning_stage(self, rng_key, fisher_out, num_steps: int, progress=None, metric="dense"):
        """The step-size phase of one chain after its Fisher phase, with ``metric``."""
        validation.check_choice("metric", metric, ("dense", "diagonal"))
        _, key_tune = jax.random.split(rng_key)
        (fstate, _), finfo = fisher_out
        num_fisher = finfo.acceptance_rate.shape[-1]
        num_tune = self.tuning_steps(num_steps, num_fisher)
        state = _hand_over(fstate, metric, ravel(fstate.logdensity_grad))
        initial = self._initial_leapfrog_step(fstate, fstate.whitened_grad.shape[-1])
        state, step, info, mean_sq = self._tune_step_size(
            key_tune, state, initial, num_tune, num_fisher, progress
        )
        state, k = self._normalize(state, mean_sq)
        step = step / k
        params, merged = self._finish(finfo, info, step, state.sqrt_precond)
        return (state, params), merged

    def tuning_stage_batch(
        self, rng_key, fisher_out, num_steps: int, progress=None, metric="dense"
    ):
        """The step-size phase of every chain after the pooled Fisher phase."""
        validation.check_choice("metric", metric, ("dense", "diagonal"))
        _, key_tune = jax.random.split(rng_key)
        (pstate, _), finfo = fisher_out
        num_fisher = finfo.acceptance_rate.shape[-1]
        num_tune = self.tuning_steps(num_steps, num_fisher)
        num_chains, dim = pstate.whitened_grad.shape
        grads = jax.vmap(ravel)(pstate.logdensity_grad)
        shared = _hand_over(pstate, metric, grads)
        states = shared._replace(
            sqrt_precond=jax.tree.map(
                lambda a: jnp.broadcast_to(a, (num_chains, *a.shape)), shared.sqrt_precond
            )
        )
        initial = self._initial_leapfrog_step(pstate, dim)

        def tune(key, state):
            return self._tune_step_size(key, state, initial, num_tune, num_fisher, progress)

        keys = jax.random.split(key_tune, num_chains)
        states, steps, info, mean_sq = jax.vmap(tune)(keys, states)
        pooled_mean_sq = jnp.broadcast_to(jnp.mean(mean_sq), mean_sq.shape)  # one R for all
        states, k = self._normalize(states, pooled_mean_sq)
        steps = steps / k
        params, merged = self._finish(finfo, info, steps, _scale_sqrt(shared.sqrt_precond, k[0]))
        return (states, params), merged

    def run(self, rng_key, position, num_steps: int, progress: ProgressBar | None = None):
        """Warm up one chain; returns ``(state, parameters), info``.

        With ``metric="auto"`` or the stopping rule (the defaults) the looks at ``R`` need
        concrete values: call it outside ``jit``, as BlackJAX's
        ``window_adaptation(...).run``, or pass a forced ``metric`` and
        ``stopping_rule=False``.
        """

        def call(method, argument, *extra):
            return getattr(self, method)(rng_key, argument, num_steps, progress, *extra)

        return self.staged_run(call, position, num_steps)

    def run_batch(self, rng_key, positions, num_steps: int, progress=None):
        """Warm up all chains (leading axis of ``positions``) with one pooled ``R``."""

        def call(method, argument, *extra):
            return getattr(self, f"{method}_batch")(rng_key, argument, num_steps, progress, *extra)

        return self.staged_run(call, positions, num_steps)


def noise_condition_number(dim: int, num_signals) -> np.ndarray:
    """Condition number that sampling noise alone gives a learned correlation matrix.

    The sample correlation matrix of ``n`` independent draws of ``N(0, I_d)`` has its
    eigenvalues between the Marchenko-Pastur edges ``(1 -+ sqrt(d / n))^2``, so its
    condition number is about ``((1 + q) / (1 - q))^2`` with ``q = sqrt(d / n)``. Infinite
    for ``n < 4 d`` (``q > 1/2``), where the learned correlations say little.
    """
    q = np.sqrt(dim / np.maximum(np.asarray(num_signals, np.float64), 1.0))
    with np.errstate(divide="ignore"):
        return np.where(q <= 0.5, ((1 + q) / (1 - q)) ** 2, np.inf)


def diagonal_suffices(sqrt_precond, num_signals) -> bool:
    """Whether a diagonal metric loses nothing measurable against the learned dense ``R``.

    True when every chain's learned correlation matrix has a condition number within
    :data:`DIAGONAL_NOISE_FACTOR` of what ``num_signals`` signals give an independent
    target (:func:`noise_condition_number`), and ``d <= AUTO_MAX_DIM``.
    """
    dim = np.shape(sqrt_precond)[-1]
    if dim > AUTO_MAX_DIM:
        return False
    kappa = correlation_condition_number(sqrt_precond)
    bound = DIAGONAL_NOISE_FACTOR * noise_condition_number(dim, num_signals)
    return bool(np.all(kappa <= bound))


def block_condition_number(sqrt_prev, sqrt_now) -> np.ndarray:
    """Condition number of ``M = R_prev^T (F_now - F_prev) R_prev`` per leading index.

    ``F = (R R^T)^{-1}``; ``M = X^T X - I`` with ``X = R_now^{-1} R_prev`` (one solve), in
    float64 on the host. Infinite where ``M`` is not positive definite.
    """
    r_prev, r_now = (np.asarray(r, np.float64) for r in (sqrt_prev, sqrt_now))
    x = np.linalg.solve(r_now, r_prev)
    m = np.swapaxes(x, -1, -2) @ x - np.eye(r_prev.shape[-1])
    eigenvalues = np.linalg.eigvalsh(m)
    smallest, largest = eigenvalues[..., 0], eigenvalues[..., -1]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(smallest > 0, largest / smallest, np.inf)


def correlation_condition_number(sqrt_precond) -> np.ndarray:
    """Condition number of the correlation matrix of ``A = R R^T`` (per leading index).

    Computed on the host in float64. It is 1 for a diagonal ``A``; a diagonal metric
    makes NUTS's whitened target have this condition number instead of about 1.
    """
    r = np.asarray(sqrt_precond, np.float64)
    a = r @ np.swapaxes(r, -1, -2)
    sd = np.sqrt(np.diagonal(a, axis1=-2, axis2=-1))
    eigenvalues = np.linalg.eigvalsh(a / sd[..., :, None] / sd[..., None, :])
    smallest, largest = eigenvalues[..., 0], eigenvalues[..., -1]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(smallest > 0, largest / smallest, np.inf)


def _hand_over(fstate, metric: str, flat_grad) -> FisherHMCState:
    """The NUTS / HMC state at the end of the Fisher phase, with a dense or diagonal ``R``.

    The diagonal ``R`` keeps ``A``'s diagonal: ``scale_i = ||R_i||`` (row norms), so the
    trace and hence FisherMALA's normalized step carry over unchanged.
    """
    r = fstate.sqrt_precond
    if metric == "diagonal":
        sqrt = DiagonalSqrt(jnp.sqrt(jnp.sum(r**2, axis=-1)))
        return FisherHMCState(
            fstate.position, fstate.logdensity, whiten_gradient(flat_grad, sqrt), sqrt
        )
    return FisherHMCState(fstate.position, fstate.logdensity, fstate.whitened_grad, r)


def _scale_sqrt(sqrt_precond, k):
    """``k R`` with ``k`` one number per leading index (per chain)."""
    if isinstance(sqrt_precond, DiagonalSqrt):
        return DiagonalSqrt(sqrt_precond.scale * k[..., None])
    return sqrt_precond * k[..., None, None]


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
        :class:`FisherParameters`, ``info`` the :class:`~fisher_mala.adaptation.WarmupInfo`.
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
