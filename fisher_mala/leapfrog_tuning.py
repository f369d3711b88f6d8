"""The step-size phase of Fisher NUTS / HMC: dual averaging of the leapfrog step (layer 4).

After the Fisher phase, ``R`` frozen (or, with ``score_prior_weight``, learning on from
the scores at NUTS's draws), NUTS or HMC in whitened coordinates with the leapfrog step
tuned by dual averaging (Hoffman and Gelman, 2014; BlackJAX's implementation,
:func:`fisher_mala.adaptations.dual_averaging.dual_averaging`). It starts from
FisherMALA's normalized step: one leapfrog step of size ``epsilon`` is MALA with
``sigma_R^2 = epsilon^2``. At its end ``R`` is rescaled so that the whitened target has
unit scale (:func:`normalize`).

Each half of the phase is a :class:`~fisher_mala.schedule.Phase` run by the schedule's
loop (:func:`~fisher_mala.schedule.iterate`): its step is the whitened NUTS / HMC kernel
composed with dual averaging (and, in the keep-learning half, the rank-one update of
``R``); between the halves, the hand-over rescales ``R`` and the averaged step.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fisher_mala import geometric_widening
from fisher_mala.adaptations.base import Adaptation
from fisher_mala.pytree import ravel
from fisher_mala.schedule import Phase, WarmupInfo, WarmupParameters, iterate
from fisher_mala.sqrt_precond import rank_one_update, whitened_product
from fisher_mala.square_roots import LowRankSqrt
from fisher_mala.whitened_hmc import (
    TRAJECTORY_LENGTH,
    DiagonalSqrt,
    FisherHMCState,
    whiten_gradient,
)

__all__ = [
    "LeapfrogTuning",
    "tuning_stage",
    "tune_step_size",
    "initial_leapfrog_step",
    "normalize",
    "hand_over",
    "scale_sqrt",
    "merge_info",
    "TuningCarry",
    "tuning_start",
    "tuning_advance",
    "tuning_finish",
]


class LeapfrogTuning(NamedTuple):
    """What the step-size phase runs.

    Attributes
    ----------
    kernel
        The whitened NUTS / HMC kernel (:func:`fisher_mala.whitened_hmc.build_kernel`).
    logdensity_fn
        ``position -> log pi(position)``.
    algorithm
        ``"nuts"`` or ``"hmc"``.
    dual_averaging
        The step-size adaptation (:func:`fisher_mala.adaptations.dual_averaging`).
    max_num_doublings, num_integration_steps
        As in :func:`fisher_mala.whitened_hmc.as_top_level_api`.
    score_prior_weight
        ``None``, or ``n0``: ``R`` keeps learning in the second half of the phase
        (:class:`~fisher_mala.whitened_warmup.FisherHMCWarmup`).
    """

    kernel: Callable
    logdensity_fn: Callable
    algorithm: str
    dual_averaging: Adaptation
    max_num_doublings: int
    num_integration_steps: Any
    score_prior_weight: Any


def tune_step_size(tuning, rng_key, state, initial_step, num_steps, offset, progress,
                   widen_at=None):  # fmt: skip
    """Dual averaging of the leapfrog step for one chain (and, optionally, more learning).

    Returns the state, the tuned step, the per-iteration info and the mean of
    ``|R^T g|^2`` over the last visited states, which gives the scale of the whitened
    target (:func:`normalize`). With ``widen_at``
    (:func:`~fisher_mala.geometric_widening.widening_point`), ``R`` is widened after that
    many iterations where the draws show the posterior wider than its Fisher metric, and the
    step is tuned again from there (:func:`widen_and_restart`).
    """
    da_init, _, da_final = tuning.dual_averaging
    da = da_init(initial_step)
    if tuning.score_prior_weight is None or num_steps < 2:
        widen_iteration = None if widen_at is None else offset + widen_at
        state, da, info, sums, _ = _dual_averaging(
            tuning, rng_key, state, da, num_steps, offset, progress, None, widen_iteration
        )
        mean_sq = sums[0] / sums[1]
    else:
        first = num_steps // 2
        key_first, key_second = jax.random.split(rng_key)
        state, da, info_first, sums, _ = _dual_averaging(
            tuning, key_first, state, da, first, offset, progress, None
        )
        state, k = normalize(state, sums[0] / sums[1])
        shift = jnp.log(k).astype(da.log_step_size.dtype)
        da = da._replace(
            log_step_size=da.log_step_size - shift,
            log_step_size_avg=da.log_step_size_avg - shift,
            mu=da.mu - shift,
        )
        prior = tuning.score_prior_weight * state.whitened_grad.shape[-1]
        state, da, info_second, sums, _ = _dual_averaging(
            tuning, key_second, state, da, num_steps - first, offset + first, progress, prior
        )
        mean_sq = sums[0] / sums[1]
        info = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), info_first, info_second)
    step = da_final(da) if num_steps else initial_step
    return state, jnp.asarray(step, initial_step.dtype), info, mean_sq


def _sums(state):
    """``(sum of |R^T g|^2, count)`` at the start of a phase: the state's own."""
    return jnp.sum(state.whitened_grad**2), jnp.ones((), state.whitened_grad.dtype)


