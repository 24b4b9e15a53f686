"""What a new user does by mistake costs them nothing (docs/own-data.md "Refusals you may meet"):
refused by name before any work, exit 2 for their input, and a good earlier result kept."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.test_cli import fedsim

REPO = Path(__file__).resolve().parents[1]


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def test_k_over_a_secondarys_rows_is_refused_before_flower_and_the_finished_run_keeps_every_file(tmp_path):
    """housing's listings have 400 rows: -c k=1000 over a finished run of that name exits 2 at once,
    naming the party and its rows, and the finished run's files are byte for byte as they were."""
    common = ("--dataset", "csv", "--data-dir", str(REPO / "examples" / "housing"), "--out-dir", str(tmp_path))
    done = fedsim("train", *common, "--engine", "inprocess", "--run-name", "housing", "-c", "epochs=1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    run = tmp_path / "housing"
    before = _digests(run)
    refused = fedsim("train", *common, "--run-name", "housing", "-c", "k=1000", cwd=tmp_path, timeout=120)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "k = 1000 is more than secondary 'listings''s 400 rows" in refused.stderr
    assert "Traceback" not in refused.stderr and "Exit Code" not in refused.stdout + refused.stderr
    assert _digests(run) == before  # nothing touched
