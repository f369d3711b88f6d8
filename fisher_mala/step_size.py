"""The multiplicative step-size rule of Algorithm 1 (layer 2).

``sigma^2 <- sigma^2 [1 + rho (alpha - alpha*)]``: the step grows when the acceptance
probability ``alpha`` of the last proposal is above the target ``alpha*`` and shrinks
otherwise. With ``0 <= rho < 1 / alpha*`` the factor is always positive. The paper uses
``rho = 0.015`` and ``alpha* = 0.574`` for MALA-type kernels (Roberts and Rosenthal,
1998) and ``0.651`` for HMC (Beskos et al., 2013).

The result is clipped to ``[sqrt(tiny), sqrt(max)]`` of the floating-point type, so that
a long run of rejections (or acceptances) can never drive ``sigma^2`` to 0 or infinity.
"""

import jax.numpy as jnp
from jax import Array

__all__ = ["MALA_TARGET_ACCEPTANCE", "LEARNING_RATE", "adapt_step_size", "step_size_bounds"]

#: Optimal acceptance rate of MALA (Roberts and Rosenthal, 1998), Algorithm 1's alpha*.
MALA_TARGET_ACCEPTANCE = 0.574
#: Algorithm 1's default constant learning rate rho_n.
LEARNING_RATE = 0.015


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
