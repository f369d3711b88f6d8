"""The warm-ups of the Langevin samplers and the paper's baselines, as schedules (layer 4).

Every warm-up here is a :class:`~fisher_mala.schedule.Schedule` built from the kernels and
the adaptations, run by :func:`~fisher_mala.schedule.run_schedule`; the paper's protocol
(Section 5.1) is that all adaptation happens in the burn-in, whose final parameters are
frozen for the sampling phase:

=================  ====================================================================
warm-up            phases (after the initial step-size search)
=================  ====================================================================
MALA               ``mala``: MALA adapting ``sigma^2`` (Algorithm 1's rule) throughout
FisherMALA         ``mala`` (``n0 = 500``), then ``fisher``: FisherMALA (Algorithm 1),
                   ``R_0 = I / sqrt(lambda)`` (the same proposal), ``tr(R R^T)``
                   recomputed every block of 1000 iterations
pooled FisherMALA  every chain's ``mala`` phase, then ``pooled``: one ``R`` learned from
                   all chains' signals (rank-C updates), the median ``sigma^2`` shared
AdaMALA            ``mala`` (500), ``collect`` (500 more MALA iterations whose states
                   feed Eq. (17); Appendix D leaves open whether ``sigma^2`` is frozen
                   there: it keeps adapting), then ``adamala`` to the end
mMALA              ``mmala``: ``sigma^2`` adapted throughout from a bracket search
                   around 1 with mMALA's own proposals
HMC                ``hmc``: 10 leapfrog steps, ``epsilon`` adapted towards 0.651 (Beskos
                   et al., 2013) from the square root of MALA's searched ``sigma^2``
=================  ====================================================================

Each builder validates its options eagerly and returns a :class:`Warmup`, whose ``run``
has the shape of BlackJAX's adaptations: ``run(rng_key, position, num_steps) ->
((state, parameters), info)``.
"""

import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fisher_mala import adamala, fisher, hmc, low_rank, mala, mmala, pooled, validation
from fisher_mala.adaptations.dual_averaging import dual_averaging
from fisher_mala.adaptations.fisher import DAMPING, capped_share, fisher_preconditioner
from fisher_mala.adaptations.haario import haario_covariance
from fisher_mala.adaptations.secant_scale import secant_scale
from fisher_mala.adaptations.step_size import (
    MALA_TARGET_ACCEPTANCE,
    STEP_SIZE_LEARNING_RATE,
    RobbinsMonroState,
    robbins_monro,
)
from fisher_mala.adaptations.step_size_search import (
    StepSizeSearch,
    bracket_step_size,
    find_reasonable_step_size,
)
from fisher_mala.pytree import ravel
from fisher_mala.schedule import (
    Phase,
    Schedule,
    Start,
    WarmupInfo,
    WarmupParameters,
    advance_schedule,
    resume_schedule,
    run_schedule,
    segments,
    snapshot,
    split_key,
)

__all__ = [
    "HMC_TARGET_ACCEPTANCE",
    "TRACE_REFRESH_EVERY",
    "Warmup",
    "WarmupInfo",
    "WarmupParameters",
    "mala_warmup",
    "fisher_mala_warmup",
    "pooled_fisher_mala_warmup",
    "adamala_warmup",
    "mmala_warmup",
    "hmc_warmup",
]

#: Iterations between exact recomputations of tr(R R^T) during the warm-up.
TRACE_REFRESH_EVERY = 1000
#: Optimal acceptance rate of HMC (Beskos et al., 2013).
HMC_TARGET_ACCEPTANCE = 0.651


