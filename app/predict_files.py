"""A predict command's files: the input checked before anything starts, the output replaced only
when the new one is whole, the records left out listed beside it.

The rule for every predict path (docs/own-data.md, docs/reference.md "Predict for new records"):
- bad input (a missing column, a non-number in a numeric column, a missing identifier, ...) is
  refused by the command itself, before any Flower process starts: exit 2, one line naming it;
- a failure after that (the run, Flower, a timeout): exit 1;
- the output is written under a temporary name in its own folder (0600) and renamed over
  ``--out`` only when whole: a failed predict leaves an older ``--out`` byte-identical, and its
  message says that file was left untouched (it is not this run's output);
- with ``--skip-invalid`` the records that cannot be predicted are left out and listed in
  ``<out stem>.skipped.csv`` (file line, id, reason), counted on stderr with their first ids;
  exit 0 only when at least one record was predicted.
"""

from __future__ import annotations

import io
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

from files.atomic import atomic_path, write_atomic


def output_refusal(out: Path, source: Path) -> str | None:
    """Why a predict reading ``source`` may not write ``out`` (None: it may): ``out`` is the input,
    or a folder, or its list of skipped records (<out stem>.skipped.csv, which every predict writes
    or removes) is the input."""
    out, source = Path(out).resolve(), Path(source).resolve()
    if out == source:
        return f"--out names the input file {source}"
    if skipped_path(out) == source:
        return (
            f"--out {out}: its list of skipped records, {skipped_path(out).name} (written or removed by every "
            "predict), would be the input file; name the output otherwise"
        )
    if out.is_dir():
        return f"--out {out} is a folder; name the CSV file to write"
    return None


def left_note(out: Path) -> str:
    """What became of ``out`` after a failed predict."""
    if Path(out).exists():
        return f"; the previous {out} was left untouched (it is not this run's output)"
    return "; no output was written"


def partial_output(out: Path) -> Path:
    """A fresh name beside ``out`` for a predict run to write (it creates it 0600, atomically)."""
    out = Path(out).resolve()
    return out.with_name(f".{out.name}.{os.getpid()}-{secrets.token_hex(4)}.partial")


def skipped_path(out: Path) -> Path:
    out = Path(out)
    return out.with_name(f"{out.stem}.skipped.csv")


def write_skipped(out: Path, skipped: list[tuple], id_column: str) -> str:
    """<out stem>.skipped.csv (line, id, reason per record left out; a header alone when none);
    returns the line for stderr ('' when none was skipped)."""
    import pandas as pd

    path = skipped_path(out)
    frame = pd.DataFrame(skipped, columns=["line", id_column or "row", "reason"])
    buf = io.StringIO()
    frame.to_csv(buf, index=False)
    write_atomic(path, buf.getvalue().encode())
    if not skipped:
        return ""
    first = ", ".join(f"{k} (line {line})" for line, k, _ in skipped[:5])
    return f"skipped {len(skipped)} record(s) that cannot be predicted, first: {first}; all of them: {path}"


def list_skipped(out: Path, skipped: list[tuple], id_column: str, skip: bool) -> str:
    """Once a predict's output is in place: the records it skipped beside it (``skip``:
    :func:`write_skipped`), else no list at all, so an earlier predict's never stands beside
    this output; returns the line for stderr."""
    if skip:
        return write_skipped(out, skipped, id_column)
    skipped_path(out).unlink(missing_ok=True)
    return ""


def input_notes(report: dict) -> list[str]:
    """The stderr lines of what predict filled in or ignored (the blank numeric cells filled with
    the training mean, unseen categories)."""
    out = []
    if report.get("nan_imputed"):
        out.append(f"note: blank numeric cell(s) filled with the training mean: {report['nan_imputed']}")
    if report.get("unseen_categories"):
        out.append(f"note: unseen categories: {report['unseen_categories']} (no one-hot feature set for them)")
    return out


def closing(out: Path, rows: int, best_epoch, report: dict, skip: bool, id_column: str) -> str:
    """After the output is in place: the notes and the skipped records on stderr (and their file);
    returns the stdout line."""
    for line in input_notes(report):
        print(line, file=sys.stderr)
    told = list_skipped(out, report.get("skipped", []), id_column, skip)
    if told:
        print(told, file=sys.stderr)
    filled = sum(report.get("nan_imputed", {}).values())
    extra = f" ({filled} blank numeric cell(s) filled with the training mean)" if filled else ""
    return f"{rows} predictions (best epoch {best_epoch}) -> {out}{extra}"


def kept_rows_input(src: Path, skipped: list[tuple], id_column: str, beside: Path) -> tuple[Path, str]:
    """A copy of the CSV ``src`` without the skipped records (their text unchanged), 0600 beside
    the output, for a predict run that reads its input itself; without an id column the records
    keep their row numbers in a ``row`` column. Returns (the copy, the id column to name)."""
    import pandas as pd

    df = pd.read_csv(src, dtype=str, keep_default_na=False)
    from files.csv_lines import record_lines  # lazy: as pandas, for a predict that skipped records

    left_out = {line for line, _, _ in skipped}
    keep = [int(line) not in left_out for line in record_lines(src, len(df))]
    if not id_column:
        if "row" in df.columns:
            raise ValueError(f"new records {src}: a column is named 'row'; name the records with --id-column")
        df.insert(0, "row", range(len(df)))
        id_column = "row"
    path = Path(beside).with_name(f".{Path(beside).name}.input.csv")
    with atomic_path(path) as tmp:
        df[keep].to_csv(tmp, index=False)
    return path, id_column


def run_to_output(out: Path, start: Callable[[Path], bool]) -> int:
    """``start(partial)`` runs the predict that writes ``partial`` (True when it ran to its end);
    the partial file replaces ``out`` only when it exists. Returns 0, or 1 with the reason."""
    partial = partial_output(out)
    try:
        if start(partial) and partial.exists():
            os.chmod(partial, 0o600)  # the predictions are the user's alone, whoever wrote them
            os.replace(partial, out)
            return 0
    finally:
        partial.unlink(missing_ok=True)
    print(f"predict failed: the run wrote no output{left_note(out)}", file=sys.stderr)
    return 1
