"""Generated pages: prose in Markdown templates (``benchmarks/templates``), numbers from code.

A template names each generated value ``{{name}}``; :func:`fill` replaces them all.
"""

import re
from pathlib import Path

__all__ = ["TEMPLATES", "collapsed", "fill", "load", "table"]

TEMPLATES = Path(__file__).resolve().parent / "templates"
PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def fill(template: str, values: dict) -> str:
    """Replace every ``{{name}}`` of ``template``; unknown or unused names are errors."""
    names = set(PLACEHOLDER.findall(template))
    missing, unused = names - set(values), set(values) - names
    if missing or unused:
        raise ValueError(
            f"template and values disagree: missing {sorted(missing)}, unused {sorted(unused)}"
        )
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)


def load(name: str) -> str:
    """The text of ``benchmarks/templates/<name>``."""
    return (TEMPLATES / name).read_text()


def table(header, rows) -> str:
    """A Markdown table: ``header`` (column titles) and ``rows`` (cells, any values)."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def collapsed(title: str, text: str) -> str:
    """``text`` in a collapsed block titled ``title`` (``pymdownx.details``): a full table
    a reader opens when the summary beside it is not enough."""
    body = "\n".join(("    " + line) if line else "" for line in text.splitlines())
    return f'??? note "{title}"\n\n{body}\n'
