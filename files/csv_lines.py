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
        if _one_line_each(h.handle):
            return plain
    starts, line = [], 0
    with get_handle(path, "r", compression="infer", encoding="utf-8", errors="replace") as h:
        reader = csv.reader(h.handle)  # pandas opens with newline="": a record's own newlines stay in it
        try:
            for row in reader:
                if row and not (len(row) == 1 and row[0] != "" and not row[0].strip()):  # pandas skips blank lines
                    starts.append(line + 1)
                line = reader.line_num  # the record's last line
        except csv.Error:  # e.g. a field past the csv module's size limit, which pandas reads
            return plain
    lines = np.asarray(starts[1:], dtype=np.int64)  # the first is the header
    return lines if len(lines) == n_records else plain


_BLANK = re.compile(
    rb"\n[ \t\r]*\n|\r(?!\n)"
)  # a blank or whitespace-only line (pandas skips it); a line ended by \r alone
BLOCK = 1 << 24  # bytes scanned at a time


def _one_line_each(handle) -> bool:
    """Whether the file (binary ``handle``) has neither a quote nor a blank line (nor a line ended by
    a carriage return alone, which the csv module counts): then its record r is on line r + 2,
    found at C speed, a block at a time."""
    carry = b"\n"  # the file's first line counts as after a line break
    while block := handle.read(BLOCK):
        text = carry + block
        if b'"' in block or _BLANK.search(text):
            return False
        carry = text[text.rfind(b"\n") :]  # a blank line may span two blocks
    return True


def first_long_record(path: Path | str) -> tuple[int, int, int] | None:
    """(line, fields, header fields) of the first record of the CSV at ``path`` with more fields than
    its header (None when there is none): pandas takes such a file's first column(s) as its index,
    shifting every column, or stops with a line number that does not count quoted line breaks."""
    from pandas.io.common import get_handle  # lazy: the files package's other modules need no pandas

    header, line = None, 0
    with get_handle(path, "r", compression="infer", encoding="utf-8", errors="replace") as h:
        reader = csv.reader(h.handle)
        try:
            for row in reader:
                if row and header is None:
                    header = len(row)
                elif len(row) > (header or 0):
                    return line + 1, len(row), header
                line = reader.line_num
        except csv.Error:
            return None
    return None


def lines_of(path: Path | str, rows, n_records: int) -> list[int]:
    """The file lines of data rows ``rows`` (0-based, as pandas read the CSV of ``n_records`` records)."""
    return record_lines(path, n_records)[np.asarray(rows, dtype=np.int64)].tolist()
