"""The shape every adaptation of the library has: ``(init, update, final)``.

As an optax ``GradientTransformation`` or BlackJAX's ``dual_averaging_adaptation``: a
small NamedTuple state and three pure functions, so that a warm-up composes kernels
with any of them and each is tested alone against its equation.
"""

from collections.abc import Callable
from typing import NamedTuple

__all__ = ["Adaptation"]


class Adaptation(NamedTuple):
    """An adaptation: three pure functions over a small NamedTuple state.

    Attributes
    ----------
    init
        ``(...) -> state``: the state before the first update.
    update
        ``(state, signal) -> state`` (or ``(state, extra)`` where the caller needs what
        the update made, as the Fisher recursion's square-root update); ``signal`` is what
        the adaptation learns from (an acceptance probability, a gradient signal, a
        position).
    final
        ``state -> value``: the tuned value to freeze for sampling.
    """

    init: Callable
    update: Callable
    final: Callable
