"""MkDocs hook: render the Sphinx roles of the docstrings as code (no raw ``:func:``).

The library's numpydoc docstrings cross-reference with Sphinx roles (``:func:`sample```,
``:class:`~fisher_mala.schedule.Phase```) and introduce literal blocks with ``::``;
mkdocstrings renders them as Markdown, which leaves ``:func:`` and ``::`` on the page.
This hook turns each role into its target in code (``~`` keeps the last component, as in
Sphinx) and a trailing ``::`` into ``:``. ``scripts/check_site.py`` fails a page that
still shows either.
"""

import re

_ROLE = re.compile(
    r":(?:py:)?(?:func|class|meth|mod|data|attr|obj|exc|ref|term):<code>([^<]*)</code>"
)
_LITERAL = re.compile(r"(\S)::(\s*</p>)")


def _code(match):
    target = match.group(1)
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"<code>{target}</code>"


def on_page_content(html, page, config, files):
    return _LITERAL.sub(r"\1:\2", _ROLE.sub(_code, html))
