"""Transcribe the paper's ESS tables into ``benchmarks/paper_values.json``.

    python -m benchmarks.extract_paper_values ../shared/paper/000_f7e3fab5f133f5c9.txt

Reads the LaTeX source and writes, for each table, target and method, the reported
``[mean, sd]`` of the max, median and min ESS over 10 repetitions.
"""

import json
import re
import sys
from pathlib import Path

TARGETS = {  # how the paper names a target -> our registry name
    "GP target": "gp",
    "Inhomog. Gaussian": "inhomogeneous",
    "Pima Indian": "pima",
    "Pima Indians": "pima",
    "Caravan": "caravan",
    "MNIST": "mnist56",
    "Heart": "heart",
    "German Credit": "german",
    "Australian Credit": "australian",
    "Ripley": "ripley",
}
CAPTION_TARGETS = {
    "table:neal": "inhomogeneous",
    "table:heart": "heart",
    "table:german": "german",
    "table:australian": "australian",
    "table:ripley": "ripley",
}
METHODS = {  # the paper's row names -> our sampler/configuration names
    "MALA": "mala",
    "AdaMALA": "adamala",
    "HMC": "hmc",
    "mMALA": "mmala",
    "FisherMALA": "fisher_mala",
    "FisherMALA-with-RB": "fisher_mala",
    "FisherMALA-no-RB": "fisher_mala-increment",
    "FisherMALA-paired-est": "fisher_mala-centered",
    "FisherMALA-paired est": "fisher_mala-centered",
    "FisherMALA (non-centered)": "fisher_mala-score",
}
TABLES = {
    "table:large_table": "table1",
    "table:neal": "table1",
    "table:heart": "table1",
    "table:german": "table1",
    "table:australian": "table1",
    "table:ripley": "table1",
    "table:all_rb": "variants",
    "table:non_centered": "noncentered",
}
NUMBER = r"\$(?:\{\\bf\s*)?([\d.]+)\}?\s*\\pm\s*([\d.]+)\$"


def extract(text: str) -> dict:
    out: dict = {}
    for block in re.findall(r"\\begin\{table\}(.*?)\\end\{table\}", text, re.S):
        label = re.search(r"\\label\{([^}]+)\}", block)
        if not label or label.group(1) not in TABLES:
            continue
        label = label.group(1)
        table = out.setdefault(TABLES[label], {})
        target = CAPTION_TARGETS.get(label)
        for line in block.splitlines():
            emph = re.match(r"\s*\\emph\{([^}]+)\}", line)
            if emph:
                target = TARGETS[emph.group(1).strip()]
                continue
            values = re.findall(NUMBER, line)
            if len(values) == 3:
                method = METHODS[line.split("&")[0].strip()]
                cell = {
                    k: [float(m), float(s)]
                    for k, (m, s) in zip(("max", "median", "min"), values, strict=True)
                }
                table.setdefault(target, {})[method] = cell
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    text = Path(argv[0]).read_text()
    values = extract(text)
    path = Path(__file__).with_name("paper_values.json")
    path.write_text(json.dumps(values, indent=1, sort_keys=True) + "\n")
    for table, targets in values.items():
        print(table, {t: sorted(m) for t, m in targets.items()})


if __name__ == "__main__":
    main()
