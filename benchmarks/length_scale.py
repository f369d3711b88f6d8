"""Where Fisher NUTS loses to NumPyro's NUTS on ``numpyro_wall``'s latent-GP model: the
length scale, per chain, and how narrow the learned metric is along it.

    python -m benchmarks.length_scale --seeds 0,1,2                 # fm.sample_numpyro
    python -m benchmarks.length_scale --seeds 1 --set metric=diagonal
    python -m benchmarks.length_scale --kernel nuts --seeds 0,1     # NumPyro's NUTS
    python -m benchmarks.length_scale --kernel nuts_dense --seeds 0,1

Each run: 4 chains, 1000 warm-up and 1000 draws, float64; printed: min bulk ESS over every
latent coordinate (and which), each chain's bulk ESS of the length scale, and for Fisher
NUTS the ratio of the draws' variance of ``log length`` to the learned metric's
(``(R R^T)_ll``) and the largest eigenvalue of the draws' covariance whitened by ``R``
(1 for a metric that fits). Nothing is cached: an investigation, not a table.
"""

import argparse

import jax
import numpy as np


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(text, text)


def run(kernel: str, seed: int, options: dict) -> None:
    import fisher_mala as fm
    from benchmarks.numpyro_wall import _models
    from fisher_mala import convergence

    model, args, kwargs = _models()["gp_latent"]
    if kernel.startswith("nuts"):
        from numpyro.infer import MCMC, NUTS

        mcmc = MCMC(NUTS(model, dense_mass=kernel == "nuts_dense"), num_warmup=1000,
                    num_samples=1000, num_chains=4, chain_method="sequential",
                    progress_bar=False)  # fmt: skip
        mcmc.run(jax.random.key(seed), *args, **kwargs)
        samples, r = mcmc.get_samples(group_by_chain=True), None
    else:
        result = fm.sample_numpyro(jax.random.key(seed), model, *args, sampler="fisher_nuts",
                                   num_warmup=1000, num_samples=1000, log_likelihood=False,
                                   model_kwargs=kwargs, diagnose=False, **options)  # fmt: skip
        samples, r = result.samples, result.parameters.sqrt_precond
    flat = np.concatenate(
        [np.asarray(samples[k]).reshape(4, 1000, -1) for k in sorted(samples)], -1
    )
    ess = convergence.ess_bulk(flat)
    per_chain = [float(convergence.ess_bulk(flat[c : c + 1])[1]) for c in range(4)]
    line = (f"{kernel} seed {seed} {options or ''}: min ESS {np.nanmin(ess):.0f} (coordinate "
            f"{int(np.nanargmin(ess))}; 1 = length), length scale per chain "
            f"{[round(e) for e in per_chain]}")  # fmt: skip
    if r is not None:
        z = np.concatenate([np.log(np.asarray(samples["amplitude"])).reshape(4, 1000, 1),
                            np.log(np.asarray(samples["length"])).reshape(4, 1000, 1),
                            np.asarray(samples["raw"]).reshape(4, 1000, -1)], -1)  # fmt: skip
        ratios, tops = [], []
        for c in range(4):
            root = np.diag(np.asarray(r.scale)[c]) if hasattr(r, "scale") else np.asarray(r)[c]
            cov = np.cov(z[c].T)
            ratios.append(cov[1, 1] / (root @ root.T)[1, 1])
            inverse = np.linalg.inv(root)
            tops.append(np.linalg.eigvalsh(inverse @ cov @ inverse.T)[-1])
        line += (f"; draws' variance of log length over the metric's {np.round(ratios, 1)}, "
                 f"largest whitened eigenvalue {np.round(tops, 1)}")  # fmt: skip
    print(line, flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="fisher_nuts",
                        choices=("fisher_nuts", "nuts", "nuts_dense"))  # fmt: skip
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE")
    args = parser.parse_args(argv)
    options = {k: _value(v) for k, v in (o.split("=", 1) for o in args.set)}
    with jax.enable_x64(True):
        for seed in (int(s) for s in args.seeds.split(",")):
            run(args.kernel, seed, options)


if __name__ == "__main__":
    main()
