"""Reproduce the paper's tables and figures (Section 5, Appendix E).

    python -m benchmarks.paper run table1 --targets gp,pima --samplers all --repeats 10
    python -m benchmarks.paper run variants --targets all
    python -m benchmarks.paper run noncentered
    python -m benchmarks.paper run frobenius
    python -m benchmarks.paper render            # -> docs/results.md + docs/images/results/
    python -m benchmarks.paper quick --out DIR   # CI smoke test of the whole pipeline

``benchmarks.paper_run`` runs the cells and caches them (one JSON per repetition under
``benchmarks/results/<target>/<config>/``, never recomputed for the same protocol, so an
interrupted run resumes; ``--iterations`` and ``--repeats`` give a reduced protocol, which
is recorded in the files and shown in the tables); ``benchmarks.paper_render`` turns the
cache into ``docs/results.md`` and its figures. This command line is the one module that
imports both.
"""

import argparse
from pathlib import Path

from benchmarks import paper_render
from benchmarks.paper_run import (
    DOCS,
    EXPERIMENTS,
    PAPER_ITERATIONS,
    PAPER_REPEATS,
    RESULTS,
    cmd_run,
    run_cell,
    run_frobenius,
)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="compute (or reuse) cells")
    run.add_argument("experiment", choices=[*EXPERIMENTS, "frobenius"])
    run.add_argument("--targets", default="all")
    run.add_argument("--samplers", default="all")
    run.add_argument("--repeats", type=int, default=PAPER_REPEATS)
    run.add_argument("--iterations", type=int, default=PAPER_ITERATIONS)
    run.add_argument("--every", type=int, default=100, help="frobenius: snapshot interval")
    run.add_argument("--root", type=Path, default=RESULTS)
    run.add_argument("--progress", action="store_true")
    render = sub.add_parser("render", help="tables and figures from the cache")
    render.add_argument("--root", type=Path, default=RESULTS)
    render.add_argument("--out", type=Path, default=DOCS)
    quick = sub.add_parser("quick", help="small end-to-end run (CI)")
    quick.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "run":
        cmd_run(args)
    elif args.command == "render":
        paper_render.render(args.root, args.out)
    else:
        root = args.out / "results"
        for target in ("gp", "ripley"):
            for config in ("mala", "fisher_mala", "fisher_mala-increment"):
                run_cell(target, config, 300, 2, root=root)
        run_frobenius("gaussian_2d", "fisher_mala", 600, 2, 50, root=root)
        paper_render.render(root, args.out)


if __name__ == "__main__":
    main()
