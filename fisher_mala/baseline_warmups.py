"""Warm-ups of the paper's baselines: AdaMALA, manifold MALA and HMC (layer 4).

Same protocol as FisherMALA (Section 5.1): all adaptation happens in the burn-in, whose
final parameters are frozen for the sampling phase; the same initial step-size search
(:func:`fisher_mala.adaptation.bracket_step_size`) and the same multiplicative rule.

* AdaMALA (Appendix D): ``n0 = 500`` MALA iterations adapting ``sigma^2``; ``n0`` more
  MALA iterations that also feed their states to the Haario recursion Eq. (17) and keep
  adapting ``sigma^2`` (Appendix D says that MALA "still runs" in this phase without
  saying whether ``sigma^2`` is frozen; we keep adapting it, as in the first phase); then
  AdaMALA with ``A = Sigma_n`` adapted every iteration to the end of the burn-in. Its
  sampling phase is preconditioned MALA with the final ``R = chol(Sigma)`` frozen (the
  frozen FisherMALA kernel, which is exactly that).
* mMALA: ``sigma^2`` adapted towards 0.574 during the whole burn-in, starting from a
  bracket search around 1 (the natural scale of a Newton-like metric) with mMALA's own
  proposals.
* HMC: 10 leapfrog steps; ``epsilon`` adapted towards 0.651 (Beskos et al., 2013) with
  the same multiplicative rule, starting from ``sqrt`` of MALA's searched ``sigma^2``
  (one leapfrog step of size ``epsilon`` *is* MALA with ``sigma^2 = epsilon^2``).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fisher_mala import adamala, fisher, hmc, mala, mmala, pooled, validation
from fisher_mala.adaptation import (
    TRACE_REFRESH_EVERY,
    MALAWarmup,
    StepSizeSearch,
    WarmupInfo,
    WarmupParameters,
    _concat_infos,
    _initial_state_and_step,
    adaptive_iterations,
    adaptive_phase,
    bracket_step_size,
    find_reasonable_step_size,
    snapshot,
)
from fisher_mala.progress import ProgressBar, scan_with_progress
from fisher_mala.step_size import MALA_TARGET_ACCEPTANCE, adapt_step_size

__all__ = [
    "AdaMALAWarmup",
    "MMALAWarmup",
    "HMCWarmup",
    "PooledFisherMALAWarmup",
    "HMC_TARGET_ACCEPTANCE",
]

#: Optimal acceptance rate of HMC (Beskos et al., 2013).
HMC_TARGET_ACCEPTANCE = 0.651


def _rates(*infos):
    return _concat_infos(*[(i.acceptance_rate, i.is_accepted, i.proposal_is_finite) for i in infos])


class AdaMALAWarmup(MALAWarmup):
    """AdaMALA burn-in (Appendix D); see the module docstring.

    Parameters
    ----------
    num_mala_steps, num_collect_steps
        The two MALA phases (500 each in the paper). ``sigma^2`` is adapted in both:
        Appendix D leaves open whether the collecting phase freezes it.
    damping
        ``lambda`` of ``Sigma_2`` (10).
    trace_every, record_precond
        Snapshots of ``sigma^2`` (and the trace-normalized ``Sigma``) every this many
        AdaMALA iterations, as for FisherMALA.
    """

    def __init__(
        self,
        logdensity_fn: Callable,
        num_mala_steps: int = 500,
        num_collect_steps: int = 500,
        damping=fisher.DAMPING,
        trace_every: int | None = None,
        record_precond: bool = False,
        **mala_options,
    ):
        super().__init__(logdensity_fn, **mala_options)
        validation.check_positive("damping", damping, "The paper uses lambda = 10.")
        for name, value in (
            ("num_mala_steps", num_mala_steps),
            ("num_collect_steps", num_collect_steps),
        ):
            if int(value) < 0:
                raise ValueError(f"`{name}` must be >= 0, got {value}.")
        if trace_every is not None and int(trace_every) < 1:
            raise ValueError(f"`trace_every` must be a positive integer, got {trace_every}.")
        self.num_mala_steps = int(num_mala_steps)
        self.num_collect_steps = int(num_collect_steps)
        self.damping = damping
        self.trace_every = trace_every
        self.record_precond = record_precond
        self.kernel = adamala.build_kernel(self.target, self.rho)

    def _snapshot(self, state, iteration):
        cov = state.covariance
        return snapshot(
            cov.chol_upper.T, cov.trace, state.step_size, iteration, self.record_precond
        )

    def run(self, rng_key, position, num_steps: int, progress: ProgressBar | None = None):
        """Run ``num_steps`` burn-in iterations (all three phases) of one chain."""
        key_mala, key_collect, key_ada = jax.random.split(rng_key, 3)
        flat, _ = ravel_pytree(position)
        num_mala = min(self.num_mala_steps, num_steps)
        num_collect = min(self.num_collect_steps, num_steps - num_mala)
        (state, step), info_mala, found = self.mala_phase(key_mala, position, num_mala, progress)
        kernel = mala.build_kernel()

        def collect(carry, iteration):
            state, step, cov = carry
            key = jax.random.fold_in(key_collect, iteration)
            state, info = kernel(key, state, self.logdensity_fn, step)
            step = adapt_step_size(step, info.acceptance_rate, self.target, self.rho)
            cov = adamala.haario_update(cov, ravel_pytree(state.position)[0])
            return (state, step, cov), info

        cov = adamala.haario_init(flat.shape[0], self.damping, flat.dtype)
        (state, step, cov), info_collect = scan_with_progress(
            collect, (state, step, cov), num_collect, num_mala, progress
        )
        astate = adamala.init(state.position, state.logdensity, state.logdensity_grad, cov, step)

        def step_fn(astate, iteration):
            key = jax.random.fold_in(key_ada, iteration)
            return self.kernel(key, astate, self.logdensity_fn)

        astate, info_ada, trace = adaptive_phase(
            step_fn,
            astate,
            num_steps - num_mala - num_collect,
            num_mala + num_collect,
            block=self.trace_every or TRACE_REFRESH_EVERY,
            finish_block=lambda s: s,
            snapshot=self._snapshot,
            progress=progress,
        )
        sqrt_precond = astate.covariance.chol_upper.T
        fstate = fisher.state_from(
            astate.position,
            astate.logdensity,
            astate.logdensity_grad,
            astate.step_size,
            self.damping,
            sqrt_precond,
        )
        info = WarmupInfo(
            *_rates(info_mala, info_collect, info_ada),
            initial_step_size=found.step_size,
            num_grad_evals=found.num_grad_evals + 1 + num_steps,
            trace=trace if self.trace_every else None,
        )
        return (fstate, WarmupParameters(astate.step_size, sqrt_precond)), info


def _adapt_throughout(kernel, key, state, step, num_steps, target, rho, progress):
    """``num_steps`` iterations of ``kernel(key, state, step)``, adapting ``step``."""

    def body(carry, iteration):
        state, step = carry
        state, info = kernel(jax.random.fold_in(key, iteration), state, step)
        return (state, adapt_step_size(step, info.acceptance_rate, target, rho)), info

    return scan_with_progress(body, (state, step), num_steps, 0, progress)


class MMALAWarmup(MALAWarmup):
    """mMALA burn-in: ``sigma^2`` adapted throughout (see the module docstring).

    Parameters
    ----------
    metric_fn
        Optional ``position -> G(position)`` (default: negative Hessian by autodiff).
    num_search_proposals
        Proposals averaged per trial step of the initial search.
    """

    def __init__(
        self,
        logdensity_fn: Callable,
        metric_fn: Callable | None = None,
        num_search_proposals: int = 4,
        **mala_options,
    ):
        super().__init__(logdensity_fn, **mala_options)
        if metric_fn is not None and not callable(metric_fn):
            raise TypeError("`metric_fn` must be callable: position -> (d, d) metric.")
        self.metric_fn = metric_fn
        self.kernel = mmala.build_kernel(metric_fn)
        self.num_search_proposals = num_search_proposals

    def _search(self, key, state):
        keys = jax.random.split(key, self.num_search_proposals)

        def mean_acceptance(step):
            def one(k):
                return self.kernel(k, state, self.logdensity_fn, step)[1].acceptance_rate

            return jnp.mean(jax.vmap(one)(keys))

        step0 = jnp.asarray(self.initial_step_size, state.natural_grad.dtype)
        if not self.find_step_size:
            return StepSizeSearch(step0, jnp.zeros((), jnp.int32))
        step, count = bracket_step_size(mean_acceptance, step0, self.target)
        return StepSizeSearch(step, (count + 1) * self.num_search_proposals)

    def run(self, rng_key, position, num_steps: int, progress: ProgressBar | None = None):
        """Run ``num_steps`` burn-in iterations of one chain.

        ``info.num_grad_evals`` counts a Hessian as ``d`` gradient evaluations.
        """
        validation.check_position(position)
        validation.check_logdensity(self.logdensity_fn, position)
        key_search, key_run = jax.random.split(rng_key)
        state = mmala.init(position, self.logdensity_fn, self.metric_fn)
        found = self._search(key_search, state)

        def kernel(key, state, step):
            return self.kernel(key, state, self.logdensity_fn, step)

        (state, step), info = _adapt_throughout(
            kernel, key_run, state, found.step_size, num_steps, self.target, self.rho, progress
        )
        per_step = 1 + state.natural_grad.shape[0]
        info = WarmupInfo(
            *_rates(info),
            initial_step_size=found.step_size,
            num_grad_evals=(found.num_grad_evals + 1 + num_steps) * per_step,
            trace=None,
        )
        return (state, WarmupParameters(step, None)), info


class HMCWarmup(MALAWarmup):
    """HMC burn-in: ``epsilon`` adapted towards 0.651 throughout (module docstring).

    Parameters
    ----------
    num_integration_steps
        Leapfrog steps per iteration (10 in the paper).
    divergence_threshold
        Energy error above which a transition is reported divergent.
    """

    def __init__(
        self,
        logdensity_fn: Callable,
        num_integration_steps: int = hmc.NUM_INTEGRATION_STEPS,
        divergence_threshold: float = hmc.DIVERGENCE_THRESHOLD,
        **mala_options,
    ):
        mala_options.setdefault("target_acceptance_rate", HMC_TARGET_ACCEPTANCE)
        super().__init__(logdensity_fn, **mala_options)
        if int(num_integration_steps) < 1:
            raise ValueError(f"`num_integration_steps` must be >= 1, got {num_integration_steps}.")
        validation.check_positive("divergence_threshold", divergence_threshold)
        self.num_integration_steps = int(num_integration_steps)
        self.kernel = hmc.build_kernel(self.num_integration_steps, divergence_threshold)

    def run(self, rng_key, position, num_steps: int, progress: ProgressBar | None = None):
        """Run ``num_steps`` burn-in iterations of one chain (``num_integration_steps``
        gradients each)."""
        key_search, key_run = jax.random.split(rng_key)
        hstate = hmc.init(position, self.logdensity_fn)
        if self.find_step_size:
            validation.check_position(position)
            validation.check_logdensity(self.logdensity_fn, position)
            found = find_reasonable_step_size(
                key_search,
                self.logdensity_fn,
                position,
                self.initial_step_size**2,
                MALA_TARGET_ACCEPTANCE,
            )
            found = StepSizeSearch(jnp.sqrt(found.step_size), found.num_grad_evals)
        else:
            _, found = _initial_state_and_step(
                key_search,
                position,
                self.logdensity_fn,
                self.initial_step_size,
                False,
                self.target,
            )

        def kernel(key, state, eps):
            return self.kernel(key, state, self.logdensity_fn, eps)

        (hstate, eps), info = _adapt_throughout(
            kernel, key_run, hstate, found.step_size, num_steps, self.target, self.rho, progress
        )
        info = WarmupInfo(
            *_rates(info),
            initial_step_size=found.step_size,
            num_grad_evals=found.num_grad_evals + 1 + num_steps * self.num_integration_steps,
            trace=None,
        )
        return (hstate, WarmupParameters(eps, None)), info


class PooledFisherMALAWarmup(MALAWarmup):
    """Burn-in of :mod:`fisher_mala.pooled`: all chains together.

    Each chain first runs Algorithm 1's MALA phase (``num_mala_steps``) on its own; the
    pooled phase then starts from ``R_0 = I / sqrt(lambda)`` and the median of the chains'
    step sizes, and adapts the shared ``R`` with all chains' signals every iteration
    (re-anchoring ``tr(R R^T)`` every 1000 iterations).
    """

    batched = True

    def __init__(
        self,
        logdensity_fn: Callable,
        num_mala_steps: int = 500,
        damping=fisher.DAMPING,
        trace_every: int | None = None,
        record_precond: bool = False,
        **mala_options,
    ):
        super().__init__(logdensity_fn, **mala_options)
        validation.check_positive("damping", damping, "Algorithm 1 uses lambda = 10.")
        self.num_mala_steps = int(num_mala_steps)
        self.damping = damping
        self.trace_every = trace_every
        self.record_precond = record_precond
        self.kernel = pooled.build_kernel(adapt=True)

    def _snapshot(self, state, iteration):
        return snapshot(
            state.sqrt_precond, state.trace_precond, state.step_size, iteration, self.record_precond
        )

    @property
    def block(self) -> int:
        """Iterations between re-anchorings of ``tr(R R^T)`` (and trace snapshots)."""
        return self.trace_every or TRACE_REFRESH_EVERY

    def _adapt(self, rng_key, pstate, num_steps, offset, progress):
        """Pooled adaptive iterations; per-iteration info with the chains first."""
        pstate, info, trace = adaptive_iterations(
            self, rng_key, pstate, num_steps, offset, progress, pooled.refresh_trace
        )
        return pstate, jax.tree.map(lambda x: jnp.moveaxis(x, 0, 1), info), trace

    def run_batch(self, rng_key, positions, num_steps: int, progress=None, stop_after=None):
        """Burn in all chains (leading axis of ``positions``) together.

        ``stop_after`` and :meth:`resume_batch` as in
        :meth:`fisher_mala.adaptation.FisherMALAWarmup.run`.
        """
        num_chains = jax.tree.leaves(positions)[0].shape[0]
        key_mala, _ = jax.random.split(rng_key)
        num_mala = min(self.num_mala_steps, num_steps)
        stop = num_steps if stop_after is None else max(min(stop_after, num_steps), num_mala)

        def mala_chain(key, position):
            (state, step), info, found = self.mala_phase(key, position, num_mala, progress)
            return state, step, info, found

        states, steps, info_mala, found = jax.vmap(mala_chain)(
            jax.random.split(key_mala, num_chains), positions
        )
        pstate = pooled.state_from(
            states.position,
            states.logdensity,
            states.logdensity_grad,
            jnp.median(steps),
            self.damping,
        )
        pstate, chain_first, trace = self._adapt(
            rng_key, pstate, stop - num_mala, num_mala, progress
        )
        rates = [
            jnp.concatenate([a, b], axis=1)
            for a, b in zip(_rates_tuple(info_mala), _rates_tuple(chain_first), strict=True)
        ]
        info = WarmupInfo(
            *rates,
            initial_step_size=found.step_size,
            num_grad_evals=found.num_grad_evals + 1 + stop,
            trace=trace if self.trace_every else None,
        )
        return (pstate, self._parameters(pstate, num_chains)), info

    def resume_batch(self, rng_key, carry, num_steps: int, progress=None, num_more: int = 0):
        """``num_more`` more pooled iterations of a :meth:`run_batch` stopped early (as
        :meth:`fisher_mala.adaptation.FisherMALAWarmup.resume`)."""
        pstate, params = carry
        num_chains = params.step_size.shape[0]
        offset = min(self.num_mala_steps, num_steps) + pstate.count
        pstate, more, trace = self._adapt(rng_key, pstate, num_more, offset, progress)
        info = WarmupInfo(
            *_rates_tuple(more),
            initial_step_size=params.step_size,
            num_grad_evals=jnp.full((num_chains,), num_more, jnp.int32),
            trace=trace if self.trace_every else None,
        )
        return (pstate, self._parameters(pstate, num_chains)), info

    @staticmethod
    def _parameters(pstate, num_chains):
        return WarmupParameters(
            jnp.broadcast_to(pstate.step_size, (num_chains,)), pstate.sqrt_precond
        )


def _rates_tuple(info):
    return (info.acceptance_rate, info.is_accepted, info.proposal_is_finite)
