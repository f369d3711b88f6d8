"""Per-coordinate scales from MALA's own proposals: the secant start of ``R``.

Every MALA step evaluates the gradient at its proposal ``y`` anyway, so each step gives
one secant pair: the move ``dx = y - x`` and the gradient's change ``dg = g_y - g_x``.
On a Gaussian target ``N(mu, P^{-1})``, ``dg = -P dx`` wherever the chain is, so with
isotropic moves (plain MALA) the ratio of root mean squares

    v_j = sqrt( sum_n dx_{n,j}^2 / sum_n dg_{n,j}^2 ) = 1 / ||P_{j,:}||

is a variance in the units of ``x_j``: ``1 / P_jj`` when ``P`` is diagonal, and never
more than the conditional variance otherwise (so never a proposal too wide along
``x_j``). It needs no mixing and no stationary draws (the move is the proposal's,
accepted or not): a chain still on its way from a far start gives it too. It reads the
same curvature as nutpie's ``sqrt(var(x) / var(g))`` from draws.

The dense least-squares secant ``-(sum dg dx^T)(sum dx dx^T)^{-1}`` would give ``P``
itself on a Gaussian, but not on a badly scaled posterior: isotropic moves sized for the
stiffest direction leave the soft directions' curvature (``10^{-6}`` against ``10^3`` on
a regression of earnings in dollars on height in inches) below what the stiff
direction's non-quadratic terms add to every gradient change. The row norm stays
conservative there.
"""

from typing import NamedTuple

import jax.numpy as jnp
from jax import Array

from fisher_mala.adaptations.base import Adaptation

__all__ = ["SecantSums", "secant_scale", "MAX_SCALE_RATIO"]

#: Largest ratio between two learned variances. A coordinate whose gradient did not
#: change at all (a flat direction, or a change lost to rounding) has no secant
#: information; it gets the largest learned variance, and the ratio bounds what noise can
#: do to the start.
MAX_SCALE_RATIO = 1e12


class SecantSums(NamedTuple):
    """Running sums of squared moves and squared gradient changes, per coordinate."""

    move: Array
    gradient_change: Array


def secant_scale() -> Adaptation:
    """The secant scales as an ``(init, update, final)`` triple.

    Returns
    -------
    Adaptation
        ``init(dim, dtype) -> SecantSums``; ``update(sums, move, gradient_change, keep)
        -> SecantSums`` with one proposal's ``y - x`` and ``g_y - g_x`` (flat; nothing is
        added where ``keep`` is false, e.g. a non-finite proposal); ``final(sums) -> v``,
        the variances ``(d,)``, all ones when nothing was absorbed.
    """

    def init(dim: int, dtype) -> SecantSums:
        zeros = jnp.zeros(dim, dtype)
        return SecantSums(zeros, zeros)

    def update(sums: SecantSums, move, gradient_change, keep) -> SecantSums:
        keep = jnp.asarray(keep)
        move = jnp.where(keep, move, 0.0)
        gradient_change = jnp.where(keep, gradient_change, 0.0)
        return SecantSums(sums.move + move**2, sums.gradient_change + gradient_change**2)

    def final(sums: SecantSums) -> Array:
        both = (sums.move > 0) & (sums.gradient_change > 0)
        ratio = jnp.sqrt(sums.move / jnp.where(both, sums.gradient_change, 1.0))
        ratio = jnp.where(both & jnp.isfinite(ratio), ratio, 0.0)
        largest = jnp.max(ratio)
        fallback = jnp.where(largest > 0, largest, 1.0)
        return jnp.where(ratio > 0, jnp.maximum(ratio, fallback / MAX_SCALE_RATIO), fallback)

    return Adaptation(init, update, final)
