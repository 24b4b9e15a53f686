"""The datasets' error and their one column check (no dependency on the other datasets modules,
so datasets/base.py and datasets/transform.py both import it without a cycle)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd  # annotations only: a process that loads no table does not import pandas


class DatasetError(ValueError):
    """Bad dataset input: the message names the dataset, party and column."""


def require_columns(df: pd.DataFrame, columns: Sequence[str], where: str) -> None:
    """Refuse a frame without every named column, naming the missing ones."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DatasetError(f"{where}: missing column(s) {missing}; available: {list(df.columns)}")
