"""The package's shape, checked: kernels without adaptation parameters, small functions and
classes, a top level of what a user calls, moved names that still work (with a warning)."""

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import fisher_mala as fm

PACKAGE = Path(fm.__file__).parent
#: Parameters that would make a kernel adapt (or choose how): adaptation lives in
#: fisher_mala.adaptations and is composed with kernels outside them.
ADAPTATION_PARAMETERS = {
    "adapt",
    "learning_rate",
    "step_size_learning_rate",
    "target_acceptance_rate",
    "target",
    "rho",
    "signal",
    "damping",
}


def _modules():
    for info in pkgutil.walk_packages([str(PACKAGE)], "fisher_mala."):
        if info.name.endswith(("numpyro_kernel", "pymc_model")):
            continue  # optional extras, checked by their own tests
        yield importlib.import_module(info.name)


def test_no_build_kernel_takes_an_adaptation_parameter():
    found = {}
    for module in _modules():
        build = module.__dict__.get("build_kernel")
        if callable(build):
            found[module.__name__] = set(inspect.signature(build).parameters)
    assert {"fisher_mala.mala", "fisher_mala.fisher", "fisher_mala.pooled"} <= set(found)
    offending = {
        m: p & ADAPTATION_PARAMETERS for m, p in found.items() if p & ADAPTATION_PARAMETERS
    }
    assert not offending, offending


def _code_lines(node) -> int:
    """Lines of a function or class, its docstring left out."""
    lines = node.end_lineno - node.lineno + 1
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            lines -= body[0].end_lineno - body[0].lineno + 1
    return lines


def test_functions_and_classes_are_small():
    """No function over 120 lines, no class over 300 (docstrings not counted)."""
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            limit = {ast.FunctionDef: 120, ast.AsyncFunctionDef: 120, ast.ClassDef: 300}.get(
                type(node)
            )
            if limit and _code_lines(node) > limit:
                too_long.append(f"{path.relative_to(PACKAGE)}:{node.name} {_code_lines(node)}")
    assert not too_long, too_long


def test_the_top_level_is_what_a_user_calls():
    assert 20 <= len(fm.__all__) <= 32, len(fm.__all__)
    for name in fm.__all__:
        if name in ("FisherMALAKernel", "FisherNUTSKernel", "sample_numpyro", "sample_pymc"):
            continue  # need the extras; tests/test_numpyro_kernel.py and test_pymc_model.py
        assert getattr(fm, name) is not None, name


@pytest.mark.parametrize("name", ["MALAState", "FisherMALAState", "WarmupParameters"])
def test_moved_names_still_resolve_with_a_deprecation_warning(name):
    with pytest.warns(DeprecationWarning, match=f"fisher_mala.{name}` moved"):
        moved = getattr(fm, name)
    assert moved is getattr(importlib.import_module(fm._MOVED[name]), name)
