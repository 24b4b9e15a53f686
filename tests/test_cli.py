"""The `fedsim` command line as a user runs it: the installed console script, as subprocesses,
on tiny CSV party folders. Exit status is the outcome; errors name the key or file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.test_byo import write_parties

FEDSIM = str(Path(sys.executable).parent / "fedsim")
REPO = Path(__file__).resolve().parents[1]
TINY = ["--dataset", "csv", "--data-dir", "data", "-c", "k=4", "-c", "batch-size=32"]


def fedsim(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([FEDSIM, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def user(tmp_path) -> Path:
    """A user's working folder with their parties in ./data (relative paths on purpose)."""
    (tmp_path / "data").mkdir()
    write_parties(tmp_path / "data")
    return tmp_path


def test_a_broken_config_exits_non_zero_naming_the_key_before_flower_starts(user):
    r = fedsim("train", *TINY, "-c", "batch-sise=32", cwd=user, timeout=120)
    assert r.returncode == 2 and "unknown run-config key(s) ['batch-sise']" in r.stderr, r.stderr
    r = fedsim("train", *TINY, "-c", "tau=1.5", cwd=user, timeout=120)
    assert r.returncode == 2 and "'tau' must be in (0, 1]" in r.stderr, r.stderr
    r = fedsim("train", "--dataset", "csv", "--data-dir", "elsewhere", cwd=user, timeout=120)
    assert r.returncode == 2 and str(user / "elsewhere" / "parties.toml") in r.stderr, r.stderr  # the absolute path
    r = fedsim("train", *TINY, "-c", "marvell=1.0", cwd=user, timeout=120)  # the data's task: regression
    assert r.returncode == 2 and "'marvell' protects binary labels" in r.stderr, r.stderr
    assert not (user / "runs").exists() or not any((user / "runs").iterdir())


def test_a_failed_run_exits_non_zero_with_its_error(user, monkeypatch, capsys):
    r = fedsim(
        "train",
        *TINY,
        "--engine",
        "inprocess",
        "--run-name",
        "bad",
        "-c",
        "parties=shops",
        "-c",
        "method=combine",
        cwd=user,
        timeout=300,
    )  # combine needs true rows: refused before the run
    assert r.returncode == 2 and "method 'combine' needs the true alignment" in r.stderr, (r.stdout, r.stderr)
    assert not (user / "runs" / "bad" / "status.json").exists()
    import app.vfl.server
    from fedsim.cli import main

    def broken(*a, **k):
        raise RuntimeError("a planted failure inside the run")

    monkeypatch.chdir(user)
    monkeypatch.setattr(app.vfl.server, "build_strategy", broken)  # the run itself fails (the one VFL driver)
    argv = ["train", *TINY, "--engine", "inprocess", "--recipe", "given", "--run-name", "bad", "-c", "parties=shops"]
    assert main(argv) == 1  # the run itself, not a recipe search's candidates
    err = capsys.readouterr().err
    assert "run " in err and "failed" in err and "a planted failure inside the run" in err, err
    assert json.loads((user / "runs" / "bad" / "status.json").read_text())["state"] == "failed"


