"""The experiment runner: runs a sweep file, resumes it, tabulates mean ± std, draws plots."""

import json

from bench.sweep import run_sweep

SWEEP = """
datasets = ["synthetic"]
seeds = [0, 1]
x = "k"
[set]
epochs = 1
n-rows = 400
batch-size = 64
[variants]
"K=3" = { method = "fedsim", k = 3 }
"K=6" = { method = "fedsim", k = 6 }
combine = { method = "combine", only = ["synthetic"] }
exact = { method = "exact", only = ["frog"] }
"""


def test_a_sweep_runs_resumes_and_tabulates(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(SWEEP)
    logs = []
    md, pngs = run_sweep(path, root=tmp_path / "runs", log=logs.append)
    assert len(logs) == 6  # 3 applicable variants x 2 seeds; exact only applies to frog
    root = tmp_path / "runs" / "tiny"
    rows = (root / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + 6 and rows[0].startswith("dataset,variant,seed,metric,test")
    assert "| K=3 | " in md and " ± " in md and "| exact |" not in md
    assert {p.name for p in pngs} == {"synthetic.png", "synthetic-vs-k.png"} and all(p.stat().st_size > 0 for p in pngs)
    # a resumed sweep runs nothing again and reports the same table
    summary = json.loads((root / "synthetic" / "K=3" / "s0" / "summary.json").read_text())
    again_logs = []
    md2, _ = run_sweep(path, root=tmp_path / "runs", log=again_logs.append)
    assert again_logs == [] and md2.split("\n")[4:] == md.split("\n")[4:]
    assert json.loads((root / "synthetic" / "K=3" / "s0" / "summary.json").read_text()) == summary
