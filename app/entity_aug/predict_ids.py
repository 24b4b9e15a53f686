"""Which of a user's entity ids an Entity Augmentation run can predict, named by the user's own
ids and the lines of their file (issue 29), before anything runs.

    screen_ids(raw (q,), cfg, data) -> (keep (q,) bool, [(line, id, reason)] of the others)
    read_screened(run_dir, ids_csv, column, skip) -> (the ids to predict, the skipped)

Without ``skip`` any id the run cannot predict refuses the whole input (KeptError, exit 2 in the
commands); with it those ids are left out and listed (app/predict_files.py write_skipped).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.config import RunConfig
from app.kept import KeptError
from datasets.overlap import EntityData

SHOWN = 5  # ids named in a refusal


def _indices(raw: np.ndarray, data: EntityData) -> np.ndarray:
    """(q,) each id's entity index, -1 for an id that is not an entity of the run."""
    n = len(data.labels)
    if data.entity_ids is not None:  # the parties' own ids, compared as text
        lookup = {str(v): i for i, v in enumerate(data.entity_ids)}
        return np.array([lookup.get(str(v), -1) for v in raw], dtype=np.int64)
    from app.entity_aug.predict import entity_ids  # whole numbers, or the input is refused as a whole

    index = entity_ids(raw)
    return np.where((index >= 0) & (index < n), index, -1)


def screen_ids(raw: np.ndarray, cfg: RunConfig, data: EntityData) -> tuple[np.ndarray, list[tuple]]:
    """(keep (q,) bool, [(file line, id, reason)] of the ids the run cannot predict): ids that are
    not entities of the run, and entities some party does not hold. Lines: header = line 1."""
    from app.entity_aug.predict import held_by_every_party

    index = _indices(np.asarray(raw), data)
    held = held_by_every_party(cfg, data)
    unknown = ("not an entity of the run (the label holder's ids)" if data.entity_ids is not None
               else f"not an entity of the run (0..{len(data.labels) - 1})")
    keep, skipped = np.ones(len(index), dtype=bool), []
    for i, (value, j) in enumerate(zip(raw, index)):
        missing = [p for p, h in held.items() if not h[j]] if j >= 0 else []
        why = unknown if j < 0 else f"not held by every party (missing at {', '.join(missing)})" if missing else ""
        if why:
            keep[i] = False
            skipped.append((i + 2, str(value), why))
    return keep, skipped


def refusal(skipped: list[tuple], q: int) -> str:
    first = "; ".join(f"{k!r} (line {line}): {why}" for line, k, why in skipped[:SHOWN])
    more = f"; and {len(skipped) - SHOWN} more" if len(skipped) > SHOWN else ""
    return (f"{len(skipped)} of {q} entity id(s) cannot be predicted: {first}{more}. Predict serves the "
            "validation, test and aligned training entities; --skip-invalid predicts the others and lists these")


def read_screened(run_dir: Path, ids_csv: Path, column: str, skip: bool) -> tuple[np.ndarray, list[tuple]]:
    """The ids of ``column`` in ``ids_csv`` the run can predict, and the skipped (line, id, reason);
    without ``skip`` a single unpredictable id raises KeptError naming the first ones."""
    from app.entity_aug.parties import ea_data
    from app.kept import read_manifest
    from app.entity_aug.predict import read_ids

    cfg = RunConfig(**read_manifest(Path(run_dir))["run"])  # the run trained in process or over Flower
    data = ea_data(cfg)
    raw = read_ids(Path(ids_csv), column, data.entity_ids is not None)
    keep, skipped = screen_ids(raw, cfg, data)
    if skipped and not skip:
        raise KeptError(refusal(skipped, len(raw)))
    if not keep.any():
        raise KeptError(f"none of the {len(raw)} entity id(s) can be predicted: {refusal(skipped, len(raw))}")
    return raw[keep], skipped
