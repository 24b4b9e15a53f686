"""A CSV's lines as its user sees them in an editor: pandas skips blank lines and keeps a quoted
field's newlines in its record, so "data row + 2" named the wrong line below either. Every
message and file that names a line (training's refusals, split.csv, the linkage client's skipped
rows, predict's skipped records) names the line the record starts on."""

from __future__ import annotations

import gzip

import numpy as np
import pandas as pd
import pytest

from datasets import DatasetError, load_dataset
from datasets.cells import read_table
from linkage.contracts import LinkageError
from linkage_server.csv_ids import read_csv_identifiers, write_skipped
from tests.test_byo import write_parties

# header on line 1; a blank line; a record spanning lines 4-5 (quoted newline); whitespace-only
# and CRLF-blank lines; records start on lines 2, 4, 7, 9, 11
TRICKY = 'a,b\n1,2\n\n3,"x\ny"\n  \t\n4,5\n\n,\n\r\n6,7\r\n\n8,9\n'
STARTS = [2, 4, 7, 9, 11, 13]


def _planted(text: str) -> list[int]:
    """Brute force: the lines whose text begins a record (every non-blank line but the header
    and a quoted record's continuation)."""
    lines = text.replace("\r\n", "\n").split("\n")
    return [i + 1 for i, s in enumerate(lines) if s.strip() and i > 0 and not s.startswith('y"')]


def test_each_record_starts_on_the_line_the_file_shows(tmp_path, monkeypatch):
    from files import csv_lines
    from files.csv_lines import record_lines

    assert _planted(TRICKY) == STARTS
    plain, packed = tmp_path / "t.csv", tmp_path / "t.csv.gz"
    plain.write_text(TRICKY, newline="")
    packed.write_bytes(gzip.compress(TRICKY.encode()))
    n = len(pd.read_csv(plain, dtype=str, keep_default_na=False))
    assert n == len(STARTS)
    assert record_lines(plain, n).tolist() == STARTS
    assert record_lines(packed, n).tolist() == STARTS
    clean = tmp_path / "clean.csv"
    clean.write_text("a,b\n1,2\n3,4\n")
    assert record_lines(clean, 2).tolist() == [2, 3]
    monkeypatch.setattr(csv_lines, "BLOCK", 3)  # the fast check, its blank lines spanning two blocks
    assert record_lines(plain, n).tolist() == STARTS and record_lines(clean, 2).tolist() == [2, 3]
    clean.write_text("a,b\n1,2\n   \t \n3,4\n")
    assert record_lines(clean, 2).tolist() == [2, 4]
    old_mac = tmp_path / "cr.csv"  # lines ended by a carriage return alone
    old_mac.write_bytes(b"a,b\r1,2\r\r3,4\r")
    assert len(pd.read_csv(old_mac)) == 2 and record_lines(old_mac, 2).tolist() == [2, 4]


def _with_blank_lines(path, after: list[int]) -> list[int]:
    """Blank lines inserted after the given data rows (0-based); returns each record's new line."""
    lines = path.read_text().splitlines()
    out, starts = [lines[0]], []
    for r, line in enumerate(lines[1:]):
        starts.append(len(out) + 1)
        out.append(line)
        if r in after:
            out += ["", "   "]
    path.write_text("\n".join(out) + "\n")
    return starts


def test_a_training_refusal_names_the_line_below_blank_lines(tmp_path):
    write_parties(tmp_path)
    shops = pd.read_csv(tmp_path / "shops.csv")
    shops.loc[[7, 30], "rent"] = [np.inf, 1.0]
    shops.to_csv(tmp_path / "shops.csv", index=False)
    starts = _with_blank_lines(tmp_path / "shops.csv", after=[0, 3])
    assert starts[7] == 13  # 9 before the blank lines
    with pytest.raises(DatasetError, match=r"party 'shops'.*line 13, column 'rent': inf .*lines \[13\]"):
        load_dataset("csv", tmp_path)


def test_the_primarys_records_are_named_by_their_lines_for_split_csv_and_missing_labels(tmp_path):
    write_parties(tmp_path)
    starts = _with_blank_lines(tmp_path / "sales.csv", after=[1, 50])
    ds = load_dataset("csv", tmp_path)
    assert ds.source_lines.tolist() == starts  # split.csv's source_line
    text = (tmp_path / "sales.csv").read_text().splitlines()
    prices = [float(text[line - 1].split(",")[-1]) for line in ds.source_lines]
    np.testing.assert_allclose(prices, ds.labels, rtol=1e-6)
    sales = pd.read_csv(tmp_path / "sales.csv")
    sales.loc[60, "price"] = np.nan
    sales.to_csv(tmp_path / "sales.csv", index=False)
    _with_blank_lines(tmp_path / "sales.csv", after=[1, 50])
    with pytest.raises(DatasetError, match=r"1 missing label\(s\) \(first lines of the file: \[66\]\)"):
        load_dataset("csv", tmp_path)


def test_the_linkage_clients_skipped_rows_are_named_by_their_lines(tmp_path):
    csv = tmp_path / "ids.csv"
    csv.write_text('zip,name\n1000,a\n\n,"b\nc"\n1002,d\n\n,e\n', newline="")
    with pytest.raises(LinkageError, match=r"2 row\(s\) have a missing identifier in \['zip'\] \(lines 4, 8\)"):
        read_csv_identifiers(str(csv), ["zip"], "numbers")
    got = read_csv_identifiers(str(csv), ["zip"], "numbers", "skip")
    out = write_skipped(str(csv), got.skipped, tmp_path / "skipped.csv")
    skipped = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert skipped["csv_line"].tolist() == ["4", "8"] and skipped["name"].tolist() == ["b\nc", "e"]


