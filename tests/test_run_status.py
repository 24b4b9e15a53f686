"""A failed run is visible (issue 13, item 7): every engine keeps <run>/status.json (running /
finished / failed + the error), a new run under an old name leaves no stale summary, a refused
resume touches no file, and the repo's tools exit non-zero on a failed run."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app import modes, run_status
from app.config import ConfigError, RunConfig
from app.entity_aug import inprocess as ea_inprocess
from app.entity_aug import server as ea_server
from app.vfl import server as primary
from app.vfl.checkpoint import CheckpointError
from linkage.contracts import LinkageError
from tests.fresh_python import imported_after

REPO = Path(__file__).resolve().parents[1]
TINY = dict(dataset="synthetic", n_rows=400, epochs=1, batch_size=64)
EA_TINY = dict(dataset="synthetic", n_rows=300, mode="entity-aug", epochs=1, batch_size=32)
TOO_BIG_K = "K=10000 must be between 1 and the size of party 'secondary' (400 rows)"  # fails after the start
OLD = ("summary.json", "metrics.jsonl", "step_losses.npy")


def status(folder: Path) -> dict:
    return json.loads((folder / "status.json").read_text())


def plant_old_run(folder: Path) -> None:
    """What a finished earlier run under this name left behind."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in OLD:
        (folder / name).write_text(json.dumps({"old": True}))
    (folder / "status.json").write_text(
        json.dumps(
            {
                "state": "finished",
                "error": None,
                "started": time.time() - 3600,
                "ended": time.time() - 3000,
                "engine": "inprocess",
            }
        )
    )


def snapshot(root: Path) -> dict:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def _primary(cfg, out):
    return primary.run_primary(None, cfg)  # Solo has no secondaries: no Grid needed


def _ea_primary(cfg, out):
    return ea_server.run_ea_primary(None, cfg)


ENGINES = {  # engine -> (run it, the loader that fails, base config)
    "primary": (_primary, (primary, "primary_data"), dict(TINY, method="solo")),
    "ea_primary": (_ea_primary, (ea_server, "ea_data"), EA_TINY),
    "inprocess": (lambda cfg, out: modes.run_experiment(cfg, out), (primary, "primary_data"), TINY),  # one driver
    "ea_inprocess": (lambda cfg, out: modes.run_experiment(cfg, out), (ea_inprocess, "ea_data"), EA_TINY),
}


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_engine_marks_a_failed_rerun_failed_and_leaves_no_stale_summary(engine, tmp_path, monkeypatch):
    run, (module, loader), base = ENGINES[engine]
    out = tmp_path / "old"
    plant_old_run(out)
    seen = {}

    def failing_loader(cfg):
        seen["status"] = status(out)  # what the folder says while this run is under way
        seen["files"] = sorted(p.name for p in out.iterdir())
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(module, loader, failing_loader)
    with pytest.raises(RuntimeError, match="disk on fire"):
        run(RunConfig.of(**base, out_dir=str(tmp_path), run_name="old"), out)
    assert seen["status"]["state"] == "running" and seen["status"]["started"] > time.time() - 60
    assert not set(OLD) & set(seen["files"])  # the earlier run's results were set aside before anything else
    # the failed attempt destroyed nothing: the earlier finished run is the folder's again, and the
    # attempt's failure is what the folder reports
    assert status(out)["state"] == "finished" and set(OLD) <= {p.name for p in out.iterdir()}
    assert json.loads((out / "summary.json").read_text()) == {"old": True}
    attempt = json.loads((out / "last-attempt.json").read_text())
    assert attempt["state"] == "failed" and attempt["error"] == "RuntimeError: disk on fire"
    why = run_status.problem(out, since=attempt["started"])
    assert "failed: RuntimeError: disk on fire" in why and "is kept as it was" in why


