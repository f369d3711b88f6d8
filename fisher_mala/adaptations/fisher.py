"""The Fisher preconditioner adaptation, an ``(init, update, final)`` triple.

In the shape of an optax transformation (or BlackJAX's ``mass_matrix_adaptation``): a
small NamedTuple state and three pure functions, so that any kernel that exposes
gradients can learn the square root ``R`` of the inverse Fisher matrix
``A = E[s s^T]^{-1}`` (Proposition 4, Appendix B, Appendix C), and FisherMALA is
preconditioned MALA + this adaptation + the step-size rule.

``update`` consumes a *whitened* signal ``phi = R^T s``. A MALA-type kernel has it for
free from the whitened gradients it computes anyway (:func:`whitened_signal`, all four
signals of the paper); any other kernel passes the raw signal ``s`` to
:func:`whiten_signal` first (one pass over ``R``, ``s @ R``). A ``(C, d)`` block of
signals (``C`` chains sharing one ``R``) is absorbed at once by the rank-C update of
:func:`fisher_mala.sqrt_precond.rank_block_update` (Proposition 4's rates only).

``update`` also returns the :class:`~fisher_mala.sqrt_precond.SqrtUpdate` (or
``BlockUpdate``) it made, with which a kernel carries cached products ``R^T v`` to the
new ``R`` in O(d) (:func:`carry_whitened`).
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from fisher_mala import validation
from fisher_mala.adaptations.base import Adaptation
from fisher_mala.sqrt_precond import (
    BlockUpdate,
    SqrtUpdate,
    block_whitened_product,
    centered_coefficients,
    damping_floor,
    fisher_coefficients,
    guarded_learning_rate,
    initial_sqrt_precond,
    rank_block_update,
    rank_one_update,
    whitened_product,
)

__all__ = [
    "SIGNALS",
    "DAMPING",
    "FisherPreconditionerState",
    "FisherPreconditioner",
    "fisher_preconditioner",
    "whitened_signal",
    "whiten_signal",
    "carry_whitened",
    "refresh_trace",
    "capped_share",
]

#: The adaptation signals of the paper (see :func:`whitened_signal`).
SIGNALS = ("rao_blackwell", "increment", "score", "centered")
#: Algorithm 1's default damping lambda (Section 5.1).
DAMPING = 10.0


class FisherPreconditionerState(NamedTuple):
    """State of the Fisher adaptation.

    Attributes
    ----------
    sqrt_precond
        ``R``, ``(d, d)``, with ``A = R R^T`` the (un-normalized) inverse Fisher estimate.
    trace_precond
        ``tr(R R^T)``, summed from ``R`` at each update.
    whitened_mean_score
        ``R^T sbar`` for Appendix C's centred signal (zeros otherwise).
    count
        Number of updates made (``n`` of Proposition 4).
    """

    sqrt_precond: Array
    trace_precond: Array
    whitened_mean_score: Array
    count: Array


#: The ``(init, update, final)`` triple returned by :func:`fisher_preconditioner`:
#: ``init(dim, dtype, sqrt_precond=None) -> FisherPreconditionerState``;
#: ``update(state, phi) -> (state, SqrtUpdate | BlockUpdate)`` with ``phi = R^T s``
#: (``(d,)``) or a block of them (``(C, d)``); ``final(state) -> R``, the square root to
#: freeze for sampling.
FisherPreconditioner = Adaptation


def whitened_signal(
    signal: str,
    whitened_grad: Array,
    proposal_whitened_grad: Array,
    acceptance_rate: Array,
    is_accepted: Array,
    proposal_is_finite: Array,
) -> Array:
    """``phi = R^T s_n`` of a MALA-type transition, from whitened gradients only.

    ==================  ===========================================  ==============
    ``signal``          ``s_n``                                      paper
    ==================  ===========================================  ==============
    ``"rao_blackwell"`` ``sqrt(alpha) (g_y - g_x)``                  Eq. (16), Alg. 1
    ``"increment"``     ``1[accepted] (g_y - g_x)``                  Eq. (15)
    ``"score"``         ``g_x`` (the raw, non-centred score)         Eq. (11)
    ``"centered"``      ``g_x`` (centred by :func:`fisher_preconditioner`)  Appendix C
    ==================  ===========================================  ==============

    A non-finite proposal contributes no increment.
    """
    finite = jnp.asarray(proposal_is_finite)[..., None]  # a leading chain axis is allowed
    difference = jnp.where(finite, proposal_whitened_grad - whitened_grad, 0.0)
    if signal == "rao_blackwell":  # Eq. (16)
        return jnp.sqrt(acceptance_rate)[..., None] * difference
    if signal == "increment":  # Eq. (15)
        return jnp.where(jnp.asarray(is_accepted)[..., None], difference, 0.0)
    return whitened_grad  # the score g_x; "centered" is centred in `update`


def whiten_signal(state: FisherPreconditionerState, signal: Array) -> Array:
    """``phi = R^T s`` for a raw signal ``s`` (or rows of them): one pass, ``s @ R``."""
    return signal @ state.sqrt_precond


def carry_whitened(update: SqrtUpdate | BlockUpdate, whitened: Array) -> Array:
    """``R'^T v`` from ``R^T v`` in O(d) (rank one) or O(d C) (rank C)."""
    if isinstance(update, BlockUpdate):
        return block_whitened_product(update, whitened)
    return whitened_product(update, whitened)


