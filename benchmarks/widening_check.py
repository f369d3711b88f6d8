"""Where the Fisher metric is too narrow, and whether Fisher NUTS widens it
(``fisher_mala/geometric_widening.py``).

    python -m benchmarks.widening_check                      # the NumPyro table's models
    python -m benchmarks.widening_check --race pima,arK      # which chains widen, race set-up
    python -m benchmarks.widening_check --run-checks funnel_fisher_nuts   # reliability set-up

Models: 4000 NumPyro NUTS draws of each model of ``benchmarks.numpyro_wall`` (float64,
unconstrained coordinates) give the Fisher matrix ``F = E[g g^T]`` and the covariance
``Sigma``; printed: the largest eigenvalues of ``Sigma`` in coordinates whitened by
``F^{-1}`` (all 1 for a Gaussian; ``Cov >= F^{-1}`` always), the coordinate with the
largest ``Var(x_i) F_ii``, the gradient kurtosis ratio that holds the widening back in a
funnel (:func:`~fisher_mala.geometric_widening.gradient_kurtosis_ratio`, in those
coordinates), and the widening's ratios (the geometric mean ``M`` of the
whitened draws' and inverse gradients' covariances over the Fisher scale) from ``n`` of the
draws, against :data:`~fisher_mala.geometric_widening.WIDENING_THRESHOLD`.

``--race``: Fisher NUTS's warm-up on race targets (``benchmarks.race_setup``, 5000
warm-up iterations, the stopping rule on), printing each chain's largest variance factor
applied (1: not widened, the chain is the one of a run without the widening) and its
gradient kurtosis ratio.
"""

import argparse
import contextlib

import jax
import numpy as np


def _psd_sqrt(c):
    w, v = np.linalg.eigh(c)
    return (v * np.sqrt(np.maximum(w, 0.0))) @ v.T


def _positions_and_scores(draws, potential_fn):
    """Flat unconstrained draws ``(n, d)`` and their scores ``grad log pi``."""
    from jax.flatten_util import ravel_pytree

    _, unravel = ravel_pytree(jax.tree.map(lambda v: v[0], draws))
    num = len(jax.tree.leaves(draws)[0])
    x = jax.vmap(lambda i: ravel_pytree(jax.tree.map(lambda v: v[i], draws))[0])(np.arange(num))

    def score(p):
        return -ravel_pytree(jax.grad(potential_fn)(unravel(p)))[0]

    return np.asarray(x), np.asarray(jax.vmap(score)(x))


