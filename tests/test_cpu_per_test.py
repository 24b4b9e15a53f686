"""bench/cpu_per_test.py: each test's CPU (its own and its reaped children's) is attributed to
that test. Planted: one test whose child process burns CPU, one that does nothing; the first
ranks first, its CPU in its children (CPU time, not wall time: a loaded machine changes neither
the order nor the side)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.cpu_per_test import read_rows, summary

REPO = Path(__file__).resolve().parents[1]
PLANTED = """
import subprocess, sys

def test_burns_in_a_child():
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(4_000_000))"], check=True)

def test_idles():
    pass
"""


def test_the_burning_test_ranks_first_with_its_cpu_in_its_children(tmp_path):
    (tmp_path / "test_planted.py").write_text(PLANTED)
    out = tmp_path / "cpu"
    env = {**os.environ, "TEST_CPU_OUT": str(out), "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "bench.cpu_per_test",
        "test_planted.py",
    ]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {row["id"].split("::")[1]: row for row in read_rows(out)}
    burn, idle = rows["test_burns_in_a_child"], rows["test_idles"]
    assert burn["children"] > 0.1 and burn["children"] > burn["own"]  # the child's ~0.3 s, reaped
    assert burn["own"] + burn["children"] > 5 * (idle["own"] + idle["children"])
    lines = summary(list(rows.values()))
    assert lines[0].startswith("2 tests") and "test_burns_in_a_child" in lines[1]
