"""The multiplicative step-size rule of Algorithm 1, as an ``(init, update, final)`` triple.

``sigma^2 <- sigma^2 [1 + rho (alpha - alpha*)]``: the step grows when the acceptance
probability ``alpha`` of the last proposal is above the target ``alpha*`` and shrinks
otherwise. With ``0 <= rho < 1 / alpha*`` the factor is always positive. The paper uses
``rho = 0.015`` and ``alpha* = 0.574`` for MALA-type kernels (Roberts and Rosenthal,
1998) and ``0.651`` for HMC (Beskos et al., 2013).

The result is clipped to ``[sqrt(tiny), sqrt(max)]`` of the floating-point type, so that
a long run of rejections (or acceptances) can never drive ``sigma^2`` to 0 or infinity.
"""

from typing import NamedTuple

import jax.numpy as jnp
from jax import Array

from fisher_mala.adaptations.base import Adaptation

__all__ = [
    "MALA_TARGET_ACCEPTANCE",
    "STEP_SIZE_LEARNING_RATE",
    "RobbinsMonroState",
    "robbins_monro",
    "adapt_step_size",
    "step_size_bounds",
]

#: Optimal acceptance rate of MALA (Roberts and Rosenthal, 1998), Algorithm 1's alpha*.
MALA_TARGET_ACCEPTANCE = 0.574
#: Algorithm 1's default constant learning rate rho_n.
STEP_SIZE_LEARNING_RATE = 0.015


def step_size_bounds(dtype) -> tuple[float, float]:
    """The interval ``[sqrt(tiny), sqrt(max)]`` that adapted step sizes are clipped to."""
    info = jnp.finfo(dtype)
    return float(info.tiny) ** 0.5, float(info.max) ** 0.5


def adapt_step_size(
    step_size: Array, acceptance_rate: Array, target_acceptance_rate, learning_rate
) -> Array:
    """One step of ``sigma^2 <- sigma^2 [1 + rho (alpha - alpha*)]``, clipped."""
    step_size = jnp.asarray(step_size)
    low, high = step_size_bounds(step_size.dtype)
    new = step_size * (1.0 + learning_rate * (acceptance_rate - target_acceptance_rate))
    return jnp.clip(new, low, high).astype(step_size.dtype)


class RobbinsMonroState(NamedTuple):
    """State of :func:`robbins_monro`: the current ``sigma^2``."""

    step_size: Array


def robbins_monro(
    target_acceptance_rate=MALA_TARGET_ACCEPTANCE, learning_rate=STEP_SIZE_LEARNING_RATE
) -> Adaptation:
    """Algorithm 1's step-size rule as an adaptation.

    Parameters
    ----------
    target_acceptance_rate
        ``alpha*`` (0.574 for MALA-type kernels).
    learning_rate
        ``rho`` (0.015), in ``[0, 1 / alpha*)`` so that the factor stays positive.

    Returns
    -------
    Adaptation
        ``init(step_size) -> RobbinsMonroState``; ``update(state, acceptance_rate) ->
        state``, one step of ``sigma^2 <- sigma^2 [1 + rho (alpha - alpha*)]``, where
        ``acceptance_rate`` is one proposal's ``alpha`` (or the mean over chains that
        share ``sigma^2``); ``final(state) -> sigma^2``.
    """

    def init(step_size) -> RobbinsMonroState:
        return RobbinsMonroState(jnp.asarray(step_size))

    def update(state: RobbinsMonroState, acceptance_rate) -> RobbinsMonroState:
        return RobbinsMonroState(
            adapt_step_size(state.step_size, acceptance_rate, target_acceptance_rate, learning_rate)
        )

    def final(state: RobbinsMonroState) -> Array:
        return state.step_size

    return Adaptation(init, update, final)


def __getattr__(name):
    """``LEARNING_RATE``, the old name of :data:`STEP_SIZE_LEARNING_RATE` (one release)."""
    if name == "LEARNING_RATE":
        import warnings

        warnings.warn(
            "`LEARNING_RATE` is now `STEP_SIZE_LEARNING_RATE` (rho of the step-size rule; "
            "`learning_rate` is Appendix B's gamma).",
            DeprecationWarning,
            stacklevel=2,
        )
        return STEP_SIZE_LEARNING_RATE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