def models() -> None:
    from numpyro.distributions.transforms import biject_to
    from numpyro.handlers import seed, trace
    from numpyro.infer import MCMC, NUTS
    from numpyro.infer.util import initialize_model

    from benchmarks.numpyro_wall import _models
    from fisher_mala.geometric_widening import WIDENING_MAX_KURTOSIS_RATIO, WIDENING_THRESHOLD

    for name, (model, args, kwargs) in _models().items():
        mcmc = MCMC(NUTS(model), num_warmup=1000, num_samples=4000, progress_bar=False)
        mcmc.run(jax.random.key(1), *args, **kwargs)
        info = initialize_model(jax.random.key(0), model, model_args=args, model_kwargs=kwargs)
        sites = trace(seed(model, 0)).get_trace(*args, **kwargs)
        draws = {k: biject_to(sites[k]["fn"].support).inv(v)
                 for k, v in mcmc.get_samples().items() if k in info.param_info.z}  # fmt: skip
        x, g = _positions_and_scores(draws, info.potential_fn)
        names = [f"{k}[{i}]" for k in sorted(draws) for i in range(np.size(draws[k][0]))]
        fisher, sigma = g.T @ g / len(g), np.cov(x.T)
        root = _psd_sqrt(fisher)
        top = np.sort(np.linalg.eigvalsh(root @ sigma @ root))[::-1][:3]
        worst = int(np.argmax(np.diag(sigma) * np.diag(fisher)))
        print(f"{name} (d = {x.shape[1]}): Sigma in Fisher-whitened coordinates, largest "
              f"eigenvalues {np.round(top, 2).tolist()}; largest Var(x_i) F_ii "
              f"{np.diag(sigma)[worst] * np.diag(fisher)[worst]:.1f} ({names[worst]})")  # fmt: skip
        r = np.linalg.cholesky(np.linalg.inv(fisher))
        z, gz = np.linalg.solve(r, x.T).T, g @ r
        q, second = np.sum(gz**2, axis=1), gz.T @ gz / len(gz)
        gaussian = 1 + 2 * np.sum(second**2) / np.trace(second) ** 2
        print(f"  gradient kurtosis ratio {np.mean(q**2) / np.mean(q) ** 2 / gaussian:.2f} "
              f"(widening held back above {WIDENING_MAX_KURTOSIS_RATIO})")  # fmt: skip
        for n in (50, 100, 400, 4000):
            pick = np.arange(0, 4000, 4000 // n)[:n]
            cz, cg = np.cov(z[pick].T), np.cov(gz[pick].T)
            h = _psd_sqrt(cg)
            hi = np.linalg.inv(h)
            mean = hi @ _psd_sqrt(h @ cz @ h) @ hi
            scale = x.shape[1] / np.mean(np.sum(gz[pick] ** 2, axis=1))
            ratios = np.sort(np.linalg.eigvalsh(mean) / scale)[::-1]
            print(f"  n = {n}: M / c largest {np.round(ratios[:3], 2).tolist()} "
                  f"(widened above {WIDENING_THRESHOLD})")  # fmt: skip


@contextlib.contextmanager
def _reported():
    """``fisher_mala.geometric_widening.widen`` printing each chain's variance factor and
    gradient kurtosis ratio, within the block."""
    from fisher_mala import geometric_widening

    widen = geometric_widening.widen

    def reported(state, moments, count):
        out = widen(state, moments, count)
        kurtosis = geometric_widening.gradient_kurtosis_ratio(moments, count)
        jax.debug.print("    variance factor {f} (gradient kurtosis ratio {k})", f=out[1],
                        k=kurtosis)  # fmt: skip
        return out

    geometric_widening.widen = reported
    try:
        yield
    finally:
        geometric_widening.widen = widen


def race(names) -> None:
    import fisher_mala as fm
    from benchmarks.race_setup import POSTERIORDB, race_start

    with _reported():
        for name in names:
            with jax.enable_x64(name in POSTERIORDB):
                target = fm.targets.get(name)
                positions, key = race_start(target, 4, 0)
                print(f"{name} (d = {target.dim}):", flush=True)
                fm.sample(key, "fisher_nuts", target.logdensity_fn, positions,
                          num_warmup=5000, num_samples=10, diagnose=False)  # fmt: skip


def run_checks(names) -> None:
    """The warm-ups of ``benchmarks.run_checks``'s cells ``names`` (their seeds, starts and
    options), each chain's widening printed."""
    import jax.numpy as jnp

    import fisher_mala as fm
    from benchmarks.run_checks import CELLS, CHAINS, _target

    with _reported():
        for name in names:
            target_name, sampler, options, num_warmup, _, seeds, _ = CELLS[name]
            target = _target(target_name)
            for seed in seeds:
                print(f"{name}, seed {seed}:", flush=True)
                with jax.enable_x64(True):
                    x0 = target.initial_positions(jax.random.key(100 + seed), CHAINS, jnp.float64)
                    fm.sample(jax.random.key(seed), sampler, target.logdensity_fn, x0,
                              num_warmup=num_warmup, num_samples=10, diagnose=False,
                              **options)  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--race", help="comma-separated race targets")
    parser.add_argument("--run-checks", help="comma-separated cells of benchmarks.run_checks")
    args = parser.parse_args(argv)
    if args.race:
        race(args.race.split(","))
        return
    if args.run_checks:
        run_checks(args.run_checks.split(","))
        return
    with jax.enable_x64(True):
        models()


if __name__ == "__main__":
    main()