def widen_and_restart(tuning, state, da, sums, moments, widen=geometric_widening.widen):
    """``(state, dual-averaging state, sums)`` after ``widen``
    (:func:`~fisher_mala.geometric_widening.widen` or its host twin ``widen_on_host``) on
    the draws summed in ``moments``: where ``R`` was widened, the dual averaging restarts
    from its averaged step so far (shrunk by the fourth root of the largest variance
    factor) and the sums of ``|R^T g|^2`` from the widened state; elsewhere all three are
    unchanged, bit for bit."""
    da_init, _, da_final = tuning.dual_averaging
    num = jnp.maximum(sums[1] - 1, 1)  # the draws summed: the states before this one
    widened_state, factor = widen(state, moments, num)
    widened = factor > 1.0
    step = jnp.asarray(da_final(da), state.whitened_grad.dtype) / factor**0.25
    restart = (widened_state, da_init(step), _sums(widened_state))
    return jax.tree.map(lambda new, old: jnp.where(widened, new, old), restart, (state, da, sums))


def _dual_averaging(tuning, rng_key, state, da, num_steps, offset, progress, prior_weight,
                    widen_iteration=None):  # fmt: skip
    """``num_steps`` NUTS / HMC transitions with dual averaging of the leapfrog step:
    ``(state, da, info, sums, moments)``, ``sums`` the running ``(sum of |R^T g|^2,
    count)``. With ``widen_iteration`` (counted from the start of the warm-up), the draws
    before it are summed in ``moments`` and ``R`` is widened there
    (:func:`widen_and_restart`); else ``moments`` is None.

    HMC's number of leapfrog steps follows the running estimate of the whitened
    target's scale, so that its trajectories last ``TRAJECTORY_LENGTH`` in units of the
    target's spread. With ``prior_weight``, ``R`` also absorbs the score at every draw
    (``score_prior_weight``).
    """
    start = (state, da, *_sums(state))
    if widen_iteration is not None:
        moments = geometric_widening.moments_init(state, widen_iteration - offset)
        start = (*start, moments, jnp.asarray(widen_iteration, jnp.int32))
    phase = _step_size_phase(tuning, state, num_steps, prior_weight, widen_iteration is not None)
    carry, info, _ = iterate(phase, rng_key, start, num_steps, offset, progress)
    moments = carry[4] if widen_iteration is not None else None
    return carry[0], carry[1], info, carry[2:4], moments


def _step_size_phase(
    tuning, state, num_steps, prior_weight, widening=False, widen=geometric_widening.widen
) -> Phase:
    """The :class:`~fisher_mala.schedule.Phase` of :func:`_dual_averaging`: its state is
    ``(kernel state, dual-averaging state, sum of |R^T g|^2, count)``, and with
    ``widening`` the draws' :class:`~fisher_mala.geometric_widening.Moments` and the
    iteration where ``R`` is widened (before it the states are summed, at it
    :func:`widen_and_restart` runs: one compiled transition for both halves)."""
    _, da_update, _ = tuning.dual_averaging
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

    def step(key, carry):
        state, da, sum_sq, count = carry[:4]
        step = jnp.exp(da.log_step_size).astype(dtype)
        steps = tuning.num_integration_steps
        if steps is None and tuning.algorithm == "hmc":
            length = TRAJECTORY_LENGTH * jnp.sqrt(dim * count / sum_sq)
            steps = jnp.clip(jnp.ceil(length / step), 1, 2**tuning.max_num_doublings)
            steps = steps.astype(jnp.int32)
        state, info = tuning.kernel(
            key, state, tuning.logdensity_fn, step, steps, tuning.max_num_doublings
        )
        sum_sq = sum_sq + jnp.sum(state.whitened_grad**2)
        if prior_weight is not None:
            state = learn(state, count)
        return (state, da_update(da, info.acceptance_rate), sum_sq, count + 1, *carry[4:]), info

    def before_step(carry, iteration):
        state, da, sum_sq, count, moments, at = carry

        def add(moments):
            return geometric_widening.moments_update(moments, state)

        if isinstance(moments, geometric_widening.LowRankMoments):  # rows written in place
            moments = geometric_widening.moments_update(moments, state, iteration < at)
        else:
            moments = jax.lax.cond(iteration < at, add, lambda m: m, moments)

        def widened(parts):
            return widen_and_restart(tuning, *parts, moments, widen)

        parts = (state, da, (sum_sq, count))
        state, da, (sum_sq, count) = jax.lax.cond(iteration == at, widened, lambda p: p, parts)
        return state, da, sum_sq, count, moments, at

    if not widening:
        return Phase("step_size", num_steps, step, key=lambda key: key)
    return Phase("step_size", num_steps, step, key=lambda key: key, before_step=before_step)


