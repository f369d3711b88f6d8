"""The same FisherMALA run on whatever accelerator JAX sees, with a device report.

On a GPU or TPU the chains run there (sharded over all local devices along the chain
axis); on a CPU-only machine it says so and still runs.

    python examples/gpu.py [--quick] [--dataset mnist56]
"""

import argparse
import time

import jax

import fisher_mala as fm


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dataset", default="mnist56")
    parser.add_argument("--chains", type=int, default=10)
    args = parser.parse_args(argv)
    if args.quick:
        print("--quick: a smoke test of this example's code with runs far too short for "
              "its numbers or its warnings to mean anything; run it without --quick for "
              "them.")
    devices = jax.devices()
    backend = jax.default_backend()
    print(f"JAX {jax.__version__}, backend {backend!r}: "
          + ", ".join(f"{d.device_kind} ({d})" for d in devices))
    if backend == "cpu":
        print("No accelerator visible: running on the CPU (for a GPU, install a CUDA build "
              "of jax, e.g. jax[cuda13]).")
    num = 200 if args.quick else 20_000
    target = fm.targets.get(args.dataset)
    positions = target.initial_positions(jax.random.key(0), args.chains)
    start = time.perf_counter()
    result = fm.sample(jax.random.key(1), "fisher_mala", target.logdensity_fn, positions,
                       num_warmup=num, num_samples=num)
    print(fm.summary(result))
    print(f"{target.name}, d = {target.dim}, {args.chains} chains on {result.devices}: "
          f"compile {result.compile_seconds:.1f} s, warm-up {result.warmup_seconds:.1f} s, "
          f"sampling {result.sampling_seconds:.1f} s (total {time.perf_counter() - start:.1f} s)")
    return result


if __name__ == "__main__":
    main()
