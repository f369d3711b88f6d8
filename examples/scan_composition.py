"""The FisherMALA kernel inside your own ``jax.lax.scan`` and ``jax.vmap``, no driver.

Algorithm 1 by hand: a MALA phase adapting sigma^2, the adaptive Fisher phase, then the
frozen sampling phase with the same state type, all in one jitted function vmapped over
chains.

    python examples/scan_composition.py [--quick]
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import fisher_mala as fm
from fisher_mala.adaptations.step_size import adapt_step_size, robbins_monro


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        print("--quick: a smoke test of this example's code with runs far too short for "
              "its numbers or its warnings to mean anything; run it without --quick for "
              "them.")
    n0, n_adapt, n_draws = (200, 1000, 1000) if args.quick else (500, 19_500, 20_000)

    target = fm.targets.gp_gaussian()
    logdensity = target.logdensity_fn
    mala = fm.mala.build_kernel()
    # Algorithm 1's step: the preconditioned MALA kernel composed with two adaptations
    adaptive = fm.fisher.adaptive_step(
        fm.fisher_preconditioner(damping=10.0), robbins_monro(0.574, 0.015), "rao_blackwell"
    )
    frozen = fm.fisher_mala.build_kernel()  # R and sigma^2 from the state

    def run_chain(key, x0):
        k_mala, k_adapt, k_draw = jax.random.split(key, 3)

        # 1. plain MALA adapting sigma^2 towards 0.574 (Algorithm 1's initialization)
        def mala_step(carry, k):
            state, sigma2 = carry
            state, info = mala(k, state, logdensity, sigma2)
            return (state, adapt_step_size(sigma2, info.acceptance_rate, 0.574, 0.015)), None

        (state, sigma2), _ = jax.lax.scan(
            mala_step, (fm.mala.init(x0, logdensity), 1e-3), jax.random.split(k_mala, n0)
        )
        # 2. R = I / sqrt(lambda) and adaptive FisherMALA: one iteration per step
        fstate = fm.fisher.state_from(
            state.position, state.logdensity, state.logdensity_grad, sigma2, damping=10.0
        )
        fstate, _ = jax.lax.scan(
            lambda s, k: adaptive(k, s, logdensity), fstate, jax.random.split(k_adapt, n_adapt)
        )
        fstate = fm.fisher.refresh_trace(fstate)

        # 3. frozen: same state type, R and sigma^2 fixed
        def draw(s, k):
            s, info = frozen(k, s, logdensity)
            return s, (s.position, info.acceptance_rate)

        fstate, (draws, rates) = jax.lax.scan(draw, fstate, jax.random.split(k_draw, n_draws))
        return draws, rates, fstate.step_size

    keys = jax.random.split(jax.random.key(0), 4)
    x0 = target.initial_positions(jax.random.key(1), 4)
    draws, rates, sigma2 = jax.jit(jax.vmap(run_chain))(keys, x0)
    ess = fm.ess(draws, method="paper", per_chain=True)  # (chains, d), the paper's estimator
    print(f"draws {draws.shape}, acceptance {float(jnp.mean(rates)):.3f}, sigma^2 {sigma2}")
    print(f"min / median ESS per chain: {np.round(ess.min(1))} / {np.round(np.median(ess, 1))}")
    return draws


if __name__ == "__main__":
    main()
