"""The funnel's race cell over eight seeds with another step-size target after a plateau.

    python -m benchmarks.funnel_plateau_target 0.85 0.95   # cells cached per target

Fisher NUTS on ``eight_schools_centered`` (the race's protocol, ``benchmarks.nutpie_race``)
with :data:`fisher_mala.whitened_warmup.PLATEAU_TARGET_ACCEPTANCE` set to each value given,
against the recorded nutpie cells of the same seeds (``nutpie_race.FUNNEL_ROOTS``). Cells in
``benchmarks/results/funnel_plateau_target/<target>/seed<s>/``; prints per seed the ratio of
min bulk ESS per gradient to nutpie's, the max |z| against the reference, the divergent
transitions and the sampling-phase acceptance, then the geometric mean.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np

from benchmarks import nutpie_race

RESULTS = Path(__file__).resolve().parent / "results" / "funnel_plateau_target"
TARGET = "eight_schools_centered"


def run(value: float) -> list[tuple]:
    from fisher_mala import whitened_warmup

    whitened_warmup.PLATEAU_TARGET_ACCEPTANCE = value
    rows = []
    for seed, recorded in enumerate(nutpie_race.FUNNEL_ROOTS):
        root = RESULTS / str(value) / f"seed{seed}"
        (root / TARGET).mkdir(parents=True, exist_ok=True)
        shutil.copy(recorded / TARGET / "nutpie_low_rank.json", root / TARGET)
        nutpie_race.run([TARGET], ["fisher_nuts"], root, seed)
        fisher, nutpie = (json.loads((root / TARGET / f"{s}.json").read_text())
                          for s in ("fisher_nuts", "nutpie_low_rank"))  # fmt: skip
        ratio = fisher["bulk_min_per_grad"] / nutpie["bulk_min_per_grad"]
        rows.append((seed, ratio, fisher["reference_max_abs_z"], fisher["divergences"],
                     fisher["acceptance_mean"]))  # fmt: skip
    return rows


def main(argv=None) -> None:
    nutpie_race.use_cpu_devices()
    for value in map(float, (argv if argv is not None else sys.argv[1:])):
        rows = run(value)
        print(f"target {value}: seed, ratio to nutpie, max |z|, divergences, acceptance")
        for seed, ratio, z, div, acc in rows:
            print(f"  {seed}  {ratio:.2f}  {z:.2f}  {div}  {acc:.2f}")
        geo = np.exp(np.mean(np.log([r[1] for r in rows])))
        print(f"  geometric mean {geo:.2f}; below 0.8 in {sum(r[1] < 0.8 for r in rows)} of 8")


if __name__ == "__main__":
    main()
