"""Which columns of a party's file are its features (parties.toml ``numeric`` / ``categorical``).

Each list may hold column names and fnmatch patterns (``*``, ``?``, ``[...]``, case-sensitive),
e.g. ``numeric = ["rooms", "pixel_*"]``; a single string is a one-item list; ``"rest"`` is every
column not otherwise used. Patterns and ``"rest"`` never pick a reserved column (the
identifiers, the entity id, the label) nor one the other list names or picks; a pattern that
picks nothing is refused. Named explicitly, the label and the entity id are refused (a leak,
and an id that is no feature); an identifier may be named as a feature on purpose.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

import pandas as pd

from datasets.base import DatasetError

REST = "rest"
KEYS = ("numeric", "categorical")
NEVER_FEATURES = {"label": "the model would be given the answer", "entity id": "an id is not a feature"}


def is_pattern(item: str) -> bool:
    return any(ch in item for ch in "*?[")


def as_items(value, key: str, where: str) -> list[str]:
    """A feature list of parties.toml as a list of names / patterns / "rest"."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise DatasetError(f'{where}: {key} must be a column name, a pattern, "rest" or a list of them; got {value!r}')


def feature_columns(
    columns: list[str], numeric, categorical, reserved: dict[str, str], where: str
) -> tuple[list[str], list[str]]:
    """(numeric, categorical) column names of a file with ``columns``, in file order for the
    columns a pattern or "rest" picks. ``reserved``: column -> its role ("identifier",
    "entity id", "label")."""
    items = {"numeric": as_items(numeric, "numeric", where), "categorical": as_items(categorical, "categorical", where)}
    if all(REST in v for v in items.values()):
        raise DatasetError(f"{where}: 'rest' in both numeric and categorical; give it to one of them")
    named = {c for v in items.values() for c in v if c != REST and not is_pattern(c)}
    out: dict[str, list[str]] = {}
    for key in sorted(KEYS, key=lambda k: REST in items[k]):  # the list holding "rest" goes last
        taken = named | {c for v in out.values() for c in v}
        out[key] = expand(items[key], key, columns, reserved, taken, where)
    both = [c for c in out["numeric"] if c in out["categorical"]]
    if both:
        raise DatasetError(f"{where}: column(s) {both} listed as both numeric and categorical; keep one")
    return out["numeric"], out["categorical"]


def expand(
    items: list[str], key: str, columns: list[str], reserved: dict[str, str], taken: set[str], where: str
) -> list[str]:
    """One feature list's names, its patterns and "rest" replaced by the free columns they pick."""
    out: list[str] = []
    for item in items:
        if item != REST and not is_pattern(item):
            role = reserved.get(item, "")
            if role in NEVER_FEATURES:
                raise DatasetError(
                    f"{where}: the {role} {item!r} is listed as a feature ({key}): {NEVER_FEATURES[role]}; remove it"
                )
            out.append(item)
            continue
        free = [c for c in columns if c not in reserved and c not in taken]
        picked = free if item == REST else [c for c in free if fnmatchcase(c, item)]
        if not picked and item != REST:
            raise DatasetError(
                f"{where}: {key} pattern {item!r} matches no column (besides identifiers, entity id, "
                f"label and the other list); columns: {columns}"
            )
        out += picked
    return list(dict.fromkeys(out))


def refuse_text(df: pd.DataFrame, numeric: list[str], where: str) -> None:
    """Refuse a column listed as numeric that holds text and no number, naming it and a value
    (one-hot it as categorical instead); a column of numbers with a few stray words is refused
    later, cell by cell (datasets.transform.numeric_features)."""
    for col in numeric:
        values = df[col] if col in df.columns else None
        if values is None or pd.api.types.is_numeric_dtype(values) or values.isna().all():
            continue
        given = values.dropna()
        if pd.to_numeric(given, errors="coerce").isna().all():
            raise DatasetError(
                f"{where}: column {col!r} is listed as numeric but holds text, e.g. {given.iloc[0]!r}; "
                "list it under categorical (one-hot) or leave it out"
            )
