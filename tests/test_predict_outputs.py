"""What predict may write and how it reads a user's ids: never its input as the list of skipped
records, never into a folder, the ids written back exactly as the user's text."""

from __future__ import annotations

import pandas as pd

from app.vfl.predict_csv import main
from tests import test_predict_csv
from tests.test_predict_csv import _new_csv, _word_at

trained = test_predict_csv.trained  # the fixture: a small own-CSV run, trained once for this module


def test_predict_never_writes_or_removes_its_input_as_the_skipped_list_and_refuses_a_folder(trained, capsys):
    """Every predict writes or removes <out stem>.skipped.csv: an input named pred.skipped.csv with
    --out pred.csv was overwritten by the list of skipped records (exit 0), or removed. A folder as
    --out predicted everything, then failed writing. Each refused before anything runs, exit 2."""
    from fedsim.cli import main as fedsim

    folder, ds = trained
    rows = ds.split.test[:6]
    new = _new_csv(folder, rows, _word_at("rooms", 2, "n/a")).rename(folder / "pred.skipped.csv")
    before = new.read_bytes()
    for extra in (["--skip-invalid"], []):
        code = fedsim(["predict", str(folder / "run"), str(new), "--out", str(folder / "pred.csv"), *extra])
        assert code == 2 and "skipped" in capsys.readouterr().err and new.read_bytes() == before
    (folder / "outdir").mkdir()
    assert fedsim(["predict", str(folder / "run"), str(new), "--out", str(folder / "outdir")]) == 2
    assert "folder" in capsys.readouterr().err and list((folder / "outdir").iterdir()) == []


def test_the_id_column_is_read_as_text_exactly(trained, capsys):
    """--id-column was parsed as numbers: '007' came back as 7 (and '007' and '7' were 'the same
    id, twice'), 'NA' and 'null' as nan, and a blank id turned every id into a float. The ids are
    the user's text, written back exactly; a blank one is refused by its line."""
    folder, ds = trained
    rows = ds.split.test[:5]
    ids = ["007", "7", "NA", "null", "0300"]
    new = _new_csv(folder, rows, lambda d: d.assign(flat_id=ids))
    assert main([str(folder / "run"), str(new), "--out", str(folder / "ids.csv"), "--id-column", "flat_id"]) == 0
    got = pd.read_csv(folder / "ids.csv", dtype={"flat_id": str}, keep_default_na=False)
    assert got["flat_id"].tolist() == ids
    new = _new_csv(folder, rows, lambda d: d.assign(flat_id=["a", "b", "", "d", "e"]))
    assert main([str(folder / "run"), str(new), "--out", str(folder / "ids.csv"), "--id-column", "flat_id"]) == 2
    assert "without an id in column 'flat_id' (lines [4])" in capsys.readouterr().err


def test_a_tampered_run_folder_is_named_by_its_file_not_a_traceback(trained, tmp_path, capsys):
    """A run folder with metrics.jsonl deleted, or summary.json or federation.json cut short:
    report printed a traceback (naming no file for the JSON), predict a JSONDecodeError naming
    no file. Each exits 1 naming the file; report of a run whose kept state is cut short reports
    its metrics and warns, naming the file, that predict refuses it."""
    import shutil

    from fedsim.cli import main as fedsim

    folder, ds = trained
    new = _new_csv(folder, ds.split.test[:3])
    cases = [("metrics.jsonl", None), ("summary.json", 200), ("kept/federation.json", 100), ("status.json", 20)]
    cases += [("kept/primary.pt", None), ("kept/primary.pt", 1000), ("kept/shops.pt", 1000)]  # a party's state
    cases += [("kept/primary.pt", "text")]  # not a saved state at all (torch raised a bare KeyError)
    for name, cut in [*cases, ("ensemble.json", 1)]:
        run = tmp_path / f"{name.replace('/', '-')}-{cut}"
        shutil.copytree(folder / "run", run)
        if name == "ensemble.json":  # a run of an ensemble, its record cut short
            (run / name).write_text("{")
        elif cut == "text":
            (run / name).write_text("hello")
        elif cut is None:
            (run / name).unlink()
        else:
            (run / name).write_bytes((folder / "run" / name).read_bytes()[:cut])
        for argv in (["report", str(run)], ["predict", str(run), str(new), "--out", str(tmp_path / "p.csv")]):
            if argv[0] == "predict" and name == "metrics.jsonl":
                continue  # predict does not read it
            code, said = fedsim(argv), capsys.readouterr()
            if argv[0] == "report" and name.startswith("kept/"):  # its metrics reported, predict's refusal said
                assert code == 0 and "warning: `fedsim predict` refuses" in said.out, said
                assert name.split("/")[-1] in said.out and "Traceback" not in said.err, said
                continue
            assert code == 1 and name.split("/")[-1] in said.err and "Traceback" not in said.err, (argv, said)
