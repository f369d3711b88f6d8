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
=============================  ==========================  =====================
"""

from typing import NamedTuple

import jax.numpy as jnp
from jax import Array

__all__ = ["DiagonalSqrt", "CholeskySqrt", "color", "whiten", "dense", "trace"]


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


def color(sqrt_precond, w: Array) -> Array:
    """``R w`` (``w`` flat, or rows of a batch for the dense form)."""
    if sqrt_precond is None:
        return w
    if isinstance(sqrt_precond, DiagonalSqrt):
        return sqrt_precond.scale * w
    if isinstance(sqrt_precond, CholeskySqrt):
        return w @ sqrt_precond.upper
    return sqrt_precond @ w


def whiten(sqrt_precond, g: Array) -> Array:
    """``R^T g``, computed as ``g @ R`` for a dense ``R``."""
    if sqrt_precond is None:
        return g
    if isinstance(sqrt_precond, DiagonalSqrt):
        return g * sqrt_precond.scale
    if isinstance(sqrt_precond, CholeskySqrt):
        return sqrt_precond.upper @ g
    return g @ sqrt_precond


def dense(sqrt_precond) -> Array:
    """``R`` as a ``(d, d)`` array (for tests and host-side checks; ``None`` has no size)."""
    if isinstance(sqrt_precond, DiagonalSqrt):
        return jnp.diag(sqrt_precond.scale)
    if isinstance(sqrt_precond, CholeskySqrt):
        return sqrt_precond.upper.T
    return sqrt_precond


def trace(sqrt_precond) -> Array:
    """``tr(A) = ||R||_F^2``, one read of ``R``."""
    if isinstance(sqrt_precond, DiagonalSqrt):
        return jnp.sum(sqrt_precond.scale**2)
    if isinstance(sqrt_precond, CholeskySqrt):
        return jnp.sum(sqrt_precond.upper * sqrt_precond.upper)
    return jnp.sum(sqrt_precond * sqrt_precond)
