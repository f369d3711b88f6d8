"""Neal's funnel (Neal 2003, Sec. 8): a target no global preconditioner fits.

``v ~ N(0, 3^2)`` and, given ``v``, ``x_i ~ N(0, e^v)`` for ``i = 1..d-1``. The scale of
``x`` changes by a factor ``e^{3}`` (about 20) per standard deviation of ``v``: any
constant step size is too large in the neck (``v`` small) and too small in the mouth.
Exact moments: ``E v = E x_i = 0``, ``sd(v) = 3``, ``sd(x_i) = e^{9/4}`` (from
``E e^v = e^{9/2}``).
"""

import jax.numpy as jnp
import numpy as np

from fisher_mala.targets.base import Target, register

__all__ = ["neal_funnel", "FUNNEL_SCALE"]

FUNNEL_SCALE = 3.0  # sd of v (Neal 2003)


@register("funnel")
def neal_funnel(dim: int = 10) -> Target:
    """Neal's funnel in ``dim`` dimensions, position ``(v, x_1, ..., x_{dim-1})``."""
    if int(dim) < 2:
        raise ValueError(f"`dim` must be >= 2, got {dim}.")
    dim = int(dim)

    def logdensity(z):
        v, x = z[0], z[1:]
        return (
            -0.5 * (v / FUNNEL_SCALE) ** 2 - 0.5 * jnp.sum(x**2) * jnp.exp(-v) - 0.5 * (dim - 1) * v
        )

    sd = np.concatenate([[FUNNEL_SCALE], np.full(dim - 1, np.exp(FUNNEL_SCALE**2 / 4))])
    return Target(
        name="funnel",
        dim=dim,
        logdensity_fn=logdensity,
        mean=np.zeros(dim),
        covariance=np.diag(sd**2),
        extras={"sd": sd, "names": ["v", *[f"x[{i}]" for i in range(1, dim)]]},
    )
