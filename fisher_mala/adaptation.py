"""Warm-up (burn-in with adaptation) for MALA and FisherMALA (layer 4).

Each warm-up follows BlackJAX's shape: ``warmup.run(rng_key, position, num_steps)``
returns ``(state, parameters), info`` for one chain; ``state`` is ready for the frozen
sampling kernel and ``parameters`` holds what was tuned.

FisherMALA (Algorithm 1, Section 5.1):

1. an initial step size from :func:`find_reasonable_step_size` (see below);
2. ``n0`` (default 500) iterations of plain MALA adapting ``sigma^2`` towards 0.574;
3. ``R = I`` (``I / sqrt(lambda)``, the same proposal) and adaptive FisherMALA
   iterations for the rest of the burn-in, ``tr(R R^T)`` re-anchored every
   ``block_size`` iterations (see :mod:`fisher_mala.sqrt_precond`).

MALA (Section 5.1): ``sigma^2`` adapted during the whole burn-in.

Initial step size. The paper's rule ``sigma^2 <- sigma^2 [1 + 0.015 (alpha - 0.574)]``
changes ``sigma^2`` by at most 1% per iteration, so a poor initial guess wastes the MALA
phase (a hundredfold reduction needs about 800 iterations of rejections). Like Stan's
and BlackJAX's ``find_reasonable_step_size``, :func:`find_reasonable_step_size` doubles
or halves ``sigma^2`` from the user's guess until the *average* M-H acceptance
probability of ``num_proposals`` (default 8) MALA proposals from the initial position
crosses the target, and returns the last step on the accepting side. It costs
``num_proposals`` gradient evaluations per doubling (about 100-200 in all), which
``fm.sample`` counts in ``num_grad_evals``.
"""

import warnings
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.flatten_util import ravel_pytree

from fisher_mala import fisher, mala, validation
from fisher_mala.base import AdaptationAlgorithm, ArrayTree
from fisher_mala.preconditioner import capped_share
from fisher_mala.progress import ProgressBar, scan_with_progress
from fisher_mala.proposals import langevin_transition
from fisher_mala.pytree import flat_logdensity_and_grad, ravel
from fisher_mala.step_size import LEARNING_RATE, MALA_TARGET_ACCEPTANCE, adapt_step_size

__all__ = [
    "WarmupParameters",
    "WarmupInfo",
    "WarmupTrace",
    "StepSizeSearch",
    "find_reasonable_step_size",
    "bracket_step_size",
    "adaptive_phase",
    "extend_info",
    "MALAWarmup",
    "FisherMALAWarmup",
    "mala_warmup",
    "fisher_mala_warmup",
]

#: Iterations between exact recomputations of tr(R R^T) during the warm-up.
TRACE_REFRESH_EVERY = 1000


class WarmupParameters(NamedTuple):
    """The frozen parameters for the sampling phase.

    Attributes
    ----------
    step_size
        The final ``sigma^2`` (un-normalized).
    sqrt_precond
        The final ``R`` (``None`` for MALA).
    """

    step_size: Array
    sqrt_precond: Array | None


class WarmupTrace(NamedTuple):
    """Snapshots taken every ``trace_every`` adaptive iterations.

    Attributes
    ----------
    iteration
        Burn-in iteration (counting the MALA phase) of each snapshot.
    step_size
        ``sigma^2`` at each snapshot.
    normalized_precond
        ``A / (tr(A) / d)`` at each snapshot (only with ``record_precond=True``).
    """

    iteration: Array
    step_size: Array
    normalized_precond: Array | None


class StepSizeSearch(NamedTuple):
    """Outcome of :func:`find_reasonable_step_size`."""

    step_size: Array
    num_grad_evals: Array


