"""The examples run, and the README's set-up commands are the ones CI runs."""

import ast
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_quickstart_runs_in_quick_mode(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "quickstart.py"),
            "--quick",
            "--chains",
            "2",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_no_nan(proc)
    assert "fisher_mala" in proc.stdout
    # each chain's learned preconditioner is closer to the truth than the identity is
    identity = float(re.search(r"([\d.]+) is the identity's", proc.stdout).group(1))
    distances = numbers_after("by chain:", proc.stdout)
    assert len(distances) >= 2 + 2 and max(distances[:2]) < identity, (distances, identity)
    # quick mode is long enough to show what the example is about: FisherMALA ahead of MALA
    ess = {
        name: float(re.search(rf"^{name} +bulk ESS min +([\d.]+)", proc.stdout, re.M).group(1))
        for name in ("mala", "fisher_mala")
    }
    assert ess["fisher_mala"] > 5 * ess["mala"], ess
    # each sampler's whole call is timed beside its phases
    assert len(re.findall(r"the whole fm.sample call [\d.]+ s", proc.stdout)) == 2, proc.stdout
    assert (tmp_path / "preconditioner.png").stat().st_size > 1000
    assert (tmp_path / "fisher_mala.nc").stat().st_size > 1000


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.+?)\n```", readme)
    assert len(commands) == 2, commands
    quickstart, tests = commands
    assert "examples/quickstart.py" in quickstart
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci, (tests, ci)


def assert_no_nan(proc):
    """A NaN or inf anywhere in an example's output fails (warnings included)."""
    for stream in (proc.stdout, proc.stderr):
        assert not re.search(r"\b(nan|inf)\b", stream, re.IGNORECASE), stream[-3000:]


def numbers_after(label, text):
    """The numbers on the line that contains ``label``, after it."""
    line = next(line for line in text.splitlines() if label in line)
    return [float(v) for v in re.findall(r"-?\d+\.?\d*(?:e[-+]?\d+)?", line.split(label, 1)[1])]


def summary_value(sampler, field, text):
    """A value of fm.summary's line for ``sampler`` (e.g. field "bulk ESS min")."""
    line = next(line for line in text.splitlines() if line.startswith(sampler) and field in line)
    return float(re.search(re.escape(field) + r"\s+(-?[\d.e+-]+)", line).group(1))


def check_logistic_regression(out):
    """Quick mode still shows the example's point: FisherMALA far ahead of MALA."""
    fisher = summary_value("fisher_mala", "bulk ESS min", out)
    assert fisher >= 200.0 and fisher >= 20 * summary_value("mala", "bulk ESS min", out)
    assert 0.3 < summary_value("fisher_mala", "acc", out) < 0.9


def check_scan_composition(out):
    assert 0.3 < numbers_after("acceptance", out)[0] <= 1.0
    assert min(numbers_after("min / median ESS per chain:", out)) >= 2.0


def check_numpyro_model(out):
    # posteriordb's reference (non-centred eight schools): mu 4.41, tau 3.60
    mu, tau = numbers_after("posterior mean of mu", out)
    assert abs(mu - 4.41) < 1.5 and 1.0 < tau < 8.0, (mu, tau)
    assert summary_value("fisher_nuts", "bulk ESS min", out) >= 100.0
    assert "fm.to_arviz variables: mu, tau, theta, theta_raw" in out


def check_gpu(out):
    assert summary_value("fisher_mala", "bulk ESS min", out) >= 2.0
    assert 0.3 < summary_value("fisher_mala", "acc", out) <= 1.0


def check_custom_schedule(out):
    rows = [line for line in out.splitlines() if re.match(r"^(1/n|n\^|optax|constant)", line)]
    assert len(rows) == 4, out
    for row in rows:  # name, window, 4 distances (each below the identity's 68), ESS, R-hat
        values = [float(v) for v in re.findall(r"\s(-?\d+\.\d+|\d+)(?=\s|$)", row)]
        window, *distances, ess, rhat = values[-7:]
        assert 1.0 <= rhat < 2.0, row
        assert window >= 100 and max(distances) < 68.0 and ess >= 5.0, row
    assert "capped" in rows[2]  # the optax schedule would forget faster than d signals


def check_own_sampler(out):
    """The page "Write your own sampler": fm.sample runs the composed warm-up (converged,
    tuned), and BlackJAX's loop runs the adaptive step (it learns the 0.95 correlation)."""
    assert summary_value("custom_sampler", "max R-hat", out) < 1.02
    assert summary_value("custom_sampler", "bulk ESS min", out) >= 500.0
    assert 0.45 < summary_value("custom_sampler", "acc", out) < 0.7  # dual averaging to 0.574
    assert len(numbers_after("tuned sigma^2", out)) == 4
    draws, correlation = numbers_after("run_inference_algorithm:", out)
    assert draws == 1500 and 0.9 < correlation < 0.99, out


EXAMPLES = {
    "logistic_regression.py": ["--quick"],
    "scan_composition.py": ["--quick"],
    "numpyro_model.py": ["--quick"],
    "gpu.py": ["--quick", "--chains", "2", "--dataset", "ripley"],
    "custom_schedule.py": ["--quick"],
    "own_sampler.py": ["--quick"],
}


CHECKS = {
    "logistic_regression.py": check_logistic_regression,
    "scan_composition.py": check_scan_composition,
    "numpyro_model.py": check_numpyro_model,
    "gpu.py": check_gpu,
    "custom_schedule.py": check_custom_schedule,
    "own_sampler.py": check_own_sampler,
}


#: Examples whose kernels other tests already check (tests/test_numpyro_kernel.py runs the
#: NumPyro kernels against NumPyro's NUTS; tests/test_fisher_kernel.py and
#: tests/reliability/test_properties.py run learning-rate schedules through the kernel):
#: run with ``-m slow`` to keep CI under 15 minutes.
SLOW_EXAMPLES = ("numpyro_model.py", "custom_schedule.py")


@pytest.mark.parametrize(
    "script",
    [pytest.param(s, marks=pytest.mark.slow) if s in SLOW_EXAMPLES else s for s in EXAMPLES],
)
def test_examples_run_in_quick_mode(script, tmp_path):
    args = [sys.executable, str(ROOT / "examples" / script), *EXAMPLES[script]]
    if script == "logistic_regression.py":
        args += ["--out", str(tmp_path)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_no_nan(proc)
    CHECKS[script](proc.stdout)


def test_paper_reproduction_pipeline_quick_mode(tmp_path):
    """benchmarks.paper end to end on a few small cells: tables and figures are produced."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.paper", "quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "results.md").read_text()
    assert "| FisherMALA |" in text and "reduced: 300 + 300 iterations, 2 repetitions" in text
    for name in (
        "frobenius_gaussian_2d.png",
        "gp_covariance.png",
        "logtarget_gp.png",
        "step_sizes.png",
    ):
        assert (tmp_path / "images" / "results" / name).stat().st_size > 1000
    records = list((tmp_path / "results").glob("gp/fisher_mala/rep*.json"))
    assert len(records) == 2


def test_performance_page_is_rendered_from_the_committed_results(tmp_path):
    """docs/performance.md is exactly what its renderer writes from benchmarks/results."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import render_performance, templating

    page = render_performance.render(tmp_path)
    assert page.read_text() == (ROOT / "docs" / "performance.md").read_text()
    text = page.read_text()
    assert "## 6. On a GPU" in text and "{{" not in text
    # the prose lives in the template; the renderer refuses a placeholder without a value
    # and a value without a placeholder
    with pytest.raises(ValueError, match="missing \\['b'\\]"):
        templating.fill("{{a}} {{b}}", {"a": 1})
    with pytest.raises(ValueError, match="unused \\['c'\\]"):
        templating.fill("{{a}}", {"a": 1, "c": 2})
    assert templating.fill("x {{a}} y", {"a": 3}) == "x 3 y"


def test_loop_threads_experiment_reports_every_variant():
    sys.path.insert(0, str(ROOT))
    from benchmarks import step_cost

    row = step_cost.loop_threads(dim=16, length=2, rounds=1)
    for name in ("R@v", "v@R"):
        for where in ("call", "loop", "unrolled"):
            assert 0 < row[f"{name} {where}"] < 1e6
    for kind in ("frozen", "adaptive"):
        for where in ("loop", "unrolled"):
            assert 0 < row[f"fisher {kind} {where}"] < 1e6


def test_fisher_nuts_page_shows_the_committed_race(tmp_path):
    """docs/fisher_nuts.md's race tables are what the harness renders from the results."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import versus_blackjax

    committed = (ROOT / "docs" / "fisher_nuts.md").read_text()
    page = tmp_path / "fisher_nuts.md"
    page.write_text(committed)
    assert versus_blackjax.write_whitened_docs(page) == committed


def test_large_problems_page_shows_the_committed_scaling_runs(tmp_path):
    """docs/large_problems.md's tables are what benchmarks/scaling.py renders."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import scaling

    committed = (ROOT / "docs" / "large_problems.md").read_text()
    page = tmp_path / "large_problems.md"
    page.write_text(committed)
    assert scaling.write_docs(page) == committed
    assert "| precond | " in committed and "| data | " in committed


def test_scaling_cells_run_at_a_small_d():
    """The scaling benchmark's cells run against today's kernels (the dense one was left
    calling an older step signature once): a few iterations each, on one CPU device."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import scaling

    dense = scaling.cell("precond", 32, 1, 2, 100)
    low = scaling.low_rank_cell(64, 4, 2)
    for record in (dense, low):
        assert record["us_per_iteration"] > 0 and record["dim"] in (32, 64), record
    assert dense["held_bytes_per_device"] == 4 * 32 * 32
    assert dense["collective_bytes_per_iteration"] == 0  # one device: nothing exchanged


def test_reliability_page_shows_the_committed_checks(tmp_path):
    """docs/reliability.md's table of the checks is what benchmarks/run_checks.py renders."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import run_checks

    committed = (ROOT / "docs" / "reliability.md").read_text()
    page = tmp_path / "reliability.md"
    page.write_text(committed)
    assert run_checks.write_docs(page) == committed
    assert "| none |" in committed and "rejection_streak" in committed


def test_site_check_finds_raw_tex_and_broken_images(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import check_site

    (tmp_path / "img.png").write_bytes(b"png")
    good = tmp_path / "good.html"
    good.write_text(
        '<p>MathML <math><mi>A</mi></math> and <code>\\(x\\)</code></p><img src="img.png">'
    )
    bad = tmp_path / "bad.html"
    bad.write_text('<p>raw \\(A^{-1}\\) here</p><img src="missing.png">')
    assert check_site.problems(good, tmp_path) == []
    found = check_site.problems(bad, tmp_path)
    assert any("raw TeX" in f for f in found) and any("broken image" in f for f in found)
    assert check_site.main([str(tmp_path)]) == 1


def test_site_check_measures_wide_tables_and_figures_far_down_in_chromium(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import check_site

    browser = check_site.chromium_binary()
    if browser is None:
        pytest.skip("no Chromium on the PATH (CI installs it: .ci/run)")
    wide = tmp_path / "wide.html"
    wide.write_text('<html><body><table><tr><th>target</th><td style="min-width:3000px">'
                    "x</td></tr></table></body></html>")  # fmt: skip
    tall = tmp_path / "tall.html"
    tall.write_text('<html><body><div style="height:9000px">text</div></body></html>')
    fits = tmp_path / "fits.html"
    fits.write_text('<html><body><table><tr><th>target</th><td>1.0</td></tr></table>'
                    '<div style="height:3000px"></div></body></html>')  # fmt: skip
    assert any("'target'" in f and "px wide" in f
               for f in check_site.layout_problems(wide, tmp_path, browser))  # fmt: skip
    assert any("(no figure)" in f for f in check_site.layout_problems(tall, tmp_path, browser))
    assert check_site.layout_problems(fits, tmp_path, browser) == []


def test_sphinx_roles_are_rendered_and_a_raw_one_fails_the_site_check(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(ROOT / "docs_hooks"))
    import check_site
    import roles

    raw = ("<p>See :func:<code>fm.sample</code> and :class:<code>~fisher_mala.schedule.Phase"
           "</code>. For example::</p><pre><code>x[::2]</code></pre>")  # fmt: skip
    page = tmp_path / "raw.html"
    page.write_text(raw)
    assert any("Sphinx" in f for f in check_site.problems(page, tmp_path))
    rendered = roles.on_page_content(raw, None, None, None)
    assert rendered == ("<p>See <code>fm.sample</code> and <code>Phase</code>. For example:"
                        "</p><pre><code>x[::2]</code></pre>")  # fmt: skip
    page.write_text(rendered)
    assert check_site.problems(page, tmp_path) == []


def test_docs_hook_renders_tex_as_mathml():
    pytest.importorskip("latex2mathml")
    sys.path.insert(0, str(ROOT / "docs_hooks"))
    import mathml

    assert mathml.plain("A^{-1}") == "A⁻¹"
    html = mathml._MATH.sub(
        lambda m: mathml.to_mathml(m, None),
        '<span class="arithmatex">\\(R R^\\top\\)</span>',
    )
    assert html.startswith("<math") and "\\(" not in html


def module_imports(package: pathlib.Path) -> dict[str, set[str]]:
    """Every module of the package in folder ``package`` with the modules of the same package
    it imports, anywhere in its code (inside functions too; not under ``if TYPE_CHECKING:``).

    ``from P import name`` imports the module ``P.name`` when there is one, else ``P``; the
    packages that a submodule's import goes through count too, except the importer's own.
    """
    files = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in files.items():
        edges = set()

        def add(target, explicit, name=name, edges=edges):
            # importing a.b.c runs a and a.b first: edges, unless the importer is inside them
            if (
                target in files
                and target != name
                and (explicit or not name.startswith(target + "."))
            ):
                edges.add(target)

        def add_path(dotted, add=add):
            parts = dotted.split(".")
            for i in range(1, len(parts)):
                add(".".join(parts[:i]), explicit=False)
            add(dotted, explicit=True)

        pending = list(ast.parse(path.read_text(), str(path)).body)
        while pending:
            node = pending.pop()
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                pending.extend(node.orelse)
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add_path(alias.name)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the importer's package, up level - 1
                    here = name.split(".")[: None if path.name == "__init__.py" else -1]
                    base = ".".join(here[: len(here) - node.level + 1] + [base] * bool(base))
                for alias in node.names:
                    if f"{base}.{alias.name}" in files:  # a submodule
                        add_path(f"{base}.{alias.name}")
                    else:
                        add_path(base)
            pending.extend(ast.iter_child_nodes(node))
        graph[name] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles a depth-first search meets (one per edge back to a module on its path),
    each as ``[a, b, ..., a]``."""
    cycles, done, path = [], set(), []

    def visit(module):
        path.append(module)
        for target in sorted(graph[module]):
            if target in path:
                cycle = path[path.index(target) :]
                start = cycle.index(min(cycle))  # one spelling per cycle
                cycle = cycle[start:] + cycle[:start]
                if cycle + cycle[:1] not in cycles:
                    cycles.append(cycle + cycle[:1])
            elif target not in done:
                visit(target)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module)
    return cycles


def test_import_cycle_check_sees_lazy_and_relative_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from pkg import a\n",
        "a.py": "import os\nimport pkg.b\n",
        "b.py": "def f():\n    from .sub import c\n",  # lazy and relative
        "sub/__init__.py": "",
        "sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from pkg import a\nelse:\n    from .. import d\n",
        "d.py": "from pkg import a as _\nfrom pkg.sub import c\n",
    }
    for name, text in files.items():
        (package / name).write_text(text)
    graph = module_imports(package)
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.sub", "pkg.sub.c"},
        "pkg.sub": set(),
        "pkg.sub.c": {"pkg.d"},
        "pkg.d": {"pkg.a", "pkg.sub", "pkg.sub.c"},
    }
    assert import_cycles(graph) == [
        ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.d", "pkg.a"],
        ["pkg.d", "pkg.sub.c", "pkg.d"],
    ]
    assert import_cycles({"p.a": {"p.b"}, "p.b": set()}) == []


@pytest.mark.parametrize("package", ["fisher_mala", "benchmarks"])
def test_no_import_cycles(package):
    """No module of ``package`` imports one that imports it back, directly or through others
    (imports inside functions count: a lazy import that dodges a cycle at run time hides it)."""
    cycles = import_cycles(module_imports(ROOT / package))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)
