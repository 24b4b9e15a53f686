"""`python -m experiments.report --sweeps A,typo` found the typo only when its turn came: after
sweep A's runs (hours for the full presets; with --existing after A's plots), and then as a
traceback. A sweep name with no conf/sweeps/<name>.toml is refused first, by name, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_misspelt_sweep_is_refused_before_any_sweep_runs(tmp_path):
    out = tmp_path / "report" / "results.md"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.report",
            "--sweeps",
            "baselines,baselinez",
            "--existing",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "'baselinez'" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "report" / "img").exists() or not any((tmp_path / "report" / "img").iterdir())