@pytest.mark.slow
def test_train_predict_and_report_through_flower(user):
    """`fedsim train` through `flwr run`, then `fedsim predict` (the predict mode of the same
    apps; each secondary embeds with the model it kept itself): the test split, given as new
    records, gets the best epoch's test metric; then `fedsim report` writes the plots."""
    r = fedsim("train", *TINY, "--epochs", "2", "--run-name", "mine", cwd=user)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "finished: best epoch" in r.stdout
    run = user / "runs" / "mine"
    summary = json.loads((run / "summary.json").read_text())
    # the yardstick on the run's own split: the primary alone and the pooled data beside the run
    yard = json.loads((run / "yardstick.json").read_text())
    assert yard["federated"] == summary["test"]["rmse"] and yard["test_rows"] == summary["split"]["sizes"]["test"]
    assert yard["primary_alone"]["model"] == "boosting" and yard["pooled"]["joined"].startswith("top-")
    assert "primary alone" in r.stdout and "verdict:" in r.stdout
    from app.kept import kept_attempt, party_kept_file

    kept = [p.name for p in (run / "shops").glob("kept*.pt")]  # the secondary's own kept model (simulation layout)
    assert kept == [party_kept_file(kept_attempt(run))] and kept_attempt(run), kept
    from app.vfl.ensemble import score_kept
    from strategies.heads import TaskHead

    head = TaskHead(**json.loads((run / "kept" / "federation.json").read_text())["head"])
    scored = score_kept([run], head)  # the outputs the primary kept through Flower score as it evaluated
    assert scored["val"][0] == summary["val"] and scored["test"][0] == summary["test"]

    from app.config import RunConfig
    from app.data import load_data

    ds = load_data(RunConfig.of(dataset="csv", data_dir=str(user / "data")))
    test = ds.split.test
    split = pd.read_csv(run / "split.csv")  # issue 29: the split, recorded by the ServerApp too
    assert np.array_equal(split.loc[split["part"] == "test", "row"], test) and summary["split"]["sizes"]["test"] == len(
        test
    )
    sales = pd.read_csv(user / "data" / "sales.csv").iloc[test].drop(columns=["price"])
    sales.assign(flat=[f"f{i}" for i in test]).to_csv(user / "new.csv", index=False)
    r = fedsim(
        "predict", "runs/mine", "new.csv", "--out", "predictions.csv", "--id-column", "flat", "--explain", cwd=user
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = pd.read_csv(user / "predictions.csv")
    assert list(out["flat"]) == [f"f{i}" for i in test] and "shops_weight_1" in out.columns
    rmse = float(np.sqrt(np.mean((out["prediction"].to_numpy() - ds.labels[test]) ** 2)))
    assert rmse == pytest.approx(summary["test"]["rmse"], rel=1e-5)  # float32: predict's batches vs evaluation's

    r = fedsim("report", "runs/mine", cwd=user)
    assert r.returncode == 0 and "best epoch" in r.stdout and "pooled reference" in r.stdout, r.stderr
    # issue 33: a run through Flower scores the label attacks on what it sent, and says so
    assert "exchange privacy: defences privacy=standard, grad_clip=auto" in r.stdout, r.stdout  # the default's
    assert "shops's label attacks (Spearman" in r.stdout, r.stdout
    assert summary["exchange_privacy"]["attacks"]["shops"]["records_scored"] > 0
    # the feature inversion against the shops, measured by the shops' ClientApp on its own data
    assert 0 <= summary["exchange_privacy"]["inversion"]["shops"]["ratio"] < 10
    assert "inversion of shops's features" in r.stdout
    assert (run / "learning_curve.png").exists() and (run / "weight_gate.png").exists()
    # issue 28: the run (models of every party, linkage, metrics) and the predictions are the user's
    # alone, 0600 in 0700, though the commands ran under umask 022 and Flower's processes wrote them
    from tests.test_private_files import _readable_by_others

    assert (
        _readable_by_others(user / "runs") == []
        and _readable_by_others(user, skip=(user / "data", user / "new.csv")) == []
    )


def test_predict_refuses_a_run_that_did_not_finish_and_writes_nothing(user):
    (user / "runs" / "half").mkdir(parents=True)
    (user / "predictions.csv").write_text("old\n")
    r = fedsim("predict", "runs/half", "new.csv", "--out", "predictions.csv", cwd=user, timeout=120)
    assert r.returncode == 1 and "did not start" in r.stderr, r.stderr
    # issue 29: an older output is kept byte for byte, and the failure says it is not this run's
    assert (user / "predictions.csv").read_text() == "old\n" and "was left untouched" in r.stderr


def test_entity_augmentation_on_csv_guests_with_id_columns(tmp_path):
    """`fedsim train --mode entity-aug` on CSV parties that declare entity id columns (the
    overlap comes from the ids), then `fedsim predict` by those ids, each row its own."""
    from app.config import RunConfig
    from app.entity_aug.parties import ea_data

    data = REPO / "examples" / "digits"
    r = fedsim(
        "train",
        "--dataset",
        "csv",
        "--data-dir",
        str(data),
        "--mode",
        "entity-aug",
        "--engine",
        "inprocess",
        "--epochs",
        "2",
        "--run-name",
        "ea",
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    yard = json.loads((tmp_path / "runs" / "ea" / "yardstick.json").read_text())
    assert yard["pooled"]["joined"] == "entity" and "verdict:" in r.stdout  # EA's pooled table: by entity id
    from tests.test_private_files import _readable_by_others

    assert _readable_by_others(tmp_path / "runs") == []  # issue 28: the run is the user's alone
    ea = ea_data(RunConfig.of(dataset="csv", data_dir=str(data), mode="entity-aug"))
    assert ea.held is not None and not all(h.all() for h in ea.held.values())  # some entities held by one guest only
    ids = ea.entity_ids[ea.split.test[:12]]
    pd.DataFrame({"image_id": ids}).to_csv(tmp_path / "ids.csv", index=False)
    r = fedsim("predict", "runs/ea", "ids.csv", "--out", "p.csv", "--id-column", "image_id", cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = pd.read_csv(tmp_path / "p.csv")
    assert list(out["image_id"]) == list(ids) and [f"p_{c}" for c in range(10)] == list(out.columns[2:])
    lacking = str(ea.entity_ids[np.flatnonzero(~ea.held["left"])[0]])  # an entity the left guest lacks
    pd.DataFrame({"image_id": [ids[0], lacking]}).to_csv(tmp_path / "ids.csv", index=False)
    before = (tmp_path / "p.csv").read_bytes()
    r = fedsim("predict", "runs/ea", "ids.csv", "--out", "p.csv", "--id-column", "image_id", cwd=tmp_path, timeout=300)
    # issue 29: refused as bad input (exit 2) by the user's own id and line, the older output kept
    assert r.returncode == 2, r.stderr
    assert f"{lacking!r} (line 3): not held by every party (missing at left)" in r.stderr, r.stderr
    assert (tmp_path / "p.csv").read_bytes() == before and "left untouched" in r.stderr
    r = fedsim(
        "predict",
        "runs/ea",
        "ids.csv",
        "--out",
        "p.csv",
        "--id-column",
        "image_id",
        "--skip-invalid",
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 0 and "skipped 1 record(s)" in r.stderr, r.stdout + r.stderr
    assert pd.read_csv(tmp_path / "p.csv", dtype=str)["image_id"].tolist() == [str(ids[0])]
    skipped = pd.read_csv(tmp_path / "p.skipped.csv", dtype=str)
    assert skipped.to_dict("records") == [
        {"line": "3", "image_id": lacking, "reason": "not held by every party (missing at left)"}
    ]


def test_link_two_string_columns_with_a_normalised_scorer_through_a_real_service(tmp_path):
    """`fedsim create-job`, `fedsim link` (each party its own CSV, name + address), `fedsim start`
    with Jaro-Winkler, `fedsim fetch`: the true partner first for every record."""
    from linkage.store import load_primary, load_secondary
    from tests.test_service import ADMIN, free_port, service
    from tests.test_service_cli import write_people

    people, perm = write_people(tmp_path)
    (tmp_path / "admin.token").write_text(ADMIN)
    with service(tmp_path / "svc", free_port()) as url:
        made = fedsim(
            "create-job",
            "--url",
            url,
            "--admin-token-file",
            "admin.token",
            "--primary",
            "p",
            "--secondary",
            "s",
            "--secrets-dir",
            ".",
            cwd=tmp_path,
            timeout=120,
        )
        assert made.returncode == 0, made.stderr
        job = json.loads(made.stdout)["job"]

        def party(name: str, *args: str) -> subprocess.CompletedProcess:
            r = fedsim(
                *args,
                *(("--privacy", "off") if args[0] == "link" else ()),  # exact releases compared
                "--url",
                url,
                "--job",
                job,
                "--party",
                name,
                "--secret-file",
                f"{job}-{name}.secret",
                cwd=tmp_path,
                timeout=120,
            )
            assert r.returncode == 0, (args, r.stdout, r.stderr)
            return r

        party("s", "link", "--csv", "s.csv", "--columns", "full_name,street", "--kind", "strings")
        party("p", "link", "--csv", "p.csv", "--columns", "name,address", "--kind", "strings", "--record", "out")
        party("p", "start", "--k", "2", "--metric", "jaro_winkler", "--fetch", "out")
        party("s", "fetch", "--out", "out")
        assert json.loads(party("s", "status").stdout)["params"]["metric"] == "jaro_winkler"
    p, s = load_primary(tmp_path / "out"), load_secondary(tmp_path / "out", "s")
    np.testing.assert_array_equal(perm[s.row_of_token[p.tokens["s"][:, 0]]], np.arange(len(people)))
    r = fedsim("link", "--url", "http://127.0.0.1:1", "--job", job, "--party", "p", "--csv", "p.csv", cwd=tmp_path)
    assert r.returncode == 2 and "--columns" in r.stderr and "Traceback" not in r.stderr  # named, no traceback
