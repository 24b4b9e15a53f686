"""A CSV's column names as written. pandas reads a repeated name as "<name>.1", which no spec or
command names, so one copy would be silently unused: every reader of a party's CSV refuses a
repeated name instead (datasets/cells.py, linkage_server/csv_ids.py)."""

from __future__ import annotations

from pathlib import Path


def repeated_columns(path: Path | str) -> list[str]:
    """The names the header line of the CSV at ``path`` gives more than once (sorted; [] for none).
    An empty file raises pandas' EmptyDataError, which the caller names."""
    import pandas as pd  # lazy: the files package's other modules need no pandas

    names = pd.read_csv(path, header=None, nrows=1, dtype=str, keep_default_na=False).iloc[0].tolist()
    return sorted({n for n in names if names.count(n) > 1})
