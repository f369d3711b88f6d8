"""Fail when a built docs page shows raw TeX or links an image that is not there.

    .venv/bin/python scripts/check_site.py SITE_DIR

CI runs it on the output of ``mkdocs build --strict``. A page fails when its visible text
(outside <code>, <pre> and <script>) still contains TeX delimiters (``\\(``, ``\\[``,
``$$``) or Sphinx markup (a role such as ``:func:``, a literal-block ``::``), which a
reader would see as source, or when an ``<img>`` points to a file missing from the site.
"""

import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

DELIMITERS = ("\\(", "\\)", "\\[", "\\]", "$$")
SPHINX = re.compile(r":(?:func|class|meth|mod|data|attr|obj|exc|ref|term):|\w::(?:\s|$)")


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.skip = 0
        self.text = []
        self.images = []

    def handle_starttag(self, tag, attrs):
        if tag in ("code", "pre", "script", "style"):
            self.skip += 1
        if tag == "img":
            self.images.append(dict(attrs).get("src", ""))

    def handle_endtag(self, tag):
        if tag in ("code", "pre", "script", "style") and self.skip:
            self.skip -= 1

    def handle_data(self, data):
        if not self.skip:
            self.text.append(data)


def problems(page: Path, site: Path) -> list[str]:
    """What is wrong with one built page (empty when nothing is)."""
    parser = _Page()
    parser.feed(page.read_text(encoding="utf-8"))
    found = []
    text = " ".join(parser.text)
    for delimiter in DELIMITERS:
        if delimiter in text:
            at = text.index(delimiter)
            found.append(f"raw TeX {delimiter!r} near {text[max(0, at - 40):at + 40]!r}")
    sphinx = SPHINX.search(text)
    if sphinx:
        at = sphinx.start()
        found.append(f"raw Sphinx markup near {text[max(0, at - 40):at + 40]!r}")
    for src in parser.images:
        url = urlparse(src)
        if url.scheme or src.startswith("data:"):
            continue
        target = (page.parent / unquote(url.path)).resolve()
        if not target.is_file() or site.resolve() not in target.parents:
            found.append(f"broken image {src!r}")
    return found


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    site = Path(argv[0])
    failures = {p: problems(p, site) for p in sorted(site.rglob("*.html"))}
    failures = {p: f for p, f in failures.items() if f}
    for page, found in failures.items():
        for item in found:
            print(f"{page.relative_to(site)}: {item}")
    pages = len(list(site.rglob("*.html")))
    print(f"{pages} pages checked, {len(failures)} with problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
