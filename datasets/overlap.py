"""The Entity Augmentation paper's classification sets as secondaries' (the paper's guests')
feature blocks of the same entities, and its overlap experiment's split of the training entities.

Every set here is named in datasets/registry.py like the other loaders (``dataset = "credit"``), as a
:class:`VFLDataset` whose primary (the host) holds the labels and no features, and whose
secondaries are the guests; secondary rows are in entity order (``true_match`` is the identity):
the entity id is the row index, which every party knows (the paper's serialised entities).

- ``credit``: UCI default of credit card clients, X1..X23 in 4 contiguous shares (binary).
- ``parkinsons``: UCI Parkinsons, its 22 voice features in 4 contiguous shares (binary).
- ``handwritten``: UCI Multiple Features, its 6 views = 6 secondaries (10 digits).
- ``digits``: scikit-learn's bundled 8x8 digits, left / right image halves = 2 secondaries.

Features are standardised with the training entities' mean and std only. The split is the
project's seeded 7:1:2 (:func:`split_primary`); validation and test entities are held by
every secondary (aligned) and never trained on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from datasets.base import DatasetError, PartyTable, Split, VFLDataset, split_primary
from datasets.options import DatasetOptions, find_data_dir
from datasets.tables import require_columns, standardize

TABULAR_SECONDARIES = 4  # the paper: "tabular and multiview datasets are divided evenly across four guests"
HANDWRITTEN_VIEWS = ("pix", "fou", "fac", "zer", "kar", "mor")  # the .mat's order: 240/76/216/47/64/6 features
# the party name of the primary's (the paper's host's) own feature block, if it has features; the
# value stays "host": run records and kept models name the party so
PRIMARY_BLOCK = "host"


# ---------------------------------------------------------------------------- the entities' view


@dataclass(frozen=True)
class EntityData:
    """Every party's features indexed by entity id, the labels, and the split of entities.

    blocks: party -> (n, d_p) float32, row j = that party's features of entity j. The secondaries,
    plus ``"host"`` (PRIMARY_BLOCK) when the label holder has features of its own.
    """

    name: str
    task: str
    n_classes: int
    blocks: dict[str, np.ndarray]
    labels: np.ndarray  # (n,)
    split: Split
    # party -> (n,) bool, the entities it holds, from the parties' own entity ids (parties.toml
    # entity_id; a row it does not hold is zeros and never sent); None: every party holds every
    # entity and the overlap is the experiment's (run-config overlap, :func:`overlap_split`)
    held: dict[str, np.ndarray] | None = None
    entity_ids: np.ndarray | None = None  # (n,) the parties' id of each entity, with ``held``
    party_rows: dict[str, np.ndarray] | None = None  # with ``held``: party -> (n,) its row of each entity, -1 none
    # parties whose features stay on their own node (an id exchange: app/entity_aug/id_exchange.py):
    # their blocks here are read-only zero views of their width
    remote: tuple[str, ...] = ()
    preprocessing: dict = field(default_factory=dict, compare=False, repr=False)  # VFLDataset.preprocessing

    @property
    def secondaries(self) -> list[str]:
        return sorted(p for p in self.blocks if p != PRIMARY_BLOCK)

    @property
    def parties(self) -> list[str]:
        """Secondaries (sorted), then the primary's own block if any: the order of the primary's input."""
        return self.secondaries + ([PRIMARY_BLOCK] if PRIMARY_BLOCK in self.blocks else [])


def entity_data(ds: VFLDataset, widths: dict[str, int] | None = None) -> EntityData:
    """Any dataset whose every secondary row of every entity is known (``true_match``) as
    entity-indexed blocks; the primary's features, if any, become the primary's own block. With the
    parties' own entity ids (``ds.entity_ids``) a party may hold only some entities: see
    :func:`entity_data_from_ids` (``widths``: the feature count of each party remote here)."""
    if PRIMARY_BLOCK in ds.secondaries:
        raise DatasetError(
            f"dataset {ds.name!r}: a secondary may not be called {PRIMARY_BLOCK!r} (the primary's own block)"
        )
    if ds.entity_ids is not None:
        return entity_data_from_ids(ds, widths or {})
    n = ds.primary.n_rows
    missing = [p for p in ds.secondaries if p not in ds.true_match or (ds.true_match[p] < 0).any()]
    if missing:
        raise DatasetError(
            f"dataset {ds.name!r}: party {missing[0]!r} does not hold every entity under a known id "
            "(no complete true_match), so its records cannot be sent by entity id; "
            "entity-aug runs on credit, parkinsons, handwritten, digits, or on your own CSVs: declare each "
            'party\'s entity id column in parties.toml (entity_id = "<column>"; docs/own-data.md)'
        )
    blocks = {p: t.features[ds.true_match[p]] for p, t in ds.secondaries.items()}  # (n, d_p) each
    if ds.primary.n_features:
        blocks[PRIMARY_BLOCK] = ds.primary.features
    for p, b in blocks.items():
        if len(b) != n:
            raise DatasetError(f"dataset {ds.name!r}: party {p!r} has {len(b)} entity rows, the primary {n}")
    return EntityData(ds.name, ds.task, ds.n_classes, blocks, ds.labels, ds.split, preprocessing=ds.preprocessing)


def entity_data_from_ids(ds: VFLDataset, widths: dict[str, int]) -> EntityData:
    """Entities = the label holder's rows some party holds (its own block counts); a party's
    block row of an entity it lacks is zeros, never sent (``held``). The split is the
    dataset's (datasets/entity_ids.py: validation and test entities are held by every party).
    A party remote here (``ds.remote``) gets a read-only zero view of its width in ``widths``."""
    rows = dict(ds.true_match)  # party -> (n_primary,) its row of each entity, -1 none
    tables = dict(ds.secondaries)
    if ds.primary.n_features:
        rows[PRIMARY_BLOCK], tables[PRIMARY_BLOCK] = np.arange(ds.primary.n_rows), ds.primary
    keep = np.flatnonzero(np.logical_or.reduce([r >= 0 for r in rows.values()]))  # (n,) primary rows
    pos = np.full(ds.primary.n_rows, -1)
    pos[keep] = np.arange(len(keep))
    blocks, held = {}, {}
    for p, r in rows.items():
        r = r[keep]
        held[p] = r >= 0
        if p in tables:
            blocks[p] = np.zeros((len(keep), tables[p].n_features), dtype=np.float32)  # (n, d_p)
            blocks[p][held[p]] = tables[p].features[r[held[p]]]
        else:
            blocks[p] = np.broadcast_to(np.zeros((1, widths[p]), dtype=np.float32), (len(keep), widths[p]))
    train = pos[ds.split.train]
    split = Split(train=train[train >= 0], val=pos[ds.split.val], test=pos[ds.split.test])  # val, test: held by all
    return EntityData(
        ds.name,
        ds.task,
        ds.n_classes,
        blocks,
        ds.labels[keep],
        split,
        held=held,
        entity_ids=ds.entity_ids[keep],
        party_rows={p: r[keep] for p, r in rows.items()},
        remote=tuple(p for p in rows if p not in tables),
        preprocessing=ds.preprocessing,
    )


def entity_overlap(
    data: EntityData, x: float, rng: np.random.Generator, variant: str = "augment"
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The aligned training entities and each party's share of the others (in ``data.parties``'
    order). Without entity ids: the paper's overlap experiment, :func:`overlap_split` with the
    fraction ``x``. With the parties' own ids the ids decide (``x`` and ``rng`` unused): aligned
    = the training entities every party holds, a party's share = those it holds that another
    lacks; variant "full" (every party trains on every entity) is refused unless none lacks any."""
    if data.held is None:
        return overlap_split(data.split.train, len(data.parties), x, rng)
    train = data.split.train
    every = np.logical_and.reduce([data.held[p][train] for p in data.parties])  # (n_train,)
    if variant == "full" and not every.all():
        lacking = {p: int((~data.held[p][train]).sum()) for p in data.parties if not data.held[p][train].all()}
        raise DatasetError(
            f"dataset {data.name!r}: ea-variant 'full' trains every party on every training entity, "
            f"but the parties' entity ids leave some out (missing per party: {lacking}); use "
            "ea-variant 'augment' or 'aligned'"
        )
    return train[every], [train[data.held[p][train] & ~every] for p in data.parties]


