"""NUTS with the U-turn checks across subtrees (layer 3).

NUTS stops a trajectory when it turns back on itself, checking the criterion on every
subtree the doublings build and on the whole trajectory. On a posterior that is close to
independent and identically scaled, which is what whitening by a good ``R`` produces, that
check misses U-turns at some step sizes: when two halves of a trajectory straddle the
point where it should stop, neither half turns and the whole does not either, and the
tree grows to its depth limit ("resonances", Betancourt, stan-dev/stan#2799). Stan since
2.21, PyMC, AdvancedHMC, DynamicHMC and Bean Machine add two checks at every merge of a
left subtree ``A`` and a right subtree ``B``: ``A`` with the first state of ``B``, and the
last state of ``A`` with ``B``. BlackJAX's iterative NUTS (1.x) does not; this module is
its kernel with them, in both places its criterion is checked:

* inside the subtree of one doubling (:func:`robust_iterative_uturn`): the checkpoints of
  NumPyro's iterative scheme (Phan et al.) give each finished subtree's first state and
  momentum sum; each checkpoint also keeps the momentum of the state just before it, the
  last state of the left half whose right half starts there;
* where a doubling's subtree joins the trajectory (:func:`robust_expansion`), from the
  two trajectories' end states and momentum sums.

The rest is BlackJAX's: its integrators, multinomial sampling of the proposal, divergence
rule and :class:`blackjax.mcmc.nuts.NUTSInfo`.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fisher_mala.optional import require_blackjax

__all__ = [
    "RobustUTurnState",
    "robust_iterative_uturn",
    "robust_expansion",
    "build_kernel",
]


class RobustUTurnState(NamedTuple):
    """Checkpoints of the subtree being built (NumPyro's iterative scheme, plus one row).

    Attributes
    ----------
    momentum, momentum_sum
        ``(max_doublings + 1, d)`` (each leaf of a pytree momentum with that leading
        axis): the momentum of each checkpoint's state and the
        subtree's momentum sum up to it (included); the last row is a spare that the steps
        which store no checkpoint write to (never read).
    previous_momentum
        ``(max_doublings + 1, d)``: the momentum of the state just before each checkpoint.
    last_momentum
        ``(d,)``: the momentum of the latest state (the next checkpoint's previous one).
    idx_min, idx_max
        The checkpoints whose subtrees end at the latest state.
    """

    momentum: jax.Array
    momentum_sum: jax.Array
    previous_momentum: jax.Array
    last_momentum: jax.Array
    idx_min: jax.Array
    idx_max: jax.Array


def _checkpoint_range(n):
    """``(idx_min, idx_max)``: the checkpoints of the subtrees that end at leaf ``n``
    (NumPyro's ``_leaf_idx_to_ckpt_idxs``)."""
    idx_max = jnp.bitwise_count(n >> 1).astype(jnp.int32)
    num_subtrees = jnp.bitwise_count((~n & (n + 1)) - 1).astype(jnp.int32)
    return idx_max - num_subtrees + 1, idx_max


def _num_rows(checkpoints: RobustUTurnState) -> int:
    return jax.tree.leaves(checkpoints.momentum)[0].shape[0]


def robust_iterative_uturn(is_turning: Callable, robust: bool = True):
    """``(new_state, update, is_turning_now)`` of the criterion inside one doubling's
    subtree, with the checks across halves (module docstring).

    ``is_turning(momentum_left, momentum_right, momentum_sum)`` is the metric's criterion;
    ``robust=False`` leaves the checks across halves out (NumPyro's and BlackJAX's scheme).
    """

    def new_state(chain_state, max_num_doublings) -> RobustUTurnState:
        # rows of every leaf of the momentum (a pytree: whitened_hmc's unexpanded momenta)
        rows = jax.tree.map(
            lambda m: jnp.zeros((max_num_doublings + 1, *jnp.shape(m)), jnp.result_type(m)),
            chain_state.momentum,
        )  # + the spare
        zero = jnp.zeros((), jnp.int32)
        last = jax.tree.map(jnp.zeros_like, chain_state.momentum)
        return RobustUTurnState(rows, rows, rows, last, zero, zero)

    def update(checkpoints: RobustUTurnState, momentum_sum, momentum, step):
        idx_min, idx_max = _checkpoint_range(step)

        # An even step stores a checkpoint; an odd one writes to the spare last row, which
        # is never read: one row written either way, no branch (under ``vmap`` a branch
        # would select between two copies of every row).
        row = jnp.where(step % 2 == 0, idx_max, _num_rows(checkpoints) - 1)

        def store(rows, value):
            return jax.tree.map(lambda r, v: r.at[row].set(v), rows, value)

        c = checkpoints
        return c._replace(
            momentum=store(c.momentum, momentum),
            momentum_sum=store(c.momentum_sum, momentum_sum),
            previous_momentum=store(c.previous_momentum, c.last_momentum),
            last_momentum=momentum,
            idx_min=idx_min,
            idx_max=idx_max,
        )

    def is_turning_now(checkpoints: RobustUTurnState, momentum_sum, momentum):
        r, r_sum = momentum, momentum_sum
        c = checkpoints

        def at(rows, i):
            return jax.tree.map(lambda x: x[i], rows)

        def turning(i):
            """The subtree of checkpoint ``i`` (to the latest state), and, when its
            right half is a finished subtree (checkpoint ``i + 1``), the two checks
            across its halves."""
            first, first_sum = at(c.momentum, i), at(c.momentum_sum, i)
            whole = is_turning(
                first, r, jax.tree.map(lambda s, fs, f: s - fs + f, r_sum, first_sum, first)
            )
            if not robust:
                return whole

            def across(j):
                first_right, before_right = at(c.momentum, j), at(c.previous_momentum, j)
                right_sum = at(c.momentum_sum, j)
                left_and_first = jax.tree.map(
                    lambda rs, fs, f: rs - fs + f, right_sum, first_sum, first
                )
                last_and_right = jax.tree.map(
                    lambda b, s, rs, fr: b + s - rs + fr,
                    before_right, r_sum, right_sum, first_right,
                )  # fmt: skip
                return is_turning(first, first_right, left_and_first) | is_turning(
                    before_right, r, last_and_right
                )

            # The smallest subtree (checkpoint ``idx_max``, two states) has one state per
            # half: its checks across halves are the whole's. A branch, not a mask: about
            # half of all checks are of that subtree, and one chain's loop skips their
            # products (under ``vmap`` the branch selects, as the mask did).
            return whole | jax.lax.cond(i < c.idx_max, across, lambda j: jnp.zeros((), bool), i + 1)

        def body(state):
            i, _ = state
            return i - 1, turning(i)

        _, found = jax.lax.while_loop(
            lambda s: (s[0] >= c.idx_min) & ~s[1], body, (c.idx_max, False)
        )
        return found

    return new_state, update, is_turning_now


def robust_expansion(trajectory_integrator: Callable, uturn_check_fn: Callable,
                     max_num_expansions: int = 10, robust: bool = True) -> Callable:  # fmt: skip
    """BlackJAX's ``dynamic_multiplicative_expansion`` (doubling in a random direction,
    biased progressive sampling of the proposal) with the checks across the trajectory
    and the new subtree where they join."""
    blackjax = require_blackjax()
    trajectory = blackjax.mcmc.trajectory
    proposal_sampler = trajectory.progressive_biased_sampling

    def expand(rng_key, initial_expansion_state, initial_energy, step_size):
        def keep_expanding(loop_state):
            expansion_state, (is_diverging, is_turning) = loop_state
            return (expansion_state.step < max_num_expansions) & ~is_diverging & ~is_turning

        def expand_once(loop_state):
            expansion_state, _ = loop_state
            step, proposal, current, termination_state = expansion_state
            subkey = jax.random.fold_in(rng_key, step)
            direction_key, trajectory_key, proposal_key = jax.random.split(subkey, 3)
            direction = jnp.where(jax.random.bernoulli(direction_key), 1, -1)
            start = jax.lax.cond(
                direction > 0, lambda: current.rightmost_state, lambda: current.leftmost_state
            )
            subtree = trajectory_integrator(
                trajectory_key, start, direction, termination_state, 2**step, step_size,
                initial_energy,
            )  # fmt: skip
            new_proposal, new_trajectory, termination_state, is_diverging, turning_inside = subtree

            def only_the_acceptance(inputs):
                _, proposal, new_proposal = inputs
                return proposal._replace(
                    sum_log_p_accept=jnp.logaddexp(
                        proposal.sum_log_p_accept, new_proposal.sum_log_p_accept
                    )
                )

            updated = jax.lax.cond(
                is_diverging | turning_inside,
                only_the_acceptance,
                lambda x: proposal_sampler(*x),
                operand=(proposal_key, proposal, new_proposal),
            )
            left, right = trajectory.reorder_trajectories(direction, current, new_trajectory)
            merged = trajectory.merge_trajectories(left, right)
            is_turning = uturn_check_fn(
                merged.leftmost_state.momentum,
                merged.rightmost_state.momentum,
                merged.momentum_sum,
            )
            if robust:
                is_turning = (
                    is_turning
                    | uturn_check_fn(
                        left.leftmost_state.momentum,
                        right.leftmost_state.momentum,
                        jax.tree.map(jnp.add, left.momentum_sum, right.leftmost_state.momentum),
                    )
                    | uturn_check_fn(
                        left.rightmost_state.momentum,
                        right.rightmost_state.momentum,
                        jax.tree.map(jnp.add, left.rightmost_state.momentum, right.momentum_sum),
                    )
                )
            state = trajectory.DynamicExpansionState(step + 1, updated, merged, termination_state)
            return state, (is_diverging, turning_inside | is_turning)

        return jax.lax.while_loop(
            keep_expanding, expand_once, (initial_expansion_state, (False, False))
        )

    return expand


def _proposal(integrator, kinetic_energy, uturn_check_fn, max_num_expansions,
              divergence_threshold, robust):  # fmt: skip
    """BlackJAX's ``iterative_nuts_proposal`` with the robust criterion."""
    blackjax = require_blackjax()
    trajectory, proposal = blackjax.mcmc.trajectory, blackjax.mcmc.proposal
    new_termination_state, update, is_turning_now = robust_iterative_uturn(uturn_check_fn, robust)
    integrate = trajectory.dynamic_progressive_integration(
        integrator, kinetic_energy, update, is_turning_now, divergence_threshold
    )
    expand = robust_expansion(integrate, uturn_check_fn, max_num_expansions, robust)

    def propose(rng_key, initial_state, step_size):
        energy = -initial_state.logdensity + kinetic_energy(initial_state.momentum)
        start = trajectory.DynamicExpansionState(
            0,
            # weight and acceptance in the energy's dtype (Python floats would be float64
            # with x64 on, where float32 positions make the sampler's float32)
            proposal.Proposal(
                initial_state, energy, jnp.zeros_like(energy), jnp.full_like(energy, -np.inf)
            ),
            trajectory.Trajectory(initial_state, initial_state, initial_state.momentum, 0),
            new_termination_state(initial_state, max_num_expansions),
        )
        (num_doublings, sampled, full, _), (is_diverging, is_turning) = expand(
            rng_key, start, energy, step_size
        )
        info = blackjax.mcmc.nuts.NUTSInfo(
            initial_state.momentum,
            is_diverging,
            is_turning,
            sampled.energy,
            full.leftmost_state,
            full.rightmost_state,
            num_doublings,
            full.num_states,
            jnp.exp(sampled.sum_log_p_accept) / full.num_states,
        )
        return sampled.state, info

    return propose


def build_kernel(integrator: Callable | None = None, divergence_threshold: float = 1000.0,
                 robust: bool = True):  # fmt: skip
    """A NUTS kernel with BlackJAX's signature (``blackjax.nuts.build_kernel``):
    ``kernel(rng_key, state, logdensity_fn, step_size, inverse_mass_matrix,
    max_num_doublings=10) -> (HMCState, NUTSInfo)``, with the robust U-turn checks
    (``robust=False``: without them, the same transitions as BlackJAX's kernel)."""
    blackjax = require_blackjax()
    mcmc = blackjax.mcmc
    integrator = integrator or mcmc.integrators.velocity_verlet

    def kernel(rng_key, state, logdensity_fn, step_size, inverse_mass_matrix,
               max_num_doublings: int = 10):  # fmt: skip
        metric = mcmc.metrics.default_metric(inverse_mass_matrix)
        propose = _proposal(
            integrator(logdensity_fn, metric.kinetic_energy), metric.kinetic_energy,
            metric.check_turning, max_num_doublings, divergence_threshold, robust,
        )  # fmt: skip
        key_momentum, key_integrator = jax.random.split(rng_key)
        position, logdensity, logdensity_grad = state
        momentum = metric.sample_momentum(key_momentum, position)
        start = mcmc.integrators.IntegratorState(position, momentum, logdensity, logdensity_grad)
        proposed, info = propose(key_integrator, start, step_size)
        return mcmc.hmc.HMCState(
            proposed.position, proposed.logdensity, proposed.logdensity_grad
        ), info

    return kernel
