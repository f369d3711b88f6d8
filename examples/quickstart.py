"""Quickstart: FisherMALA against plain MALA on the paper's 100-d GP target (Section 5.2).

Four chains, 2 x 10^4 warm-up and 2 x 10^4 draws each (the paper's protocol). Prints the
paper-style ESS table (per chain, to compare with the paper's Table 1), the multi-chain
diagnostics (ArviZ's bulk and tail ESS and R-hat over all chains: the figures to judge a
run by), how close each chain's learned preconditioner is to the true covariance, and
saves the FisherMALA run as an ArviZ file and a PNG of the preconditioner.

    python examples/quickstart.py            # full run (about 20 s on 2 CPU cores)
    python examples/quickstart.py --quick    # about 20 s (used by the tests)
"""

import argparse
import time
from pathlib import Path

import jax
import numpy as np

import fisher_mala as fm


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4000 + 4000 iterations")
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("outputs/quickstart"))
    args = parser.parse_args(argv)
    if args.quick:
        print("--quick: 4000 + 4000 iterations, a fifth of the full run: long enough for "
              "FisherMALA to pull ahead of MALA, far too short for MALA's numbers or the "
              "warnings about it to mean anything; run without --quick for the real run.")
    num = 4_000 if args.quick else 20_000
    args.out.mkdir(parents=True, exist_ok=True)

    target = fm.targets.gp_gaussian()
    key_init, key_run = jax.random.split(jax.random.key(0))
    initial_positions = target.initial_positions(key_init, args.chains)  # N(0, I)

    print(f"{target.name}: d = {target.dim}, {args.chains} chains, {num} warm-up + {num} draws")
    results, call_seconds = {}, {}
    for sampler in ("mala", "fisher_mala"):
        start = time.perf_counter()
        # MALA fails to mix here in 2 x 10^4 iterations (the paper's point): fm.sample
        # says so in a SamplingWarning, which names the coordinates.
        results[sampler] = fm.sample(
            key_run, sampler, target.logdensity_fn, initial_positions,
            num_warmup=num, num_samples=num,
        )
        call_seconds[sampler] = time.perf_counter() - start
    print("\nThe paper's Table 1 (TFP's ESS per chain, mean +- sd over chains):")
    for r in results.values():
        print(fm.paper_summary(r))
    print("\nMulti-chain diagnostics (ArviZ: rank-normalized bulk / tail ESS of all chains):")
    for sampler, r in results.items():
        print(fm.summary(r))
        print(f"{'':12} compile {r.compile_seconds:.1f} s, warm-up {r.warmup_seconds:.1f} s, "
              f"sampling {r.sampling_seconds:.1f} s; the whole fm.sample call "
              f"{call_seconds[sampler]:.1f} s (its checks included) on {r.devices}")

    fisher = results["fisher_mala"]
    idata = fm.to_arviz(fisher)
    idata.to_netcdf(args.out / "fisher_mala.nc")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    true = target.covariance / (np.trace(target.covariance) / target.dim)

    def normalized(r):
        a = r @ r.T
        return a / (np.trace(a) / target.dim)

    learned = [normalized(np.asarray(r, np.float64)) for r in fisher.parameters.sqrt_precond]
    distances = np.array([np.linalg.norm(a - true) for a in learned])
    print(f"\nFrobenius distance ||A~ - Sigma~||_F between each chain's learned preconditioner "
          f"and the true covariance (both trace-normalized to d; 0 is exact, "
          f"{np.linalg.norm(np.eye(target.dim) - true):.1f} is the identity's):")
    print("  by chain: " + ", ".join(f"{v:.3f}" for v in distances)
          + f"; mean {distances.mean():.3f}, range {distances.min():.3f}-{distances.max():.3f}")
    best = int(np.argmin(distances))
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
    for ax, image, title in zip(
        axes, (true, learned[best]), ("true covariance", f"FisherMALA, chain {best}"),
        strict=True,
    ):
        ax.imshow(image, cmap="viridis")
        ax.set_title(f"{title}\n(trace-normalized)")
        ax.axis("off")
    fig.suptitle(f"GP target, d = 100: ||A~ - Sigma~||_F = {distances[best]:.3f} "
                 f"(chains: {distances.min():.2f}-{distances.max():.2f})")
    fig.tight_layout()
    fig.savefig(args.out / "preconditioner.png", dpi=110)
    print(f"wrote {args.out / 'fisher_mala.nc'} and {args.out / 'preconditioner.png'}")
    return results


if __name__ == "__main__":
    main()