class WarmupInfo(NamedTuple):
    """Per-iteration diagnostics of a warm-up.

    Attributes
    ----------
    acceptance_rate
        ``alpha`` at every burn-in iteration.
    is_accepted
        M-H outcome at every burn-in iteration.
    proposal_is_finite
        False where the proposal's log density or gradient was not finite.
    initial_step_size
        ``sigma^2`` after the step-size search, before the first iteration.
    num_grad_evals
        Gradient evaluations of the warm-up, the search included.
    trace
        A :class:`WarmupTrace` (FisherMALA with ``trace_every``), else ``None``.
    """

    acceptance_rate: Array
    is_accepted: Array
    proposal_is_finite: Array
    initial_step_size: Array
    num_grad_evals: Array
    trace: WarmupTrace | None


def find_reasonable_step_size(
    rng_key,
    logdensity_fn: Callable,
    position: ArrayTree,
    initial_step_size=1.0,
    target_acceptance_rate=MALA_TARGET_ACCEPTANCE,
    num_proposals: int = 8,
    max_doublings: int = 60,
) -> StepSizeSearch:
    """Double or halve ``sigma^2`` until MALA's mean acceptance crosses the target.

    Parameters
    ----------
    rng_key
        Key for the proposals (the same noise is reused for every trial step, so the
        mean acceptance is a smooth function of the step).
    logdensity_fn
        ``position -> log pi(position)``.
    position
        Where the proposals start (the chain's initial position).
    initial_step_size
        The user's guess; the search starts there.
    target_acceptance_rate
        The acceptance rate to bracket.
    num_proposals
        Proposals averaged per trial step.
    max_doublings
        At most this many doublings or halvings (a factor ``2^60``).

    Returns
    -------
    StepSizeSearch
        The step and the number of gradient evaluations spent.
    """
    flat, unravel = ravel_pytree(position)
    dtype = flat.dtype
    value_and_grad = flat_logdensity_and_grad(logdensity_fn, unravel)
    logdensity, grad = value_and_grad(flat)
    keys = jax.random.split(rng_key, num_proposals)
    identity = lambda v: v  # noqa: E731

    def mean_acceptance(step):
        def one(key):
            return langevin_transition(
                key, flat, logdensity, grad, step, value_and_grad, identity, identity
            ).acceptance_rate

        return jnp.mean(jax.vmap(one)(keys))

    step, count = bracket_step_size(
        mean_acceptance,
        jnp.asarray(initial_step_size, dtype),
        target_acceptance_rate,
        max_doublings,
    )
    return StepSizeSearch(step, (count + 1) * num_proposals + 1)


def bracket_step_size(mean_acceptance: Callable, step, target, max_doublings: int = 60):
    """Double or halve ``step`` until ``mean_acceptance(step)`` crosses ``target``.

    Returns the last step on the accepting side (going down without ever accepting, the
    smallest step tried) and the number of doublings or halvings made.
    """
    dtype = step.dtype
    direction = jnp.where(mean_acceptance(step) >= target, 2.0, 0.5).astype(dtype)

    def keep_going(carry):
        _, accepting, i = carry
        # go up while accepting, down while not; stop at the crossing
        still = jnp.where(direction > 1, accepting, ~accepting)
        return still & (i < max_doublings)

    def body(carry):
        step, _, i = carry
        new = (step * direction).astype(dtype)
        return new, mean_acceptance(new) >= target, i + 1

    step, accepting, count = jax.lax.while_loop(
        keep_going, body, (step, direction > 1, jnp.zeros((), jnp.int32))
    )
    step = jnp.where(accepting | (direction < 1), step, step / direction)
    return step, count


def _mala_phase(key, state, step, logdensity_fn, num_steps, target, rho, offset, progress):
    kernel = mala.build_kernel()

    def body(carry, iteration):
        state, step = carry
        state, info = kernel(jax.random.fold_in(key, iteration), state, logdensity_fn, step)
        step = adapt_step_size(step, info.acceptance_rate, target, rho)
        return (state, step), info

    return scan_with_progress(body, (state, step), num_steps, offset, progress)


def _initial_state_and_step(rng_key, position, logdensity_fn, initial_step_size, search, target):
    state = mala.init(position, logdensity_fn)  # validates position and logdensity_fn
    if not search:
        step = jnp.asarray(initial_step_size, ravel(position).dtype)
        return state, StepSizeSearch(step, jnp.zeros((), jnp.int32))
    found = find_reasonable_step_size(rng_key, logdensity_fn, position, initial_step_size, target)
    return state, found


