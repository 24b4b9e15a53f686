"""Which of a user's entity ids an Entity Augmentation run can predict, named by the user's own
ids and the lines of their file, before anything runs.

    screen_ids(raw (q,), cfg, data, lines (q,)) -> (keep (q,) bool, [(line, id, reason)] of the others)
    read_screened(run_dir, ids_csv, column, skip) -> (the ids to predict, the skipped, their texts as written)
    read_ids(csv, column) / entity_ids(ids) / held_by_every_party(cfg, data): the pieces, also
    used by app/entity_aug/predict.py and predict_server.py

Without ``skip`` any id the run cannot predict refuses the whole input (KeptError, exit 2 in the
commands); with it those ids are left out and listed (app/predict_files.py write_skipped).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from app.config import RunConfig
from app.entity_aug import id_exchange
from app.entity_aug.parties import overlap_parts
from app.kept import KeptError, read_manifest
from datasets.base import DatasetError, require_columns
from datasets.cells import column_text, read_table
from datasets.csv_parties import data_folder, read_spec
from datasets.entity_ids import entity_keys
from datasets.overlap import EntityData
from files.csv_lines import record_lines

SHOWN = 5  # ids named in a refusal
DEFAULT_ID_COLUMN = "entity"  # the ids' column for a run whose parties declare no entity id column


def id_column(given: str, cfg: RunConfig) -> str:
    """The ids' column of a predict of the run trained with ``cfg``: ``given``, else the column the
    run's primary declares as its entity id (parties.toml ``entity_id``), else "entity"."""
    if given or cfg.data.dataset != "csv":
        return given or DEFAULT_ID_COLUMN
    try:
        spec = read_spec(data_folder(cfg.data.data_dir))
    except (DatasetError, OSError):  # the run's data folder moved: the plain default, then its refusal
        return DEFAULT_ID_COLUMN
    return str(spec["primary"].get("entity_id") or DEFAULT_ID_COLUMN)


def entity_ids(ids) -> np.ndarray:
    """(q,) int64 of whole-number ids; refused by name otherwise."""
    arr = np.asarray(ids)
    if arr.ndim != 1 or len(arr) == 0:
        raise KeptError(f"entity ids must be a non-empty list (q,), got shape {arr.shape}")
    if arr.dtype.kind not in "iuf":
        raise KeptError(f"entity ids must be numbers, got {arr.dtype} values such as {arr[:3].tolist()}")
    if arr.dtype.kind == "f":
        nan = ~np.isfinite(arr)
        if nan.any():
            raise KeptError(
                f"{int(nan.sum())} entity id(s) are NaN or infinite (at positions {np.flatnonzero(nan)[:5].tolist()})"
            )
        frac = arr != np.round(arr)
        if frac.any():
            raise KeptError(f"{int(frac.sum())} entity id(s) are not whole numbers: {arr[frac][:5].tolist()}")
    return arr.astype(np.int64)


def read_ids(path: Path, column: str, declared: bool = False, empty_ok: bool = False) -> np.ndarray:
    """(q,) the entity ids in ``column`` of the CSV at ``path`` (checked by predict); with
    ``declared`` (the run's parties declared their ids) read as text, as the parties' ids, a blank
    one refused (``empty_ok``: None, for :func:`screen_ids` to name by its line)."""
    where = f"entity ids {path}"
    df = read_table(path, where, text=[column] if declared else [])  # a file's lines, long records: as training
    require_columns(df, [column], where)
    if declared:
        ids = entity_keys(df[column])  # as training compares a party's ids (datasets/entity_ids.py)
        empty = np.array([i is None or i == "" for i in ids], dtype=bool)
        if empty.any() and not empty_ok:
            lines = record_lines(path, len(df))[empty][:5].tolist()
            raise KeptError(f"{where}: column {column!r} has {int(empty.sum())} empty value(s) (lines {lines})")
        return ids
    values = pd.to_numeric(df[column], errors="coerce")
    bad = values.isna() & df[column].notna()
    if bad.any():
        raise KeptError(
            f"entity ids {path}: column {column!r} holds {int(bad.sum())} non-number(s) such as "
            f"{df[column][bad].head(3).tolist()}"
        )
    return values.to_numpy()


