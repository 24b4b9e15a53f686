"""Predict from a user's CSV of new records into a CSV (app/vfl/predict_csv.py): the same
predictions as from the loaded arrays, the explanation's columns, and refusals that leave no
output behind."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from app.config import RunConfig
from app.data import load_data
from app.modes import run_experiment
from app.vfl.predict import Prediction, predict_in_process
from app.vfl.predict_csv import main, table
from tests.test_byo import write_parties

K = 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("byo")
    write_parties(folder)
    cfg = RunConfig.of(dataset="csv", data_dir=str(folder), k=K, epochs=2, batch_size=32, out_dir=str(folder / "out"))
    run_experiment(cfg, folder / "run")
    return folder, load_data(cfg)


def _new_csv(folder, rows, edit=lambda d: d):
    df = pd.read_csv(folder / "sales.csv").iloc[rows].drop(columns=["price"]).assign(flat_id=[f"f{i}" for i in rows])
    edit(df).to_csv(folder / "new.csv", index=False)
    return folder / "new.csv"


def test_a_csv_of_new_records_gets_the_arrays_predictions_and_an_explanation(trained, capsys):
    folder, ds = trained
    test = ds.split.test
    new = _new_csv(folder, test)
    assert (
        main([str(folder / "run"), str(new), "--out", str(folder / "pred.csv"), "--id-column", "flat_id", "--explain"])
        == 0
    )
    out = pd.read_csv(folder / "pred.csv")
    expected = predict_in_process(folder / "run", ds.primary.features[test], ds.primary.identifiers[test])
    assert list(out["flat_id"]) == [f"f{i}" for i in test]
    np.testing.assert_allclose(out["prediction"], expected.values, rtol=1e-6)
    assert [c for c in out.columns if c.startswith("shops_")] == [  # the default method, fedsim_attn
        f"shops_{what}_{k}" for k in range(1, K + 1) for what in ("token", "similarity", "weight", "attention")
    ] + ["shops_attention_null"]
    np.testing.assert_array_equal(
        out[[f"shops_token_{k}" for k in range(1, K + 1)]], expected.linkage.links["shops"].tokens
    )
    assert f"{len(test)} predictions" in capsys.readouterr().out


def test_an_attention_models_explanation_names_each_weight_by_its_neighbour():
    """fedsim_attn: after each neighbour's token, similarity and gate weight comes its attention
    weight, and the null slot's last (columns built from planted arrays, so any mix-up shows)."""
    links = {"shops": SimpleNamespace(tokens=np.array([[7, 8], [9, 6]]), sims=np.array([[0.5, 0.1], [0.2, 0.3]]))}
    pred = Prediction(
        np.array([1.0, 2.0]),
        None,
        SimpleNamespace(links=links),
        {"shops": np.full((2, 2), 0.5)},
        0,
        {},
        {"shops": np.array([[0.7, 0.2, 0.1], [0.0, 0.4, 0.6]])},
    )
    out = table(np.array(["a", "b"]), "id", pred, explain=True)
    assert list(out.columns) == ["id", "prediction"] + [
        f"shops_{what}_{k}" for k in (1, 2) for what in ("token", "similarity", "weight", "attention")
    ] + ["shops_attention_null"]
    np.testing.assert_array_equal(
        out[["shops_attention_1", "shops_attention_2", "shops_attention_null"]], pred.attention["shops"]
    )
    np.testing.assert_array_equal(out[["shops_token_1", "shops_token_2"]], links["shops"].tokens)


@pytest.mark.parametrize(
    "edit, unknown, message",
    [
        (lambda d: d.drop(columns=["rooms"]), "ignore", r"missing column\(s\) \['rooms'\]"),
        (lambda d: d.drop(columns=["lat"]), "ignore", r"missing column\(s\) \['lat'\]"),
        (
            lambda d: d.assign(lat=np.where(np.arange(len(d)) == 1, np.nan, d["lat"])),
            "ignore",
            r"line 3, column 'lat': an empty cell is no identifier",
        ),
        (lambda d: d.assign(type=["zz"] + list(d["type"][1:])), "refuse", "column 'type' holds 1 value"),
    ],
)
def test_bad_new_records_are_refused_by_name_and_keep_the_older_output(trained, capsys, edit, unknown, message):
    """Issue 29: bad input exits 2 (as `fedsim train` does) and an older output stays byte for
    byte, the message saying so: it is not this run's."""
    folder, ds = trained
    (folder / "pred.csv").write_text("an older output\n")
    new = _new_csv(folder, ds.split.test[:10], edit)
    assert main([str(folder / "run"), str(new), "--out", str(folder / "pred.csv"), "--unknown", unknown]) == 2
    assert (folder / "pred.csv").read_text() == "an older output\n"
    err = capsys.readouterr().err
    assert re.search(message, err) and f"the previous {folder / 'pred.csv'} was left untouched" in err
    assert len(err.strip().splitlines()) == 1


