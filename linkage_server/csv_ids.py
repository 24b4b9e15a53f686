"""A party's identifier columns read from its CSV under the missing-identifier rule (``--missing``).

A cell is missing when it is empty: NaN for numbers; for strings, empty or only whitespace (read
as text from the start, ``dtype=str`` with no NA words, so "02134" stays "02134" and a surname
"Na" or "null" stays a name). The rule for a row with a missing identifier:

- ``refuse`` (the default): nothing is uploaded; the error counts the rows, names their lines
  and the two other choices. The parties' own training (datasets/tables.py) refuses the same
  rows, and a default that dropped or blanked rows would change what is linked unseen.
- ``skip``: the row is left out. The linkage then indexes the rows that remain, in the file's
  order: exactly the linkage of the CSV with those rows deleted (its rows are the rows a run
  trains on). The skipped rows are written, with their line numbers, to a CSV of their own.
- ``empty`` (strings only): a missing cell is an empty string, so a record still links by its
  other columns; a row whose every identifier is missing has nothing to link by and is skipped
  as under ``skip``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from files.atomic import write_atomic
from files.csv_header import repeated_columns
from files.csv_lines import lines_of, ragged_record
from linkage.contracts import CSV_NUMBER, MAX_ABS_NUMBER, LinkageError
from linkage.strings import normalize_strings

MISSING_RULES = ("refuse", "skip", "empty")
TEXT_HINT = "for text identifiers (names, titles, addresses) use --kind strings"  # encode's and link's advice


@dataclass(frozen=True)
class CsvIdentifiers:
    """The identifiers of the rows kept, and which data rows (0-based, header excluded) were left out."""

    ids: np.ndarray
    skipped: np.ndarray  # (s,) int64 data rows left out
    empty_cells: int  # missing cells linked as empty strings (rule "empty")
    rows: int  # data rows in the CSV


def _table(csv: str, columns: list[str], kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(identifiers (n, c): normalised strings or float64 numbers, missing cells (n, c) bool)."""
    import pandas as pd

    header = list(pd.read_csv(csv, nrows=0).columns)
    twice = repeated_columns(csv)  # pandas would read a second copy as "<name>.1": one silently unused
    if twice:
        raise LinkageError(f"{csv}: names column(s) {twice} more than once; name each column once")
    absent = [c for c in columns if c not in header]
    if absent:
        raise LinkageError(f"{csv}: no column(s) {absent}; columns are {header}")
    try:
        df = (
            pd.read_csv(csv, usecols=columns, dtype=str, keep_default_na=False)
            if kind == "strings"
            else pd.read_csv(csv, usecols=columns)
        )
    except pd.errors.ParserError as e:  # a record with more fields than the rest
        raise LinkageError(f"{csv}: {ragged_record(csv) or e}") from None
    ragged = ragged_record(csv)  # a record shorter than the header pandas reads as blanks
    if ragged or not isinstance(df.index, pd.RangeIndex):  # longer ones: pandas indexed by their first field
        raise LinkageError(f"{csv}: {ragged or 'its records have more fields than its header names'}")
    if kind == "strings":
        table = np.array([normalize_strings(df[c].tolist()) if len(df) else [] for c in columns], dtype=str)
        table = table.reshape(len(columns), len(df)).T
        return table, table == ""
    values = np.stack([_numbers(csv, df[c], c) for c in columns], axis=1) if len(df) else np.zeros((0, len(columns)))
    return values, np.isnan(values)


def _numbers(csv: str, cells, column: str) -> np.ndarray:
    """(n,) float64 of one numeric identifier column: a blank or whitespace-only cell is missing
    (NaN, as training reads it); text that is not a number, inf, or a number beyond the bound the
    service refuses (MAX_ABS_NUMBER) is refused by its line and value."""
    import pandas as pd  # lazy: as _table's

    if cells.dtype != object:  # pandas read numbers (NaN where blank): only the values to check
        values = cells.to_numpy(dtype=np.float64)
        notnum = np.zeros(len(values), dtype=bool)
        shown = cells
    else:
        shown = cells.fillna("").astype(str).str.strip()
        values = pd.to_numeric(shown.where(shown != "", None), errors="coerce").to_numpy(dtype=np.float64)
        unread = np.flatnonzero(np.isnan(values) & (shown != "").to_numpy())  # what pandas could not read
        for r in unread[:SHOWN_CELLS]:  # '1e400' is inf (a few looked at: a column of text is refused at once)
            values[r] = _float(shown.iloc[r])
        notnum = np.isnan(values) & (shown != "").to_numpy() & (shown.str.lower() != "nan").to_numpy()
    bad = notnum | (np.abs(np.nan_to_num(values, nan=0.0)) > MAX_ABS_NUMBER)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        what = (
            f"is not a number: {TEXT_HINT}" if notnum[r] else f"is beyond ±{MAX_ABS_NUMBER:g}, as the service refuses"
        )
        line = lines_of(csv, [r], len(values))[0]
        raise LinkageError(
            f"{csv}, line {line}, column {column!r}: {str(shown.iloc[r])!r} {what} ({int(bad.sum())} such cell(s))"
        )
    return values


