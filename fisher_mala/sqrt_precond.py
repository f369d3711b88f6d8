"""Square-root recursions for the inverse Fisher preconditioner (layer 1).

Everything here is deterministic linear algebra on arrays: no randomness, no log
densities. The kernels in :mod:`fisher_mala.fisher` call these functions; the tests
check them against dense inverses in float64.

All three recursions of the paper (Proposition 4, Appendix B, Appendix C) are one
*generalized rank-one square-root update*. With the current square root ``R``
(``A = R R^T``), a whitened signal ``phi = R^T s``, a scale ``a > 0`` and a weight
``c > 0``::

    A' = a^2 (A - (A s)(A s)^T / (c + phi^T phi))        # Woodbury
    R' = a (R - r (R phi) phi^T / (c + phi^T phi)),       r = 1 / (1 + sqrt(c / (c + phi^T phi)))

(Lemma 1 of Appendix A applied to ``I - phi phi^T / (c + phi^T phi)``). The choices of
``(a, c)`` are

============================  =====================================  ===========================
paper                         ``c``                                  ``a``
============================  =====================================  ===========================
Prop. 4, Eq. (13)             ``1``                                  ``1``
Appendix B, n >= 2            ``(1 - gamma_n) / gamma_n``            ``1 / sqrt(1 - gamma_n)``
Appendix C, n >= 2            ``n lambda_{n-1}``                     ``1 / sqrt(lambda_{n-1})``
============================  =====================================  ===========================

with ``lambda_{n-1} = (n - 2) / (n - 1)`` for ``n >= 3`` and ``lambda_1 = 1`` (see below).

Every recursion starts from ``A_0 = I / lambda`` (``R_0 = I / sqrt(lambda)``, ``lambda`` the
damping). One Prop. 4 update of ``R_0`` with ``s_1`` is *exactly* Eq. (12):
``R_1 = (I - r_1 s_1 s_1^T / (lambda + s_1^T s_1)) / sqrt(lambda)``, and one Appendix C
update with weight ``c = 2``, ``a = 1`` gives exactly the paper's ``A_2 = (delta_2
delta_2^T / 2 + lambda I)^{-1}``. So no iteration is a special case in the code; only the
coefficients change. The proposal of Eq. (7) is invariant to the scale of ``A``, so
starting from ``I / sqrt(lambda)`` rather than Algorithm 1's ``R = I`` changes nothing
in the chain.

Cost of one update: one matrix-vector product ``t = R phi`` (one read of ``R``), one
fused read-modify-write of ``R``, and the trace ``tr(A') = ||R'||_F^2`` summed from the
new ``R'`` (on XLA:CPU a separate read of ``R'``; ``benchmarks/step_cost.py`` measures
it). Products ``R'^T v`` for vectors whose ``R^T v`` is known are carried in O(d) by
:func:`whitened_product`.

Trace bookkeeping. The trace also follows in O(d) from the previous one,
``tr(A') = a^2 (tr(A) - ||R phi||^2 / (c + phi^T phi))``, but that is a subtraction: each
step multiplies the relative error of the tracked trace by ``tr(A) / tr(A')``, so the
error after ``n`` updates is about ``eps`` times the factor by which the trace fell since
its last exact value. That factor is the ratio of ``1 / lambda`` to the target's
variance times ``n``: with a target of standard deviation 1e-3 in float32 (variance
1e-6) it reaches ``1e9`` within a thousand updates, and the tracked trace came out
wrong by 61%, by a factor 257 at 1e-4, or negative (every proposal then rejected; issue
"float32 trace drift"). The sum of squares of ``R'`` has a relative error of a few
``eps`` whatever the scale, so it is what the updates return (``exact_trace=True``, the
default); the O(d) form remains available (``exact_trace=False``) for callers that
refresh the trace themselves.

For robustness to huge and tiny signals (issue: reliability) the update is computed
from the unit vector ``phi / ||phi||`` and ``kappa = c / ||phi||^2``; the norm itself is
computed after scaling by ``max |phi_i|`` so that it neither overflows nor underflows.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.scipy.linalg import solve_triangular

from fisher_mala.sharding import constrain_sqrt_precond

__all__ = [
    "SqrtUpdate",
    "initial_sqrt_precond",
    "rank_one_update",
    "whitened_product",
    "fisher_coefficients",
    "schedule_coefficients",
    "guarded_learning_rate",
    "damping_floor",
    "centered_coefficients",
    "cholesky_rank_one_update",
    "BlockUpdate",
    "rank_block_update",
    "block_whitened_product",
]


class SqrtUpdate(NamedTuple):
    """Result of one generalized rank-one square-root update.

    Attributes
    ----------
    sqrt_precond
        The updated square root ``R'``.
    trace_precond
        ``tr(R' R'^T)``, computed in O(d) from the previous trace.
    direction
        The unit vector ``u = phi / ||phi||`` (zeros for a zero signal).
    project, coef
        Scalars with ``R' = a ((R - project (R u) u^T) + coef (R u) u^T)``: ``(0, -gain)``
        normally, ``(1, 1 - gain)`` when the signal dominates (see
        :func:`rank_one_update`), with ``gain = r ||phi||^2 / (c + ||phi||^2)``.
    scale
        The scalar ``a``.
    """

    sqrt_precond: Array
    trace_precond: Array
    direction: Array
    project: Array
    coef: Array
    scale: Array


def initial_sqrt_precond(dim: int, damping, dtype) -> tuple[Array, Array]:
    """Return ``R_0 = I / sqrt(lambda)`` and its trace ``tr(A_0) = d / lambda``.

    ``A_0 = (lambda I)^{-1}`` is the damping term of Eq. (8) seen as a prior precision,
    so that the first Prop. 4 update gives Eq. (12).
    """
    damping = jnp.asarray(damping, dtype)
    sqrt_precond = constrain_sqrt_precond(jnp.eye(dim, dtype=dtype) / jnp.sqrt(damping))
    return sqrt_precond, jnp.asarray(dim, dtype) / damping


def _unit_and_sq_norm(phi: Array) -> tuple[Array, Array]:
    """Unit vector along ``phi`` and ``||phi||^2``, safe against overflow/underflow."""
    big = jnp.max(jnp.abs(phi))
    safe_big = jnp.where(big > 0, big, 1.0)
    scaled = phi / safe_big
    scaled_norm = jnp.sqrt(jnp.dot(scaled, scaled))
    unit = jnp.where(big > 0, scaled / jnp.where(big > 0, scaled_norm, 1.0), 0.0)
    # ||phi||^2 may overflow to inf or underflow to 0; both are handled by kappa below.
    sq_norm = (big * scaled_norm) ** 2
    return unit, sq_norm


def rank_one_update(
    sqrt_precond: Array,
    trace_precond: Array,
    phi: Array,
    scale=1.0,
    weight=1.0,
    exact_trace: bool = True,
) -> SqrtUpdate:
    """Generalized rank-one square-root update (Prop. 4, Appendices B and C).

    Parameters
    ----------
    sqrt_precond
        ``R``, shape ``(d, d)``.
    trace_precond
        ``tr(R R^T)``.
    phi
        The whitened signal ``R^T s``, shape ``(d,)``. A zero vector leaves ``R``
        unchanged (up to ``scale``).
    scale
        ``a`` in the module docstring.
    weight
        ``c`` in the module docstring; must be positive.
    exact_trace
        ``tr(R' R'^T)`` summed from ``R'`` (default), or the O(d) update from
        ``trace_precond``, which drifts (see *Trace bookkeeping* in the module docstring).

    Returns
    -------
    SqrtUpdate
        ``R'`` with ``R' R'^T = a^2 (A - A s s^T A / (c + s^T A s))`` and what the caller
        needs to carry cached products in O(d).
    """
    dtype = sqrt_precond.dtype
    scale = jnp.asarray(scale, dtype)
    weight = jnp.asarray(weight, dtype)
    unit, sq_norm = _unit_and_sq_norm(phi)
    # kappa = c / ||phi||^2 (inf for a zero signal, then gain = 0 and shrink = 0).
    kappa = weight / sq_norm
    # gain = r q / (c + q) = 1 / ((1 + kappa) + sqrt(kappa (1 + kappa))), q = ||phi||^2.
    gain = 1.0 / ((1.0 + kappa) + jnp.sqrt(kappa * (1.0 + kappa)))
    # shrink = q / (c + q): fraction of ||R u||^2 removed from the trace.
    shrink = 1.0 / (1.0 + kappa)
    column = sqrt_precond @ unit  # t / ||phi||: one read of R
    # R' = a (R - gain t u^T). When the signal dominates (gain near 1) the component of R
    # along u shrinks by 1 - gain = sqrt(kappa / (1 + kappa)): write R' = a ((R - t u^T)
    # + (1 - gain) t u^T) then, so that this factor keeps its relative accuracy (exact in
    # d = 1). Both forms are one fused read-modify-write of R.
    dominant = gain > 0.5
    project = jnp.where(dominant, 1.0, 0.0).astype(dtype)
    coef = jnp.where(dominant, jnp.sqrt(kappa / (1.0 + kappa)), -gain).astype(dtype)
    outer = column[:, None] * unit[None, :]
    new_sqrt = scale * ((sqrt_precond - project * outer) + coef * outer)
    if exact_trace:
        # Summed from the stored R': without the barrier XLA:CPU recomputes the update
        # inside the reduction (a second pass of arithmetic, not only of reads). GPUs fuse
        # the update and the reduction into one pass, so the barrier is CPU-only.
        new_sqrt = jax.lax.platform_dependent(
            new_sqrt, cpu=jax.lax.optimization_barrier, default=lambda x: x
        )
        new_trace = jnp.sum(new_sqrt * new_sqrt)
    else:
        new_trace = scale**2 * (trace_precond - shrink * jnp.dot(column, column))
    new_sqrt = constrain_sqrt_precond(new_sqrt)  # rows over a mesh axis, if any
    return SqrtUpdate(new_sqrt, new_trace, unit, project, coef, scale)


def whitened_product(update: SqrtUpdate, whitened: Array) -> Array:
    """Return ``R'^T v`` from ``R^T v`` in O(d).

    ``R'^T v = a ((w - project u (u^T w)) + coef u (u^T w))`` with ``w = R^T v``.
    """
    u = update.direction
    along = u * jnp.dot(u, whitened)
    return update.scale * ((whitened - update.project * along) + update.coef * along)


# --- coefficients (a, c) of each recursion, as functions of the 1-based index n ---


def fisher_coefficients(n, dtype):
    """Prop. 4 (``gamma_n = 1/n``): ``a = 1``, ``c = 1`` for every ``n``."""
    del n
    one = jnp.ones((), dtype)
    return one, one


def guarded_learning_rate(n, gamma_n, dim, dtype):
    """``gamma_n`` capped at ``max(1/n, 1/d)``: at least ``min(n, d)`` signals in the window.

    Appendix B's estimate ``I_n = (1 - gamma_n) I_{n-1} + gamma_n s_n s_n^T`` averages
    about ``1 / gamma_n`` recent signals. Below ``d`` of them it is rank-deficient: the
    directions no recent signal touched keep only the decaying damping, their variance in
    ``A`` grows by ``(1 - gamma_n)^{-1}`` per step and ``R`` overflows (float32 within a
    few hundred steps at ``gamma_n = 0.1``, ``d = 100``). Proposition 4's ``1/n`` is
    never capped.
    """
    n = jnp.asarray(n, dtype)
    limit = jnp.maximum(1.0 / n, 1.0 / jnp.asarray(dim, dtype))
    return jnp.minimum(jnp.asarray(gamma_n, dtype), limit)


def damping_floor(n, gamma_n, damping, dtype):
    """Information ``rho_n`` added per step so that the damping stays Eq. (8)'s ``lambda/n``.

    Under ``I_n = (1 - gamma_n) I_{n-1} + ...`` the damping ``lambda I`` of ``I_1`` decays
    as ``prod (1 - gamma_k)``: like ``lambda / n`` (Eq. (8)) for ``gamma_k = 1/k``, much
    faster for larger rates. Adding ``rho_n I`` with ``rho_n = lambda / n - (1 - gamma_n)
    lambda / (n - 1) = lambda (n gamma_n - 1) / (n (n - 1))`` keeps it at ``lambda / n``:
    zero for ``gamma_n = 1/n`` (Proposition 4 is unchanged), positive for faster rates.
    """
    n = jnp.asarray(n, dtype)
    rho = damping * (n * gamma_n - 1.0) / (n * jnp.maximum(n - 1.0, 1.0))
    return jnp.where(n >= 2, jnp.maximum(rho, 0.0), 0.0).astype(dtype)


def schedule_coefficients(n, gamma_n, dtype):
    """Appendix B with learning rate ``gamma_n`` in (0, 1).

    The first update (``n = 1``) is Prop. 4's Eq. (12) (``I_1 = s_1 s_1^T + lambda I``);
    afterwards ``I_n = (1 - gamma_n) I_{n-1} + gamma_n s_n s_n^T``.
    """
    gamma_n = jnp.asarray(gamma_n, dtype)
    first = n <= 1
    keep = 1.0 - gamma_n
    scale = jnp.where(first, 1.0, 1.0 / jnp.sqrt(keep))
    weight = jnp.where(first, 1.0, keep / gamma_n)
    return scale.astype(dtype), weight.astype(dtype)


def centered_coefficients(n, dtype):
    """Appendix C (paired mean and covariance), for the ``n``-th score, ``n >= 2``.

    ``A_n = ((sum_i (s_i - sbar_n)(s_i - sbar_n)^T + lambda I) / (n - 1))^{-1}`` follows
    from ``A_{n-1}`` with ``delta_n = s_n - sbar_{n-1}``, ``c = n lambda_{n-1}`` and
    ``a = 1 / sqrt(lambda_{n-1})``, ``lambda_{n-1} = (n - 2) / (n - 1)``. Starting from
    ``A_0 = I / lambda`` instead of the paper's ``A_1 = I`` (with its ``lambda_1 = lambda``)
    makes ``lambda_1 = 1``: the same ``A_2``, with no special case.
    """
    n = jnp.asarray(n, dtype)
    lam_prev = jnp.where(n >= 3, (n - 2.0) / jnp.maximum(n - 1.0, 1.0), 1.0)
    return (1.0 / jnp.sqrt(lam_prev)).astype(dtype), (n * lam_prev).astype(dtype)


def _rank_one_rows(chol_upper: Array, vector: Array) -> Array:
    """One chain's LINPACK ``dchud``: a scan over the rows of ``U``, emitting the new rows.

    Written as a ``scan`` that reads row ``k`` and emits the updated row (no indexed
    writes into ``U``), so that XLA keeps every step O(d) without copying ``U``.
    """
    index = jnp.arange(chol_upper.shape[0])

    def body(v, row_and_k):
        row, k = row_and_k
        diag, vk = row[k], v[k]
        radius = jnp.sqrt(diag * diag + vk * vk)
        cos, sin = radius / diag, vk / diag
        right = index > k
        new_row = jnp.where(right, (row + sin * v) / cos, jnp.where(index == k, radius, row))
        return jnp.where(right, cos * v - sin * new_row, v), new_row

    return jax.lax.scan(body, vector, (chol_upper, index))[1]


@jax.custom_batching.custom_vmap
def cholesky_rank_one_update(chol_upper: Array, vector: Array) -> Array:
    """Upper Cholesky factor ``U'`` with ``U'^T U' = U^T U + v v^T``, in O(d^2).

    The classical rank-one update (LINPACK ``dchud``), one Givens-like rotation per row of
    ``U`` (rows are contiguous in memory). It is sequential over the ``d`` rows, so it has
    ``O(d^2)`` work but ``d`` dependent steps. Used by AdaMALA for the Haario covariance,
    where ``Sigma`` gains a positive rank-one term every iteration.

    Under ``vmap`` (one factor per chain) the chains are updated one after the other on a
    CPU, where a batched scan of ``d`` tiny steps costs several times the sum of the
    single ones (measured 18 ms against 4.8 ms for 3 chains at d = 785), and as one
    batched scan elsewhere (a GPU pays a kernel launch per step, not per chain). Not
    differentiable (nothing differentiates through a covariance estimate).
    """
    return _rank_one_rows(chol_upper, vector)


@cholesky_rank_one_update.def_vmap
def _cholesky_rank_one_update_vmap(axis_size, in_batched, chol_upper, vector):
    def batched(x, is_batched):
        return x if is_batched else jnp.broadcast_to(x, (axis_size, *x.shape))

    chol_upper, vector = batched(chol_upper, in_batched[0]), batched(vector, in_batched[1])

    def one_by_one(u, v):
        return jax.lax.map(lambda uv: cholesky_rank_one_update(*uv), (u, v))

    def all_at_once(u, v):
        return jax.vmap(_rank_one_rows)(u, v)

    out = jax.lax.platform_dependent(chol_upper, vector, cpu=one_by_one, default=all_at_once)
    return out, True


class BlockUpdate(NamedTuple):
    """Result of :func:`rank_block_update` (see there); ``R' = scale R B``."""

    sqrt_precond: Array
    trace_precond: Array
    signals: Array
    gain: Array
    scale: Array | float = 1.0


