"""A PyMC model's posterior with Fisher NUTS (``pip install fisher_mala[pymc]``).

Eight schools, non-centred, written in PyMC with named dimensions: ``fm.sample_pymc``
compiles the model's log density to JAX, runs any of ``fm.sample``'s samplers (here Fisher
NUTS) with its checks, and returns the model's variables on their supports (``tau > 0``),
the deterministic ``theta`` and the pointwise log-likelihood, so that ``fm.to_arviz`` gives
ArviZ data with the model's coordinates and ``az.loo`` runs on it.

    python examples/pymc_model.py [--quick]
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
    import arviz as az
    import pymc as pm

    import fisher_mala as fm

    schools = ["A", "B", "C", "D", "E", "F", "G", "H"]
    y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
    with pm.Model(coords={"school": schools}) as model:
        mu = pm.Normal("mu", 0.0, 5.0)
        tau = pm.HalfCauchy("tau", 5.0)
        theta_raw = pm.Normal("theta_raw", 0.0, 1.0, dims="school")
        theta = pm.Deterministic("theta", mu + tau * theta_raw, dims="school")
        pm.Normal("obs", theta, sigma, observed=y, dims="school")

    num = 500 if args.quick else 5_000
    result = fm.sample_pymc(jax.random.key(0), model, sampler="fisher_nuts",
                            num_warmup=num, num_samples=num)
    print(fm.summary(result))
    idata = fm.to_arviz(result)
    print("posterior variables:", ", ".join(sorted(idata.posterior.data_vars)))
    print("theta's schools:", ", ".join(map(str, idata.posterior["theta"].school.values)))
    loo = az.loo(idata)
    print(f"PSIS-LOO elpd {float(loo.elpd):.1f} (se {float(loo.se):.1f})")
    return result, idata


if __name__ == "__main__":
    main()