def _concat_infos(*infos):
    return jax.tree.map(lambda *xs: jnp.concatenate(xs), *infos)


class MALAWarmup:
    """MALA burn-in: ``sigma^2`` adapted towards ``target_acceptance_rate`` throughout.

    Parameters
    ----------
    logdensity_fn
        ``position -> log pi(position)``.
    initial_step_size
        Initial ``sigma^2`` guess (default 1).
    find_step_size
        Start from :func:`find_reasonable_step_size` of the guess (default ``True``).
    target_acceptance_rate, step_size_learning_rate
        ``alpha*`` and ``rho`` of the step-size rule.
    """

    def __init__(
        self,
        logdensity_fn: Callable,
        initial_step_size=1.0,
        find_step_size: bool = True,
        target_acceptance_rate=MALA_TARGET_ACCEPTANCE,
        step_size_learning_rate=LEARNING_RATE,
    ):
        validation.check_positive("initial_step_size", initial_step_size)
        validation.check_probability("target_acceptance_rate", target_acceptance_rate)
        validation.check_nonnegative(
            "step_size_learning_rate",
            step_size_learning_rate,
            upper=1.0 / float(target_acceptance_rate),
        )
        self.logdensity_fn = logdensity_fn
        self.initial_step_size = initial_step_size
        self.find_step_size = find_step_size
        self.target = target_acceptance_rate
        self.target_acceptance = float(target_acceptance_rate)
        self.rho = step_size_learning_rate

    def mala_phase(self, rng_key, position, num_steps: int, progress=None):
        """Step-size search, then ``num_steps`` MALA iterations adapting ``sigma^2``.

        Returns ``(state, step_size), per-iteration info, StepSizeSearch``; the first
        phase of every warm-up of the library.
        """
        key_search, key_run = jax.random.split(rng_key)
        state, found = _initial_state_and_step(
            key_search,
            position,
            self.logdensity_fn,
            self.initial_step_size,
            self.find_step_size,
            self.target,
        )
        carry, info = _mala_phase(
            key_run,
            state,
            found.step_size,
            self.logdensity_fn,
            num_steps,
            self.target,
            self.rho,
            0,
            progress,
        )
        return carry, info, found

    def run(self, rng_key, position, num_steps: int, progress: ProgressBar | None = None):
        """Run ``num_steps`` burn-in iterations of one chain.

        Returns
        -------
        (state, parameters), info
            A :class:`~fisher_mala.mala.MALAState`, :class:`WarmupParameters` and
            :class:`WarmupInfo`.
        """
        (state, step), info, found = self.mala_phase(rng_key, position, num_steps, progress)
        info = WarmupInfo(
            info.acceptance_rate,
            info.is_accepted,
            info.proposal_is_finite,
            found.step_size,
            found.num_grad_evals + 1 + num_steps,
            None,
        )
        return (state, WarmupParameters(step, None)), info