def initial_leapfrog_step(fstate, dim):
    # MALA with normalized step sigma_R^2 is one leapfrog step of size sqrt(sigma_R^2)
    return jnp.sqrt(fstate.step_size * dim / fstate.trace_precond)


def normalize(state, mean_sq_grad):
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
        sqrt_precond=scale_sqrt(state.sqrt_precond, k),
        whitened_grad=state.whitened_grad * k[..., None],
    )
    return state, k


def merge_info(finfo, info, step, sqrt_precond):
    merged = WarmupInfo(
        acceptance_rate=jnp.concatenate([finfo.acceptance_rate, info.acceptance_rate], -1),
        is_accepted=jnp.concatenate([finfo.is_accepted, info.is_accepted], -1),
        proposal_is_finite=jnp.concatenate([finfo.proposal_is_finite, info.proposal_is_finite], -1),
        initial_step_size=finfo.initial_step_size,
        num_grad_evals=finfo.num_grad_evals + jnp.sum(info.num_integration_steps, -1),
        trace=finfo.trace,
    )
    return WarmupParameters(step, sqrt_precond), merged


def hand_over(fstate, metric: str, flat_grad) -> FisherHMCState:
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


def scale_sqrt(sqrt_precond, k):
    """``k R`` with ``k`` one number per leading index (per chain)."""
    if isinstance(sqrt_precond, DiagonalSqrt):
        return DiagonalSqrt(sqrt_precond.scale * k[..., None])
    if isinstance(sqrt_precond, LowRankSqrt):  # D^(1/2) carries the scale
        return sqrt_precond._replace(scale=sqrt_precond.scale * k[..., None])
    return sqrt_precond * k[..., None, None]


def tuning_stage(tuning, rng_key, fisher_out, num_steps, progress, metric, pooled,
                 widen_at=None):  # fmt: skip
    """The step-size phase after the Fisher phase: ``((state, parameters), info)``.

    One chain, or (``pooled``) every chain after the pooled Fisher phase, each with its
    own leapfrog step and the shared ``R``, rescaled by the chains' mean whitened scale.
    ``info`` is the Fisher phase's followed by the step-size phase's. ``widen_at``: the
    step-size iteration after which ``R`` is widened where the draws call for it (one
    chain; :func:`tune_step_size`), or None.
    """
    (fstate, _), finfo = fisher_out
    num_fisher = finfo.acceptance_rate.shape[-1]
    dim = fstate.whitened_grad.shape[-1]
    initial = initial_leapfrog_step(fstate, dim)

    def tune(key, state, widen_at=None):
        return tune_step_size(
            tuning, key, state, initial, num_steps, num_fisher, progress, widen_at
        )

    if not pooled:
        state = hand_over(fstate, metric, ravel(fstate.logdensity_grad))
        state, step, info, mean_sq = tune(rng_key, state, widen_at)
        state, k = normalize(state, mean_sq)
        params, merged = merge_info(finfo, info, step / k, state.sqrt_precond)
        return (state, params), merged
    num_chains = fstate.whitened_grad.shape[0]
    shared = hand_over(fstate, metric, jax.vmap(ravel)(fstate.logdensity_grad))
    states = shared._replace(
        sqrt_precond=jax.tree.map(
            lambda a: jnp.broadcast_to(a, (num_chains, *a.shape)), shared.sqrt_precond
        )
    )
    states, steps, info, mean_sq = jax.vmap(tune)(jax.random.split(rng_key, num_chains), states)
    pooled_mean_sq = jnp.broadcast_to(jnp.mean(mean_sq), mean_sq.shape)  # one R for all
    states, k = normalize(states, pooled_mean_sq)
    params, merged = merge_info(finfo, info, steps / k, scale_sqrt(shared.sqrt_precond, k[0]))
    return (states, params), merged