def refresh_trace(state):
    """Recompute ``tr(R R^T)`` exactly (one read of ``R``); any state with the two fields.

    The updates return the exact trace already; this is for a state whose ``R`` was set
    by other means (see *Trace bookkeeping* in :mod:`fisher_mala.sqrt_precond`).
    """
    r = state.sqrt_precond
    return state._replace(trace_precond=jnp.einsum("ij,ij->", r, r))


def capped_share(learning_rate, dim: int, num_updates: int, num_probes: int = 2000) -> float:
    """Share of updates ``2..num_updates`` where ``gamma_n > max(1/n, 1/d)`` (capped).

    There the schedule would average fewer than ``d`` signals (a rank-deficient estimate)
    and :func:`~fisher_mala.sqrt_precond.guarded_learning_rate` caps it. Evaluated on up
    to ``num_probes`` evenly spaced ``n``.
    """
    if learning_rate is None or num_updates < 2:
        return 0.0
    probes = np.unique(np.linspace(2, num_updates, num_probes).astype(int))
    if callable(learning_rate):
        with jax.ensure_compile_time_eval():  # may be called while tracing the warm-up
            gammas = np.array([float(learning_rate(int(n))) for n in probes])
    else:
        gammas = np.full(probes.shape, float(learning_rate))
    return float(np.mean(gammas > np.maximum(1.0 / probes, 1.0 / dim) * (1 + 1e-6)))


