"""Issue 30: the formatter and the linter, configured in pyproject.toml ([tool.ruff]) and run
here, so CI (which runs the tests) fails on code not in the formatter's layout, an unused or
undefined name, imports out of order, or pycodestyle's errors. Fix with
`.venv/bin/ruff format . && .venv/bin/ruff check --fix .`. The size rules (tests/test_layout.py)
hold on the formatted code: they are met by structure, not by packing lines."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUFF = [sys.executable, "-m", "ruff"]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*RUFF, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_linter_finds_nothing():
    r = _ruff("check", ".")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_the_code_is_formatted():
    r = _ruff("format", "--check", ".")
    assert r.returncode == 0, "run `.venv/bin/ruff format .`:\n" + r.stdout[-4000:] + r.stderr[-2000:]


def test_the_formatter_check_can_fail(tmp_path):
    (tmp_path / "packed.py").write_text("def f(a,b): return {'a':a,'b':b}\n")
    r = subprocess.run(
        [*RUFF, "format", "--check", "--config", str(ROOT / "pyproject.toml"), str(tmp_path / "packed.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and "packed.py" in r.stdout


def test_the_linter_can_fail(tmp_path):
    (tmp_path / "bad.py").write_text("import os\nx = undefined_name\n")
    r = subprocess.run(
        [*RUFF, "check", "--config", str(ROOT / "pyproject.toml"), str(tmp_path / "bad.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and "F401" in r.stdout and "F821" in r.stdout