def test_a_run_is_finished_only_after_its_summary_and_a_real_failure_is_recorded(tmp_path):
    out = tmp_path / "run"
    summary = modes.run_experiment(RunConfig.of(**TINY, method="solo", out_dir=str(tmp_path)), out)
    st = status(out)
    assert st["state"] == "finished" and st["error"] is None and st["engine"] == "inprocess"
    assert st["ended"] >= (out / "summary.json").stat().st_mtime - 1
    assert json.loads((out / "summary.json").read_text()) == summary
    with pytest.raises(LinkageError, match="K=10000"):
        modes.run_experiment(RunConfig.of(**TINY, k=10000, out_dir=str(tmp_path)), out)
    attempt = json.loads((out / "last-attempt.json").read_text())  # the finished solo run is kept
    assert attempt["state"] == "failed" and attempt["error"] == f"LinkageError: {TOO_BIG_K}"
    assert status(out) == st and json.loads((out / "summary.json").read_text()) == summary
    (out / "summary.json").unlink()  # a folder without a finished run: a failure leaves no summary
    (out / "status.json").write_text(json.dumps({**st, "state": "failed"}))
    with pytest.raises(LinkageError, match="K=10000"):
        modes.run_experiment(RunConfig.of(**TINY, k=10000, out_dir=str(tmp_path)), out)
    st = status(out)
    assert st["state"] == "failed" and st["error"] == f"LinkageError: {TOO_BIG_K}"
    assert not (out / "summary.json").exists() and not (out / "metrics.jsonl").exists()


def test_a_refused_resume_touches_no_file(tmp_path):
    cfg = RunConfig.of(**TINY, method="solo", out_dir=str(tmp_path / "out"), run_name="r")
    primary.run_primary(None, cfg)
    before = snapshot(tmp_path)
    assert "out/r/config.json" in before and "out/r/checkpoint/checkpoint.json" in before
    time.sleep(0.01)  # a rewrite would show in the mtimes
    with pytest.raises(CheckpointError, match=r"differs from the checkpoint's in \{'lr'"):
        primary.run_primary(
            None,
            RunConfig.of(**{**TINY, "lr": 0.5}, method="solo", out_dir=cfg.runtime.out_dir, run_name="r", resume=True),
        )
    with pytest.raises(CheckpointError, match="has no checkpoint"):
        primary.run_primary(
            None, RunConfig.of(**TINY, method="solo", out_dir=cfg.runtime.out_dir, run_name="never", resume=True)
        )
    assert snapshot(tmp_path) == before
    # an accepted resume (more epochs may change) is this run from the moment it is accepted
    summary = primary.run_primary(
        None,
        RunConfig.of(**{**TINY, "epochs": 2}, method="solo", out_dir=cfg.runtime.out_dir, run_name="r", resume=True),
    )
    st = status(tmp_path / "out" / "r")
    assert st["state"] == "finished" and st["resumed"] and summary["epochs_run"] == 2
    assert len((tmp_path / "out" / "r" / "metrics.jsonl").read_text().splitlines()) == 2


def write_sweep(path: Path) -> None:
    path.write_text(
        'datasets = ["synthetic"]\nseeds = [0]\n[set]\nepochs = 1\nn-rows = 400\nbatch-size = 64\n'
        '[variants]\nok = { method = "solo" }\nbig-k = { k = 10000 }\n'
    )  # a variant with a bad run config is refused before any run: tests/test_sweep.py


def test_the_sweep_exits_non_zero_naming_each_failed_run(tmp_path, monkeypatch, capsys):
    from experiments import sweep

    write_sweep(tmp_path / "tiny.toml")
    monkeypatch.setattr(
        sys, "argv", ["experiments.sweep", str(tmp_path / "tiny.toml"), "--root", str(tmp_path / "runs")]
    )
    with pytest.raises(SystemExit) as exit_:
        sweep.main()
    assert exit_.value.code not in (0, None)
    err = capsys.readouterr().err
    assert TOO_BIG_K in err  # the failed run is named, with its error
    root = tmp_path / "runs" / "tiny" / "synthetic"
    assert status(root / "ok" / "s0")["state"] == "finished"
    assert status(root / "big-k" / "s0")["state"] == "failed" and not (root / "big-k" / "s0" / "summary.json").exists()
    assert len((tmp_path / "runs" / "tiny" / "results.csv").read_text().splitlines()) == 2  # header + the one run


def test_a_flower_run_is_judged_by_its_status_not_by_flwr_or_an_old_summary(tmp_path, monkeypatch):
    """`flwr run` exits 0 when the ServerApp fails; an old summary under the name is no result."""
    from experiments import runner as common

    def flwr_exits_0(values, home, timeout):  # the ServerApp failed before it reached the run folder
        return subprocess.CompletedProcess(["flwr"], 0, "ERROR: Exit Code: 700\n", "")

    plant_old_run(tmp_path / "out" / "run")
    monkeypatch.setattr(common, "simulate", flwr_exits_0)
    with pytest.raises(RuntimeError, match="is from an earlier run") as err:
        common.run_flower({"dataset": "synthetic"}, tmp_path, "run")
    assert "Exit Code: 700" in str(err.value)

    def flwr_exits_0_after_a_failure(values, home, timeout):
        folder = Path(values["out-dir"]) / values["run-name"]
        (folder / "status.json").write_text(
            json.dumps(
                {"state": "failed", "error": f"LinkageError: {TOO_BIG_K}", "started": time.time(), "ended": time.time()}
            )
        )
        return subprocess.CompletedProcess(["flwr"], 0, "", "")

    monkeypatch.setattr(common, "simulate", flwr_exits_0_after_a_failure)
    with pytest.raises(RuntimeError, match=re.escape(f"failed: LinkageError: {TOO_BIG_K}")):
        common.run_flower({"dataset": "synthetic"}, tmp_path, "run")


