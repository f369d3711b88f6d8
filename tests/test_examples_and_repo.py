"""The examples run, and the README's set-up commands are the ones CI runs."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_quickstart_runs_in_quick_mode(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), "--quick", "--chains", "2",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fisher_mala" in proc.stdout
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
