"""Parties' own entity ids (parties.toml ``entity_id = "<column>"``): which record of each party
is which entity, with no linkage, and the split that keeps evaluation on shared entities.

    read_entity_ids(df, column, where) -> (n,) object, the ids as text
    entity_keys(values) -> (n,) object, each id as compared (training and predict alike)
    match_entities(primary_ids, party_ids) -> (n_primary,) int64, the party's row of each entity, -1 none
    entity_rows(spec, primary_ids, frames) -> {secondary: match_entities of its file}
    entity_split(held_by_all, seed, where) -> Split   (validation / test first, sizes by eval_sizes)

Ids are compared as text, exactly, but for surrounding spaces and whole numbers (by their value):
"17" in one file and 17, 17.0 or 0017 in another are the same entity, "A7" and "a7" are not;
predict reads a user's ids alike (app/entity_aug/predict_ids.py).
"""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pandas as pd

from datasets.base import DatasetError, Split, require_columns
from linkage.contracts import CSV_NUMBER


def entity_keys(values: pd.Series) -> np.ndarray:
    """(n,) object: each id as ids are compared, one id at a time and exactly, whatever else its
    column holds: its text without surrounding spaces, a number by its decimal value (0017, 17,
    17.0 and 1.7e1 are '17'; 1.10 is '1.1'), other text as it is; missing values stay None."""
    return np.array([None if _missing(v) else _key(str(v).strip()) for v in values], dtype=object)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and value != value)  # None or NaN


def _key(text: str) -> str:
    if not CSV_NUMBER.fullmatch(text):
        return text
    value = Decimal(text)
    if value == value.to_integral_value():
        return str(int(value))  # exact at any length: '0123456789012345678' is 123456789012345678
    return format(value.normalize(), "f")  # '1.10' and 1.1 alike


def read_entity_ids(df: pd.DataFrame, column: str, where: str) -> np.ndarray:
    """(n,) object: each row's entity id as compared (:func:`entity_keys`); missing, empty and
    repeated ids are refused."""
    require_columns(df, [column], where)
    values = df[column]
    text = pd.Series(entity_keys(values), index=values.index)
    bad = (values.isna() | text.isna() | (text == "")).to_numpy()
    if bad.any():
        raise DatasetError(
            f"{where}: {int(bad.sum())} row(s) without an entity id in column {column!r} "
            f"(first rows: {np.flatnonzero(bad)[:5].tolist()}); drop or fix them"
        )
    counts = text.value_counts()
    if counts.iloc[0] > 1:
        first = counts.index[0]
        rows = np.flatnonzero((text == first).to_numpy())
        raise DatasetError(
            f"{where}: entity id {first!r} appears {int(counts.iloc[0])} times (rows "
            f"{rows[:5].tolist()}; {int((counts > 1).sum())} id(s) repeat): an entity id names "
            "one record per party"
        )
    return text.to_numpy(dtype=object)


def match_entities(primary_ids: np.ndarray, party_ids: np.ndarray) -> np.ndarray:
    """(n_primary,) int64: for each primary entity the party's row holding it, -1 where none."""
    return pd.Index(party_ids).get_indexer(primary_ids).astype(np.int64)


def entity_rows(spec: dict, primary_ids: np.ndarray, frames: dict[str, pd.DataFrame]) -> dict[str, np.ndarray]:
    """Per secondary (parties.toml ``spec``, its read file in ``frames``) its row of each primary entity (n,), -1 none."""
    return {
        name: match_entities(
            primary_ids, read_entity_ids(frames[name], p["entity_id"], f"party {name!r} ({p['file']})")
        )
        for name, p in spec["secondaries"].items()
    }


def entity_split(held_by_all: np.ndarray, seed: int, where: str) -> Split:
    """The primary's rows split so that validation and test are entities every party holds,
    held out before anything trains, at the sizes the built-in sets use whatever the overlap:
    10% and 20% of ALL the label holder's rows (seeded, as :func:`split_primary`), drawn from the
    rows every party holds. Every other row trains: the aligned training entities are the rest
    of those every party holds (the paper's overlap: a share of the training entities), so no
    validation or test entity is ever a training entity. When the rows every party holds are
    too few for that, 1% of the other 70% of the rows (at least one) stays aligned training and
    validation / test shrink in the same 1:2 ratio (the run warns: EVAL_WARN_BELOW)."""
    aligned = np.flatnonzero(held_by_all)
    if len(aligned) < 3:
        raise DatasetError(
            f"{where}: only {len(aligned)} of the label holder's entities are held by every party; "
            "validation and test entities must be, so at least 3 are needed"
        )
    n_val, n_test = eval_sizes(len(held_by_all), len(aligned))
    perm = np.random.default_rng(seed).permutation(aligned)
    val, test = np.sort(perm[:n_val]), np.sort(perm[n_val : n_val + n_test])
    train = np.setdiff1d(np.arange(len(held_by_all)), np.concatenate([val, test]))
    return Split(train=train, val=val, test=test)


EVAL_WARN_BELOW = 200  # a validation or test set under this many records is warned about (app/entity_aug/server.py)


def eval_sizes(n: int, n_aligned: int) -> tuple[int, int]:
    """(validation, test) sizes: 10% and 20% of the ``n`` rows, from the ``n_aligned`` rows every
    party holds less 1% of the other 70% of the rows (at least one) kept aligned to train;
    validation at least one."""
    want_val, want_test = max(1, int(round(0.1 * n))), max(1, int(round(0.2 * n)))
    keep = max(1, int(np.ceil(0.01 * (n - want_val - want_test))))
    room = max(2, min(n_aligned - keep, want_val + want_test))
    n_val = max(1, int(round(room * want_val / (want_val + want_test))))
    return n_val, room - n_val
