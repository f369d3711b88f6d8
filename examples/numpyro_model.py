"""A NumPyro model's posterior with FisherMALA (``pip install fisher_mala[numpyro]``).

Eight schools, non-centred, two ways, both returning the model's named sites on their
supports (``tau > 0``) with its deterministic site ``theta``:

* ``numpyro.infer.MCMC(fm.FisherMALAKernel(model), ...)``: NumPyro's driver, its
  ``print_summary`` and ``get_samples``, and ``arviz.from_numpyro``;
* ``fm.sample_numpyro(key, model, *args, sampler=...)``: ``fm.sample``'s driver, so any of
  its samplers (here Fisher NUTS) and its checks, and ``fm.to_arviz``.

    python examples/numpyro_model.py [--quick]
"""

import argparse

import jax
import numpy as np


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        print("--quick: a smoke test of this example's code with runs far too short for "
              "its numbers or its warnings to mean anything; run it without --quick for "
              "them.")
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC

    import fisher_mala as fm

    y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])

    def model(sigma, y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        with numpyro.plate("schools", len(sigma)):
            theta_raw = numpyro.sample("theta_raw", dist.Normal(0.0, 1.0))
            theta = numpyro.deterministic("theta", mu + tau * theta_raw)
            numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)

    num = 1_000 if args.quick else 10_000  # 1000: a Fisher phase of 50 d, no warning
    mcmc = MCMC(fm.FisherMALAKernel(model), num_warmup=num, num_samples=num, num_chains=4,
                chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.key(0), sigma, y=y)
    mcmc.print_summary()
    draws = mcmc.get_samples()
    print(f"posterior mean of mu {float(np.mean(draws['mu'])):.2f}, "
          f"of tau {float(np.mean(draws['tau'])):.2f}")

    result = fm.sample_numpyro(jax.random.key(1), model, sigma, y, sampler="fisher_nuts",
                               num_warmup=num, num_samples=num)
    print(fm.summary(result))
    idata = fm.to_arviz(result)
    print("fm.to_arviz variables:", ", ".join(sorted(idata.posterior.data_vars)))
    return mcmc, result


if __name__ == "__main__":
    main()
