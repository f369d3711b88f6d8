"""Fisher adaptive MALA (Titsias, 2023): Algorithm 1's loop as a BlackJAX-style kernel.

One step (``adapt=True``) is one iteration of Algorithm 1's loop:

1. propose ``y = x + R w``, ``w = (s/2) u_x + sqrt(s) eta`` with the normalized step
   ``s = sigma^2 / (tr(R R^T) / d)`` of Eq. (7), ``u_x = R^T g_x`` cached in the state;
2. evaluate ``log pi(y)`` and ``g_y`` once;
3. ``u_y = R^T g_y`` (computed as ``g_y @ R``, the fast orientation on XLA:CPU);
4. accept with Proposition 1's ``h`` terms (dot products of ``w``, ``u_x``, ``u_y``);
5. the adaptation signal in whitened form ``phi = R^T s_n``, free from ``u_x`` and
   ``u_y`` (:func:`fisher_mala.preconditioner.whitened_signal`: Eq. (16), Eq. (15), the
   score of Eq. (11), Appendix C's centred score);
6. the square-root update of :func:`fisher_mala.preconditioner.fisher_preconditioner`
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
from jax.flatten_util import ravel_pytree

from fisher_mala import validation
from fisher_mala.base import ArrayTree, SamplingAlgorithm, SamplingAPI, accept
from fisher_mala.preconditioner import (
    DAMPING,
    SIGNALS,
    FisherPreconditionerState,
    carry_whitened,
    fisher_preconditioner,
    refresh_trace,
    whitened_signal,
)
from fisher_mala.proposals import langevin_transition, normalized_step_size
from fisher_mala.pytree import flat_logdensity_and_grad, ravel
from fisher_mala.step_size import LEARNING_RATE, MALA_TARGET_ACCEPTANCE, adapt_step_size

__all__ = [
    "SIGNALS",
    "DAMPING",
    "FisherMALAState",
    "FisherMALAInfo",
    "init",
    "state_from",
    "build_kernel",
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


class FisherMALAInfo(NamedTuple):
    """Diagnostics of one FisherMALA transition.

    Attributes
    ----------
    acceptance_rate
        The M-H probability ``alpha(x_n, y_n)``.
    is_accepted
        Whether the proposal was accepted.
    proposal_is_finite
        False when the proposal's log density or gradient was NaN or inf (rejected).
    normalized_step_size
        ``sigma_R^2 = sigma^2 / (tr(A) / d)`` used by this proposal.
    """

    acceptance_rate: Array
    is_accepted: Array
    proposal_is_finite: Array
    normalized_step_size: Array


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


def build_kernel(
    signal: str = "rao_blackwell",
    learning_rate: Callable | float | None = None,
    adapt: bool = True,
    damping=DAMPING,
) -> Callable:
    """Build the FisherMALA kernel.

    Parameters
    ----------
    signal
        One of :data:`SIGNALS`.
    learning_rate
        ``None`` for ``gamma_n = 1/n`` (Proposition 4); a float in (0, 1) or a schedule
        ``n -> gamma_n`` (an optax schedule works) for Appendix B. ``n`` is the 1-based
        index of the update; the first update is always Eq. (12).
    adapt
        ``False`` freezes ``R`` and ``sigma^2`` (the sampling phase).
    damping
        ``lambda`` of Eq. (8), the same as the state's (:func:`init`): with an Appendix B
        ``learning_rate`` the kernel keeps the damping at ``lambda / n``
        (:func:`fisher_mala.preconditioner.fisher_preconditioner`); otherwise it enters
        only through the initial ``R_0 = I / sqrt(lambda)``.

    Returns
    -------
    kernel
        ``kernel(rng_key, state, logdensity_fn, target_acceptance_rate=0.574,
        step_size_learning_rate=0.015) -> (state, info)``.
    """
    validation.check_choice("signal", signal, SIGNALS)
    adaptation = fisher_preconditioner(damping, learning_rate, centered=signal == "centered")

    def kernel(
        rng_key,
        state: FisherMALAState,
        logdensity_fn: Callable,
        target_acceptance_rate=MALA_TARGET_ACCEPTANCE,
        step_size_learning_rate=LEARNING_RATE,
    ) -> tuple[FisherMALAState, FisherMALAInfo]:
        # 1. preconditioned MALA with the R of the state (u_x = R^T g_x cached with it)
        position, unravel = ravel_pytree(state.position)
        sqrt_precond = state.sqrt_precond
        step = normalized_step_size(state.step_size, state.trace_precond, position.shape[0])
        proposal = langevin_transition(
            rng_key,
            position,
            state.logdensity,
            state.whitened_grad,
            step,
            flat_logdensity_and_grad(logdensity_fn, unravel),
            lambda w: sqrt_precond @ w,  # pass 1
            lambda g: g @ sqrt_precond,  # pass 2
        )
        accepted = proposal.is_accepted
        info = FisherMALAInfo(proposal.acceptance_rate, accepted, proposal.is_finite, step)
        moved = accept(
            accepted,
            state,
            position=unravel(proposal.position),
            logdensity=proposal.logdensity,
            logdensity_grad=unravel(proposal.logdensity_grad),
            whitened_grad=proposal.whitened_grad,
        )
        if not adapt:
            return moved, info

        # 2. the Fisher adaptation, fed the whitened signal (no pass over R)
        phi = whitened_signal(
            signal,
            state.whitened_grad,
            proposal.whitened_grad,
            proposal.acceptance_rate,
            accepted,
            proposal.is_finite,
        )
        precond = FisherPreconditionerState(
            sqrt_precond, state.trace_precond, state.whitened_mean_score, state.count
        )
        precond, update = adaptation.update(precond, phi)  # passes 3 and 4
        # 3. the step-size rule of Algorithm 1
        new_step = adapt_step_size(
            state.step_size,
            proposal.acceptance_rate,
            target_acceptance_rate,
            step_size_learning_rate,
        )
        new_state = moved._replace(
            sqrt_precond=precond.sqrt_precond,
            trace_precond=precond.trace_precond,
            whitened_grad=carry_whitened(update, moved.whitened_grad),
            whitened_mean_score=precond.whitened_mean_score,
            step_size=new_step,
            count=precond.count,
        )
        return new_state, info

    return kernel


def _check_learning_rate(learning_rate) -> None:
    """Values of an Appendix B rate (its combination with the centred signal is refused by
    :func:`fisher_mala.preconditioner.fisher_preconditioner`)."""
    if learning_rate is None:
        return
    probes = (2, 3, 10, 1000)
    if callable(learning_rate):
        try:
            values = [float(learning_rate(jnp.asarray(n))) for n in probes]
        except Exception as err:
            raise ValueError(
                "`learning_rate` must be None, a float in (0, 1) or a schedule "
                f"n -> gamma_n (e.g. an optax schedule); calling it failed: {err}"
            ) from err
    else:
        values = [validation._scalar("learning_rate", learning_rate)]
    for n, value in zip(probes, values, strict=False):
        if value is not None and not (0.0 < value < 1.0):
            raise ValueError(
                f"`learning_rate` gives gamma_{n} = {value}; Appendix B needs every "
                "gamma_n in (0, 1) (None means gamma_n = 1/n)."
            )


def as_top_level_api(
    logdensity_fn: Callable,
    step_size,
    damping=DAMPING,
    target_acceptance_rate=MALA_TARGET_ACCEPTANCE,
    step_size_learning_rate=LEARNING_RATE,
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
    kernel = build_kernel(signal, learning_rate, adapt, damping)

    def init_fn(position, rng_key=None, sqrt_precond=None):
        del rng_key  # deterministic; accepted for BlackJAX's run_inference_algorithm
        return init(position, logdensity_fn, step_size, damping, sqrt_precond)

    @jax.jit
    def step_fn(rng_key, state):
        return kernel(
            rng_key, state, logdensity_fn, target_acceptance_rate, step_size_learning_rate
        )

    return SamplingAlgorithm(init_fn, step_fn)


fisher_mala = SamplingAPI(as_top_level_api, init, build_kernel)
