"""Steam games (labels) <- title, edit distance -> How-Long-To-Beat (play times, review score).

Primary "steam" (27,075 games): label = more than 20,000 owners (owners != "0-20000", 31%
positive). Features: price, required age, English, achievements, release year, platforms and
the 20 most common genres / categories as multi-hot. Steam's ratings and play-time columns are
left out: they are near-proxies of the owner count (../shared/docs/datasets-notes.md).
Secondary "hltb" (60,409 titles): review score, main story / extras / completionist hours
("23h 17m" parsed), release year. Identifiers: the title (edit distance after normalisation).
steam_app_id gives the true link for 69% of Steam games (true_match, evaluation only).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from datasets.base import VFLDataset, split_primary
from datasets.options import DatasetOptions, find_data_dir
from datasets.tables import Columns, party_table, require_columns
from linkage.strings import normalize_strings

_H = re.compile(r"(?:(\d+)h)?\s*(?:(\d+)m)?")


def hours(text) -> float:
    """'23h 17m' -> 23.28; missing or unparsable -> NaN (mean-imputed later)."""
    if not isinstance(text, str) or not text.strip():
        return float("nan")
    m = _H.fullmatch(text.strip())
    if not m or not any(m.groups()):
        return float("nan")
    return float(m.group(1) or 0) + float(m.group(2) or 0) / 60.0


def multi_hot(col: pd.Series, prefix: str, top: int = 20) -> pd.DataFrame:
    items = col.fillna("").str.split(";")
    counts = pd.Series([t for row in items for t in row if t]).value_counts()
    keep = list(counts.index[:top])
    return pd.DataFrame({f"{prefix}_{t}": items.map(lambda row, t=t: float(t in row)) for t in keep})


STEAM_COLUMNS = ["appid", "name", "owners", "price", "release_date", "platforms", "genres", "categories"]
HLTB_COLUMNS = ["Name", "Review_score", "steam_app_id", "main_story", "extras", "completionist"]


def steam_features(steam: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The primary's derived columns: normalised title, release year, a 0/1 column per platform
    and the multi-hot genres and categories; returns the table and the multi-hot columns' names."""
    steam["title"] = normalize_strings(steam["name"].astype(str).tolist())
    steam["year"] = pd.to_datetime(steam["release_date"], errors="coerce").dt.year
    for p in ("windows", "mac", "linux"):
        steam[f"on_{p}"] = steam["platforms"].fillna("").str.contains(p).astype(float)
    hot = pd.concat([multi_hot(steam["genres"], "genre"), multi_hot(steam["categories"], "cat")], axis=1)
    return pd.concat([steam, hot], axis=1), list(hot.columns)


def hltb_features(hltb: pd.DataFrame) -> pd.DataFrame:
    """The secondary's derived columns: normalised title, play times in hours, release year."""
    hltb["title"] = normalize_strings(hltb["Name"].astype(str).tolist())
    for col in ("main_story", "extras", "completionist"):
        hltb[f"{col}_h"] = hltb[col].map(hours)
    hltb["year"] = pd.to_datetime(hltb.get("Release_date"), errors="coerce").dt.year
    return hltb


def true_rows(steam: pd.DataFrame, hltb: pd.DataFrame) -> np.ndarray:
    """Each Steam game's How-Long-To-Beat row by steam_app_id (the first one), -1 when none."""
    row_of_app = {}
    for j, app in enumerate(hltb["steam_app_id"].to_numpy()):
        if np.isfinite(app):
            row_of_app.setdefault(int(app), j)
    return np.array([row_of_app.get(int(a), -1) for a in steam["appid"]], dtype=np.int64)


def load_game(data_dir: Path | None, opts: DatasetOptions) -> VFLDataset:
    folder = find_data_dir("game", data_dir)
    steam = pd.read_csv(folder / "steam.csv.gz")
    hltb = pd.read_csv(folder / "hltb.csv.gz")
    require_columns(steam, STEAM_COLUMNS, "game steam.csv.gz")
    require_columns(hltb, HLTB_COLUMNS, "game hltb.csv.gz")
    if opts.n_rows:
        steam = steam.sample(n=min(opts.n_rows, len(steam)), random_state=opts.seed).reset_index(drop=True)
    steam, hot = steam_features(steam)
    split = split_primary(len(steam), opts.seed, fold=opts.search_fold)
    primary = party_table(
        "steam",
        steam,
        Columns(
            ["title"],
            "string",
            numeric=[
                "price",
                "required_age",
                "english",
                "achievements",
                "year",
                "on_windows",
                "on_mac",
                "on_linux",
                *hot,
            ],
        ),
        fit_rows=split.train,
        recipe=opts.recipe,
    )
    hltb = hltb_features(hltb)
    secondary = party_table(
        "hltb",
        hltb,
        Columns(["title"], "string", numeric=["Review_score", "main_story_h", "extras_h", "completionist_h", "year"]),
        recipe=opts.recipe,
    )
    return VFLDataset(
        name="game",
        task="binary",
        primary=primary,
        labels=(steam["owners"] != "0-20000").to_numpy().astype(np.int64),
        secondaries={"hltb": secondary},
        split=split,
        n_classes=2,
        label_name="owners > 20,000",
        true_match={"hltb": true_rows(steam, hltb)},
        metric="edit",
    )  # the paper's: the reproduction keeps raw Levenshtein (docs/results.md)