def test_an_unseen_category_is_counted_and_predicted_without_its_one_hot(trained, capsys):
    folder, ds = trained
    new = _new_csv(folder, ds.split.test[:10], lambda d: d.assign(type=["zz"] + list(d["type"][1:])))
    assert main([str(folder / "run"), str(new), "--out", str(folder / "pred.csv")]) == 0
    assert "unseen categories: {'type': 1}" in capsys.readouterr().err
    assert len(pd.read_csv(folder / "pred.csv")) == 10


# ---------------------------------------------------------------------------- issue 29: the older output, bad cells


def _word_at(column, row, word):
    return lambda d: d.astype({column: object}).assign(
        **{column: [word if i == row else v for i, v in enumerate(d[column])]}
    )


def test_a_typo_in_the_input_keeps_the_previous_predictions_byte_identical(trained, capsys):
    folder, ds = trained
    rows = ds.split.test[:10]
    args = [str(folder / "run"), "--out", str(folder / "pred.csv"), "--id-column", "flat_id"]
    assert main([args[0], str(_new_csv(folder, rows)), *args[1:]]) == 0
    good = (folder / "pred.csv").read_bytes()
    typo = _new_csv(folder, rows, lambda d: d.rename(columns={"rooms": "room"}))
    assert main([args[0], str(typo), *args[1:]]) == 2
    assert (folder / "pred.csv").read_bytes() == good
    err = capsys.readouterr().err
    assert "missing column(s) ['rooms']" in err and "was left untouched (it is not this run's output)" in err


def test_a_predict_that_fails_after_reading_its_input_exits_1_and_keeps_the_older_output(trained, capsys, monkeypatch):
    folder, ds = trained
    (folder / "pred.csv").write_bytes(b"flat_id,prediction\nf0,1.5\n")

    def broken(*a, **k):
        raise RuntimeError("a secondary is gone")

    monkeypatch.setattr("app.vfl.predict_csv.predict_in_process", broken)
    assert main([str(folder / "run"), str(_new_csv(folder, ds.split.test[:5])), "--out", str(folder / "pred.csv")]) == 1
    assert (folder / "pred.csv").read_bytes() == b"flat_id,prediction\nf0,1.5\n"
    err = capsys.readouterr().err
    assert "a secondary is gone" in err and "was left untouched" in err


@pytest.mark.parametrize("word", ["n/a", "NA", "null", "abc"])
def test_a_word_in_a_numeric_column_is_refused_by_its_line_in_training_and_in_predict_alike(
    trained, tmp_path, capsys, word
):
    """One rule (docs/own-data.md): a blank numeric cell is missing (the training mean); any other
    text, even a word pandas reads as missing, is refused naming the file, line, column, value."""
    from datasets import DatasetError, load_dataset
    from fedsim import train
    from fedsim.cli import parser

    folder, ds = trained
    write_parties(tmp_path)
    _word_at("rooms", 2, word)(pd.read_csv(tmp_path / "sales.csv")).to_csv(tmp_path / "sales.csv", index=False)
    with pytest.raises(DatasetError) as refused:
        load_dataset("csv", tmp_path)
    shape = (
        r"^{who}: {path}, line 4, column 'rooms': {value} is not a number \(1 such cell\(s\) in the column, lines \[4\]"
    )
    assert re.search(
        shape.format(who="party 'primary'", path=re.escape(str(tmp_path / "sales.csv")), value=re.escape(repr(word))),
        str(refused.value),
    )
    args = parser().parse_args(
        [
            "train",
            "--dataset",
            "csv",
            "--data-dir",
            str(tmp_path),
            "--engine",
            "inprocess",
            "--out-dir",
            str(tmp_path / "runs"),
        ]
    )
    assert train.command(args) == 2 and "line 4, column 'rooms'" in capsys.readouterr().err

    new = _new_csv(folder, ds.split.test[:10], _word_at("rooms", 2, word))
    assert main([str(folder / "run"), str(new), "--out", str(folder / "pred.csv")]) == 2
    err = capsys.readouterr().err
    assert re.search(
        shape.format(
            who="predict refused: DatasetError: new records", path=re.escape(str(new)), value=re.escape(repr(word))
        ),
        err,
    ), err


def test_a_refusal_names_the_records_by_their_ids_and_lines(trained, capsys):
    folder, ds = trained
    rows = ds.split.test[:10]
    new = _new_csv(folder, rows, lambda d: d.assign(lat=np.where(np.isin(np.arange(len(d)), [1, 4]), np.nan, d["lat"])))
    assert main([str(folder / "run"), str(new), "--out", str(folder / "pred.csv"), "--id-column", "flat_id"]) == 2
    err = capsys.readouterr().err
    assert f"lines [3, 6] (ids ['f{rows[1]}', 'f{rows[4]}'])" in err, err


