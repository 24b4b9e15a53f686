"""The one typed structure every dataset is loaded into."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from datasets.errors import DatasetError, require_columns  # noqa: F401 - the datasets' names for them

if TYPE_CHECKING:  # annotations only (datasets/transform.py does not import this module)
    from datasets.transform import FeatureTransform

Task = Literal["regression", "binary", "multiclass"]
IdKind = Literal["numeric", "string"]
TASKS = ("regression", "binary", "multiclass")


@dataclass(frozen=True)
class PartyTable:
    """One party's records: model features and linkage identifiers, row-aligned.

    features:    (n, d) float32, already numeric (one-hot etc.), NaN-free.
    identifiers: (n, d_id) float64 for numeric identifiers; strings: (n,) object/str for one
                 column, (n, c) object/str for c columns.
    """

    name: str
    features: np.ndarray
    feature_names: tuple[str, ...]
    identifiers: np.ndarray
    id_names: tuple[str, ...]
    id_kind: IdKind = "numeric"
    # what feature preparation did (datasets.tables.party_table): dropped_constant,
    # dropped_empty (column names), nan_imputed ({column: count}), nan_imputed_total
    preprocessing: dict = field(default_factory=dict, compare=False, repr=False)
    # how raw columns became ``features`` (datasets/transform.py), to prepare new records alike;
    # None for tables built otherwise (the overlap sets, tests)
    transform: FeatureTransform | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.features)
        if self.features.ndim != 2:
            raise DatasetError(f"party {self.name!r}: features must be 2-D, got shape {self.features.shape}")
        if self.features.shape[1] != len(self.feature_names):
            raise DatasetError(
                f"party {self.name!r}: {self.features.shape[1]} feature columns but "
                f"{len(self.feature_names)} feature names"
            )
        if len(self.identifiers) != n:
            raise DatasetError(f"party {self.name!r}: {n} feature rows but {len(self.identifiers)} identifier rows")
        bad = ~np.isfinite(self.features)
        if bad.any():
            col = int(np.flatnonzero(bad.any(axis=0))[0])
            raise DatasetError(
                f"party {self.name!r}: NaN/inf in feature column {self.feature_names[col]!r} "
                f"(first rows: {np.flatnonzero(bad[:, col])[:5].tolist()})"
            )

    @property
    def n_rows(self) -> int:
        return len(self.features)

    @property
    def n_features(self) -> int:
        return self.features.shape[1]


@dataclass(frozen=True)
class Split:
    """Row indices of the primary party's train / validation / test records."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray

    def train_mask(self, n: int) -> np.ndarray:
        mask = np.zeros(n, dtype=bool)
        mask[self.train] = True
        return mask


def split_primary(n: int, seed: int, ratios: tuple[float, float, float] = (0.7, 0.1, 0.2), fold: int = 0) -> Split:
    """Seeded train/val/test split of ``n`` primary rows (default 7:1:2). ``fold`` > 0: a recipe
    search's run (fedsim/recipe_search.py): the usual validation rows choose the epoch, the
    fold-th block of as many rows before them (taken from the training rows) is held out as the
    run's "test", and the real test rows are in no part at all."""
    if n < 3:
        raise DatasetError(f"the primary party needs at least 3 rows to split, got {n}")
    if abs(sum(ratios) - 1.0) > 1e-9 or min(ratios) <= 0:
        raise DatasetError(f"split ratios must be positive and sum to 1, got {ratios}")
    perm = np.random.default_rng(seed).permutation(n)
    n_train = int(round(ratios[0] * n))
    n_val = max(1, int(round(ratios[1] * n)))
    val = perm[n_train : n_train + n_val]
    if fold == 0:
        return Split(train=np.sort(perm[:n_train]), val=np.sort(val), test=np.sort(perm[n_train + n_val :]))
    if not 1 <= fold < n_train // n_val:  # at least one block of training rows stays training
        raise DatasetError(f"search-fold must be in [0, {n_train // n_val - 1}] for {n} rows, got {fold}")
    start = n_train - fold * n_val
    held = perm[start : start + n_val]
    train = np.concatenate([perm[:start], perm[start + n_val : n_train]])
    return Split(train=np.sort(train), val=np.sort(val), test=np.sort(held))


