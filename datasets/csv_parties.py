"""Bring your own parties: CSV files described by a small ``parties.toml``.

Run config: ``dataset = "csv"``, ``data-dir = "<folder with parties.toml and the CSVs>"``::

    task = "regression"            # regression | binary | multiclass
    label = "price"                # a column of the primary's file
    [primary]
    file = "sales.csv"
    identifiers = ["lat", "lon"]   # numbers: Euclidean; one text column: edit distance
    kind = "numeric"               # numeric | string
    numeric = ["rooms", "area"]    # feature columns (mean-imputed, standardised on train)
    categorical = ["type"]         # one-hot
    [secondaries.airbnb]           # one table per secondary party
    file = "airbnb.csv"
    identifiers = ["latitude", "longitude"]
    kind = "numeric"
    numeric = ["price", "reviews"]
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pandas as pd

from datasets.base import TASKS, DatasetError, PartyTable, VFLDataset, split_primary
from datasets.options import DatasetOptions
from datasets.tables import party_table, require_columns

SPEC = "parties.toml"
TOP_KEYS = {"task", "label", "primary", "secondaries"}
PARTY_KEYS = {"file", "identifiers", "kind", "numeric", "categorical", "name"}


def read_spec(folder: Path) -> dict:
    path = folder / SPEC
    if not path.exists():
        raise DatasetError(f"dataset 'csv' needs data-dir = a folder holding {SPEC}; none at {path}")
    try:
        spec = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise DatasetError(f"{path}: not valid TOML ({e})") from None
    unknown = sorted(set(spec) - TOP_KEYS)
    missing = sorted(TOP_KEYS - set(spec))
    if unknown or missing:
        raise DatasetError(f"{path}: unknown key(s) {unknown}, missing key(s) {missing}; keys: {sorted(TOP_KEYS)}")
    if spec["task"] not in TASKS:
        raise DatasetError(f"{path}: task must be one of {TASKS}, got {spec['task']!r}")
    if not spec["secondaries"]:
        raise DatasetError(f"{path}: [secondaries.<name>] needs at least one party")
    for who, party in [("primary", spec["primary"]), *spec["secondaries"].items()]:
        bad = sorted(set(party) - PARTY_KEYS)
        if bad or "file" not in party or "identifiers" not in party:
            raise DatasetError(f"{path}: party {who!r} has unknown key(s) {bad} or lacks 'file'/'identifiers'; "
                               f"keys: {sorted(PARTY_KEYS)}")
        if party.get("kind", "numeric") not in ("numeric", "string"):
            raise DatasetError(f"{path}: party {who!r} kind must be 'numeric' or 'string', got {party['kind']!r}")
    return spec


def read_party(folder: Path, name: str, party: dict, fit_rows=None, df: pd.DataFrame | None = None) -> PartyTable:
    where = f"party {name!r} ({party['file']})"
    if df is None:
        df = read_csv(folder / party["file"], where)
    kind, ids = party.get("kind", "numeric"), list(party["identifiers"])
    require_columns(df, ids, where)
    if kind == "string":
        df = normalized_strings(df, ids, where)
    return party_table(name, df, id_cols=ids, id_kind=kind, numeric_cols=party.get("numeric", []),
                       categorical_cols=party.get("categorical", []), fit_rows=fit_rows)


def normalized_strings(df: pd.DataFrame, ids: list[str], where: str) -> pd.DataFrame:
    """``df`` with its one string identifier column normalised for linkage (missing values kept
    missing, for check_identifiers to refuse by name); numbers in it are refused."""
    from linkage.strings import normalize_strings

    if len(ids) != 1:
        raise DatasetError(f"{where}: kind 'string' takes one identifier column, got {ids}")
    if pd.api.types.is_numeric_dtype(df[ids[0]]):
        raise DatasetError(f"{where}: kind 'string' but identifier column {ids[0]!r} holds numbers; "
                           "use kind = 'numeric'")
    return df.assign(**{ids[0]: [normalize_strings([s])[0] if isinstance(s, str) else None for s in df[ids[0]]]})


def read_csv(path: Path, where: str) -> pd.DataFrame:
    if not path.exists():
        raise DatasetError(f"{where}: file {path} not found")
    return pd.read_csv(path)


def labels_of(values: pd.Series, task: str, where: str) -> tuple[np.ndarray, int]:
    bad = values.isna().to_numpy()
    if bad.any():
        raise DatasetError(f"{where}: {int(bad.sum())} missing label(s) (first rows {np.flatnonzero(bad)[:5].tolist()})")
    if task == "regression":
        y = pd.to_numeric(values, errors="coerce")
        if y.isna().any():
            raise DatasetError(f"{where}: task 'regression' but the label holds non-numbers, e.g. "
                               f"{values[y.isna()].iloc[0]!r}")
        return y.to_numpy(dtype=np.float32), 1
    classes = sorted(values.unique().tolist(), key=str)
    if task == "binary" and len(classes) != 2:
        raise DatasetError(f"{where}: task 'binary' needs exactly 2 label values, got {len(classes)}: {classes[:10]}")
    code = {c: i for i, c in enumerate(classes)}
    return values.map(code).to_numpy(dtype=np.int64), len(classes)


def load_csv_parties(data_dir: Path | None, opts: DatasetOptions) -> VFLDataset:
    if data_dir is None:
        raise DatasetError(f"dataset 'csv' needs data-dir = a folder holding {SPEC} and the parties' CSV files")
    folder = Path(data_dir)
    spec = read_spec(folder)
    prim = spec["primary"]
    df = read_csv(folder / prim["file"], f"primary ({prim['file']})")
    if spec["label"] not in df.columns:
        raise DatasetError(f"label column {spec['label']!r} is not in the primary's file {prim['file']}; "
                           f"columns: {list(df.columns)}")
    if opts.n_rows:
        df = df.sample(n=min(opts.n_rows, len(df)), random_state=opts.seed).reset_index(drop=True)
    labels, n_classes = labels_of(df[spec["label"]], spec["task"], f"primary ({prim['file']})")
    split = split_primary(len(df), opts.seed)
    primary = read_party(folder, prim.get("name", "primary"), prim, split.train, df)
    secondaries = {name: read_party(folder, name, p) for name, p in spec["secondaries"].items()}
    return VFLDataset(name="csv", task=spec["task"], primary=primary, labels=labels, secondaries=secondaries,
                      split=split, n_classes=n_classes if spec["task"] != "regression" else 1,
                      label_name=spec["label"])


def load_secondary_party(data_dir: Path, party: str) -> PartyTable:
    """One secondary's table alone, from its own CSV: what a deployed party's SuperNode reads
    (it needs neither the primary's file nor the other secondaries')."""
    folder = Path(data_dir)
    spec = read_spec(folder)
    if party not in spec["secondaries"]:
        raise DatasetError(f"party {party!r} is not a secondary of {folder / SPEC}; "
                           f"secondaries: {sorted(spec['secondaries'])}")
    return read_party(folder, party, spec["secondaries"][party])