def test_the_deployment_tools_exit_non_zero_on_a_failed_run(tmp_path, monkeypatch, capsys):
    """deploy.commands run and bench.deploy_cost judge a deployed run by its status, not by `flwr run`."""
    from bench import deploy_cost
    from deploy import commands as deploy

    dep = deploy.Deployment(str(tmp_path), "synthetic", "", False, ["secondary"], job="job-1")
    launched = []

    def flwr_fails_and_exits_0(dep_, run_config, timeout=3600.0):
        launched.append(run_config["run-name"])
        folder = tmp_path / "runs" / run_config["run-name"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "status.json").write_text(
            json.dumps(
                {"state": "failed", "error": "PartyError: node gone", "started": time.time(), "ended": time.time()}
            )
        )
        return subprocess.CompletedProcess(["flwr"], 0, "Exit Code: 700", "")

    monkeypatch.setattr(deploy, "flwr_run", flwr_fails_and_exits_0)
    monkeypatch.setattr(deploy.Deployment, "load", classmethod(lambda cls, folder: dep))
    monkeypatch.setattr(sys, "argv", ["deploy.cli", "run", str(tmp_path), "--run-config", "epochs=1"])
    from deploy import cli

    monkeypatch.setattr(cli, "flwr_run", flwr_fails_and_exits_0)  # deploy.cli took its own name for it
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code not in (0, None) and "failed: PartyError: node gone" in str(exit_.value.code)
    with pytest.raises(RuntimeError, match="failed: PartyError: node gone"):
        deploy_cost.deployed_run(dep, {"epochs": 1}, "s1")
    assert launched[1] == "s1"

    def no_flwr(*a, **k):
        raise AssertionError("flwr was started")

    monkeypatch.setattr(subprocess, "Popen", no_flwr)
    with pytest.raises(ConfigError, match=r"unknown run-config key\(s\) \['bogus'\]"):
        deploy.start_run(dep, {"bogus": 1})


