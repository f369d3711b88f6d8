"""Sampling a NumPyro model's posterior with FisherMALA (``pip install fisher_mala[numpyro]``).

Eight schools, non-centred: NumPyro gives the potential function (minus the log density
in unconstrained space) and the initial point; ``fm.sample`` takes it unchanged, the
position being NumPyro's dict of unconstrained parameters.

    python examples/numpyro_model.py [--quick]
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer.util import initialize_model

    import fisher_mala as fm

    y = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    sigma = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])

    def model(sigma, y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        with numpyro.plate("schools", len(sigma)):
            theta_raw = numpyro.sample("theta_raw", dist.Normal(0.0, 1.0))
            numpyro.sample("obs", dist.Normal(mu + tau * theta_raw, sigma), obs=y)

    info = initialize_model(jax.random.key(0), model, model_args=(sigma, y),
                            dynamic_args=False)

    def logdensity(params):
        return -info.potential_fn(params)

    num_chains = 4
    positions = jax.tree.map(
        lambda v: v + 0.1 * jax.random.normal(jax.random.key(1), (num_chains, *v.shape)),
        info.param_info.z,
    )
    num = 1_000 if args.quick else 10_000
    result = fm.sample(jax.random.key(2), "fisher_mala", logdensity, positions,
                       num_warmup=num, num_samples=num)
    print(fm.summary(result))
    tau = np.exp(np.asarray(result.samples["tau"]))  # back to the constrained scale
    print(f"posterior mean of mu {float(np.mean(result.samples['mu'])):.2f}, "
          f"of tau {tau.mean():.2f}")
    return result


if __name__ == "__main__":
    main()
