"""Pooled FisherMALA: C chains adapting **one** shared preconditioner (beyond the paper).

The paper's conclusion leaves adaptation with several interacting chains to future work.
Here ``C`` chains run FisherMALA side by side and, every iteration, their ``C``
Rao-Blackwellized signals update one square root ``R`` together by the rank-C update of
:func:`fisher_mala.sqrt_precond.rank_block_update`, so that after ``n`` iterations

    R R^T = (sum over chains and iterations of s s^T + lambda I)^{-1},

the Prop. 4 estimator fed ``C`` times as many signals. Each chain keeps its own position
and M-H test; the step size ``sigma^2`` is shared and adapted with the chains' mean
acceptance probability.

Cost per iteration for all ``C`` chains: the proposals are one ``(C x d) (d x d)``
product, the whitened gradients another, the signal product ``R Phi^T`` a third, and the
rank-C update one read-modify-write: the traffic of about one chain's step instead of
``C`` (a ``d x d`` matrix per chain is also ``C`` times the memory). With the
preconditioner frozen (``adapt=False``) it is ordinary preconditioned MALA per chain,
with the proposals still batched into matrix-matrix products.

When to use it: many chains on one machine, ``d`` in the hundreds or thousands, and a
burn-in budget to save. Pooling needs the chains to sample the same posterior mode; a
multimodal target would mix curvature from different modes.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.flatten_util import ravel_pytree

from fisher_mala import validation
from fisher_mala.base import ArrayTree, SamplingAlgorithm, accept, sampling_algorithm
from fisher_mala.fisher import FisherMALAInfo
from fisher_mala.preconditioner import (
    FisherPreconditionerState,
    carry_whitened,
    fisher_preconditioner,
    refresh_trace,
    whitened_signal,
)
from fisher_mala.proposals import (
    guarded_metropolis_hastings,
    log_proposal_ratio,
    normalized_step_size,
    whitened_increment,
)
from fisher_mala.sqrt_precond import initial_sqrt_precond
from fisher_mala.step_size import LEARNING_RATE, MALA_TARGET_ACCEPTANCE, adapt_step_size

__all__ = [
    "PooledFisherState",
    "init",
    "state_from",
    "build_kernel",
    "refresh_trace",
    "as_top_level_api",
]


class PooledFisherState(NamedTuple):
    """State of ``C`` chains sharing one preconditioner.

    Attributes
    ----------
    position, logdensity, logdensity_grad
        Per chain: every leaf has a leading chain axis of size ``C``.
    sqrt_precond
        The shared ``R``, ``(d, d)``.
    step_size
        The shared ``sigma^2``.
    trace_precond
        ``tr(R R^T)``.
    whitened_grad
        ``(C, d)``: each chain's ``R^T grad``.
    count
        Number of (block) adaptation updates.
    """

    position: ArrayTree
    logdensity: Array
    logdensity_grad: ArrayTree
    sqrt_precond: Array
    step_size: Array
    trace_precond: Array
    whitened_grad: Array
    count: Array


def _flatten_batch(tree):
    """``(C, d)`` flat rows, the batch unravel and the one-chain unravel."""
    flat = jax.vmap(lambda t: ravel_pytree(t)[0])(tree)
    unravel = ravel_pytree(jax.tree.map(lambda x: x[0], tree))[1]
    return flat, jax.vmap(unravel), unravel


def state_from(positions, logdensity, logdensity_grad, step_size, damping, sqrt_precond=None):
    """Build the state from evaluated chains (no evaluation); ``R_0 = I / sqrt(lambda)``."""
    flat_grad = _flatten_batch(logdensity_grad)[0]
    dim, dtype = flat_grad.shape[1], flat_grad.dtype
    if sqrt_precond is None:
        sqrt_precond, trace = initial_sqrt_precond(dim, damping, dtype)
    else:
        trace = jnp.einsum("ij,ij->", sqrt_precond, sqrt_precond)
    return PooledFisherState(
        positions,
        logdensity,
        logdensity_grad,
        sqrt_precond,
        jnp.asarray(step_size, dtype),
        trace,
        flat_grad @ sqrt_precond,
        jnp.zeros((), jnp.int32),
    )


def init(positions: ArrayTree, logdensity_fn: Callable, step_size, damping=10.0):
    """Evaluate every chain (leading axis of ``positions``) and start with ``R_0``."""
    logdensity, grad = jax.vmap(jax.value_and_grad(logdensity_fn))(positions)
    return state_from(positions, logdensity, grad, step_size, damping)


def build_kernel(adapt: bool = True) -> Callable:
    """Pooled kernel ``(rng_key, state, logdensity_fn, target, rho) -> (state, info)``.

    ``info`` is a :class:`~fisher_mala.fisher.FisherMALAInfo` with a chain axis.
    """
    adaptation = fisher_preconditioner()  # the damping only enters through the state

    def kernel(
        rng_key,
        state: PooledFisherState,
        logdensity_fn: Callable,
        target_acceptance_rate=MALA_TARGET_ACCEPTANCE,
        step_size_learning_rate=LEARNING_RATE,
    ):
        x, unravel, unravel_one = _flatten_batch(state.position)
        num_chains, dim = x.shape
        r = state.sqrt_precond
        step = normalized_step_size(state.step_size, state.trace_precond, dim)
        keys = jax.random.split(rng_key, num_chains)
        noise_keys, accept_keys = jax.vmap(jax.random.split, out_axes=1)(keys)
        w = jax.vmap(whitened_increment, (0, 0, None))(noise_keys, state.whitened_grad, step)
        y = x + jnp.einsum("ij,cj->ci", r, w)  # R w for all chains: one read of R
        value_and_grad = jax.vmap(jax.value_and_grad(lambda z: logdensity_fn(unravel_one(z))))
        logdensity_y, grad_y = value_and_grad(y)  # one evaluation per chain
        u_y = grad_y @ r  # all chains' R^T g_y: one read of R
        ratio = logdensity_y - state.logdensity
        ratio += jax.vmap(log_proposal_ratio, (0, 0, 0, None))(w, state.whitened_grad, u_y, step)
        accepted, alpha, finite = jax.vmap(guarded_metropolis_hastings)(
            accept_keys, ratio, logdensity_y, grad_y, u_y
        )
        info = FisherMALAInfo(alpha, accepted, finite, jnp.broadcast_to(step, alpha.shape))
        new_state = accept(
            accepted,
            state,
            position=unravel(y),
            logdensity=logdensity_y,
            logdensity_grad=unravel(grad_y),
            whitened_grad=u_y,
        )
        if not adapt:
            return new_state, info
        # Eq. (16), one row per chain, absorbed by the rank-C form of Proposition 4
        phis = whitened_signal("rao_blackwell", state.whitened_grad, u_y, alpha, accepted, finite)
        precond = FisherPreconditionerState(
            r, state.trace_precond, jnp.zeros((), r.dtype), state.count
        )
        precond, update = adaptation.update(precond, phis)
        new_state = new_state._replace(
            sqrt_precond=precond.sqrt_precond,
            trace_precond=precond.trace_precond,
            whitened_grad=carry_whitened(update, new_state.whitened_grad),
            step_size=adapt_step_size(
                state.step_size,
                jnp.mean(alpha),
                target_acceptance_rate,
                step_size_learning_rate,
            ),
            count=precond.count,
        )
        return new_state, info

    return kernel


def as_top_level_api(
    logdensity_fn: Callable,
    step_size,
    damping=10.0,
    target_acceptance_rate=MALA_TARGET_ACCEPTANCE,
    step_size_learning_rate=LEARNING_RATE,
    adapt: bool = True,
) -> SamplingAlgorithm:
    """Pooled FisherMALA: ``init(positions)`` takes all chains (leading axis) at once.

    Returns
    -------
    SamplingAlgorithm
        ``init(positions, rng_key=None)`` and a jit-compiled ``step(rng_key, state)``
        that moves every chain.
    """
    validation.check_positive("step_size", step_size, "It is sigma^2 of Algorithm 1.")
    validation.check_positive("damping", damping, "Algorithm 1 uses lambda = 10.")
    kernel = build_kernel(adapt)

    def init_fn(positions):
        validation.check_position(positions)
        validation.check_logdensity(logdensity_fn, jax.tree.map(lambda x: x[0], positions))
        return init(positions, logdensity_fn, step_size, damping)

    def step_fn(rng_key, state):
        return kernel(
            rng_key, state, logdensity_fn, target_acceptance_rate, step_size_learning_rate
        )

    return sampling_algorithm(init_fn, step_fn)
