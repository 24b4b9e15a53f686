"""Entity ids compared one way everywhere (docs/own-data.md: surrounding spaces dropped, a whole
number by its value): training read an all-number id column as integers ('0001' -> 1) and a mixed
one as text, while predict read the user's ids as text, so a run on zero-padded ids refused
'0001' (its own id) and predicted '1', which no file holds, and '17.0' was not '17'."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pandas as pd
import pytest

from app.config import RunConfig
from app.entity_aug.predict import main as predict
from app.modes import run_experiment

DIGITS = Path(__file__).resolve().parents[1] / "examples" / "digits"


def test_an_id_is_its_text_without_spaces_or_a_whole_number_by_its_value():
    from datasets.entity_ids import entity_keys  # the one rule, here by itself

    got = entity_keys(pd.Series(["0001", " 17", "17.0", "1.7e1", "A7", "a7", "NA", "0x1", "inf", "1.5", "1.50", None]))
    assert got.tolist() == ["1", "17", "17", "17", "A7", "a7", "NA", "0x1", "inf", "1.5", "1.5", None]
    # exactly, whatever else the column holds: a float parser's 17 digits collapsed long padded ids
    long = ["000000000000000001", "000000000000000002", "0123456789012345678", "A7"]
    assert entity_keys(pd.Series(long)).tolist() == ["1", "2", "123456789012345678", "A7"]
    as_read = pd.Series([123456789012345678, 2])  # a column pandas read as integers: the same keys
    assert entity_keys(as_read).tolist() == ["123456789012345678", "2"]
    assert entity_keys(pd.Series([1.1, 17.0])).tolist() == entity_keys(pd.Series(["1.10", "17"])).tolist()


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    """The digits example with ids '0000', '0001', ... as its files write them, trained 2 epochs."""
    folder = tmp_path_factory.mktemp("padded")
    shutil.copytree(DIGITS, folder / "data")
    for name in ("labels.csv", "left.csv", "right.csv"):
        rows = list(csv.reader(open(folder / "data" / name)))
        for row in rows[1:]:
            row[0] = row[0].replace("img", "")
        with open(folder / "data" / name, "w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows(rows)
    cfg = RunConfig.of(dataset="csv", data_dir=str(folder / "data"), mode="entity-aug", epochs=2, out_dir=str(folder))
    run_experiment(cfg, folder / "run")
    return folder


def test_a_run_on_zero_padded_ids_predicts_its_own_ids(padded, capsys):
    split = pd.read_csv(padded / "run" / "split.csv", dtype=str, keep_default_na=False)
    test = split.loc[split.part == "test", "entity_id"].head(3).tolist()
    ids, out = padded / "ids.csv", padded / "p.csv"
    argv = [str(padded / "run"), "--ids", str(ids), "--ids-column", "image_id", "--out", str(out)]
    given = [f"{int(i):04d}" for i in test]  # as the files write them
    pd.DataFrame({"image_id": given}).to_csv(ids, index=False)
    assert predict(argv) == 0
    assert pd.read_csv(out, dtype=str)["image_id"].tolist() == given  # written back as given, to join on
    pd.DataFrame({"image_id": [f"{test[0]}.0", f" {test[1]}", "x9"]}).to_csv(ids, index=False)  # 17.0 is 17
    assert predict(argv) == 2
    err = capsys.readouterr().err
    assert "'x9' (line 4)" in err and f"'{test[0]}" not in err and f"'{test[1]}" not in err, err


def test_predict_reads_the_runs_declared_id_column_by_default(padded):
    """Without --ids-column predict looked for a column 'entity' ("missing column(s) ['entity'];
    available: ['image_id']"), though the run's parties declare entity_id = "image_id"."""
    split = pd.read_csv(padded / "run" / "split.csv", dtype=str, keep_default_na=False)
    ids, out = padded / "ids2.csv", padded / "p2.csv"
    pd.DataFrame({"image_id": split.loc[split.part == "test", "entity_id"].head(2)}).to_csv(ids, index=False)
    assert predict([str(padded / "run"), "--ids", str(ids), "--out", str(out)]) == 0
    assert pd.read_csv(out).columns[0] == "image_id"


def test_skip_invalid_skips_a_blank_id_by_its_line(padded, capsys):
    """--skip-invalid refused a whole file for one blank id ("has 1 empty value(s)"), naming no
    line; a blank id is skipped and listed like any other id the run cannot predict."""
    split = pd.read_csv(padded / "run" / "split.csv", dtype=str, keep_default_na=False)
    test = split.loc[split.part == "test", "entity_id"].head(2).tolist()
    ids, out = padded / "ids3.csv", padded / "p3.csv"
    ids.write_text(f'image_id\n{test[0]}\n""\n{test[1]}\n')
    argv = [str(padded / "run"), "--ids", str(ids), "--out", str(out)]
    assert predict(argv) == 2 and "(line 3): an empty id" in capsys.readouterr().err
    assert predict([*argv, "--skip-invalid"]) == 0
    assert pd.read_csv(out, dtype=str)["image_id"].tolist() == test
    assert pd.read_csv(padded / "p3.skipped.csv")["line"].tolist() == [3]
