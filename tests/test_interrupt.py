"""Ctrl-C on `fedsim train`: the run stops (in process: the training thread is interrupted at its
next step, not left to finish, nor killed mid-write at exit), the command exits 130 naming the
run, and the run's status.json says it failed, interrupted; a finished run it was replacing is
put back. A fresh-clone walk found a traceback, 'terminate called without an active exception'
(exit -6) and a status.json left 'running' for good. A Flower run past the command's --timeout
ends alike (failed, timed out; exit 1), and a rerun's progress shows only its own."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from app import run_status
from app.run_status import RunStatus
from tests.test_byo import write_parties
from tests.test_cli import FEDSIM

GIVEN = ("--engine", "inprocess", "--recipe", "given", "--no-yardstick")


def _as_a_terminals_command() -> None:
    """The signals' dispositions as a terminal's foreground command has them, whatever the test runner's:
    a job a non-interactive shell starts in the background (`scripts/test.sh &`) inherits SIGINT
    ignored (POSIX), and Python then keeps it ignored: the run trained on for 120 s."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # and SIGHUP, which `nohup` ignores
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


def _train(data: Path, out: Path, *extra: str) -> subprocess.Popen:
    argv = [FEDSIM, "train", "--dataset", "csv", "--data-dir", str(data), "--out-dir", str(out), *GIVEN, *extra]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_as_a_terminals_command
    )


