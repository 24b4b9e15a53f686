"""Where a CSV's records are in the file, for messages that name a line: pandas skips blank
(and whitespace-only) lines and keeps a quoted field's newlines inside its record, so data row r
is line r + 2 only in a file with neither. Every reader of a party's or a user's CSV names lines
through here (datasets/, linkage_server/, app/).

    record_lines(path, n) -> (n,) each data record's first line
    lines_of(path, rows, n) -> [the lines of data rows ``rows``]
    ragged_record(path) -> "line L: F field(s), the header names H (...)" or "" (pandas would shift, stop or blank)
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np


def _records(path: Path | str) -> Iterator[tuple[int, list[str]]]:
    """(first line, fields) of each record of the CSV at ``path``, its header first, as pandas
    reads it: blank and whitespace-only lines skipped, a quoted field's line breaks kept in it.
    csv.Error (e.g. a field past the csv module's size limit, which pandas reads) is raised."""
    from pandas.io.common import get_handle  # lazy: the files package's other modules need no pandas

    line = 0
    with get_handle(path, "r", compression="infer", encoding="utf-8", errors="replace") as h:
        reader = csv.reader(h.handle)  # pandas opens with newline="": a record's own newlines stay in it
        for row in reader:
            if row and not (len(row) == 1 and row[0] != "" and not row[0].strip(" \t\r")):  # pandas skips blank lines
                yield line + 1, row
            line = reader.line_num  # the record's last line


def record_lines(path: Path | str, n_records: int) -> np.ndarray:
    """(n_records,) int64: the 1-based line on which each data record of the CSV at ``path``
    starts, as pandas reads it (the header is its first record). ``n_records`` is the count pandas
    read; where this reading disagrees with it (a dialect pandas parses otherwise), the plain
    count, r + 2, which holds for a file without blank lines or quoted newlines."""
    from pandas.io.common import get_handle  # lazy: as in _records

    plain = np.arange(n_records, dtype=np.int64) + 2
    with get_handle(path, "rb", compression="infer", is_text=False) as h:
        if _one_line_each(h.handle):
            return plain
    try:
        lines = np.asarray([line for line, _ in _records(path)][1:], dtype=np.int64)  # the first is the header
    except csv.Error:
        return plain
    return lines if len(lines) == n_records else plain


_BLANK = re.compile(rb"\n[ \t\r]*\n|\r(?!\n)")  # a blank or whitespace-only line; a line ended by \r alone
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


def ragged_record(path: Path | str) -> str:
    """What is wrong with the first record of the CSV at ``path`` whose field count is not its
    header's ("" when none, or the csv module cannot read the file): pandas takes a file whose
    records are longer as indexed by its first column(s), shifting every column, stops at one
    longer record naming a line that does not count quoted line breaks, and reads a shorter one
    (a file cut short, a value left out) as blank cells. C speed for a file without quotes."""
    from pandas.io.common import get_handle  # lazy: as in _records

    with get_handle(path, "rb", compression="infer", is_text=False) as h:
        found = _ragged_plain(h.handle)
    if found is None:  # quotes, or lines ended by \r alone: the csv module reads it as pandas does
        try:
            found = _ragged_quoted(path)
        except csv.Error:
            return ""
    if not found:
        return ""
    line, fields, header = found
    why = (
        "a comma too many, or a comma inside an unquoted value?"
        if fields > header
        else "a value left out, or a line cut short?"
    )
    return f"line {line}: {fields} field(s), the header names {header} ({why}); fix the line"


def _ragged_quoted(path: Path | str) -> tuple[int, int, int] | tuple[()]:
    header = None
    for line, row in _records(path):
        if header is None:
            header = (len(row), row[-1] == "")
        elif not _fits(len(row), header):
            return line, len(row), header[0]
    return ()


def _fits(fields: int, header: tuple[int, bool]) -> bool:
    """A record of ``fields`` fits a header of (fields, its last name empty): as many, or one fewer
    below a header ending in a comma (an exporter's quirk: pandas reads an empty 'Unnamed' column)."""
    return fields == header[0] or (header[1] and fields == header[0] - 1)


def _ragged_plain(handle) -> tuple[int, int, int] | tuple[()] | None:
    """(line, fields, header fields) of the first record whose count differs, () when none, None
    when the file has quotes or a line ended by \r alone (each line a record: commas counted)."""
    header, done, carry = None, 0, b""  # the header's fields; lines before ``carry``
    while True:
        block = handle.read(BLOCK)
        if b'"' in block or re.search(rb"\r(?!\n)", carry[-1:] + block):
            return None
        text = carry + block
        cut = text.rfind(b"\n") + 1 if block else len(text)
        full, carry = text[:cut], text[cut:]
        if full:
            found, header = _ragged_lines(full, header)
            if found:
                line, fields = found
                return done + line, fields, header[0]
            done += full.count(b"\n") + (0 if full.endswith(b"\n") else 1)
        if not block:
            return ()


def _ragged_lines(full: bytes, header: tuple | None) -> tuple[tuple[int, int] | None, tuple | None]:
    """((line within ``full``, fields) of its first record that does not fit ``header`` (fields,
    last name empty; :func:`_fits`), or None; the header, from the first non-blank line when not
    known yet)."""
    raw = np.frombuffer(full, dtype=np.uint8)
    ends = np.flatnonzero(raw == 10)  # (lines,)
    if not full.endswith(b"\n"):
        ends = np.r_[ends, len(full)]
    starts = np.r_[0, ends[:-1] + 1]
    commas = np.flatnonzero(raw == 44)
    fields = np.searchsorted(commas, ends) - np.searchsorted(commas, starts) + 1  # (lines,)
    blank = lambda i: not full[starts[i] : ends[i]].strip(b" \t\r")  # noqa: E731 - pandas skips such a line
    first = 0
    if header is None:
        first = next((i for i in range(len(ends)) if not blank(i)), len(ends))
        if first == len(ends):
            return None, None
        header, first = (
            (int(fields[first]), full[starts[first] : ends[first]].rstrip(b" \t\r").endswith(b",")),
            first + 1,
        )
    for i in first + np.flatnonzero(fields[first:] != header[0]):
        if not blank(i) and not _fits(int(fields[i]), header):
            return (int(i) + 1, int(fields[i])), header
    return None, header


def lines_of(path: Path | str, rows, n_records: int) -> list[int]:
    """The file lines of data rows ``rows`` (0-based, as pandas read the CSV of ``n_records`` records)."""
    return record_lines(path, n_records)[np.asarray(rows, dtype=np.int64)].tolist()