# The step-size phase in parts (a checkpointed run saves between them): ``tuning_start``
# hands over from the Fisher phase, ``tuning_advance`` runs some of the phase's
# iterations, ``tuning_finish`` rescales R and merges the infos. Together they are
# :func:`tuning_stage` of one chain without ``score_prior_weight``: the same keys, the
# same chain, bit for bit.


class TuningCarry(NamedTuple):
    """The step-size phase between its parts: the kernel state, the dual-averaging state,
    the running sum of ``|R^T g|^2`` and its count, the phase's initial leapfrog step, and
    (where ``R`` is widened, :mod:`~fisher_mala.geometric_widening`) the draws' moments and
    the iteration of the widening, else None."""

    state: Any
    dual_averaging: Any
    sum_sq: Any
    count: Any
    initial_step: Any
    moments: Any = None
    widen_iteration: Any = None


def tuning_start(tuning, fisher_state, metric, widen_iteration=None, widen_at=None) -> TuningCarry:
    """The carry at the start of the step-size phase (``fisher_state``: the Fisher phase's
    final state; ``widen_iteration``: where ``R`` is widened, counted from the start of
    the warm-up, as :func:`tune_step_size`'s ``offset + widen_at``; ``widen_at`` counted
    from the start of this phase: the draws the widening sees)."""
    dim = fisher_state.whitened_grad.shape[-1]
    initial = initial_leapfrog_step(fisher_state, dim)
    state = hand_over(fisher_state, metric, ravel(fisher_state.logdensity_grad))
    dtype = state.whitened_grad.dtype
    da = tuning.dual_averaging[0](initial)
    carry = TuningCarry(state, da, jnp.sum(state.whitened_grad**2), jnp.ones((), dtype), initial)
    if widen_iteration is None:
        return carry
    return carry._replace(
        moments=geometric_widening.moments_init(state, widen_at),
        widen_iteration=jnp.asarray(widen_iteration, jnp.int32),
    )


def tuning_advance(tuning, rng_key, carry: TuningCarry, num_steps, offset, progress):
    """``num_steps`` iterations of the step-size phase from its iteration ``offset``
    (counted from the start of the warm-up): ``(carry, info)``, ``info`` the per-iteration
    ``(acceptance_rate, is_accepted, proposal_is_finite, num_integration_steps)``."""
    widening = carry.moments is not None
    phase = _step_size_phase(tuning, carry.state, num_steps, None, widening)
    inner = (carry.state, carry.dual_averaging, carry.sum_sq, carry.count)
    if widening:
        inner = (*inner, carry.moments, carry.widen_iteration)
    out, info, _ = iterate(phase, rng_key, inner, num_steps, offset, progress)
    fields = (info.acceptance_rate, info.is_accepted, info.proposal_is_finite)
    state, da, sum_sq, count = out[:4]
    carry = carry._replace(state=state, dual_averaging=da, sum_sq=sum_sq, count=count)
    if widening:
        carry = carry._replace(moments=out[4])
    return carry, (*fields, info.num_integration_steps)


def tuning_finish(tuning, finfo, carry: TuningCarry, info, num_steps):
    """``((state, parameters), info)`` at the end of the step-size phase, as
    :func:`tuning_stage` returns them (``finfo`` the Fisher phase's info, ``info`` what
    :func:`tuning_advance` returned, joined over the parts)."""
    names = ("acceptance_rate", "is_accepted", "proposal_is_finite", "num_integration_steps")
    info = _Info(**dict(zip(names, info, strict=True)))
    step = tuning.dual_averaging[2](carry.dual_averaging) if num_steps else carry.initial_step
    step = jnp.asarray(step, carry.initial_step.dtype)
    state, k = normalize(carry.state, carry.sum_sq / carry.count)
    params, merged = merge_info(finfo, info, step / k, state.sqrt_precond)
    return (state, params), merged


class _Info(NamedTuple):
    acceptance_rate: Any
    is_accepted: Any
    proposal_is_finite: Any
    num_integration_steps: Any