class Warmup:
    """A warm-up: a schedule builder and what ``fm.sample`` needs to know of it.

    Parameters
    ----------
    build
        ``(num_steps, position, warn=True) -> Schedule`` (``position`` with a chain axis
        for a ``batched`` warm-up; ``warn=False`` when resuming, so that warnings about
        the options are given once).
    target_acceptance
        The acceptance rate the step size is tuned towards.
    batched
        One state for all chains (pooled): ``run`` takes every chain at once.
    **attributes
        Read by warm-ups built on this one (e.g. ``num_mala_steps``, ``block``,
        ``num_lead_steps``: the iterations before the last phase, ``num_mala_steps`` by
        default).
    """

    def __init__(self, build: Callable, target_acceptance, batched=False, **attributes):
        self.build = build
        self.target_acceptance = float(target_acceptance)
        self.batched = batched
        # iterations before the last (resumable) phase
        attributes.setdefault("num_lead_steps", attributes.get("num_mala_steps", 0))
        self.__dict__.update(attributes)

    def run(
        self, rng_key, position, num_steps: int, progress=None, stop_after=None, evaluated=None
    ):
        """``num_steps`` warm-up iterations: ``((state, parameters), info)``.

        With ``stop_after``, only the first ``stop_after`` of them; :meth:`resume` runs
        more of the last phase (the parts give the same chain as one run when
        ``stop_after`` ends one of its blocks). ``evaluated``: the log density and its
        gradient at ``position``, where the caller has them (see :func:`run_schedule`).
        """
        schedule = self.build(num_steps, position)
        return run_schedule(schedule, rng_key, position, progress, stop_after, evaluated)

    def check(self, num_steps: int, positions) -> None:
        """Build the schedule of a warm-up of ``num_steps`` eagerly, so that its options
        are checked at every iteration they will be used before anything is compiled
        (``positions`` with a leading chain axis)."""
        position = positions if self.batched else jax.tree.map(lambda x: x[0], positions)
        with jax.ensure_compile_time_eval():
            self.build(num_steps, position)

    def resume(self, rng_key, carry, num_steps: int, progress=None, num_more: int = 0):
        """``num_more`` more iterations of a :meth:`run` stopped early (``rng_key`` and
        ``num_steps`` those given to :meth:`run`; ``carry`` its ``(state, parameters)``)."""
        position = carry[0].position
        schedule = self.build(num_steps, position, warn=False)
        return resume_schedule(schedule, rng_key, carry, num_more, progress)

    def segments(self, num_steps: int, positions, every: int):
        """The parts a checkpointed warm-up runs in
        (:func:`~fisher_mala.schedule.segments`); ``positions`` with a chain axis."""
        position = positions if self.batched else jax.tree.map(lambda x: x[0], positions)
        with jax.ensure_compile_time_eval():
            return segments(self.build(num_steps, position, warn=False), every)

    def start(self, rng_key, position, num_steps: int):
        """The state before the first segment and its :class:`~fisher_mala.schedule.Start`
        (what :meth:`run` does before its first iteration)."""
        return self.build(num_steps, position).start(rng_key, position)

    def advance(self, rng_key, position, state, num_steps: int, segment, offset, progress=None):
        """One segment from ``state``: ``(state, rates, trace or None)``
        (:func:`~fisher_mala.schedule.advance_schedule`); ``position`` is the chain's
        initial position, which shapes the schedule."""
        schedule = self.build(num_steps, position, warn=False)
        return advance_schedule(schedule, rng_key, state, segment, offset, progress)

    def finish(self, position, state, num_steps: int):
        """``(state, parameters)`` after the last segment (what :meth:`run` returns)."""
        return self.build(num_steps, position, warn=False).finish(state)


def _check_step_size_options(initial_step_size, target, rho) -> None:
    validation.check_positive("initial_step_size", initial_step_size)
    validation.check_probability("target_acceptance_rate", target)
    validation.check_nonnegative("step_size_learning_rate", rho, upper=1.0 / float(target))


def _check_counts(**counts) -> None:
    for name, value in counts.items():
        if int(value) < 0:
            raise ValueError(f"`{name}` must be >= 0, got {value}.")


def _check_trace_every(trace_every) -> None:
    if trace_every is not None and int(trace_every) < 1:
        raise ValueError(f"`trace_every` must be a positive integer, got {trace_every}.")


def _initial_state_and_step(
    rng_key, position, logdensity_fn, initial_step_size, search, target, evaluated=None
):
    # validates position and logdensity_fn; `evaluated`: see `mala.init`
    state = mala.init(position, logdensity_fn, evaluated=evaluated)
    if not search:
        step = jnp.asarray(initial_step_size, ravel(position).dtype)
        return state, StepSizeSearch(step, jnp.zeros((), jnp.int32))
    found = find_reasonable_step_size(
        rng_key, logdensity_fn, position, initial_step_size, target,
        logdensity_and_grad=(state.logdensity, state.logdensity_grad),
    )  # fmt: skip
    return state, found


def _searched_start(logdensity_fn, initial_step_size, find_step_size, target, key) -> Callable:
    """A start at the position with the searched ``sigma^2``: state ``(MALAState, sigma^2)``."""

    def start(rng_key, position, evaluated=None):
        state, found = _initial_state_and_step(
            key(rng_key), position, logdensity_fn, initial_step_size, find_step_size, target,
            evaluated,
        )  # fmt: skip
        return (state, found.step_size), Start(found.step_size, found.num_grad_evals + 1)

    return start


def _adapting_step_size(kernel: Callable, rule) -> Callable:
    """``step(key, (state, step_size))``: ``kernel(key, state, step_size)``, then the rule."""

    def step(key, carry):
        state, step_size = carry
        state, info = kernel(key, state, step_size)
        step_size = rule.final(rule.update(RobbinsMonroState(step_size), info.acceptance_rate))
        return (state, step_size), info

    return step


def _mala_phase(logdensity_fn, num_steps, rule, key) -> Phase:
    kernel = mala.build_kernel()
    step = _adapting_step_size(lambda k, s, h: kernel(k, s, logdensity_fn, h), rule)
    return Phase("mala", num_steps, step, key)


