"""What the command line shows (issue 29 items 7 and 8): the training clock, epoch numbering,
help texts, the estimate's verdict, did-you-mean, own parties' hints, the service's log, the
job's progress total and setup.sh's phases."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_training_clock_ticks_while_progress_stands_still(tmp_path):
    """A full bar (the last step of an epoch, then evaluation) used to stop rich's elapsed column
    for good: the clock must go on every second while the run is alive."""
    from fedsim.watch import watch

    (tmp_path / "progress.json").write_text(
        json.dumps({"phase": "training", "epoch": 2, "max_epochs": 10, "step": 33, "steps_per_epoch": 33, "loss": 0.5})
    )
    now, ticks, out = [100.0], [], Tty()

    def sleep(seconds: float) -> None:
        now[0] += 1.0
        ticks.append(seconds)

    watch(lambda: len(ticks) >= 6, tmp_path, label="run", stream=out, clock=lambda: now[0], sleep=sleep)
    text = out.getvalue()
    for shown in ("0:00:01", "0:00:02", "0:00:03", "0:00:04", "0:00:05"):
        assert shown in text, text
    assert "epoch 2/10" in text and "step 33/33" in text  # numbered as summary.json's best_epoch


def test_the_bar_says_what_happens_before_progress_and_nothing_off_a_terminal_before_progress(tmp_path):
    from fedsim.watch import watch

    out, calls = Tty(), []
    watch(
        lambda: len(calls) >= 2,
        tmp_path,
        label="run",
        starting="loading the data and linking, in this process",
        stream=out,
        clock=lambda: 0.0,
        sleep=calls.append,
    )
    assert "loading the data and linking, in this process" in out.getvalue()
    assert "starting Flower" not in out.getvalue()
    plain, calls = io.StringIO(), []
    watch(lambda: len(calls) >= 2, tmp_path, label="run", stream=plain, clock=lambda: 0.0, sleep=calls.append)
    assert plain.getvalue() == ""


def test_off_a_terminal_a_line_each_time_the_phase_or_the_epoch_changes(tmp_path):
    """A log or CI got nothing for a whole Flower run (minutes): now one line per phase or epoch,
    each once, with the time so far; before the run writes its progress, nothing."""
    from fedsim.watch import watch

    states = [None, ("training", 0, 5), ("training", 0, 9), ("evaluation", 0, 9), ("training", 1, 2)]
    calls, plain = [], io.StringIO()

    def sleep(seconds: float) -> None:
        calls.append(seconds)
        if len(calls) < len(states) and states[len(calls)]:
            phase, epoch, step = states[len(calls)]
            progress = {"phase": phase, "epoch": epoch, "max_epochs": 3, "step": step, "steps_per_epoch": 9}
            (tmp_path / "progress.json").write_text(json.dumps(progress))

    watch(lambda: len(calls) >= len(states), tmp_path, label="run", stream=plain, clock=lambda: 7.0, sleep=sleep)
    lines = plain.getvalue().splitlines()
    assert [line.split(" [")[0] for line in lines] == [
        "run: training epoch 0/3",
        "run: evaluation epoch 0/3",
        "run: training epoch 1/3",
    ], lines
    assert all(line.endswith("[0:00:00]") for line in lines)


def test_epochs_are_numbered_alike_in_the_bar_the_summary_line_and_the_report(tmp_path, capsys):
    from app.run_status import tracked
    from fedsim.report import headline
    from fedsim.train import report_outcome
    from fedsim.watch import _describe

    summary = {
        "dataset": "hdb",
        "method": "fedsim",
        "best_epoch": 2,
        "epochs_run": 10,
        "val": {"rmse": 1.0},
        "test": {"rmse": 2.0},
    }
    assert "epoch 2/10" in _describe({"phase": "training", "epoch": 2, "max_epochs": 10})
    assert "best epoch 2/10" in headline(summary)[0]
    since = time.time() - 1
    with tracked(tmp_path, "inprocess"):
        (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert report_outcome(tmp_path, since, "") == 0
    assert "best epoch 2/10" in capsys.readouterr().out


# ------------------------------------------------------------------------------------ help texts


def test_help_shows_no_none_defaults_and_names_each_command(capsys):
    from fedsim.cli import main, parser

    commands = parser()._subparsers._group_actions[0].choices
    for name in ("train", "predict"):
        text = commands[name].format_help()
        assert "(default: None)" not in text and "(default: )" not in text and "(default: [])" not in text, text
    predict = re.sub(r"\s+", " ", commands["predict"].format_help())
    assert "--out OUT the predictions CSV (required)" in predict
    assert re.search(r"--timeout TIMEOUT seconds before a prediction", predict), predict
    assert main(["estimate", "--help"]) == 0
    estimate = capsys.readouterr().out
    assert estimate.startswith("usage: fedsim estimate") and "fedsim delta" not in estimate
    assert main(["report", "--help"]) == 0
    report = capsys.readouterr().out
    assert "usage: fedsim report RUN" in report and "--quick" in report
    assert main(["deploy", "run", "--help"]) == 0  # a delegated command's usage names the whole command
    assert capsys.readouterr().out.startswith("usage: fedsim deploy run")


def test_service_help_says_each_default_once():
    from linkage_server.cli import parser

    serve = parser()._subparsers._group_actions[0].choices["serve"].format_help()
    assert "else none (default: none)" not in re.sub(r"\s+", " ", serve)


# ------------------------------------------------------------------------------------ verdicts


def test_estimate_prints_a_verdict_for_each_delta(tmp_path, capsys, monkeypatch):
    from linkage.quality import delta_verdict
    from linkage_server import cli

    spread = delta_verdict(top1=12.0, avg=8.0, k=20, k_avg=20)
    assert spread[0].startswith(
        "Delta vs Top1Sim = 12.000 (60.0% of its maximum K=20) > 0: linking with K=20 "
        "neighbours is expected to help over keeping only the most similar match"
    )
    assert "averaging 20 neighbours with equal weights" in spread[1]
    assert "training-free estimate" in spread[2] and "method solo" in spread[2]
    peaked = delta_verdict(top1=0.2, avg=9.0, k=20, k_avg=20)
    assert "small" in peaked[0] and "top1sim" in peaked[0]

    class Link:
        sims = np.array([[1.0, 0.9, 0.8], [0.9, 0.1, 0.0]])

    class Primary:
        k, links = 3, {"s": Link()}

    monkeypatch.setattr("linkage.store.load_primary", lambda folder: Primary())
    cli.main(["estimate", "--linkage-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "s: K=3 Delta(Top1Sim)=" in out and "Delta vs Top1Sim = " in out and "what this is:" in out


def test_an_unknown_run_config_key_gets_a_did_you_mean():
    from app.config import ConfigError, RunConfig

    with pytest.raises(ConfigError, match=r"did you mean 'batch-size' for 'bacth-size'\?"):
        RunConfig.from_flower({"bacth-size": 64})
    with pytest.raises(ConfigError) as far:
        RunConfig.from_flower({"zzzz": 1})
    assert "did you mean" not in str(far.value)


def test_a_data_dir_with_parties_toml_is_read_as_csv_or_refused_with_the_hint(capsys):
    from fedsim.cli import main, parser
    from fedsim.train import run_values

    housing = str(ROOT / "examples" / "housing")
    values = run_values(parser().parse_args(["train", "--data-dir", housing]))
    assert values["dataset"] == "csv"
    assert "holds parties.toml: training on your own parties (--dataset csv)" in capsys.readouterr().out
    assert main(["train", "--dataset", "hdb", "--data-dir", housing]) == 2
    assert "holds parties.toml (your own parties): add --dataset csv (not 'hdb')" in capsys.readouterr().err


def test_own_data_errors_name_the_file_and_its_line_numbers(tmp_path):
    from datasets.base import DatasetError
    from datasets.csv_parties import load_csv_parties
    from datasets.options import DatasetOptions

    (tmp_path / "parties.toml").write_text(
        'task = "regression"\nlabel = "y"\n[primary]\nfile = "p.csv"\nidentifiers = ["x"]\nnumeric = ["a"]\n'
        '[secondaries.s]\nfile = "s.csv"\nidentifiers = ["x"]\nnumeric = ["nope"]\n'
    )
    rows = [f"{i},{i % 3},{i * 2}" for i in range(10)]
    rows[4] = "4,1,"  # data row 4 (0-based) = line 6 of the file (header = line 1)
    (tmp_path / "p.csv").write_text("x,a,y\n" + "\n".join(rows) + "\n")
    (tmp_path / "s.csv").write_text("x,b\n" + "\n".join(f"{i},{i}" for i in range(10)) + "\n")
    with pytest.raises(DatasetError, match=r"p\.csv.*1 missing label\(s\) \(first lines of the file: \[6\]"):
        load_csv_parties(tmp_path, DatasetOptions())
    (tmp_path / "p.csv").write_text("x,a,y\n" + "\n".join(f"{i},{i % 3},{i * 2}" for i in range(10)) + "\n")
    with pytest.raises(DatasetError, match=r"party 's' \(s\.csv\): missing column\(s\) \['nope'\]"):
        load_csv_parties(tmp_path, DatasetOptions())


# ------------------------------------------------------------------------------------ the service


def test_serve_prints_where_it_listens_and_logs_requests_without_secrets(tmp_path):
    data = tmp_path / "svc"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "linkage_server",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--data-dir",
            str(data),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )  # this tree's linkage_server, whatever is installed
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()  # never blocks the test
    try:
        deadline = time.monotonic() + 60
        while not any("listening on" in x for x in lines):
            assert time.monotonic() < deadline and proc.poll() is None, f"no URL printed: {lines}"
            time.sleep(0.1)
        url = re.match(r"linkage service listening on (http://127\.0\.0\.1:\d+)\n", lines[0])
        assert url, lines
        url = url.group(1)
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).is_success:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        token = (data / "admin-token").read_text().strip()
        made = httpx.post(
            f"{url}/jobs", json={"primary": "p", "secondaries": ["s"]}, headers={"Authorization": f"Bearer {token}"}
        ).json()
        body = io.BytesIO()
        np.save(body, np.array([[1.0, 2.0], [3.0, 4.0]]))
        upload = httpx.put(
            f"{url}/jobs/{made['job']}/parties/p/identifiers",
            content=body.getvalue(),
            headers={"Authorization": f"Bearer {made['secrets']['p']}"},
        )
        assert upload.is_success, upload.text
        wrong = httpx.get(f"{url}/jobs/{made['job']}", headers={"Authorization": "Bearer not-a-secret-of-this-job"})
        assert wrong.status_code in (401, 403, 404)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        err = proc.stderr.read()  # a few lines: the pipe never filled
    time.sleep(0.2)  # the reader thread's last lines
    out = "".join(lines)
    assert f"data dir: {data}" in out and f"admin token: in {data / 'admin-token'}" in out
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "
    assert re.search(stamp + f"job {made['job']} created: primary 'p', secondaries \\['s'\\]", err), err
    assert re.search(stamp + f"job {made['job']}: party 'p' uploaded 2 numbers identifier row\\(s\\)", err), err
    assert re.search(stamp + rf"refused {wrong.status_code} GET /jobs/{made['job']}: ", err), err
    for secret in (token, *made["secrets"].values(), "not-a-secret-of-this-job", "1.0", "3.0"):
        assert secret not in out + err


def test_a_job_says_its_total_before_its_first_chunk_ends(tmp_path, monkeypatch):
    from linkage_server.job_run import JobRunner
    from linkage_server.jobs import JobParams, JobStore
    from linkage_server.uploads import to_npy

    store = JobStore(tmp_path, chunk_rows=1000)
    job, _ = store.create("p", ["s"])
    rng = np.random.default_rng(0)
    store.upload(job, "p", to_npy(rng.uniform(size=(50, 2))))
    store.upload(job, "s", to_npy(rng.uniform(size=(40, 2))))
    store.start(job, JobParams("euclidean", 3))
    seen = []
    search = JobRunner._party_search

    def watched(self, *args, **kwargs):
        seen.append(dict(self.store.meta(job)["progress"]))
        return search(self, *args, **kwargs)

    monkeypatch.setattr(JobRunner, "_party_search", watched)
    store.run(job)
    assert store.meta(job)["state"] == "done"
    assert seen == [{"done": 0, "total": 1}]


def test_a_done_job_fills_the_bar_even_without_counts(monkeypatch):
    from linkage_server import progress

    updates = []
    monkeypatch.setattr(
        progress.Bar,
        "update",
        lambda self, done, total=None, description=None: updates.append((done, total, description)),
    )
    bar = progress.Bar.__new__(progress.Bar)
    bar.job({"state": "queued", "progress": {"done": 0, "total": 0}})
    bar.job({"state": "done", "progress": {}})  # a secondary's view has no counts
    assert updates == [(0, None, "job queued: waiting for the service's worker"), (1, 1, "job done")]


# ------------------------------------------------------------------------------------ setup.sh


def test_setup_phases_are_said_with_the_time_and_a_clock_while_they_run():
    script = ". scripts/phase.sh; run_phase 'installing something slow' sleep 2.5; say finished"
    r = subprocess.run(
        ["bash", "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PHASE_TICK": "1"},
    )
    lines = r.stdout.splitlines()
    assert r.returncode == 0, r.stderr
    # the times are the machine's (a loaded one starts bash a second late): order and format are
    # asserted, and that the phase took at least its 2.5 s sleep
    assert re.fullmatch(r"\[\d+:\d\d\] installing something slow", lines[0]), lines
    assert any(re.fullmatch(r"\[\d+:\d\d\]   still installing something slow \(\d+:\d\d\)", x) for x in lines), lines
    done = re.fullmatch(r"\[\d+:\d\d\]   done: installing something slow in (\d+):(\d\d)", lines[-2])
    assert done and 60 * int(done[1]) + int(done[2]) >= 2, lines
    failed = subprocess.run(
        ["bash", "-c", ". scripts/phase.sh; run_phase 'a step' bash -c 'echo boom; exit 3'; echo not-reached"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert failed.returncode == 1 and "FAILED: a step" in failed.stderr and "boom" in failed.stderr
    assert "not-reached" not in failed.stdout
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    for phase in (
        "creating .venv",
        "installing $TORCH (the CPU build",
        "installing the project",
        "compiling the linkage kernels",
    ):
        assert phase in setup


def test_a_built_in_dataset_trained_from_another_folder_tells_flower_where_its_data_is(tmp_path, monkeypatch):
    """Flower runs the app from its own install folder, where the loaders' default data folders
    (the checkout's data/, ../shared/data, the working folder's) do not resolve: `fedsim train
    --dataset hdb` from any folder passes the folder it found to the run (it failed in the
    simulation with "data folder 'hdb' not found", though the check before Flower had found it)."""
    from fedsim.cli import parser
    from fedsim.train import run_values

    monkeypatch.chdir(tmp_path)
    values = run_values(parser().parse_args(["train", "--dataset", "hdb"]))
    assert (Path(str(values["data-dir"])) / "hdb").is_dir()
    values = run_values(parser().parse_args(["train", "--dataset", "synthetic"]))
    assert "data-dir" not in values  # generated: reads no folder