def test_an_id_given_to_two_records_is_refused_naming_it_and_its_lines(trained, capsys):
    """Two records under one id got two predictions under it, exit 0: which is whose?"""
    folder, ds = trained
    rows = ds.split.test[:6]
    new = _new_csv(folder, rows, lambda d: d.assign(flat_id=["a", "b", "a", "c", "d", "e"]))
    out = folder / "pred-repeated.csv"  # its own: another test's pred.csv may or may not be there yet
    out.write_text("earlier\n")
    assert main([str(folder / "run"), str(new), "--out", str(out), "--id-column", "flat_id"]) == 2
    err = capsys.readouterr().err
    assert "id 'a' names 2 records (lines [2, 4])" in err and "left untouched" in err, err
    assert out.read_text() == "earlier\n"


def test_skip_invalid_predicts_the_others_and_lists_the_skipped_beside_the_output(trained, capsys):
    folder, ds = trained
    rows = ds.split.test[:10]

    def bad(d):
        d = _word_at("rooms", 2, "n/a")(d)
        return d.assign(lat=np.where(np.arange(len(d)) == 5, np.nan, d["lat"]))

    new = _new_csv(folder, rows, bad)
    assert (
        main(
            [
                str(folder / "run"),
                str(new),
                "--out",
                str(folder / "pred.csv"),
                "--id-column",
                "flat_id",
                "--skip-invalid",
            ]
        )
        == 0
    )
    kept = np.delete(rows, [2, 5])
    out = pd.read_csv(folder / "pred.csv")
    assert list(out["flat_id"]) == [f"f{i}" for i in kept]
    expected = predict_in_process(folder / "run", ds.primary.features[kept], ds.primary.identifiers[kept])
    np.testing.assert_allclose(out["prediction"], expected.values, rtol=1e-6)
    skipped = pd.read_csv(folder / "pred.skipped.csv")
    assert list(skipped["line"]) == [4, 7] and list(skipped["flat_id"]) == [f"f{rows[2]}", f"f{rows[5]}"]
    assert "column 'rooms': 'n/a' is not a number" in skipped["reason"][0] and "'lat'" in skipped["reason"][1]
    err = capsys.readouterr().err
    assert f"skipped 2 record(s) that cannot be predicted, first: f{rows[2]} (line 4), f{rows[5]} (line 7)" in err

    assert main([str(folder / "run"), str(new), "--out", str(folder / "pred.csv"), "--skip-invalid"]) == 0
    assert list(pd.read_csv(folder / "pred.csv")["row"]) == [0, 1, 3, 4, 6, 7, 8, 9]  # the input's own row numbers
    before = (folder / "pred.csv").read_bytes()
    nothing = _new_csv(folder, rows[:2], lambda d: d.assign(lat=np.nan))
    assert main([str(folder / "run"), str(nothing), "--out", str(folder / "pred.csv"), "--skip-invalid"]) == 2
    assert (folder / "pred.csv").read_bytes() == before and "none of its 2 record(s)" in capsys.readouterr().err
    # a later predict into the same --out, every record valid and no --skip-invalid: the earlier
    # list of skipped records went with the output it described (it stayed beside the new one)
    clean = _new_csv(folder, rows, lambda d: d)
    assert main([str(folder / "run"), str(clean), "--out", str(folder / "pred.csv"), "--id-column", "flat_id"]) == 0
    assert len(pd.read_csv(folder / "pred.csv")) == len(rows) and not (folder / "pred.skipped.csv").exists()
    # blank lines above a bad record: its line is the one an editor shows (pandas skips blank lines)
    new = _new_csv(folder, rows, bad)  # (the same file as above; the clean run rewrote it)
    new.write_text(new.read_text().replace("\n", "\n\n\n", 2).replace("\n\n\n", "\n", 1))  # two after row 0
    assert main([str(folder / "run"), str(new), "--out", str(folder / "pred.csv"), "--skip-invalid"]) == 0
    assert list(pd.read_csv(folder / "pred.skipped.csv")["line"]) == [6, 9]
    assert list(pd.read_csv(folder / "pred.csv")["row"]) == [0, 1, 3, 4, 6, 7, 8, 9]


# ---------------------------------------------------------------------------- fedsim predict through Flower