def test_an_unknown_run_config_key_is_named_before_flower_refuses_it_unnamed(tmp_path):
    """Flower 1.41's SuperLink refuses an unknown key with "[code: 15] Invalid run configuration."
    (exit 1, key not named), so RunConfig.from_flower never sees it: the tools check first."""
    from deploy.localsim import simulate

    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"unknown run-config key\(s\) \['bogus'\]"):
        simulate({"dataset": "synthetic", "bogus": 1}, tmp_path / "home")
    assert time.monotonic() - t0 < 5 and not (tmp_path / "home").exists()  # refused before flwr started
    r = subprocess.run(
        [sys.executable, "-m", "app.run_status", "folder", f"out-dir='{tmp_path}' run-name='x'", "bogus=1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "unknown run-config key(s) ['bogus']" in r.stderr


def test_the_status_command_exits_non_zero_with_the_error(tmp_path):
    def check(folder, *extra):
        return subprocess.run(
            [sys.executable, "-m", "app.run_status", "check", str(folder), *extra],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )

    out = tmp_path / "run"
    out.mkdir()
    (out / "status.json").write_text(
        json.dumps(
            {"state": "failed", "error": "LinkageError: K too big", "started": time.time(), "ended": time.time()}
        )
    )
    r = check(out)
    assert r.returncode == 1 and "LinkageError: K too big" in r.stderr
    plant_old_run(out)
    assert check(out).returncode == 0
    r = check(out, "--since", str(time.time()))  # an earlier run's status is not this run's
    assert r.returncode == 1 and "earlier run" in r.stderr
    r = check(tmp_path / "never")
    assert r.returncode == 1 and "no status.json" in r.stderr


@pytest.mark.slow
def test_the_demo_exits_non_zero_with_the_error_of_a_failed_flower_run(tmp_path):
    """Through `flwr run` (which exits 0 here, "Exit Code: 700"): the ServerApp marks the run
    failed, removes the old summary, and scripts/demo.sh exits non-zero with the error (the one
    `flwr run` of this file; it replaces test_flower_run.py's bad-input run)."""
    from deploy.localsim import free_port, processes_mentioning

    run = tmp_path / "out" / "old"
    plant_old_run(run)
    env = {
        **os.environ,
        "FEDSIM_FLWR_HOME": str(tmp_path / "home"),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
    }
    r = subprocess.run(
        [
            str(REPO / "scripts" / "demo.sh"),
            f"out-dir='{tmp_path / 'out'}'",
            "run-name='old'",
            "dataset='synthetic'",
            "n-rows=400",
            "k=10000",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert r.returncode != 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"failed: LinkageError: {TOO_BIG_K}" in r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    # the finished run under that name is kept, the attempt's failure recorded beside it
    assert status(run)["state"] == "finished" and set(OLD) <= {p.name for p in run.iterdir()}
    assert json.loads((run / "last-attempt.json").read_text())["error"] == f"LinkageError: {TOO_BIG_K}"
    assert processes_mentioning(str(tmp_path / "home")) == []


def test_a_finished_run_whose_predecessor_was_left_aside_is_not_replaced_by_it(tmp_path):
    """A run that finished over an older one and stopped before removing .previous/: the next
    start must keep the newer run, not put the older one back."""
    out = tmp_path / "run"
    plant_old_run(out)  # the newer finished run
    (out / ".previous").mkdir()
    (out / ".previous" / "summary.json").write_text(json.dumps({"older": True}))
    (out / ".previous" / "status.json").write_text(json.dumps({"state": "finished", "started": 1.0}))
    st = run_status.RunStatus(out, "inprocess")
    with pytest.raises(RuntimeError, match="boom"):
        with st.recording():
            st.start()
            raise RuntimeError("boom")
    assert json.loads((out / "summary.json").read_text()) == {"old": True} and not (out / ".previous").exists()


def test_the_status_reader_imports_no_torch():
    """`python -m app.run_status check` (the demo's verdict, a deployment's) reads JSON files: in a
    fresh interpreter it imports neither torch nor the training stack (1.6 s of CPU a call before)."""
    assert imported_after("import app.run_status", ("torch", "pandas", "strategies.heads")) == []


def test_a_failed_rerun_puts_back_the_finished_runs_checkpoint(tmp_path):
    """A resume after a rerun that failed over a finished run goes on from the finished run (whose
    kept states are the folder's), not from the failed attempt's checkpoint."""
    from app.run_status import RunStatus

    folder = tmp_path / "r"
    finished = RunStatus(folder, "flower")
    with finished.recording():
        finished.start()
        (folder / "checkpoint").mkdir()
        (folder / "checkpoint" / "checkpoint.json").write_text("the finished run's")
        (folder / "summary.json").write_text("{}")
    rerun = RunStatus(folder, "flower")
    with pytest.raises(RuntimeError):
        with rerun.recording():
            rerun.start()
            (folder / "checkpoint").mkdir(exist_ok=True)
            (folder / "checkpoint" / "checkpoint.json").write_text("the failed attempt's")
            raise RuntimeError("the rerun fails")
    assert (folder / "checkpoint" / "checkpoint.json").read_text() == "the finished run's"


def test_a_rerun_sets_aside_the_reports_plots_and_a_report_without_a_gate_removes_an_old_one(tmp_path):
    """Plots derived from a finished run go with it: a rerun's folder shows none of the earlier
    run's, and a report of a run without a weight gate leaves no earlier run's gate plot beside it."""
    from app.run_status import RunStatus
    from fedsim.report import one_run

    folder = tmp_path / "r"
    finished = RunStatus(folder, "inprocess")
    with finished.recording():
        finished.start()
        (folder / "summary.json").write_text("{}")
        for plot in ("learning_curve.png", "weight_gate.png"):
            (folder / plot).write_bytes(b"the earlier run's")
    rerun = RunStatus(folder, "inprocess")
    rerun.start()
    assert not (folder / "learning_curve.png").exists() and not (folder / "weight_gate.png").exists()
    cfg = RunConfig.of(**TINY, method="solo", out_dir=str(tmp_path / "out"), run_name="solo")
    primary.run_primary(None, cfg)
    run = tmp_path / "out" / "solo"
    (run / "weight_gate.png").write_bytes(b"the earlier run's")  # as a gated run's report left it
    assert one_run(run) == 0 and not (run / "weight_gate.png").exists()
