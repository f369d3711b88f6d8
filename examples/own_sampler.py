"""Write your own sampler: the preconditioned MALA kernel, the Fisher recursion and dual
averaging of sigma^2, composed into a warm-up that fm.sample and BlackJAX's loop both run.

    python examples/own_sampler.py [--quick]
"""

import argparse

import blackjax
import jax
import jax.numpy as jnp
import numpy as np

import fisher_mala as fm
from fisher_mala import adaptations
from fisher_mala.adaptations.fisher import carry_whitened
from fisher_mala.mala import build_kernel, with_sqrt_precond
from fisher_mala.schedule import Phase, Schedule, Start, WarmupParameters, split_key

# --8<-- [start:sampler]
kernel = build_kernel()  # preconditioned MALA: R in the state, sigma^2 an argument
fisher = adaptations.fisher_preconditioner(damping=10.0)  # Prop. 4 on whitened signals
dual_averaging = adaptations.dual_averaging(target_acceptance_rate=0.574)


def init(position, logdensity_fn, step_size=0.1):
    """The kernel's state with R_0 = I / sqrt(10), and the two adaptations' states."""
    state = fm.mala.init(position, logdensity_fn)
    learned = fisher.init(state.whitened_grad.shape[0], state.whitened_grad.dtype)
    state = with_sqrt_precond(state, fisher.final(learned))
    return state, learned, dual_averaging.init(step_size)


def adaptive_step(key, carry, logdensity_fn):
    """One MALA step, then both adaptations learn from what its info exposes."""
    state, learned, step = carry
    state, info = kernel(key, state, logdensity_fn, jnp.exp(step.log_step_size))
    phi = adaptations.whitened_signal(  # Eq. (16), from the whitened gradients: no pass over R
        "rao_blackwell", info.whitened_grad, info.proposal_whitened_grad,
        info.acceptance_rate, info.is_accepted, info.proposal_is_finite)
    learned, made = fisher.update(learned, phi)
    state = state._replace(sqrt_precond=learned.sqrt_precond, trace_precond=learned.trace_precond,
                           whitened_grad=carry_whitened(made, state.whitened_grad))  # O(d)
    return (state, learned, dual_averaging.update(step, info.acceptance_rate)), info


def warmup(logdensity_fn, **options):
    """The warm-up as data: a start, one phase, and what to freeze at the end."""

    def start(key, position):
        return init(position, logdensity_fn), Start(jnp.asarray(0.1), 1)

    def finish(carry):
        state, learned, step = carry
        return state, WarmupParameters(dual_averaging.final(step), fisher.final(learned))

    def build(num_steps, position, warn=True):
        step = lambda key, carry: adaptive_step(key, carry, logdensity_fn)  # noqa: E731
        return Schedule(start, (Phase("fisher", num_steps, step, split_key((2, 1))),), finish)

    return fm.warmups.Warmup(build, target_acceptance=0.574)


def sampling_kernel(logdensity_fn, **options):
    return lambda key, state, parameters: kernel(key, state, logdensity_fn, parameters.step_size)


my_sampler = fm.Sampler(warmup, sampling_kernel)
# --8<-- [end:sampler]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        print("--quick: a smoke test of this example's code with runs far too short for "
              "its numbers or its warnings to mean anything; run it without --quick for "
              "them.")
    num = 1500 if args.quick else 5000
    cov = jnp.array([[1.0, 0.95, 0.0], [0.95, 1.0, 0.3], [0.0, 0.3, 4.0]])
    precision = jnp.linalg.inv(cov)

    def logdensity(x):
        return -0.5 * x @ precision @ x

    # --8<-- [start:run]
    # 1. fm.sample: the warm-up above, then its kernel with the tuned parameters frozen
    result = fm.sample(
        jax.random.key(0),
        my_sampler,
        logdensity,
        jnp.zeros((4, 3)),
        num_warmup=num,
        num_samples=num,
    )
    print(fm.summary(result))
    # 2. BlackJAX's loop runs the adaptive step itself (a SamplingAlgorithm)
    algorithm = blackjax.base.SamplingAlgorithm(
        lambda position, rng_key=None: init(position, logdensity),
        jax.jit(lambda key, carry: adaptive_step(key, carry, logdensity)),
    )
    (_, learned, _), (draws, _) = blackjax.util.run_inference_algorithm(
        jax.random.key(1),
        algorithm,
        num,
        initial_position=jnp.zeros(3),
        transform=lambda carry, info: (carry[0].position, info),
    )
    # --8<-- [end:run]
    learned_cov = np.asarray(fm.square_roots.dense(learned.sqrt_precond))
    learned_cov = learned_cov @ learned_cov.T
    corr = learned_cov[0, 1] / np.sqrt(learned_cov[0, 0] * learned_cov[1, 1])
    print(f"fm.sample: tuned sigma^2 {np.asarray(result.parameters.step_size).round(3)}")
    print(f"run_inference_algorithm: {draws.shape[0]} draws, learned correlation {corr:.3f}")
    return result, draws, corr


if __name__ == "__main__":
    main()
