"""Checks of the driver that need timing or memory: progress-bar cost, initial step size.

    python -m benchmarks.driver_checks

1. Progress bar: ``fm.sample`` on the GP target (d = 100, 4 chains, 2 x 10^4 + 2 x 10^4)
   with and without ``progress_bar=True``; the ratio of warm-up + sampling seconds (goal:
   below 1.05).
2. Initial step size: FisherMALA on the inhomogeneous Gaussian (smallest scale 0.01, 4
   chains, the paper's protocol) from initial guesses sigma^2 in {1e-6, 1e-2, 1, 100},
   with the default bracketing search and without it (the paper's rule alone): min ESS
   (paper's estimator, mean over chains).
3. Memory: 2 x 10^4 draws of d = 785 for 10 chains (a Gaussian target, float32) and the
   peak resident memory of the process.

Results: ``benchmarks/results/driver_checks.json``.
"""

import json
import resource
import time
from pathlib import Path

import jax
import numpy as np

import fisher_mala as fm

RESULTS = Path(__file__).resolve().parent / "results" / "driver_checks.json"


def progress_overhead():
    target = fm.targets.gp_gaussian()
    x0 = target.initial_positions(jax.random.key(0), 4)
    seconds = {}
    for bar in (False, True, False, True):
        r = fm.sample(
            jax.random.key(1),
            "fisher_mala",
            target.logdensity_fn,
            x0,
            num_warmup=20_000,
            num_samples=20_000,
            progress_bar=bar,
        )
        total = r.warmup_seconds + r.sampling_seconds
        seconds[bar] = min(seconds.get(bar, np.inf), total)
    return {
        "seconds_without": seconds[False],
        "seconds_with": seconds[True],
        "ratio": seconds[True] / seconds[False],
    }


def initial_guess():
    target = fm.targets.inhomogeneous_gaussian()
    x0 = target.initial_positions(jax.random.key(0), 4)
    rows = []
    for search in (True, False):
        for guess in (1e-6, 1e-2, 1.0, 100.0):
            r = fm.sample(
                jax.random.key(1),
                "fisher_mala",
                target.logdensity_fn,
                x0,
                num_warmup=20_000,
                num_samples=20_000,
                initial_step_size=guess,
                find_step_size=search,
            )
            ess = fm.ess(r, method="paper", per_chain=True).min(axis=1)
            rows.append(
                {
                    "search": search,
                    "initial_step_size": guess,
                    "min_ess_mean": float(ess.mean()),
                    "min_ess_sd": float(ess.std()),
                    "final_step_size": float(np.mean(r.parameters.step_size)),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def memory():
    target = fm.targets.gaussian("standard785", np.zeros(785), np.eye(785))
    x0 = target.initial_positions(jax.random.key(0), 10)
    start = time.perf_counter()
    r = fm.sample(
        jax.random.key(1),
        "fisher_mala",
        target.logdensity_fn,
        x0,
        num_warmup=1_000,
        num_samples=20_000,
    )
    draws_mb = np.asarray(r.samples).nbytes / 2**20
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "draws_shape": list(np.shape(r.samples)),
        "draws_mb": draws_mb,
        "peak_rss_mb": peak_mb,
        "seconds": time.perf_counter() - start,
    }


def main():
    out = {"device": str(jax.devices()[0])}
    out["progress_bar"] = progress_overhead()
    print(json.dumps(out["progress_bar"]), flush=True)
    out["memory"] = memory()
    print(json.dumps(out["memory"]), flush=True)
    out["initial_step_size"] = initial_guess()
    RESULTS.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
