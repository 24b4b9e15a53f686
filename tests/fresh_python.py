"""A fresh interpreter for tests of what a process imports: ``python -c CODE`` in the checkout's
root (its own code first on sys.path), its stdout returned; a failure raises with its stderr."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def fresh_python(code: str, timeout: float = 120.0) -> str:
    """The stdout of ``code`` run by a new interpreter (the one running the tests) in the repo root."""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise AssertionError(f"python -c exited {out.returncode}:\n{out.stderr[-3000:]}")
    return out.stdout


def imported_after(statements: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter holds once it has run ``statements`` (which may
    assert what they did: a failed assertion fails the call)."""
    code = f"import sys\n{statements}\nprint(repr(sorted(m for m in {tuple(modules)!r} if m in sys.modules)))"
    return ast.literal_eval(fresh_python(code).strip().splitlines()[-1])
