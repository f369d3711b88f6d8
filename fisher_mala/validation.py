"""Input checks that run eagerly, before anything is compiled.

Every message names the offending argument and says how to fix it. Checks of *values*
(finiteness) run only on concrete arrays: when ``init`` is called under ``jax.jit`` or
``jax.vmap`` the values are tracers and only shapes and dtypes can be checked.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "is_concrete",
    "check_positive",
    "check_nonnegative",
    "check_probability",
    "check_choice",
    "check_position",
    "check_logdensity",
    "check_sqrt_precond",
    "check_sqrt_precond_shape",
]


def is_concrete(tree) -> bool:
    """True when no leaf of ``tree`` is a tracer (so values can be inspected)."""
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(tree))


def _scalar(name: str, value) -> float | None:
    if isinstance(value, jax.core.Tracer):
        return None
    try:
        array = np.asarray(value)
    except Exception as err:  # pragma: no cover - exotic objects
        raise TypeError(f"`{name}` must be a real number, got {value!r}.") from err
    if array.shape != () or not np.issubdtype(array.dtype, np.number):
        raise TypeError(f"`{name}` must be a real scalar, got {value!r}.")
    if np.iscomplexobj(array):
        raise TypeError(f"`{name}` must be real, got {value!r}.")
    return float(array)


def check_positive(name: str, value, hint: str = "") -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number > 0."""
    x = _scalar(name, value)
    if x is not None and not (np.isfinite(x) and x > 0):
        raise ValueError(f"`{name}` must be a finite number > 0, got {value!r}. {hint}".strip())


def check_nonnegative(name: str, value, upper: float | None = None, hint: str = "") -> None:
    """Raise ``ValueError`` unless ``0 <= value`` (``< upper`` when given)."""
    x = _scalar(name, value)
    if x is None:
        return
    if not (np.isfinite(x) and x >= 0 and (upper is None or x < upper)):
        bound = f" and < {upper:.4g}" if upper is not None else ""
        raise ValueError(f"`{name}` must be >= 0{bound}, got {value!r}. {hint}".strip())


def check_probability(name: str, value) -> None:
    """Raise ``ValueError`` unless ``0 < value < 1``."""
    x = _scalar(name, value)
    if x is not None and not (0.0 < x < 1.0):
        raise ValueError(
            f"`{name}` must lie strictly between 0 and 1, got {value!r} "
            "(0.574 is optimal for MALA, 0.651 for HMC)."
        )


def check_choice(name: str, value, choices) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        options = ", ".join(repr(c) for c in choices)
        raise ValueError(f"Unknown `{name}` {value!r}; choose one of {options}.")


def check_position(position) -> None:
    """Check that ``position`` is a non-empty pytree of real floating-point arrays."""
    leaves = jax.tree.leaves(position)
    if not leaves:
        raise ValueError("`position` is empty; pass an array (or pytree of arrays) of floats.")
    size = 0
    for leaf in leaves:
        dtype = jnp.result_type(leaf)
        if jnp.issubdtype(dtype, jnp.complexfloating):
            raise TypeError(
                f"`position` has complex dtype {dtype}; the samplers work on real "
                "parameters: split real and imaginary parts into separate arrays."
            )
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(
                f"`position` has dtype {dtype}; it must be floating point. Convert it, "
                "e.g. `jnp.asarray(position, jnp.float32)`."
            )
        size += int(np.prod(jnp.shape(leaf)))
    if size == 0:
        raise ValueError("`position` has no elements; pass at least one float parameter.")
    if is_concrete(position):
        for leaf in leaves:
            if not bool(np.all(np.isfinite(np.asarray(leaf)))):
                raise ValueError(
                    "`position` contains NaN or inf; start the chain from finite values "
                    "where the log density is finite."
                )


