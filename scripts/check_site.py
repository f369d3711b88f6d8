"""Fail when a built docs page shows raw TeX or links an image that is not there, or, as
laid out by headless Chromium at 1200 px, has a table wider than the page or too much
page before its first figure.

    .venv/bin/python scripts/check_site.py SITE_DIR [--chromium]

CI runs it on the output of ``mkdocs build --strict``. A page fails when its visible text
(outside <code>, <pre> and <script>) still contains TeX delimiters (``\\(``, ``\\[``,
``$$``) or Sphinx markup (a role such as ``:func:``, a literal-block ``::``), which a
reader would see as source, or when an ``<img>`` points to a file missing from the site.
Chromium (``chromium`` on the PATH; ``--chromium`` makes its absence an error, as in CI)
then lays out every page in a 1200 px window: a visible table wider than the article
(a reader would scroll sideways to see its last columns) fails, and so does a page, the
API reference aside, whose first figure (or end, without one) is more than
:data:`MAX_BEFORE_FIGURE` px down.
"""

import json
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

DELIMITERS = ("\\(", "\\)", "\\[", "\\]", "$$")
SPHINX = re.compile(r":(?:func|class|meth|mod|data|attr|obj|exc|ref|term):|\w::(?:\s|$)")


#: Pixels of page a reader scrolls through before the first figure (or the end of a page
#: without one), at 1200 px wide.
MAX_BEFORE_FIGURE = 6000
WINDOW = "1200,2000"
#: Pages exempt from the figure rule: reference, read by searching, not from the top.
LONG_PAGES = ("api/index.html",)

#: Injected into a copy of each page: measures the layout once it is loaded and writes it
#: into the DOM, which ``chromium --dump-dom`` prints.
_MEASURE = """<script>window.addEventListener('load', () => setTimeout(() => {
  const content = document.querySelector('.md-content article') || document.body;
  const img = content.querySelector('img');
  const out = {height: document.documentElement.scrollHeight, room: content.clientWidth,
    figure: img ? Math.round(img.getBoundingClientRect().top + window.scrollY) : null,
    tables: []};
  content.querySelectorAll('table').forEach((t) => {
    if (t.closest('details:not([open])')) return;
    const th = t.querySelector('th');
    out.tables.push({width: t.scrollWidth, head: th ? th.textContent.trim() : ''});
  });
  const pre = document.createElement('pre'); pre.id = 'fm-measure';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
}, 200));</script>"""


def chromium_binary():
    """The headless Chromium on the PATH, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def layout(page: Path, browser: str) -> dict:
    """Chromium's measurements of ``page`` in a 1200 px window: ``height``, ``room`` (the
    article's width), ``figure`` (the first image's top, or None) and ``tables``."""
    html = page.read_text(encoding="utf-8")
    html = html.replace("</body>", _MEASURE + "</body>") if "</body>" in html else html + _MEASURE
    with tempfile.NamedTemporaryFile("w", suffix=".html", dir=page.parent) as copy:
        copy.write(html)
        copy.flush()
        dom = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={WINDOW}",
             "--virtual-time-budget=5000", "--dump-dom", Path(copy.name).as_uri()],
            capture_output=True, text=True, timeout=120,
        ).stdout  # fmt: skip
    match = re.search(r'<pre id="fm-measure">([^<]*)</pre>', dom)
    if not match:
        raise RuntimeError(f"Chromium did not lay out {page}")
    from html import unescape

    return json.loads(unescape(match.group(1)))


def layout_problems(page: Path, site: Path, browser: str) -> list[str]:
    """What a reader at 1200 px meets on ``page``: tables too wide, figures too far down."""
    measured = layout(page, browser)
    found = [
        f"a table ({t['head']!r} ...) is {t['width']} px wide, the page {measured['room']} px"
        for t in measured["tables"]
        if t["width"] > measured["room"] + 1
    ]
    first = measured["figure"] if measured["figure"] is not None else measured["height"]
    if str(page.relative_to(site)) not in LONG_PAGES and first > MAX_BEFORE_FIGURE:
        where = "its first figure" if measured["figure"] is not None else "its end (no figure)"
        found.append(f"{where} is {first} px down (at most {MAX_BEFORE_FIGURE})")
    return found


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
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")
    failures = {p: problems(p, site) for p in pages}
    browser = chromium_binary()
    if browser is None and "--chromium" in argv:
        print("--chromium: no Chromium on the PATH (apt-get install chromium)")
        return 1
    if browser is None:
        print("layout not checked: no Chromium on the PATH (apt-get install chromium)")
    else:
        for page in pages:
            failures[page] += layout_problems(page, site, browser)
    failures = {p: f for p, f in failures.items() if f}
    for page, found in failures.items():
        for item in found:
            print(f"{page.relative_to(site)}: {item}")
    print(f"{len(pages)} pages checked, {len(failures)} with problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
