"""Square roots ``R`` of a preconditioner ``A = R R^T`` and their two products (layer 1).

Every kernel of the library touches its preconditioner only through

* :func:`color`: ``R w`` (a proposal ``x + R w``, a whitened position back to ``x``);
* :func:`whiten`: ``R^T g``, written ``g @ R`` (the fast orientation on XLA:CPU);

so one kernel serves every form of ``R``:

=============================  ==========================  =====================
form                           ``R``                       cost of a product
=============================  ==========================  =====================
``None``                       the identity (plain MALA)   none
a ``(d, d)`` array             dense (the Fisher ``R``)    ``O(d^2)``
:class:`DiagonalSqrt`          ``diag(scale)``             ``O(d)``
:class:`CholeskySqrt`          ``U^T``, ``U`` upper        ``O(d^2)``
:class:`LowRankSqrt`           ``D^(1/2) (I + Q C Q^T)``   ``O(d k)``
=============================  ==========================  =====================
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

__all__ = [
    "DiagonalSqrt",
    "CholeskySqrt",
    "LowRankSqrt",
    "STRUCTURED",
    "with_rows",
    "without_rows",
    "color",
    "whiten",
    "dense",
    "trace",
]


class DiagonalSqrt(NamedTuple):
    """A diagonal square root ``R = diag(scale)``: ``A = R R^T = diag(scale**2)``.

    Whitened coordinates are then ``x = x_n + scale * u``, and both products with ``R``
    are elementwise (``O(d)``). A plain 1-D array is refused as ``sqrt_precond`` (it
    would be ambiguous); this type says "diagonal" explicitly.

    Attributes
    ----------
    scale
        ``(d,)`` standard deviations of the metric (the square roots of the diagonal
        inverse mass matrix).
    """

    scale: Array


class CholeskySqrt(NamedTuple):
    """``R = U^T`` for the upper Cholesky factor ``U`` of ``A = U^T U`` (AdaMALA's Haario
    covariance, Eq. (17)). The products use ``U`` as it is stored: ``R w = w @ U`` and
    ``R^T g = U g``.

    Attributes
    ----------
    upper
        ``(d, d)`` upper-triangular ``U``.
    """

    upper: Array


class LowRankSqrt(NamedTuple):
    """A diagonal-plus-low-rank square root ``R = D^(1/2) (I + Q diag(c) Q^T)``, with
    ``Q`` ``(d, k)`` orthonormal: ``A = R R^T = D^(1/2) (I + Q diag((1 + c)^2 - 1) Q^T)
    D^(1/2)``. Both products cost ``O(d k)``, and so does its memory.

    In the coordinates scaled by ``D^(-1/2)``, ``A`` is the identity except on the ``k``
    directions of ``Q``, where it is ``(1 + c)^2``: the low-rank Fisher preconditioner of
    :mod:`fisher_mala.low_rank` puts there the directions in which the scaled Fisher
    matrix is farthest from the identity, with ``(1 + c)^2`` the inverse of its eigenvalue.

    Attributes
    ----------
    scale
        ``(d,)``, ``D^(1/2)``.
    basis
        ``(d, k)``, ``Q``, orthonormal columns.
    factors
        ``(k,)``, ``c`` (each ``> -1``, so that ``R`` is invertible).
    rows
        ``(k, d)``, ``Q^T`` stored row by row, or None. The products read it when it is
        there: XLA:CPU's product of a vector with ``Q^T`` stored ``(k, d)`` runs at about
        twice the speed of the same product with ``Q`` stored ``(d, k)`` once ``Q`` no
        longer fits in cache (``python -m benchmarks.nuts_step_cost --dims 100000
        --profile``). The low-rank learner and the sampling phase set it for the blocks of
        iterations in which ``R`` does not change (:func:`with_rows`): made in the
        program that uses it, from ``basis``, it is the same array however a run is cut
        into parts (a ``rows`` held over from another program could be stored ``(d, k)``
        by XLA in one and ``(k, d)`` in the other, and round differently).
    """

    scale: Array
    basis: Array
    factors: Array
    rows: Array | None = None


def with_rows(tree):
    """``tree`` with every :class:`LowRankSqrt` in it given its ``rows`` (``Q^T`` stored
    ``(k, d)``; a batch of them, ``(..., k, d)``), for a compiled loop in which ``R``
    does not change. Made in the program that runs the loop (see ``rows``)."""

    def give(node):
        if isinstance(node, LowRankSqrt) and node.rows is None:
            return node._replace(rows=node.basis.swapaxes(-1, -2))
        return node

    return jax.tree.map(give, tree, is_leaf=lambda node: isinstance(node, LowRankSqrt))


def without_rows(tree):
    """``tree`` with the ``rows`` of every :class:`LowRankSqrt` in it dropped."""

    def drop(node):
        return node._replace(rows=None) if isinstance(node, LowRankSqrt) else node

    return jax.tree.map(drop, tree, is_leaf=lambda node: isinstance(node, LowRankSqrt))


#: The structured forms (anything else but ``None`` is a dense ``(d, d)`` array).
STRUCTURED = (DiagonalSqrt, CholeskySqrt, LowRankSqrt)


def _low_rank_apply(root: "LowRankSqrt", v: Array) -> Array:
    """``(I + Q diag(c) Q^T) v`` for a vector or rows of vectors.

    Both products contract ``Q`` as stored: a ``Q.T`` in the expression would be copied out
    at every call inside a compiled loop (XLA:CPU does not hoist the transpose), which at
    large ``d`` costs more than the products themselves.
    """
    if root.rows is not None:
        projected = jnp.einsum("...d,kd->...k", v, root.rows) * root.factors
        return v + jnp.einsum("...k,kd->...d", projected, root.rows)
    projected = jnp.einsum("...d,dk->...k", v, root.basis) * root.factors
    return v + jnp.einsum("...k,dk->...d", projected, root.basis)


def color(sqrt_precond, w: Array) -> Array:
    """``R w`` (``w`` flat, or rows of a batch for the dense form)."""
    if sqrt_precond is None:
        return w
    if isinstance(sqrt_precond, DiagonalSqrt):
        return sqrt_precond.scale * w
    if isinstance(sqrt_precond, CholeskySqrt):
        return w @ sqrt_precond.upper
    if isinstance(sqrt_precond, LowRankSqrt):
        return sqrt_precond.scale * _low_rank_apply(sqrt_precond, w)
    return sqrt_precond @ w


def whiten(sqrt_precond, g: Array) -> Array:
    """``R^T g``, computed as ``g @ R`` for a dense ``R``."""
    if sqrt_precond is None:
        return g
    if isinstance(sqrt_precond, DiagonalSqrt):
        return g * sqrt_precond.scale
    if isinstance(sqrt_precond, CholeskySqrt):
        return sqrt_precond.upper @ g
    if isinstance(sqrt_precond, LowRankSqrt):
        return _low_rank_apply(sqrt_precond, g * sqrt_precond.scale)
    return g @ sqrt_precond


def dense(sqrt_precond) -> Array:
    """``R`` as a ``(d, d)`` array (for tests and host-side checks; ``None`` has no size)."""
    if isinstance(sqrt_precond, DiagonalSqrt):
        return jnp.diag(sqrt_precond.scale)
    if isinstance(sqrt_precond, CholeskySqrt):
        return sqrt_precond.upper.T
    if isinstance(sqrt_precond, LowRankSqrt):
        eye = jnp.eye(sqrt_precond.scale.shape[0], dtype=sqrt_precond.scale.dtype)
        return sqrt_precond.scale[:, None] * _low_rank_apply(sqrt_precond, eye)
    return sqrt_precond


def trace(sqrt_precond) -> Array:
    """``tr(A) = ||R||_F^2``, one read of ``R``."""
    if isinstance(sqrt_precond, DiagonalSqrt):
        return jnp.sum(sqrt_precond.scale**2)
    if isinstance(sqrt_precond, CholeskySqrt):
        return jnp.sum(sqrt_precond.upper * sqrt_precond.upper)
    if isinstance(sqrt_precond, LowRankSqrt):  # tr(D) + sum_j ((1 + c_j)^2 - 1) q_j^T D q_j
        variance = sqrt_precond.scale**2
        weights = (1.0 + sqrt_precond.factors) ** 2 - 1.0
        return jnp.sum(variance) + jnp.sum(weights * (variance @ sqrt_precond.basis**2))
    return jnp.sum(sqrt_precond * sqrt_precond)
