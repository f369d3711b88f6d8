"""One preconditioner for all chains: how much burn-in and time it saves.

    python -m benchmarks.pooled [--chains 16] [--targets gp,inhomogeneous]

For each target: (b) run 16 independent FisherMALA chains for the paper's 2 x 10^4 burn-in
and record the Frobenius distance ``||A~_n - Sigma~||_F`` every 100 iterations; take the
mean final distance D* of the independent chains; run the pooled warm-up (16 chains, one
R) and find the first iteration where its distance falls below D*; report the ratio of
iterations and of wall-clock seconds. (c) Sample 2 x 10^4 draws after a pooled burn-in
shortened to that iteration (rounded up to 500) and compare min ESS (paper's estimator)
with independent chains after the full burn-in. Per-iteration cost (a) comes from
``benchmarks/step_cost.py`` (rows ``16`` and ``pooled16``). Results:
``benchmarks/results/pooled.json``.
"""

import argparse
import json
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import fisher_mala as fm
from fisher_mala.warmups import fisher_mala_warmup, pooled_fisher_mala_warmup

RESULTS = Path(__file__).resolve().parent / "results" / "pooled.json"
BURN_IN = 20_000
EVERY = 100


def _distances(trace_precond, sigma):
    return np.asarray(jax.vmap(lambda a: jnp.linalg.norm(a - sigma))(trace_precond))


def compare(target_name, chains):
    target = fm.targets.get(target_name)
    sigma = jnp.asarray(target.covariance / (np.trace(target.covariance) / target.dim), jnp.float32)
    positions = target.initial_positions(jax.random.key(0), chains)
    keys = jax.random.split(jax.random.key(1), chains)
    alone = fisher_mala_warmup(target.logdensity_fn, trace_every=EVERY, record_precond=True)
    run_alone = jax.jit(jax.vmap(lambda k, x: alone.run(k, x, BURN_IN)[1].trace))
    jax.block_until_ready(run_alone(keys, positions))  # compile
    start = time.perf_counter()
    trace = jax.block_until_ready(run_alone(keys, positions))
    seconds_alone = time.perf_counter() - start
    dist_alone = np.stack(
        [_distances(trace.normalized_precond[c], sigma) for c in range(chains)]
    )  # (chains, snapshots)
    threshold = float(dist_alone[:, -1].mean())

    shared = pooled_fisher_mala_warmup(target.logdensity_fn, trace_every=EVERY, record_precond=True)
    run_shared = jax.jit(lambda k, x: shared.run(k, x, BURN_IN)[1].trace)
    jax.block_until_ready(run_shared(keys[0], positions))
    start = time.perf_counter()
    strace = jax.block_until_ready(run_shared(keys[0], positions))
    seconds_shared = time.perf_counter() - start
    dist_shared = _distances(strace.normalized_precond, sigma)
    iterations = np.asarray(strace.iteration)
    below = np.flatnonzero(dist_shared < threshold)
    reached = int(iterations[below[0]]) if below.size else None

    out = {
        "target": target_name,
        "chains": chains,
        "threshold_D*": threshold,
        "independent_final_distance_per_chain": dist_alone[:, -1].tolist(),
        "pooled_final_distance": float(dist_shared[-1]),
        "pooled_iterations_to_D*": reached,
        "iteration_ratio": BURN_IN / reached if reached else None,
        "seconds_independent_burn_in": seconds_alone,
        "seconds_pooled_to_D*": seconds_shared * (reached or BURN_IN) / BURN_IN,
        "pooled_curve": {"iteration": iterations.tolist(), "distance": dist_shared.tolist()},
        "independent_curve_mean": dist_alone.mean(0).tolist(),
    }
    out["seconds_ratio"] = out["seconds_independent_burn_in"] / out["seconds_pooled_to_D*"]
    # (c) min ESS after the shortened pooled burn-in vs the full independent burn-in
    short = max(1000, int(math.ceil((reached or BURN_IN) / 500) * 500))
    r_shared = fm.sample(
        jax.random.key(2),
        "fisher_mala",
        target.logdensity_fn,
        positions,
        num_warmup=short,
        num_samples=BURN_IN,
        pooled=True,
    )
    r_alone = fm.sample(
        jax.random.key(2),
        "fisher_mala",
        target.logdensity_fn,
        positions,
        num_warmup=BURN_IN,
        num_samples=BURN_IN,
    )
    for name, r in (("pooled_short_burn_in", r_shared), ("independent_full_burn_in", r_alone)):
        ess = fm.ess(r, method="paper", per_chain=True).min(axis=1)
        out[name] = {
            "num_warmup": r.num_warmup,
            "min_ess_mean": float(ess.mean()),
            "min_ess_sd": float(ess.std()),
            "warmup_seconds": r.warmup_seconds,
            "sampling_seconds": r.sampling_seconds,
        }
    print(
        json.dumps(
            {k: v for k, v in out.items() if "curve" not in k and "per_chain" not in k}, indent=1
        ),
        flush=True,
    )
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=16)
    parser.add_argument("--targets", default="gp,inhomogeneous")
    args = parser.parse_args(argv)
    rows = [compare(t, args.chains) for t in args.targets.split(",")]
    RESULTS.write_text(json.dumps({"device": str(jax.devices()[0]), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