class FisherMALAWarmup(MALAWarmup):
    """FisherMALA burn-in (Algorithm 1): a MALA phase, then adaptive Fisher iterations.

    Parameters
    ----------
    logdensity_fn
        ``position -> log pi(position)``.
    num_mala_steps
        ``n0``, the plain-MALA initialization phase (default 500).
    damping, signal, learning_rate
        As in :func:`fisher_mala.fisher_mala`.
    trace_every
        Record a :class:`WarmupTrace` snapshot every this many adaptive iterations
        (``None``: no trace).
    record_precond
        Include the trace-normalized ``A`` (``d x d``) in each snapshot.
    **mala_options
        ``initial_step_size``, ``find_step_size``, ``target_acceptance_rate``,
        ``step_size_learning_rate``: as in :class:`MALAWarmup`.
    """

    def __init__(
        self,
        logdensity_fn: Callable,
        num_mala_steps: int = 500,
        damping=fisher.DAMPING,
        signal: str = "rao_blackwell",
        learning_rate=None,
        trace_every: int | None = None,
        record_precond: bool = False,
        **mala_options,
    ):
        super().__init__(logdensity_fn, **mala_options)
        # Validates damping, signal and learning_rate eagerly.
        fisher.as_top_level_api(
            logdensity_fn,
            1.0,
            damping,
            self.target,
            self.rho,
            signal,
            learning_rate,
        )
        if int(num_mala_steps) < 0:
            raise ValueError(f"`num_mala_steps` must be >= 0, got {num_mala_steps}.")
        if trace_every is not None and int(trace_every) < 1:
            raise ValueError(f"`trace_every` must be a positive integer, got {trace_every}.")
        self.num_mala_steps = int(num_mala_steps)
        self.damping = damping
        self.learning_rate = learning_rate
        self.kernel = fisher.build_kernel(signal, learning_rate, adapt=True, damping=damping)
        self.trace_every = trace_every
        self.record_precond = record_precond

    def _snapshot(self, state, iteration):
        return snapshot(
            state.sqrt_precond, state.trace_precond, state.step_size, iteration, self.record_precond
        )

    @property
    def block(self) -> int:
        """Iterations between re-anchorings of ``tr(R R^T)`` (and trace snapshots)."""
        return self.trace_every or TRACE_REFRESH_EVERY

    def _adapt(self, rng_key, fstate, num_steps, offset, progress):
        return adaptive_iterations(
            self, rng_key, fstate, num_steps, offset, progress, fisher.refresh_trace
        )

    def run(
        self,
        rng_key,
        position,
        num_steps: int,
        progress: ProgressBar | None = None,
        stop_after: int | None = None,
    ):
        """Run ``num_steps`` burn-in iterations (MALA phase included) of one chain.

        With ``stop_after``, only the first ``stop_after`` of them; :meth:`resume` runs
        the rest, and the two give the same chain as one run when ``stop_after`` ends a
        block (:attr:`block`) of the adaptive phase.

        Returns
        -------
        (state, parameters), info
            A :class:`~fisher_mala.fisher.FisherMALAState` ready for the frozen kernel,
            :class:`WarmupParameters` and :class:`WarmupInfo`.
        """
        key_mala, _ = jax.random.split(rng_key)
        num_mala = min(self.num_mala_steps, num_steps)
        _warn_if_window_below_dim(self.learning_rate, position, num_steps - num_mala)
        stop = num_steps if stop_after is None else max(min(stop_after, num_steps), num_mala)
        (state, step), mala_info, found = self.mala_phase(key_mala, position, num_mala, progress)
        fstate = fisher.state_from(
            state.position, state.logdensity, state.logdensity_grad, step, self.damping
        )
        fstate, fisher_info, trace = self._adapt(
            rng_key, fstate, stop - num_mala, num_mala, progress
        )
        rates = _concat_infos(
            *[
                (i.acceptance_rate, i.is_accepted, i.proposal_is_finite)
                for i in (mala_info, fisher_info)
            ]
        )
        info = WarmupInfo(
            *rates,
            initial_step_size=found.step_size,
            num_grad_evals=found.num_grad_evals + 1 + stop,
            trace=trace if self.trace_every else None,
        )
        params = WarmupParameters(fstate.step_size, fstate.sqrt_precond)
        return (fstate, params), info

    def resume(self, rng_key, carry, num_steps: int, progress=None, num_more: int = 0):
        """``num_more`` more adaptive iterations of a :meth:`run` stopped early.

        ``carry`` is the ``(state, parameters)`` that run (or a previous ``resume``)
        returned, ``rng_key`` and ``num_steps`` those given to :meth:`run`. Returns
        ``(state, parameters), info`` with the info of the new iterations only (append it
        with :func:`extend_info`); the iteration index, which keys the random draws, comes
        from the state, so every call of one ``num_more`` compiles the same.
        """
        fstate, _ = carry
        offset = min(self.num_mala_steps, num_steps) + fstate.count
        fstate, more, trace = self._adapt(rng_key, fstate, num_more, offset, progress)
        info = WarmupInfo(
            more.acceptance_rate,
            more.is_accepted,
            more.proposal_is_finite,
            initial_step_size=fstate.step_size,
            num_grad_evals=jnp.asarray(num_more, jnp.int32),
            trace=trace if self.trace_every else None,
        )
        return (fstate, WarmupParameters(fstate.step_size, fstate.sqrt_precond)), info


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
            stacklevel=2,
        )


