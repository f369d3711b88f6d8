"""Fisher NUTS and Fisher HMC: BlackJAX's kernels in whitened coordinates (layer 3).

The paper's conclusion proposes to learn HMC's inverse mass matrix with the Fisher
recursion and notes that HMC needs both the mass matrix and its inverse. The square root
``R`` (``A = R R^T``) removes the difficulty: with ``x = x_n + R u``, HMC with inverse
mass matrix ``A`` in ``x`` *is* HMC with the identity in ``u`` (the leapfrog map, the
kinetic energy ``|R^T p|^2 / 2`` and NUTS's U-turn criterion ``p^T A p'`` are all carried
by the affine map), so the sampler only ever needs

* ``log pi(x_n + R u)``, whose gradient by autodiff is ``R^T grad log pi = g @ R``:
  **two products with R per leapfrog step**, no inverse, no Cholesky factorization;
* ``x_{n+1} = x_n + R u*`` once per transition.

``R`` may also be diagonal (:class:`DiagonalSqrt`, the standard deviations): then both
products are elementwise, ``O(d)`` per leapfrog step, which is what a posterior close to
independent needs (the Fisher warm-up chooses it from the learned ``R``).

For a diagonal-plus-low-rank ``R = D^(1/2) (I + Q diag(c) Q^T)``
(:class:`~fisher_mala.square_roots.LowRankSqrt`) each product is a pass over ``Q`` to
reduce (``Q^T v``) and one to expand (``Q w``), four per leapfrog step. The default
integrator (:func:`_fused_velocity_verlet`) moves ``x`` itself and keeps the momentum and
the whitened gradient unexpanded, as ``v + Q a`` with ``Q^T v`` beside them
(:class:`_Unexpanded`): the kicks add to their parts, the drift ``eps R p`` is the one
expansion and the gradient's ``Q^T D^(1/2) g`` the one reduction, and the kinetic energy
and NUTS's criterion are dot products of the parts. Two passes, and no more ``d``-vectors
carried through the trajectory than the plain kernel's; the same leapfrog map up to
rounding.

Each transition starts at ``u = 0`` (the current position), so nothing in the state
depends on where an earlier transition anchored. ``R`` lives in the state together with
the cached whitened gradient ``R^T grad log pi(x_n)`` it was computed with (a kernel must
not cache a quantity derived from a call argument); :func:`init` builds a consistent
state for any ``R``.

BlackJAX (``pip install 'fisher_mala[blackjax]'``) provides the NUTS (multinomial,
iterative tree building) and HMC transitions; this module only changes coordinates. A
proposal whose log density or gradient is not finite is rejected and reported
(``proposal_is_finite``); BlackJAX's divergence flag is passed through per draw.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.flatten_util import ravel_pytree

from fisher_mala import robust_nuts, square_roots, validation
from fisher_mala.base import (
    ArrayTree,
    SamplingAlgorithm,
    SamplingAPI,
    accept,
    is_finite,
    sampling_algorithm,
)
from fisher_mala.optional import require_blackjax
from fisher_mala.pytree import ravel
from fisher_mala.square_roots import DiagonalSqrt, LowRankSqrt

__all__ = [
    "ALGORITHMS",
    "DiagonalSqrt",
    "apply_sqrt",
    "whiten_gradient",
    "inverse_mass_matrix",
    "NUTS_TARGET_ACCEPTANCE",
    "TRAJECTORY_LENGTH",
    "FisherHMCState",
    "FisherHMCInfo",
    "require_blackjax",
    "check_robust_uturn",
    "Whitened",
    "whiten",
    "init",
    "build_kernel",
    "as_top_level_api",
    "fisher_nuts",
    "fisher_hmc",
]

#: The BlackJAX transitions that can run in whitened coordinates.
ALGORITHMS = ("nuts", "hmc")


def check_robust_uturn(robust_uturn) -> None:
    """``robust_uturn`` as NUTS's U-turn option takes it: ``True`` (the checks across
    subtrees), ``False`` (BlackJAX's criterion) or, for a warm-up, ``"auto"`` (its choice)."""
    auto = isinstance(robust_uturn, str) and robust_uturn == "auto"
    if not (isinstance(robust_uturn, bool) or auto):
        raise TypeError(f"`robust_uturn` must be True, False or 'auto', got {robust_uturn!r}.")


#: Dual-averaging target of NUTS and HMC (Stan's and BlackJAX's default).
NUTS_TARGET_ACCEPTANCE = 0.8
#: Fisher HMC's integration time in whitened coordinates: pi / 2, a quarter period of
#: the harmonic oscillator, maps N(0, I) to an independent draw; the learned ``A``
#: approximates the covariance, so the whitened target is close to N(0, I).
TRAJECTORY_LENGTH = jnp.pi / 2


def apply_sqrt(sqrt_precond, u: Array) -> Array:
    """``R u`` for a dense ``R`` or a :class:`DiagonalSqrt`."""
    return square_roots.color(sqrt_precond, u)


def whiten_gradient(grad: Array, sqrt_precond) -> Array:
    """``R^T g`` (``g @ R``, the fast orientation) for a dense ``R`` or a :class:`DiagonalSqrt`."""
    return square_roots.whiten(sqrt_precond, grad)


def inverse_mass_matrix(sqrt_precond) -> Array:
    """``A = R R^T`` in BlackJAX's form: ``(d, d)``, or the ``(d,)`` diagonal."""
    if isinstance(sqrt_precond, DiagonalSqrt):
        return sqrt_precond.scale**2
    if isinstance(sqrt_precond, LowRankSqrt):  # BlackJAX takes a dense matrix: O(d^2)
        root = square_roots.dense(sqrt_precond)
        return root @ root.T
    return sqrt_precond @ sqrt_precond.T


def _check_shape(sqrt_precond, dim: int | None) -> None:
    if isinstance(sqrt_precond, LowRankSqrt):
        shape = jnp.shape(sqrt_precond.scale)
        if len(shape) != 1 or (dim is not None and shape[0] != dim):
            raise ValueError(f"`LowRankSqrt.scale` must have shape (d,), got {shape}.")
        return
    if isinstance(sqrt_precond, DiagonalSqrt):
        shape = jnp.shape(sqrt_precond.scale)
        if len(shape) != 1 or (dim is not None and shape[0] != dim):
            raise ValueError(
                f"`DiagonalSqrt.scale` must have shape ({dim if dim is not None else 'd'},), "
                f"got {shape}."
            )
    else:
        validation.check_sqrt_precond_shape(sqrt_precond, dim)


def _check(sqrt_precond, dim: int) -> None:
    """Shape, dtype and finiteness of a dense or diagonal ``R`` (before compilation)."""
    if isinstance(sqrt_precond, LowRankSqrt):
        _check_shape(sqrt_precond, dim)
        return
    if isinstance(sqrt_precond, DiagonalSqrt):
        _check_shape(sqrt_precond, dim)
        scale = sqrt_precond.scale
        if not jnp.issubdtype(jnp.result_type(scale), jnp.floating):
            raise TypeError("`DiagonalSqrt.scale` must be real floating-point.")
        if validation.is_concrete(scale) and not bool(np.all(np.isfinite(np.asarray(scale)))):
            raise ValueError("`DiagonalSqrt.scale` contains NaN or inf.")
    else:
        validation.check_sqrt_precond(sqrt_precond, dim)


def _as_dtype(sqrt_precond, dtype):
    return jax.tree.map(lambda a: jnp.asarray(a, dtype), sqrt_precond)


class FisherHMCState(NamedTuple):
    """State of Fisher NUTS / Fisher HMC.

    Attributes
    ----------
    position
        The current position, in the user's pytree structure.
    logdensity
        ``log pi(position)``.
    whitened_grad
        ``R^T grad log pi(position)`` (flat), the gradient in whitened coordinates.
    sqrt_precond
        ``R`` with ``A = R R^T`` the inverse mass matrix: ``(d, d)`` or a
        :class:`DiagonalSqrt`.
    """

    position: ArrayTree
    logdensity: Array
    whitened_grad: Array
    sqrt_precond: Any


class FisherHMCInfo(NamedTuple):
    """Diagnostics of one transition.

    Attributes
    ----------
    acceptance_rate
        BlackJAX's mean acceptance probability over the trajectory (what dual averaging
        tunes).
    is_accepted
        Whether the chain moved.
    proposal_is_finite
        False when the selected state's log density or gradient was NaN or inf (the
        chain then stays).
    is_divergent
        BlackJAX's divergence flag (energy error above the threshold).
    num_integration_steps
        Leapfrog steps, i.e. gradient evaluations, of this transition.
    energy
        The Hamiltonian of the selected state in whitened coordinates
        (``-log pi`` up to the chain's constant ``log |det R|``, plus the kinetic energy),
        for ArviZ's energy plot and BFMI.
    tree_depth
        NUTS's trajectory doublings (0 for HMC).
    """

    acceptance_rate: Array
    is_accepted: Array
    proposal_is_finite: Array
    is_divergent: Array
    num_integration_steps: Array
    energy: Array
    tree_depth: Array


class Whitened(NamedTuple):
    """A log density in whitened coordinates and the map back (see :func:`whiten`)."""

    logdensity_fn: Callable
    to_position: Callable


def whiten(logdensity_fn: Callable, sqrt_precond: Array, anchor: ArrayTree) -> Whitened:
    """Whitened coordinates ``u`` with ``x = anchor + R u``, for any BlackJAX kernel.

    ``Whitened.logdensity_fn(u) = log pi(anchor + R u)`` (up to the constant
    ``log |det R|``) is sampled from ``u = 0`` with the identity metric;
    ``Whitened.to_position(u)`` maps draws back to the user's pytree. E.g.
    ``w = fm.whiten(logdensity_fn, params.sqrt_precond, x0)``,
    ``alg = blackjax.mala(w.logdensity_fn, step_size)``, ``state = alg.init(zeros)``,
    then ``jax.vmap(w.to_position)(states.position)``.
    """
    flat, unravel = ravel_pytree(anchor)
    _check(sqrt_precond, flat.shape[0])
    r = _as_dtype(sqrt_precond, flat.dtype)

    def to_position(u):
        return unravel(flat + apply_sqrt(r, u))

    def whitened_logdensity(u):
        return logdensity_fn(to_position(u))

    return Whitened(whitened_logdensity, to_position)


def init(position: ArrayTree, logdensity_fn: Callable, sqrt_precond: Array) -> FisherHMCState:
    """Evaluate ``position`` and whiten its gradient with ``R`` (validates the inputs)."""
    validation.check_position(position)
    validation.check_logdensity(logdensity_fn, position)
    flat = ravel(position)
    _check(sqrt_precond, flat.shape[0])
    sqrt_precond = _as_dtype(sqrt_precond, flat.dtype)
    logdensity, grad = jax.value_and_grad(logdensity_fn)(position)
    return FisherHMCState(
        position, logdensity, whiten_gradient(ravel(grad), sqrt_precond), sqrt_precond
    )


class _LowRankTarget(NamedTuple):
    """What the fused leapfrog step of a :class:`LowRankSqrt` needs (passed where BlackJAX
    passes the log density to the integrator's factory)."""

    logdensity_fn: Callable
    unravel: Callable
    root: LowRankSqrt
    gram: Array  # Q^T Q, (k, k)
    rows: Array  # Q^T, (k, d): see :func:`_low_rank_target`


def _low_rank_target(logdensity_fn, unravel, root: LowRankSqrt) -> _LowRankTarget:
    """The fused step's target, with ``Q^T`` stored ``(k, d)``: the root's ``rows`` (the
    sampling phase's blocks), or copied out once per transition when it has none. XLA:CPU's
    products of a vector with ``Q`` stored ``(d, k)`` run at about half the speed of the
    same products with ``Q^T`` stored ``(k, d)`` when the loop's vectors and matrices do not
    fit in cache (``python -m benchmarks.nuts_step_cost --dims 100000 --profile``), and a
    trajectory's dozens of leapfrog steps repay the one copy."""
    basis = root.basis  # the transpose is made outside the trajectory's loop, where it stays
    rows = basis.T if root.rows is None else root.rows
    return _LowRankTarget(logdensity_fn, unravel, root, basis.T @ basis, rows)


class _Unexpanded(NamedTuple):
    """A whitened vector ``vec + Q coef`` kept unexpanded, with ``proj = Q^T vec``: the
    momentum and the whitened gradient of :func:`_fused_velocity_verlet`. Linear in its
    three fields, so sums and multiples (NUTS's momentum sums, the kicks) act fieldwise."""

    vec: Array  # (d,)
    coef: Array  # (k,)
    proj: Array  # (k,)


def _unexpanded(target: _LowRankTarget, vec: Array) -> _Unexpanded:
    """``vec`` itself, as an :class:`_Unexpanded` (one reduction over ``Q``)."""
    rows = target.rows
    return _Unexpanded(vec, jnp.zeros(rows.shape[0], vec.dtype), jnp.einsum("d,kd->k", vec, rows))


def _expanded(target: _LowRankTarget, v: _Unexpanded) -> Array:
    """``vec + Q coef`` (one expansion over ``Q``)."""
    return v.vec + jnp.einsum("k,kd->d", v.coef, target.rows)


def _dot(target: _LowRankTarget, a: _Unexpanded, b: _Unexpanded) -> Array:
    """``a . b`` without expanding either: ``O(d + k^2)``."""
    return a.vec @ b.vec + a.coef @ b.proj + a.proj @ b.coef + a.coef @ (target.gram @ b.coef)


def _colored(target: _LowRankTarget, momentum: _Unexpanded) -> Array:
    """``R p = D^(1/2) (p_vec + Q (p_coef + c (Q^T p)))`` with ``Q^T p = p_proj +
    G p_coef``: one expansion over ``Q``."""
    root = target.root
    coef = momentum.coef + root.factors * (momentum.proj + target.gram @ momentum.coef)
    return root.scale * (momentum.vec + jnp.einsum("k,kd->d", coef, target.rows))


def _whitened_gradient(target: _LowRankTarget, grad: Array) -> _Unexpanded:
    """``R^T g = h + Q (c t)`` with ``h = D^(1/2) g`` and ``t = Q^T h``, unexpanded: one
    reduction over ``Q``."""
    root = target.root
    h = root.scale * grad
    t = jnp.einsum("d,kd->k", h, target.rows)
    return _Unexpanded(h, root.factors * t, t)


def _fused_velocity_verlet(target: _LowRankTarget, kinetic_energy_fn=None):
    """Velocity Verlet in whitened coordinates ``u`` (``x = x_n + R u``, the identity
    metric) for ``R`` a :class:`LowRankSqrt`, with **one reduction and one expansion over
    ``Q`` per step** instead of two products with ``R`` (a reduction and an expansion each).

    The state's position is ``x`` itself, and the momentum ``p`` and the whitened gradient
    ``R^T g`` are kept unexpanded (:class:`_Unexpanded`): the kicks add ``R^T g``'s
    ``(h, c t, t)`` to ``p``'s fields, the drift moves ``x`` by ``eps R p``
    (:func:`_colored`, the one expansion), and the gradient's ``t = Q^T D^(1/2) g`` is the
    one reduction. The kinetic energy and NUTS's criterion take their dot products unexpanded
    (:func:`_unexpanded_metric`); the map is the same leapfrog step, up to rounding."""
    del kinetic_energy_fn  # the identity metric's: the momentum itself is the velocity

    logdensity_and_grad = jax.value_and_grad(lambda x: target.logdensity_fn(target.unravel(x)))

    def kick(momentum, whitened, half):
        return jax.tree.map(lambda p, w: p + half * w, momentum, whitened)

    def one_step(state, step_size):
        x, momentum, _, whitened = state
        half = 0.5 * step_size
        momentum = kick(momentum, whitened, half)
        x = x + step_size * _colored(target, momentum)
        logdensity, grad = logdensity_and_grad(x)
        whitened = _whitened_gradient(target, grad)
        momentum = kick(momentum, whitened, half)
        integrators = require_blackjax().mcmc.integrators
        return integrators.IntegratorState(x, momentum, logdensity, whitened)

    return one_step


def _unexpanded_metric(target: _LowRankTarget, x: Array):
    """The identity metric of the whitened coordinates on :class:`_Unexpanded` momenta, for
    :func:`_fused_velocity_verlet`: the momentum drawn as the identity metric draws it (the
    same numbers, of the shape of ``u``), its kinetic energy and NUTS's U-turn criterion
    from unexpanded dot products."""
    metrics = require_blackjax().mcmc.metrics
    identity = metrics.gaussian_euclidean(jnp.ones_like(x))

    def sample_momentum(rng_key, position):
        return _unexpanded(target, identity.sample_momentum(rng_key, jnp.zeros_like(x)))

    def kinetic_energy(momentum, position=None):
        return 0.5 * _dot(target, momentum, momentum)

    def is_turning(momentum_left, momentum_right, momentum_sum, position_left=None,
                   position_right=None):  # fmt: skip
        left, right = momentum_left, momentum_right
        rho = jax.tree.map(lambda s, r, m: s - (r + m) / 2, momentum_sum, right, left)
        return (_dot(target, left, rho) <= 0) | (_dot(target, right, rho) <= 0)

    return metrics.Metric(sample_momentum, kinetic_energy, is_turning, identity.scale)


def build_kernel(
    algorithm: str = "nuts",
    integrator: Callable | None = None,
    divergence_threshold: float = 1000.0,
    robust_uturn: bool = True,
) -> Callable:
    """Build the Fisher NUTS (``"nuts"``) or Fisher HMC (``"hmc"``) kernel.

    Parameters
    ----------
    algorithm
        ``"nuts"`` or ``"hmc"``.
    integrator
        BlackJAX's integrator (default: velocity Verlet).
    divergence_threshold
        Energy error above which a transition is divergent.
    robust_uturn
        NUTS: check the U-turn criterion across subtrees too
        (:mod:`fisher_mala.robust_nuts`; a whitened posterior is close to independent
        and identically scaled, where the plain criterion misses U-turns at some step
        sizes). ``False``: BlackJAX's kernel as it is.

    Returns
    -------
    kernel
        ``kernel(rng_key, state, logdensity_fn, step_size, num_integration_steps=None,
        max_num_doublings=10) -> (state, info)``. ``step_size`` is the leapfrog step in
        whitened coordinates; HMC runs ``num_integration_steps`` leapfrog steps (default
        ``ceil(TRAJECTORY_LENGTH / step_size)``), NUTS at most ``2^max_num_doublings``.
    """
    validation.check_choice("algorithm", algorithm, ALGORITHMS)
    blackjax = require_blackjax()
    fuse = integrator is None  # BlackJAX's velocity Verlet: fused for a low-rank R
    integrator = integrator or blackjax.mcmc.integrators.velocity_verlet

    def inner_kernel(integrator):
        if algorithm == "nuts":  # BlackJAX's NUTS with the U-turn checks across subtrees
            return robust_nuts.build_kernel(integrator, divergence_threshold, robust_uturn)
        return blackjax.hmc.build_kernel(integrator, divergence_threshold)

    inner, fused = inner_kernel(integrator), inner_kernel(_fused_velocity_verlet)

    def run_inner(kernel, rng_key, start, logdensity, step, metric, num_integration_steps,
                  max_num_doublings):  # fmt: skip
        if algorithm == "nuts":
            return kernel(rng_key, start, logdensity, step, metric, max_num_doublings)
        steps = num_integration_steps
        if steps is None:
            steps = jnp.maximum(jnp.ceil(TRAJECTORY_LENGTH / step), 1).astype(jnp.int32)
        return kernel(rng_key, start, logdensity, step, metric, steps)

    def kernel(
        rng_key,
        state: FisherHMCState,
        logdensity_fn: Callable,
        step_size,
        num_integration_steps=None,
        max_num_doublings: int = 10,
    ) -> tuple[FisherHMCState, FisherHMCInfo]:
        x, unravel = ravel_pytree(state.position)
        r = state.sqrt_precond
        _check_shape(r, x.shape[0])
        step = jnp.asarray(step_size, x.dtype)
        options = (num_integration_steps, max_num_doublings)
        if fuse and isinstance(r, LowRankSqrt):
            target = _low_rank_target(logdensity_fn, unravel, r)
            # momenta and whitened gradients unexpanded through the trajectory (one
            # reduction over Q to start, one expansion for the state's R^T g at the end)
            metric = _unexpanded_metric(target, x)
            whitened = _unexpanded(target, state.whitened_grad)
            start = blackjax.mcmc.hmc.HMCState(x, state.logdensity, whitened)
            end, info = run_inner(fused, rng_key, start, target, step, metric, *options)
            y = end.position
            moved = jnp.any(y != x)
            end = end._replace(logdensity_grad=_expanded(target, end.logdensity_grad))
        else:

            def whitened_logdensity(u):
                return logdensity_fn(unravel(x + apply_sqrt(r, u)))  # gradient g @ R by autodiff

            start = blackjax.mcmc.hmc.HMCState(
                jnp.zeros_like(x), state.logdensity, state.whitened_grad
            )
            identity = jnp.ones_like(x)  # the unit metric in whitened coordinates
            end, info = run_inner(inner, rng_key, start, whitened_logdensity, step, identity,
                                  *options)  # fmt: skip
            y = x + apply_sqrt(r, end.position)
            moved = jnp.any(end.position != 0)
        finite = is_finite(end.logdensity, end.logdensity_grad, y)
        moved = moved & finite
        new_state = accept(
            finite,
            state,
            position=unravel(y),
            logdensity=end.logdensity,
            whitened_grad=end.logdensity_grad,
        )
        out = FisherHMCInfo(
            acceptance_rate=jnp.asarray(info.acceptance_rate, x.dtype),
            is_accepted=moved,
            proposal_is_finite=finite,
            is_divergent=jnp.asarray(info.is_divergent),
            num_integration_steps=jnp.asarray(info.num_integration_steps, jnp.int32),
            energy=jnp.asarray(info.energy, x.dtype),
            tree_depth=jnp.asarray(getattr(info, "num_trajectory_expansions", 0), jnp.int32),
        )
        return new_state, out

    return kernel


def as_top_level_api(
    logdensity_fn: Callable,
    step_size,
    sqrt_precond: Array,
    algorithm: str = "nuts",
    num_integration_steps: int | None = None,
    max_num_doublings: int = 10,
    divergence_threshold: float = 1000.0,
    integrator: Callable | None = None,
    robust_uturn: bool = True,
) -> SamplingAlgorithm:
    """NUTS or HMC with inverse mass matrix ``A = R R^T``, run in whitened coordinates.

    Parameters
    ----------
    logdensity_fn
        ``position -> log pi(position)``.
    step_size
        Leapfrog step in whitened coordinates (the same number as BlackJAX's step with
        ``inverse_mass_matrix = R R^T``).
    sqrt_precond
        ``R``, ``(d, d)``, or a :class:`DiagonalSqrt`: e.g. ``parameters.sqrt_precond`` of
        a Fisher warm-up.
    algorithm
        ``"nuts"`` or ``"hmc"``.
    num_integration_steps
        HMC only; default ``ceil(TRAJECTORY_LENGTH / step_size)``.
    max_num_doublings, divergence_threshold, integrator
        As in ``blackjax.nuts``.
    robust_uturn
        NUTS: the U-turn checks across subtrees (:func:`build_kernel`).

    Returns
    -------
    SamplingAlgorithm
        ``init(position, rng_key=None)`` and a jit-compiled ``step(rng_key, state)``.
    """
    validation.check_positive("step_size", step_size, "It is the leapfrog step size.")
    if not isinstance(sqrt_precond, DiagonalSqrt | LowRankSqrt):
        sqrt_precond = jnp.asarray(sqrt_precond)
    _check_shape(sqrt_precond, None)
    if num_integration_steps is not None and int(num_integration_steps) < 1:
        raise ValueError(f"`num_integration_steps` must be >= 1, got {num_integration_steps}.")
    if int(max_num_doublings) < 1:
        raise ValueError(f"`max_num_doublings` must be >= 1, got {max_num_doublings}.")
    kernel = build_kernel(algorithm, integrator, divergence_threshold, robust_uturn)

    def step_fn(rng_key, state):
        return kernel(
            rng_key, state, logdensity_fn, step_size, num_integration_steps, max_num_doublings
        )

    return sampling_algorithm(lambda position: init(position, logdensity_fn, sqrt_precond), step_fn)


def _nuts_top_level(logdensity_fn, step_size, sqrt_precond, **options) -> SamplingAlgorithm:
    """Fisher NUTS: ``as_top_level_api(..., algorithm="nuts")``."""
    return as_top_level_api(logdensity_fn, step_size, sqrt_precond, "nuts", **options)


def _hmc_top_level(logdensity_fn, step_size, sqrt_precond, **options) -> SamplingAlgorithm:
    """Fisher HMC: ``as_top_level_api(..., algorithm="hmc")``."""
    return as_top_level_api(logdensity_fn, step_size, sqrt_precond, "hmc", **options)


fisher_nuts = SamplingAPI(_nuts_top_level, init, lambda **kw: build_kernel("nuts", **kw))
fisher_hmc = SamplingAPI(_hmc_top_level, init, lambda **kw: build_kernel("hmc", **kw))