@pytest.fixture
def flower_run(trained, tmp_path):
    """The trained run as a run whose secondaries kept their own states: `fedsim predict` takes
    the `flwr run` path (nothing here starts Flower: start_simulation is replaced)."""
    import json
    import shutil

    folder, ds = trained
    run = tmp_path / "runs" / "flwr"
    shutil.copytree(folder / "run", run)
    manifest = run / "kept" / "federation.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "secondary_states": "parties"}))
    (tmp_path / "pred.csv").write_bytes(b"row,prediction\n0,1.5\n")
    return run, tmp_path / "pred.csv", folder, ds


def _fedsim_predict(*argv):
    from fedsim import predict
    from fedsim.cli import parser

    return predict.command(parser().parse_args(["predict", *map(str, argv)]))


class _Ran:
    def poll(self):
        return 0

    def wait(self):
        return 0


def _fake_flower(monkeypatch, write):
    seen = []

    def start(values, home, num_supernodes, output):
        seen.append(dict(values))
        if write:
            assert pd.read_csv(values["predict-input"]) is not None
            Path(values["predict-output"]).write_text("row,prediction\n7,2.5\n")
        return _Ran(), 0

    monkeypatch.setattr("deploy.localsim.start_simulation", start)
    monkeypatch.setattr("deploy.localsim.stop_superlink", lambda port: None)
    return seen


def test_fedsim_predict_refuses_bad_input_before_any_flower_process(flower_run, monkeypatch, capsys):
    run, out, folder, ds = flower_run
    monkeypatch.setattr("deploy.localsim.start_simulation", lambda *a, **k: pytest.fail("Flower was started"))
    for edit in (lambda d: d.rename(columns={"rooms": "room"}), _word_at("rooms", 1, "n/a")):
        assert _fedsim_predict(run, _new_csv(folder, ds.split.test[:5], edit), "--out", out) == 2
        assert out.read_bytes() == b"row,prediction\n0,1.5\n"
        err = capsys.readouterr().err
        assert err.startswith("fedsim predict: DatasetError: ") and "was left untouched" in err


def test_fedsim_predict_through_flower_replaces_the_output_only_when_whole(flower_run, monkeypatch, capsys):
    run, out, folder, ds = flower_run
    new = _new_csv(folder, ds.split.test[:5])
    _fake_flower(monkeypatch, write=False)  # the run ends without an output (failed, timed out)
    assert _fedsim_predict(run, new, "--out", out) == 1
    assert out.read_bytes() == b"row,prediction\n0,1.5\n" and "was left untouched" in capsys.readouterr().err
    seen = _fake_flower(monkeypatch, write=True)
    assert _fedsim_predict(run, new, "--out", out) == 0
    assert out.read_text() == "row,prediction\n7,2.5\n" and out.stat().st_mode & 0o777 == 0o600
    partial = Path(seen[0]["predict-output"])
    assert partial.parent == out.parent and partial.name.startswith(".pred.csv.") and not partial.exists()
    assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".")) == []


def test_fedsim_predict_through_flower_skips_invalid_records_by_their_row(flower_run, monkeypatch, capsys):
    run, out, folder, ds = flower_run
    seen = _fake_flower(monkeypatch, write=True)
    new = _new_csv(folder, ds.split.test[:5], _word_at("rooms", 1, "n/a"))
    assert _fedsim_predict(run, new, "--out", out, "--skip-invalid") == 0
    given = seen[0]
    assert given["predict-id-column"] == "row" and not Path(given["predict-input"]).exists()  # removed after
    skipped = pd.read_csv(out.with_name("pred.skipped.csv"))
    assert list(skipped["row"]) == [1] and list(skipped["line"]) == [3]
    assert "skipped 1 record(s)" in capsys.readouterr().err


def test_fedsim_predict_an_ensemble_through_flower_or_nothing(flower_run, monkeypatch, capsys):
    """An ensemble (--member) of runs trained through Flower: each member predicts by its own
    `flwr run`, the output is their mean; one failed member fails the ensemble, older output kept."""
    import json
    import shutil

    run, out, folder, ds = flower_run
    member = run.with_name("flwr-m1")
    shutil.copytree(run, member)
    manifest = member / "kept" / "federation.json"
    meta = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**meta, "run": {**meta["run"], "member": 1}}))
    new = _new_csv(folder, ds.split.test[:5])
    seen = _fake_flower(monkeypatch, write=True)
    assert _fedsim_predict(run, new, "--out", out, "--member", member) == 0
    assert [Path(v["predict-run"]).name for v in seen] == ["flwr", "flwr-m1"]  # each member by its own run
    assert out.read_text() == "row,prediction\n7,2.5\n" and "the mean of 2 members" in capsys.readouterr().out
    _fake_flower(monkeypatch, write=False)
    assert _fedsim_predict(run, new, "--out", out, "--member", member) == 1
    assert out.read_text() == "row,prediction\n7,2.5\n" and "member 0" in capsys.readouterr().err
    assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".")) == []  # no member's file left
