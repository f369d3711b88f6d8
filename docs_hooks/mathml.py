"""MkDocs hook: render the pages' TeX as MathML at build time (no script, no network).

``pymdownx.arithmatex`` (generic mode) wraps each formula in ``<span class="arithmatex">
\\(...\\)</span>`` or ``<div class="arithmatex">\\[...\\]</div>``; this hook replaces the
wrapper by the MathML that ``latex2mathml`` writes, which browsers render natively. A
formula it cannot convert fails the build (``mkdocs build --strict``), naming the page.
"""

import html
import re

from latex2mathml.converter import convert

_MATH = re.compile(
    r'<(?P<tag>span|div) class="arithmatex">(?P<body>.*?)</(?P=tag)>', re.DOTALL
)
_DELIMITERS = {"\\(": ("\\)", "inline"), "\\[": ("\\]", "block")}


def to_mathml(match, page):
    body = html.unescape(match.group("body")).strip()
    opening = body[:2]
    closing, display = _DELIMITERS[opening]
    if not body.endswith(closing):
        raise ValueError(f"{page.file.src_path}: unbalanced formula {body!r}")
    tex = body[2:-2].strip()
    tex = re.sub(r"\\tag\{([^}]*)\}", r"\\qquad(\1)", tex)  # equation numbers, as text
    try:
        return convert(tex, display=display)
    except Exception as err:
        raise ValueError(f"{page.file.src_path}: cannot render {tex!r}: {err}") from err


_SUPERSCRIPTS = str.maketrans("-0123456789T", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹ᵀ")


def plain(tex: str) -> str:
    """A formula of a heading as text for the table of contents (``A^{-1}`` -> ``A⁻¹``)."""
    tex = re.sub(r"\^\{([-0-9T]+)\}|\^([0-9T])", lambda m: (m.group(1) or m.group(2))
                 .translate(_SUPERSCRIPTS), tex)
    return re.sub(r"\\([A-Za-z]+)|[{}]", lambda m: m.group(1) or "", tex)


def _plain_titles(items):
    for item in items:
        item.title = re.sub(r"\\\((.*?)\\\)", lambda m: plain(m.group(1)), item.title)
        _plain_titles(item.children)


def on_page_content(html_text, page, config, files):
    _plain_titles(page.toc)
    return _MATH.sub(lambda m: to_mathml(m, page), html_text)
