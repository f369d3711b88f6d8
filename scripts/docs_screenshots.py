"""Build the docs, serve them on localhost and screenshot every page with headless Chromium.

    .venv/bin/python scripts/docs_screenshots.py [--out outputs/docs_screenshots]

Needs Chromium (Debian: ``apt-get install chromium``); not a CI requirement (CI runs
``scripts/check_site.py --chromium`` on the built HTML instead). Look at the PNGs
before you ship docs.
"""

import argparse
import functools
import http.server
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "docs_screenshots")
    parser.add_argument("--height", type=int, default=2400)
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("Chromium not found: apt-get install chromium")
    site = Path(tempfile.mkdtemp())
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                    str(site)], cwd=ROOT, check=True, env={"NO_MKDOCS_2_WARNING": "1",
                                                           "PATH": "/usr/bin:/bin"})
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    args.out.mkdir(parents=True, exist_ok=True)
    profile = tempfile.mkdtemp()
    try:
        for page in sorted(site.rglob("index.html")):
            rel = page.parent.relative_to(site)
            top = str(rel) == "."
            name = "home" if top else str(rel).replace("/", "_")
            path = "" if top else rel.as_posix() + "/"
            url = f"http://127.0.0.1:{server.server_port}/{path}"
            png = args.out / f"{name}.png"
            subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}",
                            f"--window-size=1280,{args.height}", f"--screenshot={png}", url],
                           check=True, capture_output=True, timeout=120)
            print(f"{url} -> {png}")
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
