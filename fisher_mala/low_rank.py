"""A diagonal-plus-low-rank Fisher preconditioner in ``O(d k)`` time and memory.

The paper's dense ``R`` costs ``O(d^2)`` memory and time per step; its Section 7 names
low-rank approximations as the way past that. This module learns, from the same signals
``s_n`` (Eq. (16), one gradient per MALA step), a square root of the form
:class:`~fisher_mala.square_roots.LowRankSqrt`, ``R = D^(1/2) (I + Q diag(c) Q^T)``:

* ``D``: the inverse of the running Fisher diagonal, ``F_ii = (lambda + sum_n s_ni^2) /
  (1 + n)`` (the diagonal of the damped estimate of Eq. (8); ``D = I / lambda`` at the
  start, as the dense ``R_0 = I / sqrt(lambda)``);
* in the scaled coordinates ``phi = D^(1/2) s`` the Fisher matrix ``F~ = E[phi phi^T]`` has
  unit diagonal, and ``A = D^(1/2) F~^(-1) D^(1/2)`` is approximated by the identity except
  on the ``k`` eigen-directions of ``F~`` whose eigenvalue ``theta`` is farthest from 1 on
  a log scale, where ``A`` is ``1 / theta`` (``c = theta^(-1/2) - 1``). Both ends matter:
  ``theta << 1`` is a direction of strong posterior correlation (a hierarchical model's
  population direction, the large variance that a diagonal misses), ``theta >> 1`` a stiff
  one. A sketch of the signals' largest directions (Frequent Directions, streaming PCA)
  finds only the second kind.

The directions come from a stochastic block Rayleigh-Ritz (Davidson) iteration on ``F~``,
run on the stream of signals. A search basis ``W`` of ``2 k`` orthonormal columns
accumulates, over a cycle of ``T`` signals, ``G = sum (W^T phi)(W^T phi)^T`` (``W^T F~ W``
times ``T``) and ``Z = sum phi (W^T phi)^T`` (``F~ W`` times ``T``). At the end of a cycle
the Ritz pairs of ``G / T`` give ``Q`` and ``theta`` (the ``k`` farthest from 1), and the
next basis is ``Q`` and the residuals ``F~ Q - Q diag(theta)`` (from ``Z``), orthonormalized:
one block Krylov step per cycle, which approximates both ends of the spectrum. Per signal:
two ``d x 2k`` products (``O(d k)``); per cycle: an eigendecomposition of ``2k x 2k`` and a QR
of ``d x 2k`` (``O(d k^2)``, every ``T >= 2k`` signals). Memory: ``W``, ``Z`` and ``Q``, ``5 d
k`` numbers, and ``O(d)`` more. Nothing ``O(d^2)``.

With ``2 k >= d`` the search basis spans everything and ``A`` is the inverse of the cycle's
Fisher estimate in the scaled coordinates: the same target as the dense recursion
(Proposition 4, ``A_n = (lambda I + sum s s^T)^(-1)`` up to scale), estimated from the last
cycle's signals instead of all of them (``tests/test_low_rank.py``).
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from fisher_mala import mala
from fisher_mala.adaptations.fisher import DAMPING
from fisher_mala.adaptations.step_size import RobbinsMonroState
from fisher_mala.mala import kernel_view
from fisher_mala.pytree import ravel
from fisher_mala.square_roots import LowRankSqrt

__all__ = [
    "LowRankFisherState",
    "CYCLE_SIGNALS_PER_RANK",
    "MIN_CYCLE",
    "THETA_BOUNDS",
    "cycle_length",
    "init",
    "update",
    "sqrt_from_eigen",
    "adaptive_step",
    "check_rank",
]

#: Signals per cycle: ``T = max(MIN_CYCLE, CYCLE_SIGNALS_PER_RANK * 2 k)``, enough for the
#: ``2k x 2k`` Rayleigh quotient matrix ``G / T`` to be estimated well (relative error
#: about ``sqrt(2 / T)`` per entry) while the basis still turns every few hundred signals.
CYCLE_SIGNALS_PER_RANK = 10
MIN_CYCLE = 100
#: Eigenvalues of the scaled Fisher matrix kept within these bounds (a direction ``10^4``
#: times stiffer or looser than the diagonal says is taken as that far, no farther): an
#: estimate from one cycle's signals must not make ``R`` singular.
THETA_BOUNDS = (1e-4, 1e4)


class LowRankFisherState(NamedTuple):
    """State of the low-rank Fisher learner.

    Attributes
    ----------
    sqrt_precond
        The :class:`~fisher_mala.square_roots.LowRankSqrt` in use (refreshed each cycle).
    sum_squares
        ``(d,)``, ``sum_n s_n^2``: the Fisher diagonal's running sum.
    count
        Signals absorbed.
    basis
        ``(d, 2k)``, the search basis ``W`` of the current cycle.
    gram
        ``(2k, 2k)``, ``sum (W^T phi)(W^T phi)^T`` over the current cycle.
    products
        ``(d, 2k)``, ``sum phi (W^T phi)^T`` over the current cycle.
    cycle
        Signals absorbed in the current cycle.
    """

    sqrt_precond: LowRankSqrt
    sum_squares: Array
    count: Array
    basis: Array
    gram: Array
    products: Array
    cycle: Array


def cycle_length(rank: int) -> int:
    """``T``, the signals of one cycle (:data:`CYCLE_SIGNALS_PER_RANK`)."""
    return max(MIN_CYCLE, CYCLE_SIGNALS_PER_RANK * 2 * int(rank))


def _orthonormal(matrix: Array) -> Array:
    return jnp.linalg.qr(matrix)[0]


def init(rng_key, dim: int, dtype, rank: int, damping=DAMPING) -> LowRankFisherState:
    """The learner before any signal: ``D = I / lambda``, ``c = 0`` (``A = I / lambda``,
    the dense ``R_0``), and a random orthonormal search basis of ``min(2k, d)`` columns."""
    width = min(2 * int(rank), int(dim))
    basis = _orthonormal(jax.random.normal(rng_key, (dim, width), dtype))
    scale = jnp.full((dim,), 1.0 / jnp.sqrt(jnp.asarray(damping, dtype)), dtype)
    kept = min(int(rank), width)
    return LowRankFisherState(
        sqrt_precond=LowRankSqrt(scale, basis[:, :kept], jnp.zeros((kept,), dtype)),
        sum_squares=jnp.zeros((dim,), dtype),
        count=jnp.zeros((), jnp.int32),
        basis=basis,
        gram=jnp.zeros((width, width), dtype),
        products=jnp.zeros((dim, width), dtype),
        cycle=jnp.zeros((), jnp.int32),
    )


def sqrt_from_eigen(scale: Array, basis: Array, theta: Array) -> LowRankSqrt:
    """``R`` with ``A = D^(1/2) (I + Q (1 / theta - 1) Q^T) D^(1/2)``: ``c = theta^(-1/2) - 1``."""
    theta = jnp.clip(theta, *THETA_BOUNDS)
    return LowRankSqrt(scale, basis, jax.lax.rsqrt(theta) - 1.0)


def _refresh(state: LowRankFisherState, rank: int, damping) -> LowRankFisherState:
    """End of a cycle: Rayleigh-Ritz on the basis, the new ``Q``, ``theta``, ``D`` and the
    next basis ``[Q, residuals]`` orthonormalized."""
    signals = state.cycle.astype(state.gram.dtype)
    quotient = state.gram / signals
    quotient = 0.5 * (quotient + quotient.T)
    theta, vectors = jnp.linalg.eigh(quotient)
    theta = jnp.clip(theta, *THETA_BOUNDS)
    order = jnp.argsort(-jnp.abs(jnp.log(theta)))[:rank]  # farthest from 1, both ends
    theta, vectors = theta[order], vectors[:, order]
    directions = state.basis @ vectors  # (d, k), orthonormal
    residuals = (state.products / signals) @ vectors - directions * theta
    residuals = residuals - directions @ (directions.T @ residuals)
    width = state.basis.shape[1]
    basis = _orthonormal(jnp.concatenate([directions, residuals], axis=1)[:, :width])
    fisher_diagonal = (damping + state.sum_squares) / (1.0 + state.count)
    return state._replace(
        sqrt_precond=sqrt_from_eigen(jax.lax.rsqrt(fisher_diagonal), directions, theta),
        basis=basis,
        gram=jnp.zeros_like(state.gram),
        products=jnp.zeros_like(state.products),
        cycle=jnp.zeros_like(state.cycle),
    )


def update(state: LowRankFisherState, signal: Array, rank: int, damping=DAMPING):
    """Absorb one raw signal ``s`` (``(d,)``); a cycle's last one refreshes ``R``.

    Returns the new state; ``state.sqrt_precond`` changes only at a refresh (every
    :func:`cycle_length` signals).
    """
    phi = state.sqrt_precond.scale * signal  # D^(1/2) s, with the D that R uses
    projected = phi @ state.basis
    state = state._replace(
        sum_squares=state.sum_squares + signal**2,
        count=state.count + 1,
        gram=state.gram + jnp.outer(projected, projected),
        products=state.products + jnp.outer(phi, projected),
        cycle=state.cycle + 1,
    )
    rank = min(int(rank), state.basis.shape[1])
    return jax.lax.cond(
        state.cycle >= cycle_length(rank),
        lambda s: _refresh(s, rank, damping),
        lambda s: s,
        state,
    )


def _unwhiten(sqrt_precond: LowRankSqrt, whitened: Array) -> Array:
    """``D^(1/2) R^(-T) v = (I + Q diag(1 / (1 + c) - 1) Q^T) v``: a whitened gradient
    ``R^T g`` back to the scaled coordinates, in ``O(d k)`` (no inverse of a ``d x d``)."""
    inverse = 1.0 / (1.0 + sqrt_precond.factors) - 1.0
    return whitened + ((whitened @ sqrt_precond.basis) * inverse) @ sqrt_precond.basis.T


def adaptive_step(step_size_rule, rank: int, damping=DAMPING) -> Callable:
    """One FisherMALA iteration with the low-rank learner: preconditioned MALA with the
    learner's ``R``, the Rao-Blackwellized signal of Eq. (16), the learner's update, the
    step-size rule of Algorithm 1.

    ``step(rng_key, (fisher_state, learner), logdensity_fn) -> ((fisher_state, learner),
    info)``; ``fisher_state`` is a :class:`~fisher_mala.fisher.FisherMALAState` whose
    ``sqrt_precond`` is the learner's :class:`~fisher_mala.square_roots.LowRankSqrt`.
    """
    from fisher_mala import square_roots

    mala_kernel = mala.build_kernel()

    def step(rng_key, carry, logdensity_fn):
        state, learner = carry
        moved, info = mala_kernel(rng_key, kernel_view(state), logdensity_fn, state.step_size)
        finite = info.proposal_is_finite
        difference = jnp.where(finite, info.proposal_whitened_grad - info.whitened_grad, 0.0)
        scaled = _unwhiten(learner.sqrt_precond, jnp.sqrt(info.acceptance_rate) * difference)
        signal = scaled / learner.sqrt_precond.scale  # s = D^(-1/2) (D^(1/2) s)
        learner = update(learner, signal, rank, damping)
        root = learner.sqrt_precond
        step_size = step_size_rule.update(RobbinsMonroState(state.step_size), info.acceptance_rate)
        state = state._replace(
            position=moved.position,
            logdensity=moved.logdensity,
            logdensity_grad=moved.logdensity_grad,
            sqrt_precond=root,
            step_size=step_size_rule.final(step_size),
            trace_precond=square_roots.trace(root),
            whitened_grad=square_roots.whiten(root, ravel(moved.logdensity_grad)),
            count=learner.count,
        )
        return (state, learner), info

    return step


def check_rank(rank, dim: int | None = None) -> int:
    """``rank`` as a positive int (a clear error otherwise)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"`rank` must be a positive integer, got {rank!r}.")
    del dim
    return rank