def _scouting_phase(logdensity_fn, num_steps, target, key) -> Phase:
    """The MALA phase of a fast start: ``sigma^2`` by dual averaging (Hoffman and Gelman,
    2014), which moves it by orders of magnitude in tens of iterations where Algorithm
    1's rule moves it by 1%, and the secant pairs of its proposals summed
    (:mod:`~fisher_mala.adaptations.secant_scale`). State ``((MALAState, sigma^2),
    (SecantSums, DualAveragingAdaptationState))``."""
    kernel = mala.build_kernel()
    scales, rule = secant_scale(), dual_averaging(target)

    def step(key, carry):
        (state, step_size), (sums, averaging) = carry
        position = ravel(state.position)
        state, info = kernel(key, state, logdensity_fn, step_size)
        change = info.proposal_whitened_grad - info.whitened_grad  # R = I: raw gradients
        # the second half only: the first crosses from the start, where the curvature
        # can be orders of magnitude off the typical set's, while sigma^2 settles
        counted = info.proposal_is_finite & (averaging.step > num_steps // 2)
        sums = scales.update(sums, info.proposal - position, change, counted)
        averaging = rule.update(averaging, info.acceptance_rate)
        step_size = jnp.exp(averaging.log_step_size).astype(step_size.dtype)
        return ((state, step_size), (sums, averaging)), info

    return Phase("scout", num_steps, step, key)


def _scouting_start(start: Callable, target) -> Callable:
    """``start`` with empty secant sums and dual averaging from the searched step."""

    def scouting(rng_key, position, evaluated=None):
        (state, step_size), info = start(rng_key, position, evaluated)
        flat = ravel(position)
        sums = secant_scale().init(flat.shape[0], flat.dtype)
        return ((state, step_size), (sums, dual_averaging(target).init(step_size))), info

    return scouting


def _restart(prior_weight) -> Callable:
    """A FisherMALA state whose recursion restarts from its estimate so far.

    Proposition 4 accumulates ``F_n = (R_n R_n^T)^{-1} = F_0 + sum_{i <= n} s_i s_i^T``,
    with ``F_0`` worth ``prior_weight`` signals (the damping ``lambda`` at the start, then
    what the last restart kept). The restart keeps ``F_0' = w F_n / (prior_weight + n)``
    (``R <- R sqrt((prior_weight + n) / w)``, count 0): ``w = min(d, prior_weight + n)``
    signals' worth of the estimate so far (the next window's ``prior_weight``:
    :func:`_kept_weights`), and forgets the rest, drawn with an ``A`` further from the
    fixed point (a window of Stan's warm-up, for ``R``). ``d`` signals, not ``lambda``:
    each signal is rank one, and the first few after a restart would otherwise leave
    every direction they have not touched far wider than the estimate, where the
    proposals are then rejected and teach nothing; never more than the estimate holds,
    so a window that leaves it worth fewer than ``d`` signals forgets nothing.
    ``sigma^2`` follows ``tr(A)``, so the normalized step is kept.
    """

    def restart(state):
        dtype = state.step_size.dtype
        held = jnp.asarray(prior_weight, dtype) + jnp.asarray(state.count, dtype)
        kept = jnp.minimum(jnp.asarray(state.whitened_grad.shape[-1], dtype), held)
        factor = held / kept  # F_0' = F_n / factor: R and A grow by it
        scale = jnp.sqrt(factor)
        return state._replace(
            sqrt_precond=state.sqrt_precond * scale,
            trace_precond=state.trace_precond * factor,
            whitened_grad=state.whitened_grad * scale,
            whitened_mean_score=state.whitened_mean_score * scale,
            step_size=state.step_size * factor,
            count=jnp.zeros_like(state.count),
        )

    return restart


def _restarts_at(iterations, restarts) -> Callable:
    """``(state, iteration) -> state``: ``restarts[k]`` applied before warm-up iteration
    ``iterations[k]``, the state as it is before every other iteration (one
    ``lax.switch``, so that the windows share one compiled loop body)."""
    iterations = tuple(int(i) for i in iterations)
    if not iterations:
        return lambda state, iteration: state
    branches = [lambda state: state, *restarts]

    def before_step(state, iteration):
        index = sum((iteration == i) * (k + 1) for k, i in enumerate(iterations))
        return jax.lax.switch(index, branches, state)

    return before_step


def _kept_weights(damping, lengths, dim: int) -> list[float]:
    """The prior weight (in signals) each restart window starts with, and then the main
    part: ``lambda``, then ``min(d, previous + length)`` (:func:`_restart`)."""
    weights = [float(damping)]
    for length in lengths:
        weights.append(min(float(dim), weights[-1] + length))
    return weights


def _frozen(carry):
    """The MALA phase's ``(state, sigma^2)`` as the sampling state and parameters."""
    state, step_size = carry
    return state, WarmupParameters(step_size, None)


def mala_warmup(
    logdensity_fn: Callable,
    initial_step_size=1.0,
    find_step_size: bool = True,
    target_acceptance_rate=MALA_TARGET_ACCEPTANCE,
    step_size_learning_rate=STEP_SIZE_LEARNING_RATE,
) -> Warmup:
    """MALA's warm-up: ``sigma^2`` adapted towards ``target_acceptance_rate`` throughout.

    Parameters
    ----------
    logdensity_fn
        ``position -> log pi(position)``.
    initial_step_size
        Initial ``sigma^2`` guess (default 1).
    find_step_size
        Start from :func:`~fisher_mala.adaptations.step_size_search.find_reasonable_step_size`
        of the guess (default ``True``).
    target_acceptance_rate, step_size_learning_rate
        ``alpha*`` and ``rho`` of the step-size rule.
    """
    target, rho = target_acceptance_rate, step_size_learning_rate
    _check_step_size_options(initial_step_size, target, rho)
    rule = robbins_monro(target, rho)
    start = _searched_start(
        logdensity_fn, initial_step_size, find_step_size, target, split_key((2, 0))
    )

    def build(num_steps, position, warn=True):
        phase = _mala_phase(logdensity_fn, num_steps, rule, split_key((2, 1)))
        return Schedule(start, (phase,), _frozen)

    return Warmup(build, target)


def _warn_if_window_below_dim(learning_rate, position, num_updates: int) -> None:
    """Warn when an Appendix B schedule is capped for most of the adaptive phase."""
    if learning_rate is None:
        return
    dim = sum(int(np.prod(jnp.shape(leaf))) for leaf in jax.tree.leaves(position))
    share = capped_share(learning_rate, dim, num_updates)
    if share > 0.5:
        warnings.warn(
            f"The learning-rate schedule forgets faster than d = {dim} signals "
            f"(gamma_n > max(1/n, 1/d)) in {share:.0%} of the {num_updates} adaptive "
            "updates: its estimate would be rank-deficient there, so gamma_n is capped at "
            "max(1/n, 1/d). Use a schedule with gamma_n <= 1/d for most of the warm-up.",
            RuntimeWarning,
            stacklevel=4,
        )


def _precond_snapshot(record_precond):
    def take(state, iteration):
        return snapshot(
            state.sqrt_precond, state.trace_precond, state.step_size, iteration, record_precond
        )

    return take


def _with_parameters(state):
    return state, WarmupParameters(state.step_size, state.sqrt_precond)


def fisher_mala_warmup(
    logdensity_fn: Callable,
    num_mala_steps: int = 500,
    damping=DAMPING,
    signal: str = "rao_blackwell",
    learning_rate=None,
    trace_every: int | None = None,
    record_precond: bool = False,
    initial_step_size=1.0,
    find_step_size: bool = True,
    target_acceptance_rate=MALA_TARGET_ACCEPTANCE,
    step_size_learning_rate=STEP_SIZE_LEARNING_RATE,
    rank: int | None = None,
    fast_start: bool = False,
    restart_windows: tuple[int, ...] = (),
    low_rank_diagonal: str = low_rank.DEFAULT_DIAGONAL,
) -> Warmup:
    """Algorithm 1's warm-up: a MALA phase, then adaptive FisherMALA iterations.

    Parameters
    ----------
    logdensity_fn
        ``position -> log pi(position)``.
    num_mala_steps
        ``n0``, the plain-MALA initialization phase (default 500).
    damping, signal, learning_rate
        As in :func:`fisher_mala.fisher_mala`.
    trace_every
        Record a :class:`~fisher_mala.schedule.WarmupTrace` snapshot every this many
        adaptive iterations (``None``: no trace); also the block length (default 1000)
        after which ``tr(R R^T)`` is recomputed exactly.
    record_precond
        Include the trace-normalized ``A`` (``d x d``) in each snapshot.
    initial_step_size, find_step_size, target_acceptance_rate, step_size_learning_rate
        As in :func:`mala_warmup`.
    rank
        ``None``: the dense ``R`` of the paper. An integer ``k``: the diagonal-plus-rank-k
        Fisher preconditioner of :mod:`fisher_mala.low_rank` (``O(d k)`` time and memory
        per iteration; the Rao-Blackwellized signal, Proposition 4's rates).
    low_rank_diagonal
        With ``rank``: how the diagonal ``D`` of :mod:`fisher_mala.low_rank` is learned.
        ``"whitened"`` (default): after the first cycles, a quarter step per cycle
        toward the diagonal that whitens what the whole ``R`` leaves once the cycle's
        low-rank update is made, so that ``D`` does not take on stiffness the low-rank
        part explains (a whitened latent Gaussian process, a non-centred model).
        ``"learned"``: ``sqrt(Var x / F_ii)`` from the chain's positions and signals
        (nutpie's diagonal), which converges fastest where the target's heterogeneity
        lies on the coordinates but shrinks the coordinates that a few informed
        directions load on. ``"unit"``: ``D`` held at the identity (times the learned
        level), for coordinates in which the prior is ``N(0, I)`` and the data inform a
        few directions (a non-centred hierarchical model, a whitened latent Gaussian
        process).
    fast_start
        ``False``: Algorithm 1. ``True`` (needs BlackJAX): the MALA phase adapts
        ``sigma^2`` by dual averaging (a far start, where the searched step is orders of
        magnitude too small for the typical set, costs tens of iterations instead of
        thousands), and the adaptive phase starts from ``R_0 = diag(sqrt(v / lambda))``,
        ``v`` the per-coordinate variances that the MALA phase's proposals give
        (:mod:`~fisher_mala.adaptations.secant_scale`), with ``sigma^2`` rescaled to keep
        the proposal's spread along the narrowest of them. The damping of Eq. (8) is then
        ``lambda diag(1 / v)``, in the posterior's own units.
    restart_windows
        Lengths of the windows at the start of the adaptive phase after each of which the
        recursion restarts from its estimate (:func:`_restart`: ``min(d, what it holds)``
        signals' worth of it), forgetting the signals drawn with an ``A`` further from the
        fixed point;
        Fisher NUTS uses ``(25, 50, 100, 200)``. ``()``: one running average
        (Algorithm 1).

    Returns
    -------
    Warmup
        ``run(rng_key, position, num_steps) -> ((state, parameters), info)``: the state
        is ready for ``fm.fisher_mala(..., adapt=False)``'s kernel and
        ``parameters.sqrt_precond`` is the learned ``R``.
    """
    target, rho = target_acceptance_rate, step_size_learning_rate
    if rank is not None:
        return _low_rank_warmup(
            logdensity_fn, rank, num_mala_steps, damping, signal, learning_rate, trace_every,
            record_precond, initial_step_size, find_step_size, target, rho, low_rank_diagonal,
        )  # fmt: skip
    if low_rank_diagonal != low_rank.DEFAULT_DIAGONAL:
        raise ValueError("`low_rank_diagonal` needs `rank`: the dense R has no separate D.")
    _check_step_size_options(initial_step_size, target, rho)
    # validates damping and signal eagerly; the schedule at every update it will be used,
    # when the warm-up's length is known (build)
    fisher.as_top_level_api(logdensity_fn, 1.0, damping, target, rho, signal)
    fisher._check_learning_rate(learning_rate, 2)
    _check_counts(num_mala_steps=num_mala_steps)
    _check_trace_every(trace_every)
    num_mala_steps, block = int(num_mala_steps), trace_every or TRACE_REFRESH_EVERY
    step = fisher.adaptive_step(
        fisher_preconditioner(damping, learning_rate, centered=signal == "centered"),
        robbins_monro(target, rho),
        signal,
    )
    rule = robbins_monro(target, rho)
    key_mala = (2, 0)
    start = _searched_start(
        logdensity_fn, initial_step_size, find_step_size, target, split_key(key_mala, (2, 0))
    )

    def enter(carry):  # R_0 = I / sqrt(lambda): the same proposal as MALA's (Eq. (7))
        state, step_size = carry
        return fisher.state_from(
            state.position, state.logdensity, state.logdensity_grad, step_size, damping
        )

    def enter_scaled(carry):  # R_0 = diag(sqrt(v / lambda)), the scout's spread kept
        (state, _), (sums, averaging) = carry
        variances = secant_scale().final(sums)
        step_size = dual_averaging(target).final(averaging).astype(variances.dtype)
        sqrt_precond = jnp.diag(jnp.sqrt(variances / jnp.asarray(damping, variances.dtype)))
        # the proposal's variance along j is sigma^2 v_j / mean(v) (Eq. (7)): the scout's
        # isotropic sigma^2 fits the narrowest v_j, and stays the spread there
        step_size = step_size * jnp.mean(variances) / jnp.min(variances)
        return fisher.state_from(
            state.position, state.logdensity, state.logdensity_grad, step_size, damping,
            sqrt_precond,
        )  # fmt: skip

    windows = tuple(int(w) for w in restart_windows)
    if any(w < 1 for w in windows):
        raise ValueError(f"`restart_windows` must be positive lengths, got {restart_windows}.")
    if fast_start:
        dual_averaging(target)  # BlackJAX's: a clear error now if it is missing
        start = _scouting_start(start, target)

    def build(num_steps, position, warn=True):
        num_mala = min(num_mala_steps, num_steps)
        if warn:  # the schedule at every update it will make, then its window
            fisher._check_learning_rate(learning_rate, num_steps - num_mala)
            _warn_if_window_below_dim(learning_rate, position, num_steps - num_mala)
        key = split_key(key_mala, (2, 1))
        fisher_step = lambda key, state: step(key, state, logdensity_fn)  # noqa: E731
        first_enter = enter_scaled if fast_start else enter
        lengths, left = [], num_steps - num_mala
        for w in windows:  # each restarts from the estimate so far (_restart)
            if left <= 0:
                break
            lengths.append(min(w, left))
            left -= lengths[-1]
        weights = _kept_weights(damping, lengths, ravel(position).shape[0])
        # the hand-over into each window after the first, then into the main part
        restarts = [_restart(weight) for weight in weights[:-1]]
        enters = [first_enter, *restarts]
        lead = (  # the windows: one loop, restarted where each window after the first begins
            [Phase("fisher_windows", sum(lengths), fisher_step, split_key((2, 1)),
                   enter=first_enter,
                   before_step=_restarts_at(num_mala + np.cumsum(lengths[:-1]), enters[1:-1]))]
            if lengths else []
        )  # fmt: skip
        phases = (
            _scouting_phase(logdensity_fn, num_mala, target, key)
            if fast_start
            else _mala_phase(logdensity_fn, num_mala, rule, key),
            *lead,
            Phase(
                "fisher",
                left,
                fisher_step,
                split_key((2, 1)),
                enter=enters[len(lengths)],
                block=block,
                finish_block=fisher.refresh_trace,
                snapshot=_precond_snapshot(record_precond),
                progress_of=lambda state: state.count,
            ),
        )
        return Schedule(start, phases, _with_parameters, record_trace=bool(trace_every))

    return Warmup(
        build, target, num_mala_steps=num_mala_steps, block=block,
        num_lead_steps=num_mala_steps + sum(windows),
    )  # fmt: skip


def _low_rank_warmup(
    logdensity_fn, rank, num_mala_steps, damping, signal, learning_rate, trace_every,
    record_precond, initial_step_size, find_step_size, target, rho,
    diagonal=low_rank.DEFAULT_DIAGONAL,
) -> Warmup:  # fmt: skip
    """:func:`fisher_mala_warmup` with the low-rank learner (:mod:`fisher_mala.low_rank`)."""
    rank = low_rank.check_rank(rank)
    diagonal = low_rank.check_diagonal(diagonal)
    _check_step_size_options(initial_step_size, target, rho)
    validation.check_positive("damping", damping, "Algorithm 1 uses lambda = 10.")
    refused = {
        "signal": signal != "rao_blackwell",
        "learning_rate": learning_rate is not None,
        "record_precond": bool(record_precond),
        "trace_every": trace_every is not None,  # no snapshots: R changes once per cycle
    }
    for name, given in refused.items():
        if given:
            raise ValueError(
                f"`{name}` is not available with `rank`: the low-rank Fisher preconditioner "
                "learns from the Rao-Blackwellized signal with its own cycle of updates "
                "(fisher_mala.low_rank); leave it at its default, or drop `rank`."
            )
    _check_counts(num_mala_steps=num_mala_steps)
    num_mala_steps = int(num_mala_steps)
    step = low_rank.adaptive_step(robbins_monro(target, rho), rank, damping, diagonal)
    rule = robbins_monro(target, rho)
    key_mala = (2, 0)
    start = _searched_start(
        logdensity_fn, initial_step_size, find_step_size, target, split_key(key_mala, (2, 0))
    )

    def enter(carry):  # R_0 = I / sqrt(lambda), as the dense warm-up's
        state, step_size = carry
        flat = ravel(state.position)
        learner = low_rank.init(
            jax.random.key(0), flat.shape[0], flat.dtype, rank, damping
        )  # a fixed basis to start from: the run's keys drive the chain alone
        fisher_state = low_rank.fisher_state(
            state.position, state.logdensity, state.logdensity_grad, step_size,
            learner.sqrt_precond,
        )  # fmt: skip
        return fisher_state, learner

    def build(num_steps, position, warn=True):
        num_mala = min(num_mala_steps, num_steps)
        phases = (
            _mala_phase(logdensity_fn, num_mala, rule, split_key(key_mala, (2, 1))),
            Phase(
                "fisher",
                num_steps - num_mala,
                lambda key, carry: step(key, carry, logdensity_fn),
                split_key((2, 1)),
                enter=enter,
                block=low_rank.BUFFER,  # R is refreshed between blocks (low_rank docs)
                finish_block=low_rank.finish_block(rank, damping, diagonal),
                progress_of=lambda carry: carry[0].count,
                start_block=low_rank.start_block,
            ),
        )
        # the phase's state is (FisherMALA state, learner); its enter runs even when the
        # phase has no iterations
        return Schedule(start, phases, lambda carry: _with_parameters(carry[0]), False)

    return Warmup(build, target, num_mala_steps=num_mala_steps, block=low_rank.BUFFER, rank=rank)


def pooled_fisher_mala_warmup(
    logdensity_fn: Callable,
    num_mala_steps: int = 500,
    damping=DAMPING,
    trace_every: int | None = None,
    record_precond: bool = False,
    initial_step_size=1.0,
    find_step_size: bool = True,
    target_acceptance_rate=MALA_TARGET_ACCEPTANCE,
    step_size_learning_rate=STEP_SIZE_LEARNING_RATE,
    rank: int | None = None,
    low_rank_diagonal: str = low_rank.DEFAULT_DIAGONAL,
) -> Warmup:
    """The warm-up of :mod:`fisher_mala.pooled`, all chains together (``run`` takes every
    chain's position, leading axis).

    Each chain first runs Algorithm 1's MALA phase (``num_mala_steps``) on its own; the
    pooled phase then starts from ``R_0 = I / sqrt(lambda)`` and the median of the chains'
    step sizes, and adapts the shared ``R`` with all chains' signals every iteration
    (re-anchoring ``tr(R R^T)`` every 1000 iterations). Options as in
    :func:`fisher_mala_warmup`.
    """
    if rank is not None or low_rank_diagonal != low_rank.DEFAULT_DIAGONAL:
        raise ValueError(
            "`rank` is not available with pooled=True: the low-rank Fisher preconditioner "
            "learns one R per chain (fisher_mala.low_rank); drop one of them."
        )
    target, rho = target_acceptance_rate, step_size_learning_rate
    _check_step_size_options(initial_step_size, target, rho)
    validation.check_positive("damping", damping, "Algorithm 1 uses lambda = 10.")
    _check_counts(num_mala_steps=num_mala_steps)
    _check_trace_every(trace_every)
    num_mala_steps, block = int(num_mala_steps), trace_every or TRACE_REFRESH_EVERY
    step = pooled.adaptive_step(
        fisher_preconditioner(),  # the damping only enters through the state
        robbins_monro(target, rho),
    )
    rule = robbins_monro(target, rho)
    one_chain = _searched_start(
        logdensity_fn, initial_step_size, find_step_size, target, split_key((2, 0))
    )
    mala_step = _mala_phase(logdensity_fn, 0, rule, None).step

    def chain_keys(rng_key, num_chains, index):
        """Chain c's key of the MALA phase: split(split(key)[0], C)[c], then split."""
        keys = jax.random.split(jax.random.split(rng_key)[0], num_chains)
        return jax.vmap(lambda k: jax.random.split(k)[index])(keys)

    def enter(carry):
        states, steps = carry
        return pooled.state_from(
            states.position, states.logdensity, states.logdensity_grad, jnp.median(steps), damping
        )

    def finish(state):
        num_chains = state.whitened_grad.shape[0]
        steps = jnp.broadcast_to(state.step_size, (num_chains,))
        return state, WarmupParameters(steps, state.sqrt_precond)

    def build(num_steps, positions, warn=True):
        num_chains = jax.tree.leaves(positions)[0].shape[0]
        num_mala = min(num_mala_steps, num_steps)

        def start(rng_key, positions):
            keys = jax.random.split(jax.random.split(rng_key)[0], num_chains)
            return jax.vmap(one_chain)(keys, positions)

        phases = (
            Phase(
                "mala",
                num_mala,
                jax.vmap(mala_step),
                lambda rng_key: chain_keys(rng_key, num_chains, 1),
                fold_in=jax.vmap(jax.random.fold_in, (0, None)),
                chains_first=True,
            ),
            Phase(
                "pooled",
                num_steps - num_mala,
                lambda key, state: step(key, state, logdensity_fn),
                split_key((2, 1)),
                enter=enter,
                block=block,
                finish_block=pooled.refresh_trace,
                snapshot=_precond_snapshot(record_precond),
                chains_first=True,
                progress_of=lambda state: state.count,
            ),
        )
        return Schedule(start, phases, finish, record_trace=bool(trace_every))

    return Warmup(build, target, batched=True, num_mala_steps=num_mala_steps, block=block)


def adamala_warmup(
    logdensity_fn: Callable,
    num_mala_steps: int = 500,
    num_collect_steps: int = 500,
    damping=DAMPING,
    trace_every: int | None = None,
    record_precond: bool = False,
    initial_step_size=1.0,
    find_step_size: bool = True,
    target_acceptance_rate=MALA_TARGET_ACCEPTANCE,
    step_size_learning_rate=STEP_SIZE_LEARNING_RATE,
) -> Warmup:
    """AdaMALA's warm-up (Appendix D; module docstring). Its sampling state is FisherMALA's
    with the final ``R = chol(Sigma)`` frozen (preconditioned MALA).

    Parameters
    ----------
    num_mala_steps, num_collect_steps
        The two MALA phases (500 each in the paper).
    damping
        ``lambda`` of ``Sigma_2`` (10).
    trace_every, record_precond, initial_step_size, find_step_size,
    target_acceptance_rate, step_size_learning_rate
        As in :func:`fisher_mala_warmup`.
    """
    target, rho = target_acceptance_rate, step_size_learning_rate
    _check_step_size_options(initial_step_size, target, rho)
    validation.check_positive("damping", damping, "The paper uses lambda = 10.")
    _check_counts(num_mala_steps=num_mala_steps, num_collect_steps=num_collect_steps)
    _check_trace_every(trace_every)
    num_mala_steps, num_collect_steps = int(num_mala_steps), int(num_collect_steps)
    rule = robbins_monro(target, rho)
    haario = haario_covariance(damping)
    step = adamala.adaptive_step(haario, rule)
    start = _searched_start(
        logdensity_fn, initial_step_size, find_step_size, target, split_key((3, 0), (2, 0))
    )
    mala_kernel = mala.build_kernel()
    adapting = _adapting_step_size(lambda k, s, h: mala_kernel(k, s, logdensity_fn, h), rule)

    def collect(key, carry):  # MALA, and its states fed to Eq. (17)
        state, step_size, cov = carry
        (state, step_size), info = adapting(key, (state, step_size))
        return (state, step_size, haario.update(cov, ravel(state.position))), info

    def enter_collect(carry):
        state, step_size = carry
        flat = ravel(state.position)
        return state, step_size, haario.init(flat.shape[0], flat.dtype)

    def enter_adamala(carry):
        state, step_size, cov = carry
        return adamala.init(state.position, state.logdensity, state.logdensity_grad, cov, step_size)

    def take(state, iteration):
        cov = state.covariance
        return snapshot(cov.chol_upper.T, cov.trace, state.step_size, iteration, record_precond)

    def finish(state):
        sqrt_precond = state.covariance.chol_upper.T
        fstate = fisher.state_from(
            state.position,
            state.logdensity,
            state.logdensity_grad,
            state.step_size,
            damping,
            sqrt_precond,
        )
        return fstate, WarmupParameters(state.step_size, sqrt_precond)

    def build(num_steps, position, warn=True):
        num_mala = min(num_mala_steps, num_steps)
        num_collect = min(num_collect_steps, num_steps - num_mala)
        phases = (
            _mala_phase(logdensity_fn, num_mala, rule, split_key((3, 0), (2, 1))),
            Phase("collect", num_collect, collect, split_key((3, 1)), enter=enter_collect),
            Phase(
                "adamala",
                num_steps - num_mala - num_collect,
                lambda key, state: step(key, state, logdensity_fn),
                split_key((3, 2)),
                enter=enter_adamala,
                block=trace_every or TRACE_REFRESH_EVERY,
                snapshot=take,
            ),
        )
        return Schedule(start, phases, finish, record_trace=bool(trace_every))

    return Warmup(build, target)


def mmala_warmup(
    logdensity_fn: Callable,
    metric_fn: Callable | None = None,
    num_search_proposals: int = 4,
    initial_step_size=1.0,
    find_step_size: bool = True,
    target_acceptance_rate=MALA_TARGET_ACCEPTANCE,
    step_size_learning_rate=STEP_SIZE_LEARNING_RATE,
) -> Warmup:
    """mMALA's warm-up: ``sigma^2`` adapted throughout (module docstring).
    ``info.num_grad_evals`` counts a Hessian as ``d`` gradient evaluations.

    Parameters
    ----------
    metric_fn
        Optional ``position -> G(position)`` (default: negative Hessian by autodiff).
    num_search_proposals
        Proposals averaged per trial step of the initial search.
    initial_step_size, find_step_size, target_acceptance_rate, step_size_learning_rate
        As in :func:`mala_warmup`.
    """
    target, rho = target_acceptance_rate, step_size_learning_rate
    _check_step_size_options(initial_step_size, target, rho)
    if metric_fn is not None and not callable(metric_fn):
        raise TypeError("`metric_fn` must be callable: position -> (d, d) metric.")
    kernel = mmala.build_kernel(metric_fn)
    rule = robbins_monro(target, rho)

    def search(key, state):
        keys = jax.random.split(key, num_search_proposals)

        def mean_acceptance(step):
            def one(k):
                return kernel(k, state, logdensity_fn, step)[1].acceptance_rate

            return jnp.mean(jax.vmap(one)(keys))

        step0 = jnp.asarray(initial_step_size, state.natural_grad.dtype)
        if not find_step_size:
            return StepSizeSearch(step0, jnp.zeros((), jnp.int32))
        step, count = bracket_step_size(mean_acceptance, step0, target)
        return StepSizeSearch(step, (count + 1) * num_search_proposals)

    def start(rng_key, position):
        validation.check_position(position)
        validation.check_logdensity(logdensity_fn, position)
        state = mmala.init(position, logdensity_fn, metric_fn)
        found = search(jax.random.split(rng_key)[0], state)
        per_step = 1 + state.natural_grad.shape[0]
        return (state, found.step_size), Start(
            found.step_size, (found.num_grad_evals + 1) * per_step
        )

    def build(num_steps, position, warn=True):
        per_step = 1 + ravel(position).shape[0]  # a Hessian costs about d gradients
        step = _adapting_step_size(lambda k, s, h: kernel(k, s, logdensity_fn, h), rule)
        phase = Phase("mmala", num_steps, step, split_key((2, 1)), grads_per_step=per_step)
        return Schedule(start, (phase,), _frozen)

    return Warmup(build, target)


def hmc_warmup(
    logdensity_fn: Callable,
    num_integration_steps: int = hmc.NUM_INTEGRATION_STEPS,
    divergence_threshold: float = hmc.DIVERGENCE_THRESHOLD,
    initial_step_size=1.0,
    find_step_size: bool = True,
    target_acceptance_rate=HMC_TARGET_ACCEPTANCE,
    step_size_learning_rate=STEP_SIZE_LEARNING_RATE,
) -> Warmup:
    """HMC's warm-up: ``epsilon`` adapted towards 0.651 throughout (module docstring).

    Parameters
    ----------
    num_integration_steps
        Leapfrog steps per iteration (10 in the paper).
    divergence_threshold
        Energy error above which a transition is reported divergent.
    initial_step_size, find_step_size, target_acceptance_rate, step_size_learning_rate
        As in :func:`mala_warmup` (``initial_step_size`` is ``epsilon``; the search runs
        MALA from ``epsilon^2``: one leapfrog step of size ``epsilon`` *is* MALA with
        ``sigma^2 = epsilon^2``).
    """
    target, rho = target_acceptance_rate, step_size_learning_rate
    _check_step_size_options(initial_step_size, target, rho)
    if int(num_integration_steps) < 1:
        raise ValueError(f"`num_integration_steps` must be >= 1, got {num_integration_steps}.")
    validation.check_positive("divergence_threshold", divergence_threshold)
    num_integration_steps = int(num_integration_steps)
    kernel = hmc.build_kernel(num_integration_steps, divergence_threshold)
    rule = robbins_monro(target, rho)

    def start(rng_key, position):
        key_search = jax.random.split(rng_key)[0]
        state = hmc.init(position, logdensity_fn)
        if find_step_size:
            validation.check_position(position)
            validation.check_logdensity(logdensity_fn, position)
            found = find_reasonable_step_size(
                key_search, logdensity_fn, position, initial_step_size**2, MALA_TARGET_ACCEPTANCE,
                logdensity_and_grad=(state.logdensity, state.logdensity_grad),
            )  # fmt: skip
            found = StepSizeSearch(jnp.sqrt(found.step_size), found.num_grad_evals)
        else:
            _, found = _initial_state_and_step(
                key_search, position, logdensity_fn, initial_step_size, False, target
            )
        return (state, found.step_size), Start(found.step_size, found.num_grad_evals + 1)

    def build(num_steps, position, warn=True):
        step = _adapting_step_size(lambda k, s, h: kernel(k, s, logdensity_fn, h), rule)
        phase = Phase(
            "hmc", num_steps, step, split_key((2, 1)), grads_per_step=num_integration_steps
        )
        return Schedule(start, (phase,), _frozen)

    return Warmup(build, target, num_integration_steps=num_integration_steps)
