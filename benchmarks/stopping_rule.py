"""The stopping rule of Fisher NUTS's Fisher phase, measured on the race's targets.

    python -m benchmarks.stopping_rule        # writes results/stopping_rule.json
    python -m benchmarks.stopping_rule --targets eight_schools_centered --warmup 20000

Runs the race's Fisher phase (4 chains, the race's starts and keys, ``metric="dense"``)
and looks at it every 1000 adaptive iterations (one block). Proposition 4 learns the
un-normalized Fisher matrix ``F_n = (R_n R_n^T)^{-1} = lambda I + sum_{i <= n} s_i s_i^T``,
so the signals of the last block alone, whitened by the ``R`` learned before it, are

    M = R_prev^T (F_now - F_prev) R_prev = X^T X - I,   X = R_now^{-1} R_prev,

whatever the running average has accumulated. If ``R_prev`` were already right, ``M``
would be the sum of ``B`` whitened signals of covariance proportional to ``I``: its
condition number would be sampling noise, about the Marchenko-Pastur ratio for
``(d, B)`` (``fisher_mala.adaptations.stopping_rule.noise_condition_number``) if the
signals were independent.
The table gives, per look and chain, ``kappa(M)`` over that ratio; the rule
(``FisherHMCWarmup.learned``) stops at the first look where it is at most
``LEARNED_NOISE_FACTOR`` on every chain. Its effect on the race's min ESS is measured by
``python -m benchmarks.versus_blackjax --stopping-rule on|off`` (the Fisher NUTS page).
"""

import argparse
import json
from pathlib import Path

import jax
import numpy as np

import fisher_mala as fm
from benchmarks import templating
from benchmarks.race_setup import POSTERIORDB, TARGETS, race_start
from fisher_mala import whitened_warmup
from fisher_mala.adaptations.stopping_rule import (
    block_condition_number,
    noise_condition_number,
)

OUT = Path(__file__).resolve().parent / "results" / "stopping_rule.json"
WARMUP = 5000
BLOCK = 1000


def row(name: str, num_warmup: int = WARMUP) -> dict:
    with jax.enable_x64(name in POSTERIORDB):
        target = fm.targets.get(name)
        positions, key_run = race_start(target, 4)
        warmup = whitened_warmup.FisherHMCWarmup(target.logdensity_fn, metric="dense")
        fisher = warmup.fisher
        num_fisher, _ = warmup.split(num_warmup)
        keys = jax.vmap(lambda k: jax.random.fold_in(k, 0))(jax.random.split(key_run, 4))
        keys = jax.vmap(lambda k: jax.random.split(k)[0])(keys)  # fisher_stage's key
        done = fisher.num_mala_steps + BLOCK
        first = jax.jit(jax.vmap(lambda k, x: fisher.run(k, x, num_fisher, stop_after=done)))
        carry = first(keys, positions)[0]
        resume = jax.jit(jax.vmap(lambda k, c: fisher.resume(k, c, num_fisher, None, BLOCK)))
        looks = []
        while done < num_fisher:  # the race's Fisher phase is whole blocks
            new = resume(keys, carry)[0]
            done += BLOCK
            kappa = block_condition_number(
                carry[0].sqrt_precond, new[0].sqrt_precond
            )
            signals = int(np.min(new[0].count - carry[0].count))
            noise = float(noise_condition_number(target.dim, signals))
            looks.append(
                {
                    "iteration": done,
                    "signals": signals,
                    "noise": noise,
                    "ratio": [float(k / noise) for k in kappa],
                }
            )
            carry = new
        return {"target": name, "dim": target.dim, "looks": looks}


def render(path=OUT) -> str:
    """The table of ``docs/fisher_nuts.md``: ``kappa(M)`` over the noise ratio, per look."""
    rows = json.loads(path.read_text())
    iterations = [look["iteration"] for look in rows[0]["looks"]]
    header = ["target", "d", *(f"to iteration {i}" for i in iterations)]
    cells = [
        [
            r["target"],
            r["dim"],
            *(f"{min(k['ratio']):.2g}-{max(k['ratio']):.2g}" for k in r["looks"]),
        ]
        for r in rows
    ]
    return templating.table(header, cells)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--targets", help="comma-separated targets: print their looks, write nothing"
    )
    parser.add_argument("--warmup", type=int, default=WARMUP, help="with --targets")
    args = parser.parse_args(argv)
    if args.targets:
        for name in args.targets.split(","):
            for look in row(name, args.warmup)["looks"]:
                ratios = ", ".join(f"{r:.2f}" for r in look["ratio"])
                print(f"{name} to iteration {look['iteration']}: kappa / noise {ratios}")
        return
    names = [t for t in (*TARGETS, *POSTERIORDB) if t != "mnist56"]
    rows = []
    for name in names:
        rows.append(row(name))
        print(rows[-1], flush=True)
    OUT.write_text(json.dumps(rows, indent=1))
    print(render())


if __name__ == "__main__":
    main()