def test_a_predict_inputs_copy_without_its_skipped_records_drops_the_records_on_those_lines(tmp_path):
    from app.predict_files import kept_rows_input

    src = tmp_path / "new.csv"
    src.write_text('id,x\na,1\n\nb,"2\n"\nc,3\n\nd,4\n', newline="")  # b on line 4, d on line 8
    copy, column = kept_rows_input(src, [(4, "b", "bad"), (8, "d", "bad")], "id", tmp_path / "pred.csv")
    assert column == "id" and pd.read_csv(copy, dtype=str)["id"].tolist() == ["a", "c"]


def test_a_row_with_more_fields_than_the_header_is_refused_by_file_and_line(tmp_path):
    """Data rows ending in a comma (the header not) made pandas take the first column as the
    index: every column shifted one to the left, the run trained on them, exit 0. One row with a
    field too many failed with pandas' own message, naming no file and a line that does not
    count a quoted line break. Both refused naming the file, the line an editor shows, the counts."""
    write_parties(tmp_path)
    lines = (tmp_path / "shops.csv").read_text().splitlines()
    (tmp_path / "shops.csv").write_text("\n".join([lines[0], *(line + "," for line in lines[1:])]) + "\n")
    with pytest.raises(DatasetError, match=r"party 'shops'.*shops.csv, line 2: 4 field\(s\), the header names 3"):
        load_dataset("csv", tmp_path)
    y, x, rent = lines[3].split(",")
    lines[3] = f'{y},{x},"{rent}\n"'  # a quoted line break in data row 2 (lines 4-5)
    lines[9] += ",oops"  # data row 9: line 11 in the file (one break above it)
    (tmp_path / "shops.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=r"party 'shops'.*shops.csv, line 11: 4 field\(s\), the header names 3"):
        load_dataset("csv", tmp_path)


def test_a_long_record_is_found_whatever_the_first_column_holds_and_wherever_the_header_is(tmp_path):
    """A first column of 0, 1, 2, ... made the shifted table's index look like pandas' own, so
    the check let it through; a blank line above the header was taken for the header."""
    from files.csv_lines import ragged_record

    csv = tmp_path / "t.csv"
    csv.write_text("id,x,y\n0,1.5,2.5,\n1,3.5,4.5,\n2,5.5,6.5,\n")
    with pytest.raises(DatasetError, match=r"t.csv, line 2: 4 field\(s\), the header names 3"):
        read_table(csv, "party 't'")
    csv.write_text("  \na,b\n1,2\n3,4,5\n")
    assert ragged_record(csv).startswith("line 4: 3 field(s), the header names 2")


def test_the_linkage_clients_identifiers_refuse_a_long_record_as_training_does(tmp_path):
    """Read by usecols, rows ending in a comma still shifted: 'name' linked the numbers."""
    csv = tmp_path / "ids.csv"
    csv.write_text("name,x\nann,1,\nbob,2,\n")
    for kind in ("strings", "numbers"):
        with pytest.raises(LinkageError, match=r"ids.csv: line 2: 3 field\(s\), the header names 2"):
            read_csv_identifiers(str(csv), ["name"] if kind == "strings" else ["x"], kind)


def test_a_record_with_fewer_fields_than_the_header_is_refused_not_blanked(tmp_path):
    """A record cut short (a copy or an export stopped mid-line, a value left out) was read as
    blank cells and filled with the training mean, named by no line: refused by file and line,
    with and without quotes in the file, in training and in the linkage client alike."""
    from files import csv_lines

    write_parties(tmp_path)
    lines = (tmp_path / "shops.csv").read_text().splitlines()
    lines[5] = ",".join(lines[5].split(",")[:2])  # data row 4: line 6, its rent left out
    for quoted in (False, True):
        if quoted:  # the csv module's path: a quoted field above it
            lines[2] = '"{}",{}'.format(*lines[2].split(",", 1))
        (tmp_path / "shops.csv").write_text("\n".join(lines) + "\n")
        with pytest.raises(DatasetError, match=r"shops.csv, line 6: 2 field\(s\), the header names 3"):
            load_dataset("csv", tmp_path)
        with pytest.raises(LinkageError, match=r"line 6: 2 field\(s\), the header names 3"):
            read_csv_identifiers(str(tmp_path / "shops.csv"), ["y", "x"], "numbers")
    assert csv_lines.ragged_record(tmp_path / "sales.csv") == ""


def test_a_header_ending_in_a_comma_is_no_ragged_file_and_a_form_feed_line_is_a_record(tmp_path):
    """An exporter's trailing comma on the header alone (pandas reads an empty 'Unnamed' column)
    was refused as every record being short; a line holding a form feed, which pandas reads as a
    record of blanks, was taken for a blank line."""
    from files.csv_lines import ragged_record

    csv = tmp_path / "t.csv"
    for quote in ("", '"'):
        csv.write_text(f"a,b,\n{quote}1{quote},2\n3,4\n")
        assert ragged_record(csv) == ""
    csv.write_text("a,b\n1,2\n\x0c\n3,4\n")
    assert len(pd.read_csv(csv)) == 3 and ragged_record(csv).startswith("line 3: 1 field(s), the header names 2")