def snapshot(sqrt_precond, trace, step_size, iteration, record_precond: bool) -> WarmupTrace:
    """A :class:`WarmupTrace` entry: ``sigma^2`` and, if asked, ``A / (tr(A) / d)``."""
    precond = None
    if record_precond:
        precond = (sqrt_precond @ sqrt_precond.T) * (sqrt_precond.shape[0] / trace)
    return WarmupTrace(iteration, step_size, precond)


def adaptive_iterations(warmup, rng_key, state, num_steps, offset, progress, finish_block):
    """``num_steps`` adaptive iterations of ``warmup.kernel`` from iteration ``offset``.

    The keys are ``fold_in(split(rng_key)[1], iteration)``, so a phase run in parts is the
    same chain as in one; ``finish_block`` re-anchors the trace every ``warmup.block``.
    """
    key_adapt = jax.random.split(rng_key)[1]

    def step_fn(state, iteration):
        key = jax.random.fold_in(key_adapt, iteration)
        return warmup.kernel(key, state, warmup.logdensity_fn, warmup.target, warmup.rho)

    return adaptive_phase(
        step_fn,
        state,
        num_steps,
        offset,
        block=warmup.block,
        finish_block=finish_block,
        snapshot=warmup._snapshot,
        progress=progress,
    )


def adaptive_phase(step_fn, state, num_steps, offset, block, finish_block, snapshot, progress):
    """``num_steps`` iterations of ``step_fn(state, iteration) -> (state, info)``.

    Run as ``lax.scan`` over blocks of ``block`` iterations; after each block
    ``finish_block(state)`` (e.g. re-anchor the trace) and ``snapshot(state, iteration)``
    is recorded. Returns the state, the per-iteration infos and the stacked snapshots.
    """
    num_blocks, remainder = divmod(num_steps, block)

    def outer(state, b):
        start = offset + b * block
        if progress is not None:
            jax.debug.callback(progress.update_to, start, ordered=False)
        state, info = jax.lax.scan(step_fn, state, start + jnp.arange(block))
        state = finish_block(state)
        return state, (info, snapshot(state, start + block))

    state, (info, trace) = jax.lax.scan(outer, state, jnp.arange(num_blocks))
    infos = [jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), info)]
    if remainder:
        start = offset + num_blocks * block
        state, tail = jax.lax.scan(step_fn, state, start + jnp.arange(remainder))
        infos.append(tail)
        state = finish_block(state)
    return state, _concat_infos(*infos), trace


def mala_warmup(logdensity_fn: Callable, **options) -> AdaptationAlgorithm:
    """MALA's warm-up as an ``AdaptationAlgorithm`` (the shape of BlackJAX's adaptations).

    ``run(rng_key, position, num_steps) -> ((state, parameters), info)`` with a
    :class:`~fisher_mala.mala.MALAState`, :class:`WarmupParameters` and
    :class:`WarmupInfo`; ``options`` as in :class:`MALAWarmup`.
    """
    return AdaptationAlgorithm(MALAWarmup(logdensity_fn, **options).run)


def fisher_mala_warmup(logdensity_fn: Callable, **options) -> AdaptationAlgorithm:
    """Algorithm 1's warm-up as an ``AdaptationAlgorithm``.

    ``run(rng_key, position, num_steps) -> ((state, parameters), info)``: the state is
    ready for ``fm.fisher_mala(..., adapt=False)``'s kernel, ``parameters.sqrt_precond``
    is the learned ``R``; ``options`` as in :class:`FisherMALAWarmup`.
    """
    return AdaptationAlgorithm(FisherMALAWarmup(logdensity_fn, **options).run)