def rank_block_update(
    sqrt_precond: Array,
    trace_precond: Array,
    phis: Array,
    exact_trace: bool = True,
    scale=1.0,
) -> BlockUpdate:
    """Rank-C square-root update: C signals at once (Prop. 4 generalized to a block).

    With the ``C x d`` matrix ``Phi`` of whitened signals (rows ``phi_c = R^T s_c``) and
    ``M = Phi Phi^T`` (``C x C``), Woodbury's identity gives::

        A' = (A^{-1} + sum_c s_c s_c^T)^{-1} = R (I - Phi^T (I + M)^{-1} Phi) R^T.

    A square root of the middle factor is Andrews' (1968) ``B = I - Phi^T K Phi`` with
    ``K = L^{-T} (L + I)^{-1}`` and ``L L^T = I + M`` (Cholesky), so ``R' = R B``: one
    ``C x C`` Cholesky factorization and two triangular solves, no eigendecomposition. For
    ``C = 1``, ``L = sqrt(1 + phi^T phi)`` and ``K`` is Eq. (13)'s
    ``r / (1 + phi^T phi)``. Cost: one ``d x d`` times ``d x C`` product (``T = R Phi^T``,
    one read of ``R``), one rank-C read-modify-write ``R - (T K) Phi``, and O(C^3 + d C^2);
    ``tr(A')`` is summed from ``R'`` (``exact_trace=True``, see *Trace bookkeeping*), or
    ``tr(A) - ||L^{-1} T^T||_F^2`` in O(d C^2). ``scale`` ``a`` multiplies the result,
    ``R' = a R B`` (Appendix B's forgetting, as in :func:`rank_one_update`). Products
    ``R'^T v`` follow in O(d C) from ``R^T v`` with :func:`block_whitened_product`. Rows
    of ``Phi`` that are zero leave ``R`` unchanged.
    """
    dtype = sqrt_precond.dtype
    eye = jnp.eye(phis.shape[0], dtype=dtype)
    chol = jnp.linalg.cholesky(eye + phis @ phis.T)  # L, lower triangular, diagonal >= 1
    # K = L^{-T} (L + I)^{-1}. With M = L L^T - I, B B^T = I - Phi^T (L L^T)^{-1} Phi holds
    # iff K + K^T - K M K^T = (L L^T)^{-1}; times L^T on the left and L on the right this is
    # (L + I)^{-1} L + L^T (L^T + I)^{-1} - (L + I)^{-1} (L L^T - I) (L^T + I)^{-1} = I,
    # which times (L + I) on the left and (L^T + I) on the right is an identity.
    # Only C x C triangular solves: every O(d) product below is a matrix product.
    chol_inv = solve_triangular(chol, eye, lower=True)  # L^{-1}
    gain = chol_inv.T @ solve_triangular(chol + eye, eye, lower=True)
    columns = jnp.einsum("ij,cj->ic", sqrt_precond, phis)  # T = R Phi^T: one read of R
    scale = jnp.asarray(scale, dtype)
    new_sqrt = scale * (sqrt_precond - (columns @ gain) @ phis)
    if exact_trace:
        new_trace = jnp.einsum("ij,ij->", new_sqrt, new_sqrt)
    else:  # tr(A') = a^2 (tr(A) - ||L^{-1} T^T||_F^2) = a^2 (tr(A) - tr((I + M)^{-1} T^T T))
        removed = jnp.sum((chol_inv.T @ chol_inv) * (columns.T @ columns))
        new_trace = scale**2 * (trace_precond - removed)
    new_sqrt = constrain_sqrt_precond(new_sqrt.astype(dtype))
    return BlockUpdate(new_sqrt, new_trace.astype(dtype), phis, gain, scale)


def block_whitened_product(update: BlockUpdate, whitened: Array) -> Array:
    """Rows ``R'^T v`` from rows ``R^T v``: ``a (W - (W Phi^T) K Phi)`` in O(d C) per row."""
    return update.scale * (
        whitened - ((whitened @ update.signals.T) @ update.gain) @ update.signals
    )
