"""Warm-ups as data: a schedule of phases, run by one loop (layer 4).

A warm-up is a :class:`Schedule`: how a chain starts (an initial state and step size,
usually from :func:`~fisher_mala.adaptations.step_size_search.find_reasonable_step_size`),
a list of :class:`Phase` (which step to iterate, composed of a kernel and the
adaptations it updates; for how many iterations; how its state is handed over from the
previous phase; whether it runs in blocks with something done between them), and how
the tuned parameters are frozen at the end. Algorithm 1 is two phases (a MALA phase
adapting ``sigma^2``, then FisherMALA), AdaMALA three, Fisher NUTS's Fisher phase is
Algorithm 1's schedule run in compiled parts with looks at ``R`` between them.

:func:`run_schedule` knows nothing of samplers: it keys iteration ``i`` of a phase with
``fold_in(phase key, i)`` (``i`` counted from the start of the warm-up, so a phase run in
parts is the same chain as one run in one), stacks the per-iteration acceptance
statistics of every phase and counts gradient evaluations. :func:`resume_schedule` runs
more iterations of the last phase of a run stopped early. :func:`segments` and
:func:`advance_schedule` run a warm-up in parts that can be saved between them (a
checkpointed run).
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from fisher_mala.progress import ProgressBar, scan_with_progress

__all__ = [
    "WarmupParameters",
    "WarmupTrace",
    "WarmupInfo",
    "Start",
    "Phase",
    "Schedule",
    "split_key",
    "iterate",
    "run_phase",
    "run_schedule",
    "resume_schedule",
    "Segment",
    "segments",
    "advance_schedule",
    "extend_info",
    "step_at",
    "snapshot",
]


class WarmupParameters(NamedTuple):
    """The frozen parameters for the sampling phase.

    Attributes
    ----------
    step_size
        The final step (``sigma^2`` for the Langevin kernels, the leapfrog step for HMC
        and NUTS).
    sqrt_precond
        The final ``R`` (``None`` without a preconditioner).
    """

    step_size: Array
    sqrt_precond: Any


class WarmupTrace(NamedTuple):
    """Snapshots taken at the end of every block of a blocked phase.

    Attributes
    ----------
    iteration
        Warm-up iteration (counting the earlier phases) of each snapshot.
    step_size
        ``sigma^2`` at each snapshot.
    normalized_precond
        ``A / (tr(A) / d)`` at each snapshot (only with ``record_precond=True``).
    """

    iteration: Array
    step_size: Array
    normalized_precond: Array | None


class WarmupInfo(NamedTuple):
    """Per-iteration diagnostics of a warm-up.

    Attributes
    ----------
    acceptance_rate
        ``alpha`` at every warm-up iteration.
    is_accepted
        M-H outcome at every warm-up iteration.
    proposal_is_finite
        False where the proposal's log density or gradient was not finite.
    initial_step_size
        The step after the step-size search, before the first iteration.
    num_grad_evals
        Gradient evaluations of the warm-up, the search included.
    trace
        A :class:`WarmupTrace` (with ``trace_every``), else ``None``.
    """

    acceptance_rate: Array
    is_accepted: Array
    proposal_is_finite: Array
    initial_step_size: Array
    num_grad_evals: Array
    trace: WarmupTrace | None


class Start(NamedTuple):
    """What a schedule's ``start`` returns besides the state.

    Attributes
    ----------
    step_size
        The initial step (``WarmupInfo.initial_step_size``).
    num_grad_evals
        Gradient evaluations spent before the first phase (the initial evaluation and
        the step-size search).
    """

    step_size: Array
    num_grad_evals: Array


def _identity(state):
    return state


class Phase(NamedTuple):
    """One phase of a warm-up.

    Attributes
    ----------
    name
        What the phase is (``"mala"``, ``"fisher"``, ...), for people reading a schedule.
    num_steps
        Iterations of the phase.
    step
        ``step(key, state) -> (state, info)``: one iteration, a kernel composed with the
        adaptations the phase updates; ``info`` has ``acceptance_rate``, ``is_accepted``
        and ``proposal_is_finite``.
    key
        ``rng_key -> phase key``: the phase's stream of randomness, derived from the
        warm-up's key (:func:`split_key`).
    enter
        ``state -> state``: the hand-over from the previous phase (e.g. a MALA state and
        its ``sigma^2`` to a FisherMALA state with ``R_0``).
    block
        ``None``: one compiled loop. An integer: blocks of that many iterations, with
        ``finish_block`` applied and a ``snapshot`` taken after each.
    finish_block
        ``state -> state`` after each block (e.g. recompute ``tr(R R^T)`` exactly).
    start_block
        ``state -> state`` before each block (and before the remainder): e.g. a layout
        of ``R`` for the block's products, which ``finish_block`` drops again.
    snapshot
        ``(state, iteration) -> WarmupTrace`` taken after each block.
    grads_per_step
        Gradient evaluations of one iteration.
    fold_in
        ``(phase key, iteration) -> key`` of one iteration (``jax.random.fold_in``; a
        batch of per-chain keys for phases whose state holds several chains).
    chains_first
        The state holds several chains and the per-iteration info has a chain axis,
        which the loop moves first (``(chains, iterations)``).
    progress_of
        ``state -> iterations of this phase done`` (a traced count), needed to resume a
        run stopped inside the phase (:func:`resume_schedule`).
    before_step
        ``(state, iteration) -> state`` before each iteration (``iteration`` counted from
        the start of the warm-up): hand-overs inside the phase, e.g. the restarts of
        :func:`~fisher_mala.warmups.fisher_mala_warmup`'s windows, so that windows of
        different lengths share one compiled loop.
    """

    name: str
    num_steps: int
    step: Callable
    key: Callable
    enter: Callable = _identity
    block: int | None = None
    finish_block: Callable = _identity
    snapshot: Callable | None = None
    grads_per_step: int = 1
    fold_in: Callable = jax.random.fold_in
    chains_first: bool = False
    progress_of: Callable | None = None
    before_step: Callable = lambda state, iteration: state
    start_block: Callable = _identity


class Schedule(NamedTuple):
    """A warm-up as data.

    Attributes
    ----------
    start
        ``(rng_key, position) -> (state, Start)``: the initial state (validated,
        evaluated) and step.
    phases
        The :class:`Phase` sequence.
    finish
        ``state -> (state, WarmupParameters)``: the state for the sampling kernel and the
        frozen parameters.
    record_trace
        Whether ``WarmupInfo.trace`` carries the blocked phase's snapshots.
    """

    start: Callable
    phases: tuple[Phase, ...]
    finish: Callable
    record_trace: bool = False


def split_key(*path: tuple[int, int]) -> Callable:
    """``rng_key -> key`` following ``path``: ``(num, index)`` means
    ``jax.random.split(key, num)[index]``, applied in turn."""

    def key(rng_key):
        for num, index in path:
            rng_key = jax.random.split(rng_key, num)[index]
        return rng_key

    return key


def _concat(*infos, axis=0):
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=axis), *infos)


def _blocked(step_fn, state, num_steps, offset, block, blocks, snapshot, progress):
    """``num_steps`` iterations in blocks of ``block``: ``start_block`` before each and
    before the remainder, ``finish_block`` and a snapshot after each full block,
    ``finish_block`` after the remainder (``blocks``: the pair)."""
    start_block, finish_block = blocks
    num_blocks, remainder = divmod(num_steps, block)

    def outer(state, b):
        start = offset + b * block
        if progress is not None:
            jax.debug.callback(progress.update_to, start, ordered=False)
        state, info = jax.lax.scan(step_fn, start_block(state), start + jnp.arange(block))
        state = finish_block(state)
        return state, (info, snapshot(state, start + block))

    state, (info, trace) = jax.lax.scan(outer, state, jnp.arange(num_blocks))
    infos = [jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), info)]
    if remainder:
        start = offset + num_blocks * block
        state, tail = jax.lax.scan(step_fn, start_block(state), start + jnp.arange(remainder))
        infos.append(tail)
        state = finish_block(state)
    return state, _concat(*infos), trace


def iterate(phase: Phase, rng_key, state, num_steps: int, offset, progress=None):
    """``num_steps`` iterations of ``phase`` from warm-up iteration ``offset``:
    ``(state, per-iteration info, snapshots or None)``, the info as the step reports it."""
    key = phase.key(rng_key)

    def step_fn(state, iteration):
        state = phase.before_step(state, iteration)
        return phase.step(phase.fold_in(key, iteration), state)

    if phase.block is None:
        state, info = scan_with_progress(step_fn, state, num_steps, offset, progress)
        return state, info, None
    snap = phase.snapshot or (lambda s, i: None)
    blocks = (phase.start_block, phase.finish_block)
    return _blocked(step_fn, state, num_steps, offset, phase.block, blocks, snap, progress)


def run_phase(phase: Phase, rng_key, state, num_steps: int, offset, progress=None):
    """:func:`iterate`, keeping the per-iteration ``(acceptance_rate, is_accepted,
    proposal_is_finite)`` (iterations last) of the info."""
    state, info, trace = iterate(phase, rng_key, state, num_steps, offset, progress)
    rates = (info.acceptance_rate, info.is_accepted, info.proposal_is_finite)
    if phase.chains_first:
        rates = tuple(jnp.moveaxis(x, 0, 1) for x in rates)
    return state, rates, trace


def run_schedule(
    schedule: Schedule,
    rng_key,
    position,
    progress: ProgressBar | None = None,
    stop_after: int | None = None,
    evaluated=None,
):
    """Run a warm-up: ``((state, parameters), info)``.

    With ``stop_after``, only the first ``stop_after`` iterations (at least all phases
    but the last); :func:`resume_schedule` runs more of the last phase, and the parts give
    the same chain as one run when ``stop_after`` ends a block of that phase.
    ``evaluated``: ``(log pi(position), its gradient)`` where the caller has them, handed
    to a start that takes them (the Langevin warm-ups'), so that the program evaluates
    and compiles one gradient less.
    """
    if evaluated is None:
        state, start = schedule.start(rng_key, position)
    else:
        state, start = schedule.start(rng_key, position, evaluated)
    phases = schedule.phases
    total = sum(p.num_steps for p in phases)
    stop = total
    if stop_after is not None:
        stop = max(min(stop_after, total), total - (phases[-1].num_steps if phases else 0))
    offset, rates, trace, evals = 0, [], None, start.num_grad_evals
    for phase in phases:
        num = min(phase.num_steps, stop - offset)
        state = phase.enter(state)
        state, phase_rates, phase_trace = run_phase(phase, rng_key, state, num, offset, progress)
        rates.append(phase_rates)
        trace = phase_trace if phase_trace is not None else trace
        evals = evals + num * phase.grads_per_step
        offset += num
    state, parameters = schedule.finish(state)
    merged = _concat(*rates, axis=-1)
    info = WarmupInfo(
        *merged,
        initial_step_size=start.step_size,
        num_grad_evals=evals,
        trace=trace if schedule.record_trace else None,
    )
    return (state, parameters), info


def resume_schedule(
    schedule: Schedule, rng_key, carry, num_more: int, progress: ProgressBar | None = None
):
    """``num_more`` more iterations of the last phase of a :func:`run_schedule` stopped
    early; ``carry`` is the ``(state, parameters)`` it (or an earlier resume) returned.

    Returns ``(state, parameters), info`` with the info of the new iterations only
    (append it with :func:`extend_info`). The iteration index, which keys the random
    draws, comes from the state (``phase.progress_of``), so every call of one
    ``num_more`` compiles the same.
    """
    phase = schedule.phases[-1]
    state, parameters = carry
    before = sum(p.num_steps for p in schedule.phases[:-1])
    offset = before + phase.progress_of(state)
    state, rates, trace = run_phase(phase, rng_key, state, num_more, offset, progress)
    state, parameters = schedule.finish(state)
    num_chains = jnp.shape(rates[0])[:-1]
    info = WarmupInfo(
        *rates,
        initial_step_size=parameters.step_size,
        num_grad_evals=jnp.full(num_chains, num_more * phase.grads_per_step, jnp.int32),
        trace=trace if schedule.record_trace else None,
    )
    return (state, parameters), info


class Segment(NamedTuple):
    """A part of a warm-up run by one compiled call (:func:`advance_schedule`).

    Attributes
    ----------
    phase
        Index of the phase the part belongs to.
    num_steps
        Its iterations (0 for a phase of no iterations: only its ``enter``).
    enter
        Whether the part starts the phase (its ``enter`` hand-over comes first).
    begin
        Its first iteration, counted from the start of the warm-up.
    grads_per_step
        Gradient evaluations of one of its iterations.
    """

    phase: int
    num_steps: int
    enter: bool
    begin: int
    grads_per_step: int = 1


def segments(schedule: Schedule, every: int) -> tuple[Segment, ...]:
    """The warm-up cut into parts of at most ``every`` iterations, none across a phase's
    boundary; inside a blocked phase, parts of whole blocks (``every`` rounded down to a
    multiple of the block, at least one block), so that each block's ``finish_block`` comes
    where it would in one run."""
    if isinstance(every, bool) or int(every) < 1:
        raise ValueError(f"`every` must be an integer >= 1, got {every!r}.")
    parts, begin = [], 0
    for index, phase in enumerate(schedule.phases):
        length = int(every)
        if phase.block is not None:
            length = max(phase.block, length // phase.block * phase.block)
        done = 0
        while True:
            num = min(length, phase.num_steps - done)
            parts.append(Segment(index, num, done == 0, begin + done, phase.grads_per_step))
            done += num
            if done >= phase.num_steps:
                break
        begin += phase.num_steps
    return tuple(parts)


def advance_schedule(
    schedule: Schedule,
    rng_key,
    state,
    segment: Segment,
    offset,
    progress: ProgressBar | None = None,
):
    """Run one :class:`Segment` of a warm-up from ``state`` (the schedule's ``start``
    state or what the previous segment returned): ``(state, rates, trace or None)``,
    ``rates`` the per-iteration ``(acceptance_rate, is_accepted, proposal_is_finite)``
    (iterations last). ``offset`` is the segment's first iteration (``segment.begin``),
    passed as a traced integer so that parts of one length compile once."""
    phase = schedule.phases[segment.phase]
    if segment.enter:
        state = phase.enter(state)
    state, rates, trace = run_phase(phase, rng_key, state, segment.num_steps, offset, progress)
    return state, rates, trace if schedule.record_trace else None


def extend_info(info: WarmupInfo, more: WarmupInfo) -> WarmupInfo:
    """``info`` of a warm-up followed by ``more``, the info of its continuation
    (iterations on the last axis; a leading axis of chains is kept)."""
    old = (info.acceptance_rate, info.is_accepted, info.proposal_is_finite)
    new = (more.acceptance_rate, more.is_accepted, more.proposal_is_finite)
    merged = [jnp.concatenate([a, b], axis=-1) for a, b in zip(old, new, strict=True)]
    trace = info.trace
    if trace is not None:
        axis = trace.iteration.ndim - 1  # snapshots follow any chain axis
        trace = jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=axis), trace, more.trace)
    return WarmupInfo(
        *merged,
        initial_step_size=info.initial_step_size,
        num_grad_evals=info.num_grad_evals + more.num_grad_evals,
        trace=trace,
    )


def step_at(phases, iteration, key, state):
    """One iteration of a schedule whose phases share one state type, the phase chosen by
    the iteration's index (``lax.switch``); the last phase goes on past its length. For
    drivers that make one transition per call (NumPyro's ``MCMC``), which hand the key."""
    bounds = np.cumsum([p.num_steps for p in phases[:-1]])
    index = jnp.searchsorted(jnp.asarray(bounds), iteration, side="right")
    branches = [lambda s, p=p: p.step(key, s) for p in phases]
    return jax.lax.switch(index, branches, state)


def snapshot(sqrt_precond, trace, step_size, iteration, record_precond: bool) -> WarmupTrace:
    """A :class:`WarmupTrace` entry: ``sigma^2`` and, if asked, ``A / (tr(A) / d)``."""
    precond = None
    if record_precond:
        precond = (sqrt_precond @ sqrt_precond.T) * (sqrt_precond.shape[0] / trace)
    return WarmupTrace(iteration, step_size, precond)
