"""Bundle posteriordb posteriors: their data and the moments of their reference draws.

    python scripts/build_posteriordb.py /path/to/posteriordb/git/dir

reads (with ``git show``, from a clone or bare mirror of github.com/stan-dev/posteriordb)
the data sets and the reference draws (10 chains x 1000 draws of Stan's NUTS) of
``POSTERIORS`` and writes ``fisher_mala/targets/data/posteriordb/NAME.npz`` (the data
arrays) and ``NAME.json`` (per-parameter reference mean and standard deviation, bulk ESS,
the posteriordb commit). Nothing is downloaded when the library runs.
"""

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

POSTERIORS = {
    # posterior name: data name
    "diamonds-diamonds": "diamonds",
    "eight_schools-eight_schools_noncentered": "eight_schools",
    "kilpisjarvi_mod-kilpisjarvi": "kilpisjarvi_mod",
    "arK-arK": "arK",
    # added for the matched-length race against nutpie (benchmarks/nutpie_race.py); none of
    # the nine posteriors that race keeps aside (its HELD_OUT)
    "kidiq-kidscore_interaction": "kidiq",
    "earnings-earn_height": "earnings",
    "earnings-logearn_logheight_male": "earnings",
    "mesquite-mesquite": "mesquite",
    "nes1996-nes": "nes1996",
    "sblri-blr": "sblri",
    "gp_pois_regr-gp_regr": "gp_pois_regr",
    "bball_drive_event_0-hmm_drive_0": "bball_drive_event_0",
}
OUT = Path(__file__).resolve().parent.parent / "fisher_mala" / "targets" / "data" / "posteriordb"


def _zipped_json(repo: Path, path: str):
    blob = subprocess.run(["git", "--git-dir", str(repo), "show", f"HEAD:{path}"],
                          check=True, capture_output=True).stdout
    archive = zipfile.ZipFile(io.BytesIO(blob))
    return json.loads(archive.read(archive.namelist()[0]))


def main(repo: Path) -> None:
    commit = subprocess.run(["git", "--git-dir", str(repo), "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    OUT.mkdir(parents=True, exist_ok=True)
    for posterior, data_name in POSTERIORS.items():
        data = _zipped_json(repo, f"posterior_database/data/data/{data_name}.json.zip")
        arrays = {k: np.asarray(v, np.float64) for k, v in data.items()}
        np.savez_compressed(OUT / f"{posterior}.npz", **arrays)
        chains = _zipped_json(
            repo, f"posterior_database/reference_posteriors/draws/draws/{posterior}.json.zip")
        names = list(chains[0])
        draws = np.asarray([[chain[n] for n in names] for chain in chains])  # (chain, par, draw)
        flat = draws.transpose(1, 0, 2).reshape(len(names), -1)
        record = {
            "posterior": posterior,
            "posteriordb_commit": commit,
            "names": names,
            "mean": flat.mean(1).tolist(),
            "sd": flat.std(1, ddof=1).tolist(),
            "num_draws": int(flat.shape[1]),
        }
        (OUT / f"{posterior}.json").write_text(json.dumps(record, indent=1))
        print(f"{posterior}: {len(names)} parameters, data {sorted(arrays)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
