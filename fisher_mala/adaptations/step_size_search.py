"""The initial step-size search: double or halve until the acceptance crosses the target.

The paper's rule ``sigma^2 <- sigma^2 [1 + 0.015 (alpha - 0.574)]`` changes ``sigma^2`` by
at most 1% per iteration, so a poor initial guess wastes the MALA phase (a hundredfold
reduction needs about 800 iterations of rejections). Like Stan's and BlackJAX's
``find_reasonable_step_size``, the search doubles or halves the step from the user's
guess until the *average* M-H acceptance probability of a few proposals from the initial
position crosses the target, and returns the last step on the accepting side.

The search is an adaptation like the others (:func:`step_size_search`): its state is the
step being tried; :func:`bracket_step_size` runs it in a ``lax.while_loop`` for any
``mean_acceptance(step)`` (MALA's proposals in :func:`find_reasonable_step_size`,
mMALA's in its warm-up).
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.flatten_util import ravel_pytree

from fisher_mala.adaptations.base import Adaptation
from fisher_mala.adaptations.step_size import MALA_TARGET_ACCEPTANCE
from fisher_mala.base import ArrayTree
from fisher_mala.proposals import langevin_transition
from fisher_mala.pytree import flat_logdensity_and_grad

__all__ = [
    "StepSizeSearch",
    "StepSizeSearchState",
    "step_size_search",
    "trial_step_size",
    "search_continues",
    "bracket_step_size",
    "find_reasonable_step_size",
]

#: At most this many doublings or halvings: a factor ``2^60`` either way.
MAX_DOUBLINGS = 60


class StepSizeSearch(NamedTuple):
    """Outcome of :func:`find_reasonable_step_size`."""

    step_size: Array
    num_grad_evals: Array


class StepSizeSearchState(NamedTuple):
    """State of :func:`step_size_search`.

    Attributes
    ----------
    step_size
        The step tried last.
    direction
        2 (going up, the first step accepted) or 1/2 (going down).
    accepting
        Whether the mean acceptance at ``step_size`` reached the target.
    count
        Doublings or halvings made.
    """

    step_size: Array
    direction: Array
    accepting: Array
    count: Array


def step_size_search(target_acceptance_rate=MALA_TARGET_ACCEPTANCE) -> Adaptation:
    """The bracketing search as an adaptation.

    Returns
    -------
    Adaptation
        ``init(step_size, mean_acceptance) -> state`` from the guess and the mean
        acceptance there; ``update(state, mean_acceptance) -> state`` with the mean
        acceptance at :func:`trial_step_size` ``(state)``; ``final(state) -> step``, the
        last step on the accepting side (going down without ever accepting, the smallest
        step tried). Stop updating when :func:`search_continues` is false.
    """

    def init(step_size, mean_acceptance) -> StepSizeSearchState:
        step_size = jnp.asarray(step_size)
        direction = jnp.where(mean_acceptance >= target_acceptance_rate, 2.0, 0.5)
        direction = direction.astype(step_size.dtype)
        return StepSizeSearchState(step_size, direction, direction > 1, jnp.zeros((), jnp.int32))

    def update(state: StepSizeSearchState, mean_acceptance) -> StepSizeSearchState:
        return StepSizeSearchState(
            trial_step_size(state),
            state.direction,
            mean_acceptance >= target_acceptance_rate,
            state.count + 1,
        )

    def final(state: StepSizeSearchState) -> Array:
        keep = state.accepting | (state.direction < 1)
        return jnp.where(keep, state.step_size, state.step_size / state.direction)

    return Adaptation(init, update, final)


def trial_step_size(state: StepSizeSearchState) -> Array:
    """The next step to try: the last one doubled or halved."""
    return (state.step_size * state.direction).astype(state.step_size.dtype)


def search_continues(state: StepSizeSearchState, max_doublings: int = MAX_DOUBLINGS) -> Array:
    """Go up while accepting, down while not, at most ``max_doublings`` times."""
    still = jnp.where(state.direction > 1, state.accepting, ~state.accepting)
    return still & (state.count < max_doublings)


def bracket_step_size(mean_acceptance: Callable, step, target, max_doublings: int = MAX_DOUBLINGS):
    """Double or halve ``step`` until ``mean_acceptance(step)`` crosses ``target``.

    Returns the last step on the accepting side (going down without ever accepting, the
    smallest step tried) and the number of doublings or halvings made.
    """
    search = step_size_search(target)
    # The guess is evaluated in the loop too (a first pass, count -1, direction 1 so that
    # the trial step is the guess, then the search's own start): the compiled program then
    # holds one copy of ``mean_acceptance`` (the proposals and the log density's gradient)
    # instead of two.
    step = jnp.asarray(step)

    def body(state):
        rate = mean_acceptance(trial_step_size(state))
        started = search.init(state.step_size, rate).direction
        direction = jnp.where(state.count < 0, started, state.direction)
        return search.update(state, rate)._replace(direction=direction)

    before = StepSizeSearchState(
        step, jnp.ones((), step.dtype), jnp.zeros((), bool), -jnp.ones((), jnp.int32)
    )
    state = jax.lax.while_loop(
        lambda s: (s.count < 0) | search_continues(s, max_doublings), body, before
    )
    return search.final(state), state.count


def find_reasonable_step_size(
    rng_key,
    logdensity_fn: Callable,
    position: ArrayTree,
    initial_step_size=1.0,
    target_acceptance_rate=MALA_TARGET_ACCEPTANCE,
    num_proposals: int = 8,
    max_doublings: int = MAX_DOUBLINGS,
    logdensity_and_grad=None,
) -> StepSizeSearch:
    """Double or halve ``sigma^2`` until MALA's mean acceptance crosses the target.

    Parameters
    ----------
    rng_key
        Key for the proposals (the same noise is reused for every trial step, so the
        mean acceptance is a smooth function of the step).
    logdensity_fn
        ``position -> log pi(position)``.
    position
        Where the proposals start (the chain's initial position).
    initial_step_size
        The user's guess; the search starts there.
    target_acceptance_rate
        The acceptance rate to bracket.
    num_proposals
        Proposals averaged per trial step.
    max_doublings
        At most this many doublings or halvings.
    logdensity_and_grad
        ``(log pi(position), its gradient)`` (the gradient a pytree like ``position``),
        where the caller has them already (a chain's initial state): the gradient is then
        not evaluated (nor compiled) again.

    Returns
    -------
    StepSizeSearch
        The step and the number of gradient evaluations spent (the one at ``position``
        included unless ``logdensity_and_grad`` gave it).
    """
    flat, unravel = ravel_pytree(position)
    dtype = flat.dtype
    value_and_grad = flat_logdensity_and_grad(logdensity_fn, unravel)
    if logdensity_and_grad is None:
        logdensity, grad = value_and_grad(flat)
    else:
        logdensity, grad = logdensity_and_grad[0], ravel_pytree(logdensity_and_grad[1])[0]
    keys = jax.random.split(rng_key, num_proposals)
    identity = lambda v: v  # noqa: E731

    def mean_acceptance(step):
        def one(key):
            return langevin_transition(
                key, flat, logdensity, grad, step, value_and_grad, identity, identity
            ).acceptance_rate

        # one proposal after another, not vmapped: a batched gradient, compiled for a
        # handful of trials, costs more to compile than the one the warm-up's steps use
        return jnp.mean(jax.lax.map(one, keys))

    step, count = bracket_step_size(
        mean_acceptance,
        jnp.asarray(initial_step_size, dtype),
        target_acceptance_rate,
        max_doublings,
    )
    evaluated_here = 1 if logdensity_and_grad is None else 0  # the gradient at `position`
    return StepSizeSearch(step, (count + 1) * num_proposals + evaluated_here)
