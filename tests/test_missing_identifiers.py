"""Identifiers as they come in real files (issue 29 item 6): `--missing refuse|skip|empty`, strings
read as strings, and a skipped row's linkage equal to the linkage of the file without it."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from linkage.binding import identifier_digest
from linkage.contracts import LinkageError
from linkage.store import load_primary, load_secondary
from linkage_server.cli import main
from linkage_server.cli_party import read_identifiers
from tests.test_service import ADMIN, free_port, service
from tests.test_service_cli import cli

FIRST = ["anna", "bob", "zoe", "lee", "kim", "max", "eva", "tom", "ida", "ole"]
LAST = ["smith", "lee", "kim", "park", "berg", "holm", "nagy", "rossi"]


def people(seed: int, n: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    zips = [f"0{z}" for z in rng.integers(1000, 9999, n)]  # leading zeros: read as text, kept
    return pd.DataFrame({"first": rng.choice(FIRST, n), "last": rng.choice(LAST, n), "zip": zips})


def with_gaps(df: pd.DataFrame, rows_first, rows_last) -> pd.DataFrame:
    df = df.copy()
    df.loc[list(rows_first), "first"] = ""  # written as an empty cell
    df.loc[list(rows_last), "last"] = "   "  # only whitespace: missing too
    return df


def test_strings_are_read_as_strings_and_empty_cells_follow_the_rule(tmp_path):
    csv = tmp_path / "p.csv"
    csv.write_text("first,last,zip\nAnna,Smith,02134\n,Lee,00501\nNA,null,12345\n , ,99999\n")
    zips = read_identifiers(str(csv), ["zip"], "strings")
    assert zips.tolist() == ["02134", "00501", "12345", "99999"]  # leading zeros kept, not 2134
    from linkage_server.csv_ids import read_csv_identifiers

    with pytest.raises(LinkageError) as refused:
        read_csv_identifiers(str(csv), ["first", "last"], "strings")
    msg = str(refused.value)
    assert "2 row(s) have a missing identifier in ['first', 'last'] (lines 3, 5)" in msg
    assert "--missing skip" in msg and "--missing empty" in msg and "nothing was uploaded" in msg
    skip = read_csv_identifiers(str(csv), ["first", "last"], "strings", "skip")
    assert skip.ids.tolist() == [["anna", "smith"], ["na", "null"]]  # "NA" and "null" are names here
    assert skip.skipped.tolist() == [1, 3] and skip.rows == 4
    empty = read_csv_identifiers(str(csv), ["first", "last"], "strings", "empty")
    assert empty.ids.tolist() == [["anna", "smith"], ["", "lee"], ["na", "null"]]  # the all-empty row is left out
    assert empty.skipped.tolist() == [3] and empty.empty_cells == 1
    with pytest.raises(LinkageError, match="--missing empty is for --kind strings"):
        read_csv_identifiers(str(csv), ["zip"], "numbers", "empty")


def test_numbers_skip_rows_with_a_missing_number(tmp_path):
    from linkage_server.csv_ids import read_csv_identifiers

    csv = tmp_path / "n.csv"
    csv.write_text("lat,lon\n1.5,2\n,3\n4,5\n")
    with pytest.raises(LinkageError, match=r"1 row\(s\) have a missing identifier .* \(lines 3\)"):
        read_csv_identifiers(str(csv), ["lat", "lon"], "numbers")
    got = read_csv_identifiers(str(csv), ["lat", "lon"], "numbers", "skip")
    np.testing.assert_array_equal(got.ids, [[1.5, 2.0], [4.0, 5.0]])
    assert got.skipped.tolist() == [1]


def test_encode_skips_as_if_the_rows_were_deleted(tmp_path, capsys):
    """Private mode (Bloom filters): the encoding of a file with skipped rows is the encoding of the
    file without them, byte for byte, and so is the raw digest a run binds the linkage by."""
    df = people(1, 30)
    gappy = with_gaps(df, [2, 9], [9, 20])
    gappy.to_csv(tmp_path / "gappy.csv", index=False)
    gappy.drop(index=[2, 9, 20]).to_csv(tmp_path / "clean.csv", index=False)
    (tmp_path / "k.key").write_text(json.dumps({"secret": "shared by the parties"}))
    common = ["--columns", "first,last", "--kind", "strings", "--key-file", str(tmp_path / "k.key")]
    main(
        [
            "encode",
            "--csv",
            str(tmp_path / "gappy.csv"),
            *common,
            "--missing",
            "skip",
            "--skipped-out",
            str(tmp_path / "skipped.csv"),
            "--out",
            str(tmp_path / "gappy.npy"),
        ]
    )
    said = capsys.readouterr().err
    assert "skipped 3 row(s) with a missing identifier: lines 4, 11, 22" in said
    main(["encode", "--csv", str(tmp_path / "clean.csv"), *common, "--out", str(tmp_path / "clean.npy")])
    np.testing.assert_array_equal(np.load(tmp_path / "gappy.npy"), np.load(tmp_path / "clean.npy"))
    rec = json.loads((tmp_path / "gappy.npy.source.json").read_text())
    assert rec["raw_sha256"] == json.loads((tmp_path / "clean.npy.source.json").read_text())["raw_sha256"]
    assert rec["rows"] == 27 and rec["csv_rows"] == 30 and rec["skipped"] == 3
    skipped = pd.read_csv(tmp_path / "skipped.csv", dtype=str, keep_default_na=False)
    assert skipped["csv_line"].tolist() == ["4", "11", "22"]
    assert skipped["zip"].tolist() == df["zip"][[2, 9, 20]].tolist()  # the rows as they are in the file


def _job(capsys, url, tmp_path, tag):
    (tmp_path / "admin.token").write_text(ADMIN)
    job = json.loads(
        cli(
            "create-job",
            "--url",
            url,
            "--admin-token-file",
            str(tmp_path / "admin.token"),
            "--primary",
            "p",
            "--secondary",
            "s",
            "--secrets-dir",
            str(tmp_path / tag),
        ).stdout
    )["job"]

    def party(name, *args, check=True):
        return cli(
            *args,
            *(("--privacy", "off") if args[0] == "link" else ()),  # exact releases compared
            "--url",
            url,
            "--job",
            job,
            "--party",
            name,
            "--secret-file",
            str(tmp_path / tag / f"{job}-{name}.secret"),
            check=check,
        )

    return party


def _pairs(out, kept_p, kept_s):
    """(primary CSV row, secondary CSV row, similarity) of every released link, in original rows."""
    p, s = load_primary(out), load_secondary(out, "s")
    rows = s.row_of_token[p.tokens["s"]]  # (m, K) rows of the secondary's upload
    return kept_p[:, None].repeat(rows.shape[1], 1), kept_s[rows], p.sims


def test_linkage_with_skipped_rows_is_the_linkage_of_the_file_without_them(tmp_path, capsys):
    """The oracle: both parties skip rows with a missing identifier; mapped back to the original
    rows, every released pair and similarity equals the linkage of the CSVs with those rows deleted.
    With --missing empty an all-empty record is skipped too (no 422), the others link on what they have."""
    pdf, sdf = people(2, 40), people(3, 50)
    sdf.iloc[:30, :2] = pdf.iloc[:30, :2].to_numpy()  # 30 shared people
    pgap, sgap = with_gaps(pdf, [3, 17], [17, 25]), with_gaps(sdf, [0, 44], [5, 44])
    pgap.to_csv(tmp_path / "p.csv", index=False)
    sgap.to_csv(tmp_path / "s.csv", index=False)
    drop_p, drop_s = [3, 17, 25], [0, 5, 44]
    pgap.drop(index=drop_p).to_csv(tmp_path / "p_clean.csv", index=False)
    sgap.drop(index=drop_s).to_csv(tmp_path / "s_clean.csv", index=False)
    kept_p, kept_s = np.setdiff1d(np.arange(40), drop_p), np.setdiff1d(np.arange(50), drop_s)
    ids = ["--columns", "first,last", "--kind", "strings"]
    with service(tmp_path / "svc", free_port()) as url:
        for tag, suffix, rule in (("skip", "", "skip"), ("clean", "_clean", "refuse")):
            party = _job(capsys, url, tmp_path, tag)
            refused = party("s", "link", "--csv", str(tmp_path / "s.csv"), *ids, check=False)
            assert refused.returncode == 2 and "--missing skip" in refused.stderr  # the user's input
            sent = party(
                "s",
                "link",
                "--csv",
                str(tmp_path / f"s{suffix}.csv"),
                *ids,
                "--missing",
                rule,
                "--skipped-out",
                str(tmp_path / f"{tag}-s-skipped.csv"),
            )
            assert ("skipped 3 row(s) with a missing identifier: lines 2, 7, 46" in sent.stderr) == (tag == "skip")
            party(
                "p",
                "link",
                "--csv",
                str(tmp_path / f"p{suffix}.csv"),
                *ids,
                "--missing",
                rule,
                "--skipped-out",
                str(tmp_path / f"{tag}-p-skipped.csv"),
                "--start",
                "--k",
                "3",
                "--fetch",
                str(tmp_path / tag),
            )
            party("s", "fetch", "--out", str(tmp_path / tag))
        party = _job(capsys, url, tmp_path, "empty")
        party(
            "s",
            "link",
            "--csv",
            str(tmp_path / "s.csv"),
            *ids,
            "--missing",
            "empty",
            "--skipped-out",
            str(tmp_path / "empty-s-skipped.csv"),
        )  # row 44: both names empty
        got = party(
            "p",
            "link",
            "--csv",
            str(tmp_path / "p.csv"),
            *ids,
            "--missing",
            "empty",
            "--skipped-out",
            str(tmp_path / "empty-p-skipped.csv"),
            "--start",
            "--k",
            "3",
            "--fetch",
            str(tmp_path / "empty"),
        )
        assert (
            "2 missing identifier(s) in ['first', 'last'] treated as empty; skipped 1 row(s) with every "
            "identifier missing: lines 19" in got.stderr
        )
        party("s", "fetch", "--out", str(tmp_path / "empty"))
    skipped, clean = _pairs(tmp_path / "skip", kept_p, kept_s), _pairs(tmp_path / "clean", kept_p, kept_s)
    for a, b in zip(skipped, clean):
        np.testing.assert_array_equal(a, b)
    top1 = skipped[1][:, 0]  # a shared person whose copy was not skipped finds its names
    shared = (kept_p < 30) & ~np.isin(kept_p, drop_s)
    assert (sdf.iloc[top1[shared], :2].to_numpy() == pdf.iloc[kept_p[shared], :2].to_numpy()).all()
    # the primary's run on the CSV without those rows binds to this linkage: the same raw digest
    from datasets.csv_parties import normalized_strings
    from datasets.tables import read_identifiers

    clean_df = pd.read_csv(tmp_path / "p_clean.csv")
    run_ids = read_identifiers(normalized_strings(clean_df, ["first", "last"], "p"), ["first", "last"], "string", "p")
    record = json.loads((tmp_path / "skip" / "upload-record.json").read_text())
    assert record["raw_sha256"] == identifier_digest(run_ids)
    empty = load_primary(tmp_path / "empty")
    assert empty.tokens["s"].shape == (39, 3)  # rows 3 and 25 link on one name; row 17 has neither
    assert len(load_secondary(tmp_path / "empty", "s").row_of_token) == 49  # the all-empty row 44 skipped


def test_a_refused_encode_leaves_the_last_list_of_skipped_rows(tmp_path, capsys):
    """The skipped rows' list was written before the key was checked: an encode of numbers with a
    key that has no FEDERAL section (refused, exit 2) replaced the list of the last good encode,
    whose .npy stayed, so the list no longer described the identifiers beside it."""
    (tmp_path / "v1.csv").write_text("name,x\nann,1\nbob,\ncat,3\n")
    (tmp_path / "v2.csv").write_text("name,x\nann,\nbob,2\ncat,3\ndan,4\n")
    (tmp_path / "k.key").write_text(json.dumps({"secret": "shared by the parties"}))  # no 'federal' section
    skipped = tmp_path / "skipped.csv"
    common = ["--columns", "x", "--missing", "skip", "--skipped-out", str(skipped), "--out", str(tmp_path / "enc")]
    main(["encode", "--csv", str(tmp_path / "v1.csv"), *common])
    before = skipped.read_bytes()
    with pytest.raises(SystemExit) as done:
        main(["encode", "--csv", str(tmp_path / "v2.csv"), "--key-file", str(tmp_path / "k.key"), *common])
    assert done.value.code == 2 and "federal" in capsys.readouterr().err
    assert skipped.read_bytes() == before


def test_encode_refuses_an_out_that_is_a_folder(tmp_path, capsys):
    """`encode --out DIR` wrote DIR.npy beside the folder (exit 0): refused by name, nothing written."""
    people(1, 10).to_csv(tmp_path / "p.csv", index=False)
    (tmp_path / "k.key").write_text(json.dumps({"secret": "shared by the parties"}))
    (tmp_path / "enc").mkdir()
    argv = ["encode", "--csv", str(tmp_path / "p.csv"), "--columns", "first,last", "--kind", "strings"]
    with pytest.raises(SystemExit) as done:
        main([*argv, "--key-file", str(tmp_path / "k.key"), "--out", str(tmp_path / "enc")])
    assert done.value.code == 2 and "--out" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["enc", "k.key", "p.csv"]


def test_skipped_out_may_not_name_the_input_the_key_or_the_output(tmp_path, capsys):
    """`encode --missing skip --skipped-out X` wrote the skipped rows over X: over the party's CSV
    (its data gone, exit 0), over the shared key (then failed reading it), over --out (the list
    lost). Each is refused before anything is read or written, and each file stays as it was."""
    people(1, 10).pipe(with_gaps, [2], [5]).to_csv(tmp_path / "p.csv", index=False)
    (tmp_path / "k.key").write_text(json.dumps({"secret": "shared by the parties"}))
    argv = ["encode", "--csv", str(tmp_path / "p.csv"), "--columns", "first,last", "--kind", "strings"]
    argv += ["--key-file", str(tmp_path / "k.key"), "--missing", "skip", "--out", str(tmp_path / "e.npy")]
    (tmp_path / "d").mkdir()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    for target in ("p.csv", "k.key", "e.npy", "e.npy.source.json", "d"):
        out = cli(*argv, "--skipped-out", str(tmp_path / target), check=False)
        assert out.returncode == 2 and "--skipped-out" in out.stderr, out.stderr
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_only_encode_writes_its_out_as_npy_so_only_its_npy_names_clash(tmp_path):
    """query writes --out as named: `query --npy new.npy --out new` is no clash (it was refused)."""
    np.save(tmp_path / "new.npy", np.zeros((2, 2)))
    (tmp_path / "s.secret").write_text("x" * 32)
    argv = ["query", "--npy", str(tmp_path / "new.npy"), "--out", str(tmp_path / "new"), "--url", "http://127.0.0.1:1"]
    out = cli(
        *argv, "--job", "0123456789abcdef", "--party", "p", "--secret-file", str(tmp_path / "s.secret"), check=False
    )
    assert "is also" not in out.stderr and "cannot reach the linkage service" in out.stderr, out.stderr


def test_a_numeric_identifier_that_is_blank_text_or_too_large_is_named_by_its_line(tmp_path):
    """A whitespace-only number was 'text' (use --kind strings), naming no line and not offering
    --missing skip, where training counts it as missing; 1e400 was the same 'text', and inf went
    into the .npy. Blank is missing (skip works), the others are refused by line and value."""
    from linkage_server.csv_ids import read_csv_identifiers

    csv = tmp_path / "n.csv"
    csv.write_text("lat,lon\n1.5,2.5\n\n , 3\n4,5\n")
    with pytest.raises(LinkageError, match=r"1 row\(s\) have a missing identifier .* \(lines 4\)"):
        read_csv_identifiers(str(csv), ["lat", "lon"], "numbers")
    got = read_csv_identifiers(str(csv), ["lat", "lon"], "numbers", "skip")
    np.testing.assert_array_equal(got.ids, [[1.5, 2.5], [4.0, 5.0]])
    cases = (("abc", "'abc' is not a number"), ("1e400", "'1e400' is beyond"), ("inf", "'inf' is beyond"))
    for bad, what in (*cases, ("1_000", "'1_000' is not a number")):  # as training refuses it
        csv.write_text(f"lat,lon\n1.5,2.5\n\n{bad},3\n")
        with pytest.raises(LinkageError, match=rf"n.csv, line 4, column 'lat': {what}"):
            read_csv_identifiers(str(csv), ["lat", "lon"], "numbers")


def test_make_key_fits_the_numbers_it_has_and_advises_only_its_own_options(tmp_path):
    """make-key refused a missing number suggesting --missing skip and --kind strings, options it
    does not have: a missing number does not move the range it fits, and text gets advice it can use."""
    csv, key = tmp_path / "b.csv", tmp_path / "k.json"
    csv.write_text("lat,lon\n1.5,2.5\n,3\n4,5\n")
    assert cli("make-key", "--out", str(key), "--csv", str(csv), "--columns", "lat,lon", "--k", "1").returncode == 0
    assert json.loads(key.read_text())["federal"]["lo"] == [1.5, 2.5]
    csv.write_text("lat,lon\n1.5,2.5\nabc,3\n")
    argv = ["make-key", "--out", str(tmp_path / "k2.json"), "--csv", str(csv), "--columns", "lat,lon", "--k", "1"]
    out = cli(*argv, check=False)
    assert out.returncode == 2 and "line 3, column 'lat'" in out.stderr and "--kind" not in out.stderr, out.stderr
    assert "without --csv" in out.stderr and not (tmp_path / "k2.json").exists()