def _wait_training(run: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Until the run writes its progress in the training phase (a bound for a loaded machine)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        progress = run / "progress.json"
        if progress.exists() and json.loads(progress.read_text() or "{}").get("phase") == "training":
            return
        time.sleep(0.2)
    raise AssertionError(f"the run did not reach training: {proc.poll()!r}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["INT", "TERM", "HUP"])
def test_ctrl_c_stops_an_in_process_run_and_marks_it_failed(tmp_path, sig):
    """And `kill` (SIGTERM: a CI's cancel, a scheduler) or a closed terminal (SIGHUP) alike: each
    left the status 'running' for good, hiding a finished run it replaced from report and predict."""
    (tmp_path / "data").mkdir()
    write_parties(tmp_path / "data")
    out, run = tmp_path / "runs", tmp_path / "runs" / "r"
    # thousands of epochs (minutes of steps), interrupted as it trains
    proc = _train(tmp_path / "data", out, "--run-name", "r", "--epochs", "5000", "-c", "patience=0")
    try:
        _wait_training(run, proc)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)  # a step of this run is milliseconds: 120 s is load's margin
    except subprocess.TimeoutExpired:  # say what the run was doing
        proc.kill()
        stdout, stderr = proc.communicate()
        raise AssertionError(f"no exit 120 s after {sig!r}; status {run_status.read(run)}; stderr {stderr[-3000:]}")
    finally:
        proc.kill()  # a run that ignored the interrupt would train for minutes after the test
    assert proc.returncode == 128 + sig, stderr[-3000:]  # as a shell reports the signal
    assert f"fedsim train: interrupted ({signal.Signals(sig).name})" in stderr and str(run) in stderr
    assert "Traceback" not in stderr and "terminate called" not in stderr, stderr[-3000:]
    st = run_status.read(run)
    assert st["state"] == "failed" and "interrupted" in st["error"] and not (run / "summary.json").exists()


def test_a_run_left_running_by_an_interrupt_is_marked_failed_and_an_older_one_is_not(tmp_path):
    """A Flower run's ServerApp dies with the processes the interrupt stops, its status still
    'running': the command marks it failed; a status from before the command is not its to touch."""
    status = RunStatus(tmp_path, "flower")
    status.start()
    since = status.record["started"]
    run_status.mark_stopped(tmp_path, since=since + 1)  # started before this command: left as it is
    assert run_status.read(tmp_path)["state"] == "running"
    run_status.mark_stopped(tmp_path, since=since)
    st = run_status.read(tmp_path)
    assert st["state"] == "failed" and "interrupted" in st["error"] and st["ended"] >= since


def test_an_interrupted_run_puts_back_the_finished_run_it_was_replacing(tmp_path):
    with RunStatus(tmp_path, "flower").recording() as finished:
        finished.start()
        (tmp_path / "summary.json").write_text('{"test": 1}')
    again = RunStatus(tmp_path, "flower")
    again.start()  # the finished run's files set aside while this one runs
    assert not (tmp_path / "summary.json").exists()
    run_status.mark_stopped(tmp_path, since=again.record["started"])
    assert (tmp_path / "summary.json").read_text() == '{"test": 1}'  # the folder's finished run again
    attempt = json.loads((tmp_path / run_status.LAST_ATTEMPT).read_text())
    assert attempt["state"] == "failed" and "interrupted" in attempt["error"]
    assert "interrupted" in run_status.problem(tmp_path, since=attempt["started"])


def test_a_flower_run_past_its_timeout_is_marked_failed_and_the_finished_run_put_back(tmp_path, monkeypatch, capsys):
    """`fedsim train --timeout` killed the Flower run at its deadline but, unlike Ctrl-C, left its
    status 'running' for good and the finished run it was replacing hidden in .previous/: predict
    and `app.run_status check` refused the folder as still running. A stand-in for Flower that
    starts the run and never ends (deploy.localsim.start_simulation)."""
    import argparse

    from deploy import localsim
    from fedsim.train import engine

    with RunStatus(tmp_path, "flower").recording() as finished:
        finished.start()
        (tmp_path / "summary.json").write_text('{"test": 1}')

    def never_ending(values, home, num_supernodes, output):
        RunStatus(tmp_path, "flower").start()  # the ServerApp starts the run, then trains past the deadline
        return subprocess.Popen(["sleep", "120"]), 0

    monkeypatch.setattr(localsim, "start_simulation", never_ending)
    monkeypatch.setattr(localsim, "stop_superlink", lambda port: 0)
    args = argparse.Namespace(deployment=None, timeout=1.0)
    values = {"out-dir": str(tmp_path / "out"), "run-name": "r"}
    assert engine(args, 1, in_process=False)(values, tmp_path) == 1
    err = capsys.readouterr().err
    assert "timed out" in err and "--timeout" in err, err
    assert (tmp_path / "summary.json").read_text() == '{"test": 1}'  # the folder's finished run again
    attempt = json.loads((tmp_path / run_status.LAST_ATTEMPT).read_text())
    assert attempt["state"] == "failed" and "timed out" in attempt["error"]


def test_an_earlier_runs_progress_is_not_shown_as_this_runs(tmp_path):
    """A rerun under a finished run's name showed that run's last progress ("done epoch 0/1 loss=...
    | val ...") as its own first line, before it had written any: progress from before the command
    started is not this run's."""
    from fedsim.watch import watch

    old = {"phase": "done", "epoch": 0, "max_epochs": 1, "step": 9, "steps_per_epoch": 9, "loss": 0.71}
    (tmp_path / "progress.json").write_text(json.dumps(old))
    os.utime(tmp_path / "progress.json", (1e9, 1e9))  # written long before this command
    calls, plain = [], io.StringIO()

    def sleep(seconds: float) -> None:
        calls.append(seconds)
        if len(calls) == 2:  # the new run's first progress
            now = {"phase": "training", "epoch": 0, "max_epochs": 5, "step": 1, "steps_per_epoch": 9}
            (tmp_path / "progress.json").write_text(json.dumps(now))

    since = time.time()  # the command's run starts
    watch(lambda: len(calls) >= 3, tmp_path, label="run", stream=plain, clock=lambda: 7.0, sleep=sleep, since=since)
    lines = [line.split(" [")[0] for line in plain.getvalue().splitlines()]
    assert lines == ["run: training epoch 0/5"], lines


def test_an_in_process_run_past_its_timeout_stops_and_a_timeout_that_is_not_positive_is_refused(tmp_path, capsys):
    """`--timeout` stopped only a Flower run: in process the run trained on past it, exit 0, and
    `--timeout 0` or `-5` were taken."""
    from fedsim.cli import main as fedsim

    (tmp_path / "data").mkdir()
    write_parties(tmp_path / "data")
    out, run = tmp_path / "runs", tmp_path / "runs" / "r"
    argv = ["train", "--dataset", "csv", "--data-dir", str(tmp_path / "data"), "--out-dir", str(out), *GIVEN]
    for bad in ("0", "-5", "nan"):
        assert fedsim([*argv, "--run-name", "r", "--timeout", bad]) == 2
        assert "--timeout must be a number of seconds > 0" in capsys.readouterr().err
    assert not run.exists()
    # thousands of epochs (minutes of steps): stopped at 5 s, after loading and linking
    assert fedsim([*argv, "--run-name", "r", "--epochs", "5000", "-c", "patience=0", "--timeout", "5"]) == 1
    assert "timed out" in capsys.readouterr().err
    st = run_status.read(run)
    assert st["state"] == "failed" and "timed out" in st["error"] and not (run / "summary.json").exists()