def _float(text: str) -> float:
    """A number as a CSV writes one, past float64's range ('1e400' is inf); NaN for anything else
    (Python's float also reads '1_000' and other scripts' digits, which training refuses)."""
    return float(text) if CSV_NUMBER.fullmatch(text) else float("nan")


SHOWN_CELLS = 100  # unreadable cells read again by Python's float before a column is refused


def read_csv_identifiers(csv: str, columns: list[str], kind: str, missing: str = "refuse") -> CsvIdentifiers:
    """One party's identifier columns from its CSV under the rule ``missing``: numbers (n, d)
    float64, or normalised strings, (n,) for one column and (n, c) for several."""
    if missing not in MISSING_RULES:
        raise LinkageError(f"--missing must be one of {MISSING_RULES}, got {missing!r}")
    if missing == "empty" and kind != "strings":
        raise LinkageError(
            "--missing empty is for --kind strings (a number cannot be empty): use --missing skip "
            "to leave out the rows with a missing number, or fill them"
        )
    table, cells = _table(csv, columns, kind)
    if len(table) == 0:
        raise LinkageError(f"{csv}: no rows below its header: nothing to link")
    bad = cells.all(axis=1) if missing == "empty" else cells.any(axis=1)
    skipped = np.flatnonzero(bad)
    if missing == "refuse" and len(skipped):
        shown = ", ".join(map(str, lines_of(csv, skipped[:10], len(table)))) + (", ..." if len(skipped) > 10 else "")
        raise LinkageError(
            f"{csv}: {len(skipped)} row(s) have a missing identifier in {columns} (lines {shown}); nothing was "
            f"uploaded or written. Choose what to do with them: --missing skip (leave them out; the linkage then "
            f"indexes the rows that remain, as if they were deleted from the file) or, for --kind strings, --missing "
            f"empty (a missing cell is an empty string; a row with every identifier missing is left out)"
        )
    if len(skipped) == len(table):
        raise LinkageError(
            f"{csv}: every one of its {len(table)} row(s) has a missing identifier in {columns}: nothing to link"
        )
    kept = table[~bad]
    ids = kept[:, 0] if kind == "strings" and len(columns) == 1 else kept
    return CsvIdentifiers(ids, skipped.astype(np.int64), int(cells[~bad].sum()), len(table))


def write_skipped(csv: str, skipped: np.ndarray, out: Path) -> Path:
    """The skipped rows of ``csv`` as they are in it (every column, as text), after their line number."""
    import pandas as pd

    table = pd.read_csv(csv, dtype=str, keep_default_na=False)
    df = table.iloc[skipped]
    df.insert(0, "csv_line", lines_of(csv, skipped, len(table)))
    write_atomic(Path(out), df.to_csv(index=False).encode())  # 0600: the party's own records
    return Path(out)


def skipped_path(csv: str, given: str | None) -> Path:
    """Where the skipped rows go: ``--skipped-out``, else ``<csv stem>.skipped.csv`` in the working folder."""
    return Path(given) if given else Path(f"{Path(csv).stem}.skipped.csv")


def report(got: CsvIdentifiers, csv: str, columns: list[str], rule: str, out: Path | None) -> str:
    """What the rule did, in one line for stderr ("" when every row was read as it is)."""
    parts = []
    if got.empty_cells:
        parts.append(f"{got.empty_cells} missing identifier(s) in {columns} treated as empty")
    if len(got.skipped):
        shown = ", ".join(map(str, lines_of(csv, got.skipped[:10], got.rows))) + (
            ", ..." if len(got.skipped) > 10 else ""
        )
        why = "every identifier missing" if rule == "empty" else "a missing identifier"
        parts.append(
            f"skipped {len(got.skipped)} row(s) with {why}: lines {shown} (written to {out}); the linkage "
            f"indexes the {len(got.ids)} rows that remain, in the file's order: train on {Path(csv).name} "
            "without them"
        )
    return f"{csv}: " + "; ".join(parts) if parts else ""
