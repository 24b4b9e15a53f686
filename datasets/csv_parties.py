"""Bring your own parties: CSV files described by a small ``parties.toml`` (docs/own-data.md).

Run config: ``dataset = "csv"``, ``data-dir = "<folder with parties.toml and the CSVs>"``::

    task = "regression"            # regression | binary | multiclass
    label = "price"                # a column of the primary's file
    metric = "euclidean"           # optional linkage metric ("" / absent = the default for the kind)
    [primary]
    file = "sales.csv"             # relative to the folder of parties.toml
    identifiers = ["lat", "lon"]   # numbers: euclidean (or manhattan, chebyshev); text columns: string metrics
    kind = "numeric"               # numeric | string
    numeric = ["rooms", "area"]    # feature columns: names, patterns ("px_*") or "rest"
    categorical = ["type"]         # one-hot
    entity_id = "sale_id"          # optional: the same entity has the same id in every party
    [secondaries.airbnb]           # one table per secondary party
    file = "airbnb.csv"
    identifiers = ["latitude", "longitude"]
    numeric = "rest"

With ``entity_id`` (every party, or none), ``identifiers`` may be left out (the entity id is
then the identifier), the label holder may hold labels only, ``true_match`` comes from the ids
and validation / test records are entities every party holds (datasets/entity_ids.py).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pandas as pd

from datasets.base import TASKS, DatasetError, PartyTable, VFLDataset, split_primary
from datasets.cells import cell_problems, header, read_table, refuse_problems
from datasets.columns import feature_columns, refuse_text
from datasets.entity_ids import entity_rows, entity_split, read_entity_ids
from datasets.options import PLE_BINS, SPEC, DatasetOptions, Recipe
from datasets.tables import Columns, party_table, require_columns
from files.csv_lines import record_lines
from linkage.contracts import STRING_METRICS, party_names_problem
from linkage.metrics import REGISTRY
from linkage.strings import normalize_strings

REQUIRED_KEYS = ("task", "label", "primary", "secondaries")
TOP_KEYS = {*REQUIRED_KEYS, "metric"}
PARTY_KEYS = {
    "file",
    "identifiers",
    "kind",
    "numeric",
    "categorical",
    "name",
    "entity_id",
    "scale",
    "missing",
    "ple_bins",
}
NUMERIC_METRICS = tuple(m.name for m in REGISTRY.values() if m.kind == "numbers")  # linkage.metrics


def data_folder(data_dir: Path | str | None) -> Path:
    """The absolute folder of parties.toml: every error names the paths it tried in full."""
    if data_dir is None:
        raise DatasetError(f"dataset 'csv' needs data-dir = a folder holding {SPEC} and the parties' CSV files")
    return Path(data_dir).expanduser().absolute()


def read_spec(folder: Path) -> dict:
    path = folder / SPEC
    if not path.exists():
        raise DatasetError(f"dataset 'csv' needs data-dir = a folder holding {SPEC}; none at {path}")
    try:
        spec = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark, as some editors save
    except tomllib.TOMLDecodeError as e:
        raise DatasetError(f"{path}: not valid TOML ({e})") from None
    unknown = sorted(set(spec) - TOP_KEYS)
    missing = sorted(set(REQUIRED_KEYS) - set(spec))
    if unknown or missing:
        raise DatasetError(f"{path}: unknown key(s) {unknown}, missing key(s) {missing}; keys: {sorted(TOP_KEYS)}")
    if spec["task"] not in TASKS:
        raise DatasetError(f"{path}: task must be one of {TASKS}, got {spec['task']!r}")
    if not spec["secondaries"]:
        raise DatasetError(f"{path}: [secondaries.<name>] needs at least one party")
    parties = [("primary", spec["primary"]), *spec["secondaries"].items()]
    names = [spec["primary"].get("name", "primary"), *spec["secondaries"]]
    if party_names_problem(names):  # the linkage service's rule: a name names the party's files
        raise DatasetError(f"{path}: {party_names_problem(names)}")
    for who, party in parties:
        check_party(path, who, party)
    declared = sorted(who for who, party in parties if "entity_id" in party)
    if declared and len(declared) != len(parties):
        raise DatasetError(
            f"{path}: entity_id is declared for {declared} but not for "
            f"{sorted(who for who, _ in parties if who not in declared)}: every party needs one, or none"
        )
    return spec


def check_party(path: Path, who: str, party: dict) -> None:
    bad = sorted(set(party) - PARTY_KEYS)
    if bad or "file" not in party or not ({"identifiers", "entity_id"} & set(party)):
        raise DatasetError(
            f"{path}: party {who!r} has unknown key(s) {bad} or lacks 'file' or 'identifiers' "
            f"(which 'entity_id' may stand for); keys: {sorted(PARTY_KEYS)}"
        )
    if party.get("kind", "numeric") not in ("numeric", "string"):
        raise DatasetError(f"{path}: party {who!r} kind must be 'numeric' or 'string', got {party['kind']!r}")
    if "ple_bins" in party and party.get("scale") != "ple":
        raise DatasetError(f'{path}: party {who!r} sets ple_bins, which only scale = "ple" uses')
    problems = party_recipe(party).problems()
    if problems:
        raise DatasetError(f"{path}: party {who!r} {'; '.join(problems)}")
    if not isinstance(party.get("entity_id", ""), str):
        raise DatasetError(f"{path}: party {who!r} entity_id must be one column name, got {party['entity_id']!r}")
    check_identifiers_spec(path, who, party.get("identifiers", ["-"]))


def check_identifiers_spec(path: Path, who: str, ids) -> None:
    """A party's ``identifiers``: a list of distinct column names (a column named twice would link
    one party's first identifier against another's second)."""
    if not (isinstance(ids, list) and ids and all(isinstance(c, str) and c for c in ids)):
        raise DatasetError(
            f'{path}: party {who!r} identifiers must be a list of column names, e.g. ["lat", "lon"], got {ids!r}'
        )
    repeated = sorted({c for c in ids if ids.count(c) > 1})
    if repeated:
        raise DatasetError(f"{path}: party {who!r} names identifier column(s) {repeated} more than once")


def check_metric(metric, kind: str, path: Path) -> None:
    """Refuse a ``metric`` that does not link identifiers of this kind, naming the ones that do."""
    allowed = STRING_METRICS if kind == "string" else NUMERIC_METRICS
    if metric == "" or metric in allowed:
        return
    if metric in (*STRING_METRICS, *NUMERIC_METRICS):
        other = "numeric" if kind == "string" else "string"
        raise DatasetError(
            f"{path}: metric {metric!r} is for {other} identifiers; {kind} identifiers take {list(allowed)}"
        )
    raise DatasetError(f"{path}: metric {metric!r} is not a linkage metric; {kind} identifiers take {list(allowed)}")


def read_party(
    folder: Path,
    name: str,
    party: dict,
    fit_rows=None,
    df: pd.DataFrame | None = None,
    label: str | None = None,
    scale: str = "standard",
) -> PartyTable:
    """One party's table; ``label``: the primary's label column (never a feature)."""
    where = f"party {name!r} ({party['file']})"
    if df is None:
        df = read_csv(folder / party["file"], where, party, label)
    require_columns(df, _roles_ids(party), where)
    ids, numeric, categorical = _roles(list(df.columns), party, label, where)
    require_columns(df, [*numeric, *categorical], where)  # a missing feature column, named with its file
    kind = party.get("kind") or (
        "string"
        if "identifiers" not in party and not all(pd.api.types.is_numeric_dtype(df[c]) for c in ids)
        else "numeric"
    )
    refuse_text(df, numeric, where)
    if kind == "string":
        df = normalized_strings(df, ids, where)
    return party_table(
        name,
        df,
        Columns(ids, kind, numeric=numeric, categorical=categorical),
        fit_rows=fit_rows,
        labels_only=label is not None,
        recipe=party_recipe(party, scale),  # the party's own input recipe (datasets/transform.py)
    )


def party_recipe(party: dict, scale: str = "standard") -> Recipe:
    """The input recipe a party's parties.toml section declares; ``scale``: the run's, for a party
    that declares none (run-config input-scale, the recipe search's candidates)."""
    return Recipe(party.get("scale", scale), party.get("missing", "mean"), party.get("ple_bins", PLE_BINS))


def normalized_strings(df: pd.DataFrame, ids: list[str], where: str) -> pd.DataFrame:
    """``df`` with its string identifier columns normalised for linkage (missing values kept
    missing, for check_identifiers to refuse by name); numbers in them are refused."""
    for col in ids:
        text = df[col].dropna().astype(str)
        decimals = (
            len(text) and pd.to_numeric(text, errors="coerce").notna().all() and text.str.contains(r"[.eE]").any()
        )  # read as text: codes such as "02134" are strings, decimal numbers are not
        if pd.api.types.is_numeric_dtype(df[col]) or decimals:
            raise DatasetError(
                f"{where}: kind 'string' but identifier column {col!r} holds numbers; use kind = 'numeric'"
            )
    return df.assign(
        **{col: [normalize_strings([s])[0] if isinstance(s, str) else None for s in df[col]] for col in ids}
    )


def read_csv(path: Path, where: str, party: dict | None = None, label: str | None = None) -> pd.DataFrame:
    """A party's file; with its ``party`` entry, the numeric feature columns are read and checked
    as datasets/cells.py says (only a blank cell is missing; other text refused by its line)."""
    if party is None:
        return read_table(path, where)
    columns = header(path, where)
    numeric = _roles(columns, party, label, where)[1] if set(_roles_ids(party)) <= set(columns) else []
    text = _roles_ids(party) if party.get("kind") == "string" else []  # declared: read as text
    df = read_table(path, where, numeric, text)
    refuse_text(df, numeric, where)
    ids = [c for c in _roles_ids(party) if c]  # a missing identifier named by its file line too
    kind = party.get("kind") or (
        "string"
        if "identifiers" not in party
        and not all(  # as read_party infers it
            pd.api.types.is_numeric_dtype(df[c]) for c in ids if c in df
        )
        else "numeric"
    )
    refuse_problems(cell_problems(df, numeric=numeric, identifiers=ids, id_kind=kind), df, path, where.split(" (")[0])
    return df


def _roles_ids(party: dict) -> list[str]:
    return list(party.get("identifiers", [party.get("entity_id", "")]))


def _roles(columns: list[str], party: dict, label: str | None, where: str) -> tuple[list[str], list[str], list[str]]:
    """(identifier, numeric, categorical) columns of a party's file with ``columns``."""
    entity = party.get("entity_id", "")
    ids = _roles_ids(party)
    reserved = (
        {c: "identifier" for c in ids} | ({entity: "entity id"} if entity else {}) | ({label: "label"} if label else {})
    )
    return ids, *feature_columns(columns, party.get("numeric"), party.get("categorical"), reserved, where)


def labels_of(values: pd.Series, task: str, where: str, lines=None) -> tuple[np.ndarray, int]:
    """The labels as numbers and the class count; ``lines``: each value's line in the file
    (files/csv_lines.py; default: its position below a header on line 1), named in errors."""
    lines = np.arange(len(values)) + 2 if lines is None else np.asarray(lines)
    bad = values.isna().to_numpy()
    if bad.any():
        raise DatasetError(
            f"{where}: {int(bad.sum())} missing label(s) (first lines of the file: {lines[bad][:5].tolist()})"
        )
    if task == "regression":
        y = pd.to_numeric(values, errors="coerce")
        if y.isna().any():
            raise DatasetError(
                f"{where}: task 'regression' but the label holds non-numbers, e.g. {values[y.isna()].iloc[0]!r}"
            )
        with np.errstate(over="ignore"):  # past float32's largest: inf, refused below
            y = y.to_numpy(dtype=np.float32)  # as training holds them
        bad = ~np.isfinite(y)
        if bad.any():
            raise DatasetError(
                f"{where}: {int(bad.sum())} label(s) not finite as float32 (inf, or beyond 3.4e38; first lines "
                f"of the file: {lines[bad][:5].tolist()})"
            )
        return y, 1
    classes = sorted(values.unique().tolist(), key=str)
    if task == "binary" and len(classes) != 2:
        raise DatasetError(f"{where}: task 'binary' needs exactly 2 label values, got {len(classes)}: {classes[:10]}")
    if len(classes) < 2:
        raise DatasetError(f"{where}: task {task!r} needs at least 2 label values, got {len(classes)}: {classes}")
    code = {c: i for i, c in enumerate(classes)}
    return values.map(code).to_numpy(dtype=np.int64), len(classes)


EVERY_FILE = (
    "the whole dataset needs every party's file (their identifiers are linked in this process); a "
    "primary whose linkage comes from the linkage service (run-config linkage-dir) reads only "
    f"{SPEC} and its own file"
)
ENTITY_FILES = (
    f"{SPEC} declares entity_id: validation and test records are entities every party holds "
    "(datasets/entity_ids.py), so the primary needs every party's file for its entity ids"
)


def load_csv_parties(data_dir: Path | None, opts: DatasetOptions) -> VFLDataset:
    folder = data_folder(data_dir)
    spec = read_spec(folder)
    df, source_lines, labels = primary_frame(folder, spec, opts)
    frames = secondary_frames(folder, spec, EVERY_FILE)
    drawn = draw_split(folder, spec, df, frames, opts)
    return assemble(folder, spec, (df, source_lines, labels), drawn, frames, opts.recipe.scale)


def primary_frame(folder: Path, spec: dict, opts: DatasetOptions) -> tuple[pd.DataFrame, np.ndarray, tuple]:
    """(the primary's rows (sampled to ``n_rows``), each one's line in its file (files/csv_lines.py),
    (labels, class count))."""
    prim = spec["primary"]
    path = folder / prim["file"]
    df = read_csv(path, f"party {prim.get('name', 'primary')!r} ({prim['file']})", prim, spec["label"])
    if spec["label"] not in df.columns:
        raise DatasetError(
            f"label column {spec['label']!r} is not in the primary's file {prim['file']}; columns: {list(df.columns)}"
        )
    if opts.n_rows > len(df):  # a sample of more rows than there are: the user meant another file or number
        raise DatasetError(
            f"n-rows = {opts.n_rows} is more than the primary's {len(df)} rows ({prim['file']}); "
            f"set -c n-rows=<at most {len(df)}>, or leave it out for every row"
        )
    lines = record_lines(path, len(df))  # (n,) each record's line in the file
    if opts.n_rows:
        df = df.sample(n=opts.n_rows, random_state=opts.seed)
    source_lines, df = lines[df.index.to_numpy()], df.reset_index(drop=True)
    return df, source_lines, labels_of(df[spec["label"]], spec["task"], f"primary ({prim['file']})", source_lines)


def secondary_frames(folder: Path, spec: dict, why: str) -> dict[str, pd.DataFrame]:
    """Every secondary's file, read; missing ones are named together, with ``why`` they are needed."""
    missing = [
        f"party {name!r} ({p['file']}): file {folder / p['file']} not found"
        for name, p in spec["secondaries"].items()
        if not (folder / p["file"]).exists()
    ]
    if missing:
        raise DatasetError(f"{'; '.join(missing)}: {why}")
    return {
        name: read_csv(folder / p["file"], f"party {name!r} ({p['file']})", p)
        for name, p in spec["secondaries"].items()
    }


def primary_ids(spec: dict, df: pd.DataFrame) -> np.ndarray:
    prim = spec["primary"]
    if "entity_id" not in prim:
        raise DatasetError(f"the primary ({prim['file']}) declares no entity_id in {SPEC}")
    return read_entity_ids(df, prim["entity_id"], f"party {prim.get('name', 'primary')!r} ({prim['file']})")


def draw_split(folder: Path, spec: dict, df: pd.DataFrame, frames: dict, opts: DatasetOptions, matches=None) -> tuple:
    """(the primary's Split, its entity ids or None, true_match): by entity when declared, from
    the secondaries' ``frames`` or the exchange's ``matches``."""
    if "entity_id" not in spec["primary"]:
        return split_primary(len(df), opts.seed, fold=opts.search_fold), None, {}
    if opts.search_fold:
        raise DatasetError(
            f"search-fold {opts.search_fold}: {folder / SPEC} declares entity_id, whose validation and test rows "
            "are entities every party holds (datasets/entity_ids.py), not blocks of the training rows"
        )
    entity_ids = primary_ids(spec, df)
    if matches is not None and set(matches) != set(spec["secondaries"]):
        raise DatasetError(
            f"the id exchange met {sorted(matches)}; {folder / SPEC} declares {sorted(spec['secondaries'])}: "
            "the split is drawn from every secondary's ids"
        )
    true_match = dict(matches) if matches is not None else entity_rows(spec, entity_ids, frames)
    held = np.logical_and.reduce([rows >= 0 for rows in true_match.values()])
    return entity_split(held, opts.seed, f"dataset 'csv' ({folder / SPEC})"), entity_ids, true_match


def assemble(folder: Path, spec: dict, primary_rows: tuple, drawn: tuple, frames: dict, scale: str) -> VFLDataset:
    """The VFLDataset: ``primary_rows`` from :func:`_primary_frame`, ``drawn`` from :func:`draw_split`;
    a table for each secondary whose file is in ``frames``, every other one remote; ``scale``
    for each party that declares none."""
    prim, (df, source_lines, (labels, n_classes)) = spec["primary"], primary_rows
    split, entity_ids, true_match = drawn
    primary = read_party(folder, prim.get("name", "primary"), prim, split.train, df, label=spec["label"], scale=scale)
    secondaries = {
        name: read_party(folder, name, spec["secondaries"][name], df=frame, scale=scale)
        for name, frame in frames.items()
    }
    check_metric(spec.get("metric", ""), primary.id_kind, folder / SPEC)
    return VFLDataset(
        name="csv",
        task=spec["task"],
        primary=primary,
        labels=labels,
        secondaries=secondaries,
        split=split,
        n_classes=n_classes if spec["task"] != "regression" else 1,
        label_name=spec["label"],
        true_match=true_match,
        entity_ids=entity_ids,
        metric=spec.get("metric", ""),
        source_lines=source_lines,
        remote=tuple(name for name in spec["secondaries"] if name not in secondaries),
    )
