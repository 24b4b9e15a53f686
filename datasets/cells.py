"""A party's CSV read cell by cell as its numeric columns demand, and its bad cells named by the
file's line (files/csv_lines.py: header = line 1, blank lines counted), in training and in predict alike.

The one rule (docs/own-data.md "Blank cells and non-numbers"): in a numeric feature column a
blank cell is missing and is filled with the training mean (counted and reported); any text that
is not a number is refused, also the words pandas would read as missing ('n/a', 'NA', 'null',
'nan', ...), with the file, the line, the column and the value. Other columns (identifiers,
categorical features, the label) are read as pandas reads them.

    read_table(path, where, numeric) -> DataFrame
    cell_problems(df, numeric=..., identifiers=..., id_kind=...) -> [(column, rows (n,) bool, what)]
    refuse_problems(problems, df, path, who, names=None)   raises DatasetError naming the first
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from pandas._libs.parsers import STR_NA_VALUES

from datasets.base import DatasetError
from files.csv_header import repeated_columns
from files.csv_lines import lines_of, ragged_record
from linkage.contracts import MAX_ABS_NUMBER

BEYOND = f"is beyond ±{MAX_ABS_NUMBER:g}"  # a finite number too large to standardise, sum or link
NUMERIC_RULE = "a numeric column holds numbers, or blank cells (filled with the training mean)"


def not_utf8(where: str, path: Path, e: UnicodeDecodeError) -> DatasetError:
    byte = e.object[e.start : e.start + 1].hex()
    return DatasetError(f"{where}: file {path} is not UTF-8 text ({e.reason}, byte 0x{byte}); save it as UTF-8")


def header(path: Path, where: str) -> list[str]:
    """The column names of the CSV at ``path``; a missing file is refused with its absolute path."""
    path = Path(path).absolute()
    if not path.exists():
        raise DatasetError(f"{where}: file {path} not found")
    try:
        twice = repeated_columns(path)
    except pd.errors.EmptyDataError:
        raise DatasetError(f"{where}: file {path} is empty (no header line, no rows)") from None
    except UnicodeDecodeError as e:
        raise not_utf8(where, path, e) from None
    if twice:
        raise DatasetError(f"{where}: file {path} names column(s) {twice} more than once; name each column once")
    return list(pd.read_csv(path, nrows=0).columns)


def read_table(path: Path, where: str, numeric: Sequence[str] = (), text: Sequence[str] = ()) -> pd.DataFrame:
    """The CSV at ``path``; in the ``numeric`` columns only a blank cell is missing (NaN), so a
    word such as 'n/a' stays text for :func:`cell_problems` to refuse; the ``text`` columns (string
    identifiers) are read as text from the start ("02134" stays "02134"), only a blank cell
    missing (a surname 'NA' is a name), as the linkage service's parties read them
    (linkage_server/csv_ids.py)."""
    path = Path(path).absolute()
    columns, blank_only = header(path, where), set(numeric) | set(text)
    na = {c: [""] if c in blank_only else list(STR_NA_VALUES) for c in columns}
    try:
        df = pd.read_csv(path, keep_default_na=False, na_values=na, dtype={c: str for c in text if c in columns})
    except UnicodeDecodeError as e:  # a byte past the header line
        raise not_utf8(where, path, e) from None
    except pd.errors.ParserError as e:  # a record with more fields than the rest
        raise _ragged(where, path, e) from None
    if not isinstance(df.index, pd.RangeIndex) or ragged_record(path):  # pandas shifted or blanked a record
        raise _ragged(where, path, None)
    if df.empty:
        raise DatasetError(f"{where}: file {path} has a header line but no rows")
    return df


def _ragged(where: str, path: Path, error: Exception | None) -> DatasetError:
    """A record with more or fewer fields than the header, named by its line (files/csv_lines.py)."""
    found = ragged_record(path) or (None if error else "its records have more fields than its header names")
    return DatasetError(
        f"{where}: file {path}, {found}" if found else f"{where}: file {path} cannot be read as a CSV: {error}"
    )


def column_text(path: Path, column: str) -> np.ndarray:
    """(n,) str: one column of the CSV at ``path`` exactly as the file writes it ('007' stays '007',
    'NA' stays 'NA', a blank cell is ''), read apart from the rest: ids a predict writes back."""
    return pd.read_csv(path, usecols=[column], dtype=str, keep_default_na=False)[column].to_numpy()


def cell_problems(
    df: pd.DataFrame, *, numeric: Sequence[str] = (), identifiers: Sequence[str] = (), id_kind: str = "numeric"
) -> list[tuple[str, np.ndarray, str]]:
    """Every bad cell of ``df``, per column: (column, rows (n,) bool, what is wrong). Numeric
    feature columns: text that is not a number, inf / -inf; identifiers: NaN or empty, and for
    numeric identifiers text that is not a number."""
    out = []
    for col in numeric:
        if col in df.columns:
            raw = df[col]
            num = pd.to_numeric(raw, errors="coerce") if raw.dtype == object else raw
            out.append((col, (raw.notna() & num.isna()).to_numpy(), "is not a number"))
            values = num.to_numpy(dtype=np.float64)
            out.append((col, np.isinf(values), "is not a finite number"))
            out.append((col, np.isfinite(values) & (np.abs(values) > MAX_ABS_NUMBER), BEYOND))
    for col in identifiers:
        if col in df.columns:
            raw = df[col]
            empty = raw.isna() | (raw.astype(str).str.strip() == "")
            out.append((col, empty.to_numpy(), "is no identifier (every record needs its identifiers)"))
            if id_kind == "numeric":
                num = pd.to_numeric(raw, errors="coerce")
                if not pd.api.types.is_numeric_dtype(raw):
                    text = (raw.notna() & num.isna() & ~empty).to_numpy()
                    out.append((col, text, "is not a number (numeric identifiers)"))
                values = num.to_numpy(dtype=np.float64)
                out.append((col, np.abs(np.nan_to_num(values)) > MAX_ABS_NUMBER, f"{BEYOND} (an identifier)"))
    return [(c, rows, what) for c, rows, what in out if rows.any()]


def bad_rows(problems: list[tuple[str, np.ndarray, str]], n: int) -> np.ndarray:
    """(n,) bool: the rows with any problem."""
    bad = np.zeros(n, dtype=bool)
    for _, rows, _ in problems:
        bad |= rows
    return bad


def row_reasons(problems: list[tuple[str, np.ndarray, str]], df: pd.DataFrame) -> dict[int, str]:
    """{row: the first problem of that row, as 'column 'c': 'value' <what>'}."""
    out: dict[int, str] = {}
    for col, rows, what in problems:
        for r in np.flatnonzero(rows):
            out.setdefault(int(r), f"column {col!r}: {_shown(df[col].iloc[r])} {what}")
    return out


def refuse_problems(
    problems: list[tuple[str, np.ndarray, str]],
    df: pd.DataFrame,
    path: Path,
    who: str,
    names: Sequence | None = None,
    lines: np.ndarray | None = None,
) -> None:
    """Refuse the first problem, naming the file, its line, the column and the value, how many
    cells of the column are bad and their first lines (and the records' ids, ``names``);
    ``lines``: each record's line where the caller has them (files/csv_lines.py)."""
    if not problems:
        return
    col, rows, what = problems[0]
    idx = np.flatnonzero(rows)
    lines = lines_of(path, idx[:5], len(df)) if lines is None else lines[idx[:5]].tolist()
    ids = f" (ids {[names[i] for i in idx[:5]]})" if names is not None else ""
    feature = "identifier" not in what
    rule = f"; {NUMERIC_RULE}" if feature else ""
    others = sorted({c for c, _, _ in problems[1:] if c != col})
    also = f"; also bad cells in column(s) {others}" if others else ""
    raise DatasetError(
        f"{who}: {Path(path).absolute()}, line {lines[0]}, column {col!r}: "
        f"{_shown(df[col].iloc[idx[0]])} {what} ({len(idx)} such cell(s) in the column, lines "
        f"{lines}{ids}){rule}{also}; {'fix or blank them' if feature else 'fix or drop those rows'}"
    )


def _shown(value) -> str:
    value = value.item() if isinstance(value, np.generic) else value
    return "an empty cell" if value is None or (isinstance(value, float) and np.isnan(value)) else repr(value)


def imputed_warnings(preprocessing: dict) -> list[str]:
    """summary.json's warning about blank numeric cells filled with the training mean, per party
    (``preprocessing``: datasets.base.VFLDataset.preprocessing); none when nothing was filled."""
    parties = {"primary": preprocessing.get("primary") or {}, **(preprocessing.get("secondaries") or {})}
    filled = {p: r["nan_imputed"] for p, r in parties.items() if r.get("nan_imputed")}
    if not filled:
        return []
    total = sum(n for cols in filled.values() for n in cols.values())
    return [
        f"{total} blank numeric cell(s) were filled with the training mean (party: column: count): {filled}; "
        "blank cells are missing values, other text is refused (docs/own-data.md)"
    ]