def fisher_preconditioner(
    damping=DAMPING,
    learning_rate: Callable | float | None = None,
    centered: bool = False,
) -> FisherPreconditioner:
    """The square-root adaptation of the inverse Fisher matrix.

    Parameters
    ----------
    damping
        ``lambda > 0`` of Eq. (8) (the damping): ``R_0 = I / sqrt(lambda)``, so that the
        first update is exactly Eq. (12).
    learning_rate
        ``None`` for Proposition 4 (``gamma_n = 1/n``); a float in (0, 1) or a schedule
        ``n -> gamma_n`` (an optax schedule works) for Appendix B. ``n`` is the 1-based
        index of the update. Two guards keep ``R`` finite and well conditioned under
        every schedule, and leave ``gamma_n = 1/n`` exactly Proposition 4: ``gamma_n`` is
        capped at ``max(1/n, 1/d)`` (the estimate averages about ``1/gamma_n`` signals,
        and fewer than ``d`` leave it rank-deficient:
        :func:`~fisher_mala.sqrt_precond.guarded_learning_rate`), and the damping is kept
        at Eq. (8)'s ``lambda / n`` instead of decaying with the forgetting
        (:func:`~fisher_mala.sqrt_precond.damping_floor`), added along one coordinate
        axis per update in turn (``rho_n d e_k e_k^T``, ``k = (n - 2) mod d``) so that each
        update stays one square-root update of rank 2.
    centered
        Appendix C: centre the signals by their running mean (pass the raw score
        ``R^T g_x`` as ``phi``); the first signal only initializes the mean.

    Returns
    -------
    FisherPreconditioner
    """
    validation.check_positive("damping", damping, "Algorithm 1 uses lambda = 10.")
    if centered and learning_rate is not None:
        raise ValueError(
            "`learning_rate` cannot be combined with the centred signal: Appendix C fixes "
            "its own rates. Use learning_rate=None, or another signal."
        )

    def coefficients(n, dtype):
        if centered:
            return centered_coefficients(n, dtype)
        return fisher_coefficients(n, dtype)

    def schedule_update(state, phi, count):
        """Appendix B with the two guards of :func:`fisher_preconditioner` (rank 2)."""
        r = state.sqrt_precond
        dim, dtype = r.shape[0], r.dtype
        raw = learning_rate(count) if callable(learning_rate) else learning_rate
        gamma = guarded_learning_rate(count, raw, dim, dtype)
        rho = damping_floor(count, gamma, damping, dtype)
        first = count <= 1  # Eq. (12): I_1 = s_1 s_1^T + lambda I
        keep = 1.0 - gamma
        # I_n = (1 - gamma) [I_{n-1} + gamma / (1 - gamma) s s^T + rho d / (1 - gamma) e e^T]
        signal_weight = jnp.where(first, 1.0, gamma / keep)
        floor_weight = jnp.where(first, 0.0, rho * dim / keep)
        axis = jnp.mod(count - 2, dim)  # the floor visits the coordinate axes in turn
        rows = jnp.stack(
            [jnp.sqrt(signal_weight) * phi, jnp.sqrt(floor_weight) * r[axis]]  # R^T e = r[k]
        ).astype(dtype)
        scale = jnp.where(first, 1.0, 1.0 / jnp.sqrt(keep))
        block = rank_block_update(r, state.trace_precond, rows, scale=scale)
        new = state._replace(
            sqrt_precond=block.sqrt_precond, trace_precond=block.trace_precond, count=count
        )
        return new, block

    def init(dim: int, dtype, sqrt_precond: Array | None = None) -> FisherPreconditionerState:
        if sqrt_precond is None:
            sqrt_precond, trace = initial_sqrt_precond(dim, damping, dtype)
        else:
            validation.check_sqrt_precond(sqrt_precond, dim)
            sqrt_precond = jnp.asarray(sqrt_precond, dtype)
            trace = jnp.einsum("ij,ij->", sqrt_precond, sqrt_precond)
        return FisherPreconditionerState(
            sqrt_precond, trace, jnp.zeros(dim, dtype), jnp.zeros((), jnp.int32)
        )

    def update(state: FisherPreconditionerState, phi: Array):
        count = state.count + 1
        r = state.sqrt_precond
        if phi.ndim == 2:  # C chains' signals: the rank-C form of Proposition 4
            if centered or learning_rate is not None:
                raise ValueError("A block of signals needs Proposition 4's rates.")
            block = rank_block_update(r, state.trace_precond, phi)
            new = state._replace(
                sqrt_precond=block.sqrt_precond, trace_precond=block.trace_precond, count=count
            )
            return new, block
        dtype = r.dtype
        mean_score = state.whitened_mean_score
        if centered:  # Appendix C: delta_n = s_n - sbar_{n-1}; no update of R at n = 1
            delta = phi - mean_score
            phi = jnp.where(count >= 2, delta, 0.0)
            mean_score = mean_score + delta / count.astype(dtype)  # R^T sbar_n, old R
        if learning_rate is not None:
            return schedule_update(state, phi, count)
        scale, weight = coefficients(count, dtype)
        made = rank_one_update(r, state.trace_precond, phi, scale, weight)
        if centered:
            mean_score = whitened_product(made, mean_score)
        new = FisherPreconditionerState(made.sqrt_precond, made.trace_precond, mean_score, count)
        return new, made

    def final(state: FisherPreconditionerState) -> Array:
        return state.sqrt_precond

    return FisherPreconditioner(init, update, final)
