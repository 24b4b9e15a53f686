"""Where a CSV's records are in the file, for messages that name a line: pandas skips blank
(and whitespace-only) lines and keeps a quoted field's newlines inside its record, so data row r
is line r + 2 only in a file with neither. Every reader of a party's or a user's CSV names lines
through here (datasets/, linkage_server/, app/)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np


def record_lines(path: Path | str, n_records: int) -> np.ndarray:
    """(n_records,) int64: the 1-based line on which each data record of the CSV at ``path``
    starts, as pandas reads it (the header is its first record). ``n_records`` is the count pandas
    read; where this reading disagrees with it (a dialect pandas parses otherwise), the plain
    count, r + 2, which holds for a file without blank lines or quoted newlines."""
    from pandas.io.common import get_handle  # lazy: the files package's other modules need no pandas

    plain = np.arange(n_records, dtype=np.int64) + 2
    with get_handle(path, "rb", compression="infer", is_text=False) as h:
        data = h.handle.read()
    if b'"' not in data and not _BLANK.search(data):  # one line per record: the count (C speed)
        return plain
    starts, line = [], 0
    with get_handle(path, "r", compression="infer", encoding="utf-8", errors="replace") as h:
        reader = csv.reader(h.handle)  # pandas opens with newline="": a record's own newlines stay in it
        for row in reader:
            if row and not (len(row) == 1 and row[0] != "" and not row[0].strip()):  # pandas skips blank lines
                starts.append(line + 1)
            line = reader.line_num  # the record's last line
    lines = np.asarray(starts[1:], dtype=np.int64)  # the first is the header
    return lines if len(lines) == n_records else plain


_BLANK = re.compile(rb"(?:^|\n)[ \t\r]*\n")  # a blank or whitespace-only line before another (pandas skips it)


def lines_of(path: Path | str, rows, n_records: int) -> list[int]:
    """The file lines of data rows ``rows`` (0-based, as pandas read the CSV of ``n_records`` records)."""
    return record_lines(path, n_records)[np.asarray(rows, dtype=np.int64)].tolist()
