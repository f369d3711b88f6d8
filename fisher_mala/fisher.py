"""Fisher adaptive MALA (Titsias, 2023): Algorithm 1's loop as a composed step.

FisherMALA is the preconditioned MALA kernel (:mod:`fisher_mala.mala`) composed with two
adaptations (:mod:`fisher_mala.adaptations`): the Fisher square-root recursion and the
step-size rule. :func:`adaptive_step` composes them; :func:`build_kernel` is the frozen
kernel of the sampling phase (``R`` and ``sigma^2`` from the state).

One adaptive step is one iteration of Algorithm 1's loop:

1. propose ``y = x + R w``, ``w = (s/2) u_x + sqrt(s) eta`` with the normalized step
   ``s = sigma^2 / (tr(R R^T) / d)`` of Eq. (7), ``u_x = R^T g_x`` cached in the state;
2. evaluate ``log pi(y)`` and ``g_y`` once;
3. ``u_y = R^T g_y`` (computed as ``g_y @ R``, the fast orientation on XLA:CPU);
4. accept with Proposition 1's ``h`` terms (dot products of ``w``, ``u_x``, ``u_y``);
5. the adaptation signal in whitened form ``phi = R^T s_n``, free from ``u_x`` and
   ``u_y`` (:func:`fisher_mala.adaptations.fisher.whitened_signal`: Eq. (16), Eq. (15), the
   score of Eq. (11), Appendix C's centred score);
6. the square-root update of :func:`fisher_mala.adaptations.fisher.fisher_preconditioner`
   (Prop. 4, or Appendix B with ``learning_rate``, or Appendix C for ``"centered"``);
7. ``sigma^2 <- sigma^2 [1 + rho (alpha - alpha*)]``;
8. ``tr(R R^T)``, the cached ``u = R^T g`` of the new state and (centred signal) the cached
   ``R^T sbar`` corrected in O(d).

Passes over the ``d x d`` matrix per step:

* sampling phase (``adapt=False``): **2** (``R w`` and ``g_y^T R``);
* adaptive phase: **3 matrix-vector passes + 1 rank-one read-modify-write**
  (``R w``, ``g_y^T R``, ``R phi``, ``R - gamma (R phi) phi^T``); one more read with an
  Appendix B ``learning_rate``, whose trace must be recomputed (see
  :mod:`fisher_mala.sqrt_precond`).

No ``O(d^3)`` operation, and no inverse, is ever formed. The initial square root is
``R_0 = I / sqrt(lambda)`` (``A_0^{-1} = lambda I``, the damping of Eq. (8)): the first
update then is exactly Eq. (12), and the proposal equals Algorithm 1's ``R = I`` one
because Eq. (7) is invariant to the scale of ``A``.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from fisher_mala import mala, validation
from fisher_mala.adaptations.base import Adaptation
from fisher_mala.adaptations.fisher import (
    DAMPING,
    SIGNALS,
    FisherPreconditionerState,
    carry_whitened,
    fisher_preconditioner,
    refresh_trace,
    whitened_signal,
)
from fisher_mala.adaptations.step_size import (
    MALA_TARGET_ACCEPTANCE,
    STEP_SIZE_LEARNING_RATE,
    RobbinsMonroState,
    robbins_monro,
)
from fisher_mala.base import ArrayTree, SamplingAlgorithm, SamplingAPI
from fisher_mala.mala import MALAInfo, kernel_view, take_move
from fisher_mala.pytree import ravel

__all__ = [
    "SIGNALS",
    "DAMPING",
    "FisherMALAState",
    "FisherMALAInfo",
    "init",
    "state_from",
    "build_kernel",
    "adaptive_step",
    "refresh_trace",
    "as_top_level_api",
    "fisher_mala",
]


class FisherMALAState(NamedTuple):
    """State of FisherMALA; a pytree of arrays (save it with ``numpy.savez``).

    Attributes
    ----------
    position
        The current position (any pytree of arrays).
    logdensity
        ``log pi(position)``.
    logdensity_grad
        Its gradient, in the position's structure.
    sqrt_precond
        ``R``, ``(d, d)``, with ``A = R R^T`` the (un-normalized) inverse Fisher estimate.
    step_size
        ``sigma^2``, un-normalized as in Algorithm 1; the proposal uses
        ``sigma^2 / (tr(A) / d)``.
    trace_precond
        ``tr(R R^T)``, summed from ``R`` at each update.
    whitened_grad
        ``R^T grad`` at the position (flat), carried so that no extra pass is needed.
    whitened_mean_score
        ``R^T sbar`` for the centred signal of Appendix C (zeros otherwise).
    count
        Number of adaptation updates made so far (``n`` of Prop. 4).
    """

    position: ArrayTree
    logdensity: Array
    logdensity_grad: ArrayTree
    sqrt_precond: Array
    step_size: Array
    trace_precond: Array
    whitened_grad: Array
    whitened_mean_score: Array
    count: Array


#: FisherMALA reports the preconditioned MALA kernel's info.
FisherMALAInfo = MALAInfo


def init(
    position: ArrayTree,
    logdensity_fn: Callable,
    step_size,
    damping=DAMPING,
    sqrt_precond: Array | None = None,
) -> FisherMALAState:
    """Create the initial :class:`FisherMALAState`.

    Parameters
    ----------
    position
        Initial position (array or pytree of floating-point arrays, finite).
    logdensity_fn
        ``position -> log pi(position)``.
    step_size
        Initial ``sigma^2`` (e.g. from a MALA warm-up, as in Algorithm 1).
    damping
        ``lambda > 0`` of Eq. (8) (the damping); sets ``R_0 = I / sqrt(lambda)``.
    sqrt_precond
        Optional initial ``R_0`` (e.g. a frozen preconditioner from an earlier run);
        the recursion then treats ``(R_0 R_0^T)^{-1}`` as its prior precision.
    """
    validation.check_position(position)
    validation.check_positive("step_size", step_size, "It is sigma^2 of Algorithm 1.")
    validation.check_positive("damping", damping, "Algorithm 1 uses lambda = 10.")
    validation.check_logdensity(logdensity_fn, position)
    logdensity, grad = jax.value_and_grad(logdensity_fn)(position)
    return state_from(position, logdensity, grad, step_size, damping, sqrt_precond)


def state_from(
    position: ArrayTree,
    logdensity: Array,
    logdensity_grad: ArrayTree,
    step_size,
    damping=DAMPING,
    sqrt_precond: Array | None = None,
) -> FisherMALAState:
    """Build a :class:`FisherMALAState` from an already evaluated position (no evaluation).

    Used by the warm-up to hand a MALA state over to FisherMALA without recomputing the
    log density and its gradient. No validation is done here.
    """
    flat = ravel(position)
    dim, dtype = flat.shape[0], flat.dtype
    adaptation = fisher_preconditioner(damping).init(dim, dtype, sqrt_precond)
    return FisherMALAState(
        position=position,
        logdensity=logdensity,
        logdensity_grad=logdensity_grad,
        sqrt_precond=adaptation.sqrt_precond,
        step_size=jnp.asarray(step_size, dtype),
        trace_precond=adaptation.trace_precond,
        whitened_grad=ravel(logdensity_grad) @ adaptation.sqrt_precond,
        whitened_mean_score=adaptation.whitened_mean_score,
        count=adaptation.count,
    )


def build_kernel() -> Callable:
    """The frozen FisherMALA kernel: preconditioned MALA with the state's ``R`` and
    ``sigma^2`` (the sampling phase; two passes over ``R`` per step).

    Returns
    -------
    kernel
        ``kernel(rng_key, state, logdensity_fn) -> (state, info)`` for a
        :class:`FisherMALAState`; ``info`` is a :class:`~fisher_mala.mala.MALAInfo`.
    """
    mala_kernel = mala.build_kernel()

    def kernel(rng_key, state: FisherMALAState, logdensity_fn: Callable):
        after, info = mala_kernel(rng_key, kernel_view(state), logdensity_fn, state.step_size)
        return take_move(state, after), info

    return kernel


def adaptive_step(
    preconditioner: Adaptation,
    step_size_rule: Adaptation,
    signal: str = "rao_blackwell",
) -> Callable:
    """Algorithm 1's loop: the preconditioned MALA kernel, then the two adaptations.

    Parameters
    ----------
    preconditioner
        :func:`~fisher_mala.adaptations.fisher.fisher_preconditioner` (its ``centered``
        must match ``signal``).
    step_size_rule
        :func:`~fisher_mala.adaptations.step_size.robbins_monro`.
    signal
        One of :data:`SIGNALS`: which whitened signal the preconditioner learns from.

    Returns
    -------
    step
        ``step(rng_key, state, logdensity_fn) -> (state, info)`` on a
        :class:`FisherMALAState`: 3 matrix-vector passes over ``R`` and one rank-one
        read-modify-write (module docstring).
    """
    validation.check_choice("signal", signal, SIGNALS)
    mala_kernel = mala.build_kernel()

    def step(rng_key, state: FisherMALAState, logdensity_fn: Callable):
        # 1. preconditioned MALA with the R of the state (u_x = R^T g_x cached with it)
        moved, info = mala_kernel(rng_key, kernel_view(state), logdensity_fn, state.step_size)
        # 2. the Fisher adaptation, fed the whitened signal (no pass over R)
        phi = whitened_signal(
            signal,
            info.whitened_grad,
            info.proposal_whitened_grad,
            info.acceptance_rate,
            info.is_accepted,
            info.proposal_is_finite,
        )
        precond = FisherPreconditionerState(
            state.sqrt_precond, state.trace_precond, state.whitened_mean_score, state.count
        )
        precond, update = preconditioner.update(precond, phi)  # passes 3 and 4
        # 3. the step-size rule of Algorithm 1
        step_size = step_size_rule.update(RobbinsMonroState(state.step_size), info.acceptance_rate)
        new_state = FisherMALAState(
            position=moved.position,
            logdensity=moved.logdensity,
            logdensity_grad=moved.logdensity_grad,
            sqrt_precond=precond.sqrt_precond,
            step_size=step_size_rule.final(step_size),
            trace_precond=precond.trace_precond,
            whitened_grad=carry_whitened(update, moved.whitened_grad),
            whitened_mean_score=precond.whitened_mean_score,
            count=precond.count,
        )
        return new_state, info

    return step


#: A learning-rate schedule of the top-level kernel, whose run length is not known when
#: it is built, is checked at every update up to this one before compiling.
SCHEDULE_CHECKED_UPDATES = 100_000


def _check_learning_rate(learning_rate, num_updates: int = SCHEDULE_CHECKED_UPDATES) -> None:
    """Values of an Appendix B rate at every update ``n = 2..num_updates`` (its combination
    with the centred signal is refused by
    :func:`fisher_mala.adaptations.fisher.fisher_preconditioner`)."""
    if learning_rate is None:
        return
    if callable(learning_rate):
        validation.check_schedule("learning_rate", learning_rate, 2, num_updates)
        return
    value = validation._scalar("learning_rate", learning_rate)
    if value is not None and not (0.0 < value < 1.0):
        raise ValueError(
            f"`learning_rate` gives gamma_n = {value}; Appendix B needs every "
            "gamma_n in (0, 1) (None means gamma_n = 1/n)."
        )


def as_top_level_api(
    logdensity_fn: Callable,
    step_size,
    damping=DAMPING,
    target_acceptance_rate=MALA_TARGET_ACCEPTANCE,
    step_size_learning_rate=STEP_SIZE_LEARNING_RATE,
    signal: str = "rao_blackwell",
    learning_rate: Callable | float | None = None,
    adapt: bool = True,
) -> SamplingAlgorithm:
    """Fisher adaptive MALA.

    Parameters
    ----------
    logdensity_fn
        ``position -> log pi(position)`` written with ``jax.numpy``; differentiated by
        autodiff.
    step_size
        Initial ``sigma^2`` (un-normalized; Algorithm 1 takes it from a MALA warm-up).
    damping
        ``lambda`` of Eq. (8) (the damping), default 10.
    target_acceptance_rate
        ``alpha*``, default 0.574.
    step_size_learning_rate
        ``rho`` of the step-size rule, default 0.015; must be in ``[0, 1/alpha*)``.
    signal
        The adaptation signal: ``"rao_blackwell"`` (Eq. (16), default), ``"increment"``
        (Eq. (15)), ``"score"`` (non-centred) or ``"centered"`` (Appendix C).
    learning_rate
        ``None`` for Prop. 4 (``gamma_n = 1/n``) or a float / schedule for Appendix B.
    adapt
        ``True``: adapt ``R`` and ``sigma^2`` at every step (burn-in). ``False``: keep
        them frozen (sampling); the state type is the same.

    Returns
    -------
    SamplingAlgorithm
        ``init(position, rng_key=None, sqrt_precond=None)`` and a jit-compiled
        ``step(rng_key, state) -> (state, info)``.

    Examples
    --------
    >>> import jax, jax.numpy as jnp, fisher_mala as fm
    >>> alg = fm.fisher_mala(lambda x: -0.5 * jnp.sum(x**2), step_size=0.5)
    >>> state = alg.init(jnp.zeros(3))
    >>> state, info = alg.step(jax.random.key(0), state)
    """
    validation.check_positive("step_size", step_size, "It is sigma^2 of Algorithm 1.")
    validation.check_positive("damping", damping, "Algorithm 1 uses lambda = 10.")
    validation.check_probability("target_acceptance_rate", target_acceptance_rate)
    validation.check_nonnegative(
        "step_size_learning_rate",
        step_size_learning_rate,
        upper=1.0 / float(target_acceptance_rate),
        hint="Algorithm 1 uses 0.015.",
    )
    validation.check_choice("signal", signal, SIGNALS)
    _check_learning_rate(learning_rate)
    if not callable(logdensity_fn):
        raise TypeError(f"`logdensity_fn` must be callable, got {logdensity_fn!r}.")
    if adapt:
        kernel = adaptive_step(
            fisher_preconditioner(damping, learning_rate, centered=signal == "centered"),
            robbins_monro(target_acceptance_rate, step_size_learning_rate),
            signal,
        )
    else:
        kernel = build_kernel()

    def init_fn(position, rng_key=None, sqrt_precond=None):
        del rng_key  # deterministic; accepted for BlackJAX's run_inference_algorithm
        return init(position, logdensity_fn, step_size, damping, sqrt_precond)

    @jax.jit
    def step_fn(rng_key, state):
        return kernel(rng_key, state, logdensity_fn)

    return SamplingAlgorithm(init_fn, step_fn)


fisher_mala = SamplingAPI(as_top_level_api, init, build_kernel)
