"""The experiment runner: runs a sweep file, resumes it, tabulates mean ± std, draws plots."""

import json

import pytest

from experiments.sweep import Workers, run_sweep

SWEEP = """
datasets = ["synthetic"]
seeds = [0, 1]
x = "k"
[set]
epochs = 1
n-rows = 400
batch-size = 64
privacy = "off"  # the runs compare across roots: each root's in-process service draws its own noise
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
    # each run's privacy report: the strongest attack on its release (combine links by the planted truth: none)
    cells = {line.split(" | ")[0]: line.split(" | ") for line in md.splitlines() if line.startswith("| ")}
    assert "| strongest attack |" in md and cells["| combine"][5] == "-"
    assert all(c[5].endswith(" %") for name, c in cells.items() if name.startswith("| K="))
    # and the exchange's (issue 33): the strongest label attack / the primary's best inversion error
    assert "| label attack / inversion error |" in md and all(
        " / " in c[6] for n, c in cells.items() if n != "| variant"
    )
    assert {p.name for p in pngs} == {"synthetic.png", "synthetic-vs-k.png"} and all(p.stat().st_size > 0 for p in pngs)
    # a resumed sweep runs nothing again and reports the same table
    summary = json.loads((root / "synthetic" / "K=3" / "s0" / "summary.json").read_text())
    again_logs = []
    md2, _ = run_sweep(path, root=tmp_path / "runs", log=again_logs.append)
    assert again_logs == [] and md2.split("\n")[4:] == md.split("\n")[4:]
    assert json.loads((root / "synthetic" / "K=3" / "s0" / "summary.json").read_text()) == summary
    # a sweep file changed since: its runs under other settings run again, never tabulated as its own
    path.write_text(SWEEP.replace('"K=6" = { method = "fedsim", k = 6 }', '"K=6" = { method = "fedsim", k = 5 }'))
    changed_logs = []
    run_sweep(path, root=tmp_path / "runs", log=changed_logs.append)
    assert len(changed_logs) == 2  # K=6's two seeds, now at k = 5
    config = json.loads((root / "synthetic" / "K=6" / "s0" / "config.json").read_text())
    assert config["run"]["k"] == 5


def test_parallel_runs_equal_serial_runs(tmp_path):
    """--jobs runs each run in its own process; a run's result does not depend on it."""
    path = tmp_path / "tiny.toml"
    path.write_text(SWEEP)
    run_sweep(path, root=tmp_path / "serial", log=lambda m: None)
    logs = []
    run_sweep(path, root=tmp_path / "parallel", log=logs.append, workers=Workers(jobs=2))
    assert len(logs) == 6 and not any(m.startswith("FAILED") for m in logs)
    runs = sorted((tmp_path / "serial" / "tiny").glob("*/*/s*/summary.json"))
    assert len(runs) == 6
    for run in runs:
        twin = tmp_path / "parallel" / run.relative_to(tmp_path / "serial")
        a, b = json.loads(run.read_text()), json.loads(twin.read_text())
        # one thread per worker vs the default: the same run up to float summation order
        assert a["test"] == pytest.approx(b["test"], rel=1e-4) and a["best_epoch"] == b["best_epoch"], run


def test_a_failing_run_in_a_worker_fails_alone(tmp_path):
    from experiments.sweep import run_pending

    good = {"dataset": "synthetic", "n-rows": 400, "epochs": 1, "batch-size": 64, "method": "solo", "seed": 0}
    bad = {**good, "method": "no-such-method"}
    results = dict(
        run_pending([("good", good, tmp_path / "good"), ("bad", bad, tmp_path / "bad")], "inprocess", Workers(jobs=2))
    )
    assert isinstance(results["good"], dict) and "accuracy" in results["good"]["test"]
    assert isinstance(results["bad"], str) and "ConfigError" in results["bad"] and "no-such-method" in results["bad"]


def test_runs_on_ray_equal_serial_runs(tmp_path):
    """--ray local: each run a Ray task with its own thread budget; the same results."""
    import ray

    path = tmp_path / "tiny.toml"
    path.write_text(SWEEP.replace('"K=6" = { method = "fedsim", k = 6 }\n', "").replace("combine =", "# combine ="))
    run_sweep(path, root=tmp_path / "serial", log=lambda m: None)
    logs = []
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        run_sweep(path, root=tmp_path / "ray", log=logs.append, workers=Workers(ray="local", threads=1))
    finally:
        ray.shutdown()
    assert len(logs) == 2 and not any(m.startswith("FAILED") for m in logs)
    for run in sorted((tmp_path / "serial" / "tiny").glob("*/*/s*/summary.json")):
        twin = tmp_path / "ray" / run.relative_to(tmp_path / "serial")
        a, b = json.loads(run.read_text()), json.loads(twin.read_text())
        assert a["test"] == pytest.approx(b["test"], rel=1e-4) and a["best_epoch"] == b["best_epoch"], run


def test_a_variant_with_a_bad_run_config_is_refused_before_any_run(tmp_path):
    """A misspelt key was found only when its variant's run was reached, after the others had run."""
    path = tmp_path / "tiny.toml"
    path.write_text(SWEEP + 'typo = { method = "fedsim", epoch = 3 }\n')
    with pytest.raises(SystemExit, match=r"variant 'typo' on synthetic: .*unknown run-config key\(s\) \['epoch'\]"):
        run_sweep(path, root=tmp_path / "runs", log=lambda m: None)
    assert not (tmp_path / "runs").exists()  # no run started
