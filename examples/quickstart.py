"""Quickstart: FisherMALA against plain MALA on the paper's 100-d GP target (Section 5.2).

Four chains, 2 x 10^4 warm-up and 2 x 10^4 draws each (the paper's protocol). Prints the
paper-style ESS table, saves the FisherMALA run as an ArviZ file and a PNG comparing the
learned preconditioner with the true covariance.

    python examples/quickstart.py            # full run (about a minute on 2 CPU cores)
    python examples/quickstart.py --quick    # a few seconds (used by the tests)
"""

import argparse
from pathlib import Path

import jax
import numpy as np

import fisher_mala as fm


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1000 + 1000 iterations")
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("outputs/quickstart"))
    args = parser.parse_args(argv)
    num = 1_000 if args.quick else 20_000
    args.out.mkdir(parents=True, exist_ok=True)

    target = fm.targets.gp_gaussian()
    key_init, key_run = jax.random.split(jax.random.key(0))
    initial_positions = target.initial_positions(key_init, args.chains)  # N(0, I)

    print(f"{target.name}: d = {target.dim}, {args.chains} chains, "
          f"{num} warm-up + {num} draws; ESS with the paper's estimator (mean +- sd over chains)")
    results = {}
    for sampler in ("mala", "fisher_mala"):
        results[sampler] = fm.sample(
            key_run, sampler, target.logdensity_fn, initial_positions,
            num_warmup=num, num_samples=num,
        )
        r = results[sampler]
        print(fm.summary(r))
        print(f"{'':12} compile {r.compile_seconds:.1f} s, warm-up {r.warmup_seconds:.1f} s, "
              f"sampling {r.sampling_seconds:.1f} s")

    fisher = results["fisher_mala"]
    idata = fm.to_arviz(fisher)
    idata.to_netcdf(args.out / "fisher_mala.nc")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = np.asarray(fisher.parameters.sqrt_precond[0])
    learned = r @ r.T
    learned /= np.trace(learned) / target.dim
    true = target.covariance / (np.trace(target.covariance) / target.dim)
    distance = np.linalg.norm(learned - true)
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
    for ax, image, title in zip(
        axes, (true, learned), ("true covariance", "FisherMALA preconditioner"), strict=True
    ):
        ax.imshow(image, cmap="viridis")
        ax.set_title(f"{title}\n(trace-normalized)")
        ax.axis("off")
    fig.suptitle(f"GP target, d = 100: ||A~ - Sigma~||_F = {distance:.3f}")
    fig.tight_layout()
    fig.savefig(args.out / "preconditioner.png", dpi=110)
    print(f"Frobenius distance of the learned preconditioner (chain 0): {distance:.3f}")
    print(f"wrote {args.out / 'fisher_mala.nc'} and {args.out / 'preconditioner.png'}")
    return results


if __name__ == "__main__":
    main()