def held_by_every_party(cfg: RunConfig, data: EntityData) -> dict[str, np.ndarray]:
    """Per party (n,) bool: the entities it holds (declared ids: its own rows; else the overlap
    experiment's: every entity but the other parties' own shares of the training entities; in
    ``full``, every entity)."""
    if data.held is not None:
        return data.held
    n = len(data.labels)
    if cfg.ea.variant == "full" or len(data.parties) == 1:
        return {p: np.ones(n, dtype=bool) for p in data.parties}
    _, shares = overlap_parts(cfg, data)  # one per party, in data.parties' order
    held = {}
    for p in data.parties:
        mask = np.ones(n, dtype=bool)
        for q, share in zip(data.parties, shares, strict=True):
            if q != p:
                mask[share] = False
        held[p] = mask
    return held


def _indices(raw: np.ndarray, data: EntityData) -> np.ndarray:
    """(q,) each id's entity index, -1 for an id that is not an entity of the run."""
    n = len(data.labels)
    if data.entity_ids is not None:  # the parties' own ids, compared as text
        lookup = {str(v): i for i, v in enumerate(data.entity_ids)}
        return np.array([-1 if v is None else lookup.get(str(v), -1) for v in raw], dtype=np.int64)
    index = entity_ids(raw)  # whole numbers, or the input is refused as a whole
    return np.where((index >= 0) & (index < n), index, -1)


def screen_ids(raw: np.ndarray, cfg: RunConfig, data: EntityData, lines: np.ndarray) -> tuple[np.ndarray, list[tuple]]:
    """(keep (q,) bool, [(file line, id, reason)] of the ids the run cannot predict): ids that are
    not entities of the run, and entities some party does not hold; ``lines`` (q,) each id's line
    in its file (files/csv_lines.py)."""
    index = _indices(np.asarray(raw), data)
    held = held_by_every_party(cfg, data)
    unknown = (
        "not an entity of the run (the label holder's ids)"
        if data.entity_ids is not None
        else f"not an entity of the run (0..{len(data.labels) - 1})"
    )
    keep, skipped = np.ones(len(index), dtype=bool), []
    for i, (value, j) in enumerate(zip(raw, index)):
        missing = [p for p, h in held.items() if not h[j]] if j >= 0 else []
        why = unknown if j < 0 else f"not held by every party (missing at {', '.join(missing)})" if missing else ""
        if why:
            keep[i] = False
            skipped.append(
                (int(lines[i]), "" if value is None else str(value), "an empty id" if value is None else why)
            )
    return keep, skipped


def refusal(skipped: list[tuple], q: int) -> str:
    first = "; ".join(f"{k!r} (line {line}): {why}" for line, k, why in skipped[:SHOWN])
    more = f"; and {len(skipped) - SHOWN} more" if len(skipped) > SHOWN else ""
    return (
        f"{len(skipped)} of {q} entity id(s) cannot be predicted: {first}{more}. Predict serves the "
        "validation, test and aligned training entities; --skip-invalid predicts the others and lists these"
    )


def read_screened(run_dir: Path, ids_csv: Path, column: str, skip: bool) -> tuple[np.ndarray, list[tuple], np.ndarray]:
    """The ids of ``column`` in ``ids_csv`` the run can predict (as compared), the skipped (line,
    id, reason), and the predicted ids as the file writes them (for the output); without ``skip``
    a single unpredictable id raises KeptError naming the first ones."""
    cfg = RunConfig.of(**read_manifest(Path(run_dir))["run"])  # the run trained in process or over Flower
    data = id_exchange.run_data(cfg, Path(run_dir))
    raw = read_ids(Path(ids_csv), column, data.entity_ids is not None, empty_ok=True)
    keep, skipped = screen_ids(raw, cfg, data, record_lines(ids_csv, len(raw)))
    if skipped and not skip:
        raise KeptError(refusal(skipped, len(raw)))
    if not keep.any():
        raise KeptError(f"none of the {len(raw)} entity id(s) can be predicted: {refusal(skipped, len(raw))}")
    return raw[keep], skipped, column_text(Path(ids_csv), column)[keep]