def check_logdensity(logdensity_fn: Callable, position, evaluate: bool = True) -> None:
    """Check that ``logdensity_fn(position)`` is a finite real scalar with a finite gradient.

    The shape and dtype are checked by abstract evaluation (``jax.eval_shape``), which
    compiles nothing; values are checked only when ``position`` is concrete and
    ``evaluate`` is true.
    """
    if not callable(logdensity_fn):
        raise TypeError(f"`logdensity_fn` must be callable, got {logdensity_fn!r}.")
    try:
        out = jax.eval_shape(logdensity_fn, position)
    except Exception as err:
        raise ValueError(
            f"`logdensity_fn` raised {type(err).__name__} when called on `position`: {err}. "
            "It must accept the position (same structure and shapes) and use jax.numpy."
        ) from err
    if not hasattr(out, "shape") or out.shape != ():
        shape = getattr(out, "shape", type(out).__name__)
        raise ValueError(
            f"`logdensity_fn` must return a scalar, got shape {shape}; sum the "
            "log-likelihood terms (e.g. `jnp.sum(...)`)."
        )
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise TypeError(
            f"`logdensity_fn` returned dtype {out.dtype}; it must return a real float "
            "(integer operations are not differentiable)."
        )
    if not evaluate or not is_concrete(position):
        return
    value, grad = jax.value_and_grad(logdensity_fn)(position)
    if not bool(np.isfinite(np.asarray(value))):
        raise ValueError(
            f"`logdensity_fn(position)` is {float(value)}; start the chain where the log "
            "density is finite (inside the support)."
        )
    if not all(bool(np.all(np.isfinite(np.asarray(g)))) for g in jax.tree.leaves(grad)):
        raise ValueError(
            "The gradient of `logdensity_fn` at `position` contains NaN or inf; start "
            "the chain at a point where the log density is differentiable."
        )


def check_sqrt_precond_shape(sqrt_precond, dim: int | None) -> None:
    """Check that ``sqrt_precond`` is a square ``(dim, dim)`` matrix (static: works under jit).

    ``dim=None`` checks squareness only. A vector (e.g. the diagonal of a preconditioner)
    is refused rather than broadcast, which would tie every coordinate together.
    """
    shape = jnp.shape(sqrt_precond)
    if len(shape) != 2 or shape[0] != shape[1] or (dim is not None and shape[0] != dim):
        expected = f"({dim}, {dim})" if dim is not None else "square (d, d)"
        raise ValueError(
            f"`sqrt_precond` must be a {expected} matrix R with A = R R^T, got shape {shape}. "
            "For a diagonal preconditioner pass `jnp.diag(jnp.sqrt(variances))`."
        )


def check_sqrt_precond(sqrt_precond, dim: int) -> None:
    """Check that ``sqrt_precond`` is a finite, real ``(dim, dim)`` matrix."""
    check_sqrt_precond_shape(sqrt_precond, dim)
    if not jnp.issubdtype(jnp.result_type(sqrt_precond), jnp.floating):
        raise TypeError("`sqrt_precond` must be a real floating-point matrix.")
    if is_concrete(sqrt_precond) and not bool(np.all(np.isfinite(np.asarray(sqrt_precond)))):
        raise ValueError("`sqrt_precond` contains NaN or inf.")


def check_schedule(name: str, schedule, first: int, last: int) -> None:
    """Every value ``schedule(n)``, ``first <= n <= last``, in (0, 1), checked before
    compiling in one vectorized call (``jax.vmap``, so an optax schedule works)."""
    if last < first:
        return
    steps = np.arange(first, last + 1)
    try:
        with jax.ensure_compile_time_eval():
            values = np.asarray(jax.vmap(schedule)(jnp.asarray(steps)), np.float64)
    except Exception as err:
        raise ValueError(
            f"`{name}` must be None, a float in (0, 1) or a schedule n -> gamma_n (e.g. an "
            f"optax schedule); calling it on n = {first}..{last} failed: {err}"
        ) from err
    values = np.broadcast_to(values, steps.shape)
    bad = np.flatnonzero(~((values > 0.0) & (values < 1.0)))
    if bad.size:
        n, value = int(steps[bad[0]]), float(values[bad[0]])
        raise ValueError(
            f"`{name}` gives gamma_{n} = {value} (and {bad.size - 1} more outside (0, 1) for "
            f"n <= {last}); Appendix B needs every gamma_n in (0, 1) (None means gamma_n = 1/n)."
        )
