"""One party's view of a CSV federation (datasets/csv_parties.py): what a deployed party reads
when it holds parties.toml and its own file only.

    load_primary_view(data_dir, options, matches=None) -> VFLDataset   the secondaries remote
    primary_entity_ids(data_dir, options) -> (n,)                      the primary's ids, row for row
    load_secondary_party(data_dir, party, scale) -> PartyTable         one secondary's table
    load_secondary_with_ids(data_dir, party, scale) -> (PartyTable, (n,) ids)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from datasets.base import DatasetError, PartyTable, VFLDataset
from datasets.csv_parties import (
    ENTITY_FILES,
    assemble,
    data_folder,
    draw_split,
    primary_frame,
    primary_ids,
    read_csv,
    read_party,
    read_spec,
    secondary_frames,
)
from datasets.entity_ids import read_entity_ids
from datasets.options import SPEC, DatasetOptions


def load_primary_view(data_dir: Path | None, options: DatasetOptions, matches: dict | None = None) -> VFLDataset:
    """The primary's side alone, as a deployed primary whose linkage comes from the linkage
    service holds it: parties.toml and its own file; the secondaries known by name only
    (``VFLDataset.remote``), their files never read. With ``entity_id`` the split needs each
    secondary's row of each primary row (-1 none): ``matches``, from the parties' id exchange
    (app/entity_aug/id_exchange.py), or else their files are read (a missing one is named, with
    why). Not a registered loader (datasets/registry.py): ``options`` as a loader's ``opts``."""
    folder = data_folder(data_dir)
    spec = read_spec(folder)
    df, source_lines, labels = primary_frame(folder, spec, options)
    read = "entity_id" in spec["primary"] and matches is None
    frames = secondary_frames(folder, spec, ENTITY_FILES) if read else {}
    drawn = draw_split(folder, spec, df, frames, options, matches)
    return assemble(folder, spec, (df, source_lines, labels), drawn, {}, options.recipe.scale)


def primary_entity_ids(data_dir: Path | None, options: DatasetOptions) -> np.ndarray:
    """(n,) the primary's entity ids, row for row as :func:`load_primary_view` reads its rows."""
    folder = data_folder(data_dir)
    spec = read_spec(folder)
    df, _, _ = primary_frame(folder, spec, options)
    return primary_ids(spec, df)


def load_secondary_party(data_dir: Path, party: str, scale: str = "standard") -> PartyTable:
    """One secondary's table alone, from its own CSV: what a deployed party's SuperNode reads
    (it needs neither the primary's file nor the other secondaries'); ``scale`` if it declares none."""
    folder = data_folder(data_dir)
    spec = read_spec(folder)
    if party not in spec["secondaries"]:
        raise DatasetError(
            f"party {party!r} is not a secondary of {folder / SPEC}; secondaries: {sorted(spec['secondaries'])}"
        )
    return read_party(folder, party, spec["secondaries"][party], scale=scale)


def load_secondary_with_ids(
    data_dir: Path | None, party: str, scale: str = "standard"
) -> tuple[PartyTable, np.ndarray]:
    """(:func:`load_secondary_party`'s table, its entity ids (n,)) from one read of its own CSV,
    row for row as :func:`load_csv_parties` reads it."""
    folder = data_folder(data_dir)
    spec = read_spec(folder)
    if party not in spec["secondaries"] or "entity_id" not in spec["secondaries"][party]:
        raise DatasetError(f"party {party!r} is not a secondary with an entity_id in {folder / SPEC}")
    p, where = spec["secondaries"][party], f"party {party!r} ({spec['secondaries'][party]['file']})"
    frame = read_csv(folder / p["file"], where, p)
    return read_party(folder, party, p, df=frame, scale=scale), read_entity_ids(frame, p["entity_id"], where)