def overlap_split(
    train_ids: np.ndarray, n_parties: int, x: float, rng: np.random.Generator
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The paper's overlap experiment: a fraction ``x`` of the training entities is held by
    every party (aligned); the rest is shuffled and cut into ``n_parties`` disjoint shares of
    (almost) equal size, one per party. Returns (aligned ids (m,), [share ids per party])."""
    if not 0.0 < x <= 1.0:
        raise ValueError(f"overlap must be in (0, 1], got {x}")
    if n_parties < 1:
        raise ValueError(f"need at least one party, got {n_parties}")
    perm = rng.permutation(np.asarray(train_ids))
    n_aligned = max(1, int(round(x * len(perm))))
    return np.sort(perm[:n_aligned]), [np.sort(s) for s in np.array_split(perm[n_aligned:], n_parties)]


# ---------------------------------------------------------------------------- loaders


def contiguous_shares(columns: list[str], n_shares: int) -> list[list[str]]:
    """Columns cut into ``n_shares`` contiguous shares of (almost) equal size."""
    return [list(c) for c in np.array_split(np.asarray(columns, dtype=object), n_shares)]


def _subsample(n: int, opts: DatasetOptions) -> np.ndarray:
    if not opts.n_rows or opts.n_rows >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng([opts.seed, 31]).choice(n, opts.n_rows, replace=False))


def _as_dataset(
    name: str,
    raw: dict[str, tuple[np.ndarray, list[str]]],
    y: np.ndarray,
    task: str,
    label_name: str,
    opts: DatasetOptions,
) -> VFLDataset:
    """Secondaries' raw blocks (features, names) of the same entities -> a primary with labels only."""
    rows = _subsample(len(y), opts)
    y = y[rows]
    n = len(y)
    split = split_primary(n, opts.seed, fold=opts.search_fold)
    entity = np.arange(n, dtype=np.float64)[:, None]  # (n, 1) the shared entity id
    primary = PartyTable(PRIMARY_BLOCK, np.zeros((n, 0), dtype=np.float32), (), entity, ("entity",))
    secondaries = {
        g: PartyTable(
            g, standardize(np.asarray(x, dtype=np.float64)[rows], split.train), tuple(cols), entity, ("entity",)
        )
        for g, (x, cols) in raw.items()
    }
    classes = np.unique(y)
    return VFLDataset(
        name=name,
        task=task,
        primary=primary,
        labels=np.searchsorted(classes, y).astype(np.int64),
        secondaries=secondaries,
        split=split,
        n_classes=len(classes),
        label_name=label_name,
        true_match={g: np.arange(n) for g in secondaries},
    )


def _tabular(name: str, df: pd.DataFrame, feature_cols: list[str], label: str, opts: DatasetOptions) -> VFLDataset:
    require_columns(df, [*feature_cols, label], name)
    # the party names "guest_<i>" are kept as runs and kept models name them
    raw = {
        f"guest_{i}": (df[cols].to_numpy(dtype=np.float64), cols)
        for i, cols in enumerate(contiguous_shares(feature_cols, TABULAR_SECONDARIES))
    }
    return _as_dataset(name, raw, df[label].to_numpy(), "binary", label, opts)


def load_credit(data_dir: Path | None, opts: DatasetOptions) -> VFLDataset:
    df = pd.read_csv(find_data_dir("credit_default", data_dir) / "UCI_Credit_Card.csv.gz")
    return _tabular("credit", df, [f"X{i}" for i in range(1, 24)], "Y", opts)


def load_parkinsons(data_dir: Path | None, opts: DatasetOptions) -> VFLDataset:
    df = pd.read_csv(find_data_dir("parkinsons", data_dir) / "parkinsons.data")
    features = [c for c in df.columns if c not in ("name", "status")]
    return _tabular("parkinsons", df, features, "status", opts)


def load_handwritten(data_dir: Path | None, opts: DatasetOptions) -> VFLDataset:
    import scipy.io

    mat = scipy.io.loadmat(find_data_dir("handwritten", data_dir) / "handwritten.mat")
    views = mat["X"].ravel()
    if len(views) != len(HANDWRITTEN_VIEWS):
        raise DatasetError(f"handwritten.mat: expected {len(HANDWRITTEN_VIEWS)} views, got {len(views)}")
    raw = {
        v: (np.asarray(x, dtype=np.float64), [f"{v}{i}" for i in range(x.shape[1])])
        for v, x in zip(HANDWRITTEN_VIEWS, views)
    }
    return _as_dataset("handwritten", raw, mat["Y"].ravel(), "multiclass", "digit", opts)


def load_digits_halves(data_dir: Path | None, opts: DatasetOptions) -> VFLDataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    images = d.images  # (n, 8, 8)
    raw = {
        half: (images[:, :, cols].reshape(len(images), -1), [f"{half}{i}" for i in range(32)])
        for half, cols in (("left", slice(0, 4)), ("right", slice(4, 8)))
    }
    return _as_dataset("digits", raw, d.target, "multiclass", "digit", opts)