@dataclass(frozen=True)
class VFLDataset:
    """A primary party with labels and one or more secondary parties, before linkage.

    ``labels`` are float32 targets for regression, int64 class ids for classification.
    ``true_match`` (optional, synthetic sets): for each primary row the secondary row of
    the same entity, per secondary party (-1: the party holds none); used only for evaluation
    of linkage, and by Entity Augmentation, which sends records by entity.
    ``entity_ids`` (own CSVs whose parties declare an entity id column): each primary row's
    entity id; ``true_match`` then comes from them. ``metric``: the parties' linkage metric
    (parties.toml ``metric``), "" = the default for the identifiers' kind.
    """

    name: str
    task: Task
    primary: PartyTable
    labels: np.ndarray
    secondaries: dict[str, PartyTable]
    split: Split
    n_classes: int = 1
    label_name: str = "y"
    true_match: dict[str, np.ndarray] = field(default_factory=dict)
    entity_ids: np.ndarray | None = field(default=None, compare=False, repr=False)  # (n,) str
    metric: str = ""
    # own CSVs: each primary row's line in the primary's file (n,), files/csv_lines.py; None otherwise
    source_lines: np.ndarray | None = field(default=None, compare=False, repr=False)
    # secondaries this process knows by name only, their tables held by each party on its own host
    # (the primary's view: datasets/csv_views.py load_primary_view); :attr:`party_names` has all
    remote: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise DatasetError(f"dataset {self.name!r}: task must be one of {TASKS}, got {self.task!r}")
        if len(self.labels) != self.primary.n_rows:
            raise DatasetError(
                f"dataset {self.name!r}: {self.primary.n_rows} primary rows but {len(self.labels)} labels"
            )
        if self.primary.n_rows == 0:
            raise DatasetError(f"dataset {self.name!r}: the primary party has zero rows")
        if set(self.remote) & set(self.secondaries):
            raise DatasetError(
                f"dataset {self.name!r}: parties {sorted(set(self.remote) & set(self.secondaries))} "
                "are both held here and remote"
            )
        for party, table in self.secondaries.items():
            if party != table.name:
                raise DatasetError(f"dataset {self.name!r}: secondary key {party!r} != table name {table.name!r}")
            if table.n_rows == 0:
                raise DatasetError(f"dataset {self.name!r}: secondary party {party!r} has zero rows")
            if table.id_kind != self.primary.id_kind:
                raise DatasetError(
                    f"dataset {self.name!r}: party {party!r} has {table.id_kind} identifiers, "
                    f"the primary has {self.primary.id_kind}"
                )
            if table.identifiers.shape[1:] != self.primary.identifiers.shape[1:]:
                raise DatasetError(
                    f"dataset {self.name!r}: party {party!r} has identifiers of shape "
                    f"{table.identifiers.shape[1:]}, the primary {self.primary.identifiers.shape[1:]}"
                )

    @property
    def party_names(self) -> list[str]:
        """Every secondary's name: those whose tables are held here, then the remote ones."""
        return [*self.secondaries, *self.remote]

    @property
    def preprocessing(self) -> dict:
        """Per party, what feature preparation dropped and imputed (PartyTable.preprocessing); a
        remote party prepares its own features: {"remote": True}."""
        held = {p: t.preprocessing for p, t in self.secondaries.items()}
        return {
            "primary": self.primary.preprocessing,
            "secondaries": {p: held.get(p, {"remote": True}) for p in sorted(self.party_names)},
        }

    def preprocessing_note(self) -> str:
        """One line for the run's log: per party, the columns dropped and the NaN imputed."""

        def one(r: dict) -> str:
            parts = [
                f"dropped constant {r['dropped_constant']}" if r.get("dropped_constant") else "",
                f"dropped empty {r['dropped_empty']}" if r.get("dropped_empty") else "",
                f"imputed {r['nan_imputed_total']} NaN {r['nan_imputed']}" if r.get("nan_imputed_total") else "",
            ]
            return ", ".join(p for p in parts if p) or "nothing dropped or imputed"

        tables = [("primary", self.primary), *sorted(self.secondaries.items())]
        remote = [f"{who}: prepared by the party, on its own host" for who in sorted(self.remote)]
        return "; ".join([*(f"{who}: {one(t.preprocessing)}" for who, t in tables), *remote])

    def split_rule(self, seed: int, fold: int = 0) -> str:
        """How :attr:`split` was drawn, in one sentence (the run folder's split.csv says which rows)."""
        if self.entity_ids is not None:
            return (
                f"seed {seed}: validation 10% and test 20% of all the entities, held out first from those "
                "every party holds (datasets/entity_ids.py entity_split); every other row is training"
            )
        return (
            f"seed {seed}: a permutation of the primary's rows, 70% train / 10% validation / 20% test "
            "(datasets/base.py split_primary)"
            + (
                f"; a recipe search's run (fold {fold}): its 'test' is a tenth of the training rows, the "
                "real test rows are unused"
                if fold
                else ""
            )
        )

    @property
    def output_dim(self) -> int:
        return self.n_classes if self.task == "multiclass" else 1
