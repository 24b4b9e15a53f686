"""The run config's typed groups: what a run trains on, how, with which model and linkage, where.

``[tool.flwr.app.config]`` is flat (Flower's run config is one table of keys); each key belongs
to exactly one group here (the linkage's and the exchange's: app/config_link.py), under the same
name (``tau`` -> ``cfg.link.tau``), except the prefixed ones: ``predict-input`` ->
``cfg.predict.input``, ``ea-variant`` -> ``cfg.ea.variant``. Each is declared once, with
:func:`app.config_fields.opt` (default, help, resumability); pyproject.toml's table is rendered
from these declarations (app/config_table.py).
:data:`GROUPS` maps group names to their classes; :func:`flat_key` and :func:`split_flat` go
between the two shapes. Each group checks its own values (``check``); the rules that tie two
groups together live in :meth:`app.config.RunConfig.validate`.

Benchmark and fault-injection knobs are not here: they are probes read from the environment
(app/probes.py), never part of a product run's config.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields

from app.config_fields import BEFORE, MAY_CHANGE, Need, nonnegative, opt
from app.config_link import ExchangeOptions, LinkOptions
from app.dataset_defaults import DATASET_MISSING
from app.messages import PLAIN_NAME
from datasets.options import MISSING, PLE_BINS, PLE_BINS_RANGE, SCALES, Recipe
from strategies.vfl.methods import UnknownMethod, method

HPARAMS = ("reference", "paper", "dataset")
MERGES = ("", "cnn", "mlp", "avg")
MODES = ("vfl", "entity-aug")
TRANSPORTS = ("auto", "flower", "direct")  # how a run's steps travel (app/direct_links.py); auto = direct
EA_VARIANTS = ("aligned", "augment", "full")  # as strategies.entity_aug.model.VARIANTS


RESERVED_RUN_NAMES = ("linkage", "linkage-service")  # <out-dir>'s linkage jobs and job secrets (app/vfl/linking.py)


def plain_run_name(name: str) -> bool:
    return bool(PLAIN_NAME.fullmatch(name)) and ".." not in name


@dataclass(frozen=True)
class DataOptions:
    """Which data: the dataset, its folder, and how much of it."""

    dataset: str = opt(
        "hdb",
        "hdb | house | house3 | game | frog | synthetic | csv (your own parties: data-dir holds parties.toml); entity-aug: credit | parkinsons | handwritten | digits | csv",
    )
    data_dir: str = opt(
        "", 'folder holding <dataset>/...; "" = $FEDSIM_DATA_DIR, ./data, ../shared/data', may_change=True
    )
    n_rows: int = opt(0, "subsample the primary (synthetic: generate) to this many rows; 0 = all")
    parties: str = opt("", 'comma-separated subset of the dataset\'s secondaries; "" = all')
    sigma_cf: float = opt(0.0, "noise on the secondary's identifiers (synthetic, frog)")
    input_scale: str = opt(
        "",
        'numeric inputs of every party: "" (the dataset\'s: ple for hdb, house, game, frog), standard, quantile or ple; csv: of each party whose parties.toml sets no scale',
        before="standard",
    )
    missing: str = opt(
        "",
        'a numeric NaN: "" (the dataset\'s), mean (the training mean) or indicator (also a 0/1 "was missing" feature)',
        before="mean",
    )
    ple_bins: int = opt(
        PLE_BINS, "input-scale ple: bins per numeric column, cut at its training quantiles (2-256)", before=PLE_BINS
    )
    search_fold: int = opt(
        0, '> 0: a recipe search\'s run: its "test" is a tenth of the training rows, the real test rows unused'
    )

    @property
    def recipe(self) -> Recipe:
        """Every party's input recipe (the shipped datasets; csv: each party's own, parties.toml)."""
        return Recipe(self.scale, self.missing_values, self.ple_bins)

    @property
    def scale(self) -> str:
        """The input encoding the parties use: the run config's, else standard."""
        return self.input_scale or "standard"

    @property
    def missing_values(self) -> str:
        """How the parties fill a numeric NaN: the run config's, else the dataset's."""
        return self.missing or DATASET_MISSING.get(self.dataset, "mean")

    def check(self, need: Need) -> None:
        nonnegative(need, self, "n_rows", "sigma_cf", "search_fold")
        need(
            self.input_scale in ("", *SCALES),
            f"run-config 'input-scale' must be one of {SCALES}, got {self.input_scale!r}",
        )
        need(self.missing in ("", *MISSING), f"run-config 'missing' must be one of {MISSING}, got {self.missing!r}")
        lo, hi = PLE_BINS_RANGE
        need(lo <= self.ple_bins <= hi, f"run-config 'ple-bins' must be in [{lo}, {hi}], got {self.ple_bins}")
        need(
            self.ple_bins == PLE_BINS or (self.scale == "ple" and self.dataset != "csv"),
            f"run-config 'ple-bins' is for input-scale \"ple\" on the shipped datasets (this run's: "
            f"{self.scale!r}); with dataset csv each party declares its own (ple_bins in its parties.toml section)",
        )
        need(
            self.missing in ("", "mean") or self.dataset != "csv",
            "run-config 'missing' is for the shipped datasets; with dataset csv each party declares its "
            'own (missing = "indicator" in its parties.toml section)',
        )


@dataclass(frozen=True)
class TrainOptions:
    """Which training mode and method, its optimisation budget, and how the steps are exchanged."""

    mode: str = opt("vfl", "vfl (FedSim and baselines) | entity-aug (Entity Augmentation, classification only)")
    method: str = opt(
        "fedsim_attn",
        "fedsim_attn (default: FedSim + attention, docs/fedsim-attn.md) | fedsim (the paper's) | a baseline",
    )
    hparams: str = opt(
        "reference",
        "reference: every method uses the dataset's FedSim values (the reference code's) | paper: App. E per "
        "method | dataset: reference plus the recipe chosen by hand on the built-in set's validation "
        "(docs/fedsim-attn.md; fedsim train then does not search)",
    )
    batch_size: int = opt(0, "hdb: 128")
    epochs: int = opt(
        0, "0 = the dataset's (hdb: 100, the paper's); with patience > 0 the maximum (own data: 200)", may_change=True
    )
    patience: int = opt(
        -1,
        "stop after this many epochs without a better validation value (a classifier's log loss, else the metric); 0 = fixed epochs; -1 = the dataset's: 0 for the built-in ones, 10 for a dataset without tuned defaults (csv)",
        may_change=True,
    )
    lr: float = opt(0.0, "hdb: 1e-3 (LAMB)")
    lr_decay: float = opt(
        1.0,
        "< 1: every party's lr times this after lr-patience epochs without a better validation value (ReduceLROnPlateau; the primary's schedule, sent with each step); 1 = constant",
        before=1.0,
    )
    lr_patience: int = opt(
        3, "lr-decay's patience: epochs without a better validation value before each decay", before=3
    )
    weight_decay: float = opt(-1.0, "hdb: 1e-4")
    seed: int = opt(0, "the split, the linkage and the measurements draw from it (an ensemble member's model: member)")
    member: int = opt(
        0, "an ensemble member: the split of `seed`, its own initial weights, dropout and batch order", before=0
    )
    steps_per_exchange: int = opt(
        1, "S: training steps per exchange; 1 = exact split learning, more = a stale window for WANs"
    )
    pipeline: bool = opt(
        False, "true: request window w + 1 while computing window w (one more window stale; docs/deployment.md)"
    )
    max_steps: int = opt(0, "stop after this many training steps (tests); 0 = all epochs")
    max_minutes: float = opt(
        0.0,
        "stop after the epoch in which training and evaluation reached this many minutes (a resume counts the time before it; the best epoch so far is reported); 0 = no limit",
        may_change=True,
    )
    checkpoint: bool = opt(
        True, "every party saves its state after each epoch; resume with resume=true", may_change=True
    )
    resume: bool = opt(False, "go on from the last checkpoint of run `run-name`", may_change=True)

    @property
    def model_seed(self) -> int:
        """What the model draws from (initial weights, dropout masks, batch order). The split, the
        linkage and the measurements draw from ``seed``; member m > 0 of an ensemble shares them and
        draws its model from a seed of its own."""
        if self.member == 0:
            return self.seed
        return int.from_bytes(hashlib.sha256(f"fedsim-member-{self.seed}-{self.member}".encode()).digest()[:4], "big")

    @property
    def member_tag(self) -> str:
        """A default run name's mark of an ensemble member ("" for member 0)."""
        return f"-m{self.member}" if self.member else ""

    def check(self, need: Need) -> None:
        try:
            method(self.method)  # refused by name, the registered methods listed
        except UnknownMethod as e:
            need(False, str(e))
        need(self.mode in MODES, f"run-config 'mode' must be one of {MODES}, got {self.mode!r}")
        need(self.hparams in HPARAMS, f"run-config 'hparams' must be one of {HPARAMS}, got {self.hparams!r}")
        need(
            self.patience >= -1, f"run-config 'patience' must be >= 0 (-1 = the dataset's default), got {self.patience}"
        )
        nonnegative(need, self, "batch_size", "epochs", "max_steps", "max_minutes", "member")
        need(
            self.member == 0 or self.mode == "vfl",
            f"run-config 'member' {self.member} applies to mode 'vfl'; mode {self.mode!r} has no ensembles",
        )
        need(
            self.steps_per_exchange >= 1, f"run-config 'steps-per-exchange' must be >= 1, got {self.steps_per_exchange}"
        )
        need(self.lr >= 0.0, f"run-config 'lr' must be >= 0 (0 = dataset default), got {self.lr}")
        need(0.0 < self.lr_decay <= 1.0, f"run-config 'lr-decay' must be in (0, 1] (1 = constant), got {self.lr_decay}")
        need(self.lr_patience >= 1, f"run-config 'lr-patience' must be >= 1, got {self.lr_patience}")
        need(
            self.lr_decay == 1.0 or self.mode == "vfl",
            f"run-config 'lr-decay' {self.lr_decay} applies to mode 'vfl'; mode {self.mode!r} trains at a constant rate",
        )


@dataclass(frozen=True)
class ModelOptions:
    """Switches of FedSim's model over the dataset's defaults (app/dataset_defaults.py)."""

    merge: str = opt("", "cnn | mlp | avg")
    dropout: float = opt(-1.0, "merge-gate dropout; hdb: 0.2")
    weight_gate: bool = opt(True, "FedSim's weight gate: each link's similarity weighs its embedding")
    sort_gate: bool = opt(True, "FedSim's sort gate: the K links ordered by similarity before the merge")
    attention_start: str = opt(
        "",
        "fedsim_attn's attention branch starts at Top1Sim (top1) or adds nothing at first (silent: FedSim); \"\" = the dataset's",
        before="top1",
    )
    attention_lr: float = opt(
        0.0,
        "fedsim_attn's attention branch learns at this fraction of lr, in (0, 1]; 0 = the dataset's (1)",
        before=1.0,
    )

    def check(self, need: Need) -> None:
        need(
            self.attention_start in ("", "top1", "silent"),
            f"run-config 'attention-start' must be top1, silent or empty, got {self.attention_start!r}",
        )
        need(
            self.attention_lr == 0.0 or 0.0 < self.attention_lr <= 1.0,
            f"run-config 'attention-lr' must be in (0, 1] (0: the dataset's), got {self.attention_lr}",
        )
        need(self.merge in MERGES, f"run-config 'merge' must be one of {MERGES[1:]} or empty, got {self.merge!r}")
        need(
            self.dropout == -1.0 or 0.0 <= self.dropout < 1.0,
            f"run-config 'dropout' must be in [0, 1), got {self.dropout}",
        )


@dataclass(frozen=True)
class RuntimeOptions:
    """Where and on what a run executes: its folder and name, transport, device, timeouts."""

    out_dir: str = opt("", 'run directories and linkage jobs; "" = ./runs of the process', may_change=True)
    run_name: str = opt("", '"" = <dataset>-<method>-s<seed>-<time>', may_change=True)
    transport: str = opt(
        "auto",
        "auto = direct: tensors over each party worker's encrypted link (both modes) | flower: every exchange a Flower message",
        may_change=True,
    )
    device: str = opt("auto", "auto | cpu | cuda")
    dtype: str = opt("float32", "float32 | float64")
    eval_chunk: int = opt(50_000, "tokens per evaluation message", may_change=True)
    node_timeout: float = opt(120.0, "seconds to wait for a secondary before failing", may_change=True)
    threads: int = opt(
        0,
        "torch / BLAS threads per party process; 0 = chosen from its CPUs, their sharing and the model size (app/threads.py)",
        may_change=True,
    )

    @property
    def direct(self) -> bool:
        """The run's steps travel over each party worker's own encrypted link: ``transport`` =
        ``auto`` (the default, in both modes: exact S = 1 near the in-process engine's pace;
        docs/benchmarks.md "Simulation at S = 1") or ``direct``; ``flower``: one Flower exchange each."""
        return self.transport in ("auto", "direct")

    def check(self, need: Need) -> None:
        need(self.threads >= 0, f"run-config 'threads' must be >= 0 (0 = chosen per process), got {self.threads}")
        need(
            self.device in ("auto", "cpu", "cuda"),
            f"run-config 'device' must be auto, cpu or cuda, got {self.device!r}",
        )
        need(self.dtype in ("float32", "float64"), f"run-config 'dtype' must be float32 or float64, got {self.dtype!r}")
        need(self.eval_chunk >= 1, f"run-config 'eval-chunk' must be >= 1, got {self.eval_chunk}")
        need(
            self.transport in TRANSPORTS, f"run-config 'transport' must be one of {TRANSPORTS}, got {self.transport!r}"
        )
        need(self.node_timeout > 0, f"run-config 'node-timeout' must be > 0, got {self.node_timeout}")
        need(
            not self.run_name or plain_run_name(self.run_name),
            f"run-config 'run-name' must be one plain folder name (letters, digits, _ . + = , @ -), "
            f"got {self.run_name!r}: the parties are told only this name",
        )
        need(
            self.run_name not in RESERVED_RUN_NAMES,
            f"run-config 'run-name' {self.run_name!r} names a folder the out-dir keeps for the linkage "
            f"({', '.join(RESERVED_RUN_NAMES)}); pick another name",
        )


@dataclass(frozen=True)
class EntityAugOptions:
    """Entity Augmentation's own settings (mode "entity-aug")."""

    overlap: float = opt(
        0.05, "entity-aug: fraction of training entities held by every guest (the rest: disjoint shares)"
    )
    variant: str = opt(
        "augment", "entity-aug: aligned (aligned subset only) | augment (+ misaligned rest) | full (all aligned)"
    )
    secondary_timeout: float = opt(
        0.0, "entity-aug: seconds to wait for a secondary before reusing its last activation; 0 = no fallback"
    )

    def check(self, need: Need) -> None:
        need(0.0 < self.overlap <= 1.0, f"run-config 'overlap' must be in (0, 1], got {self.overlap}")
        need(self.variant in EA_VARIANTS, f"run-config 'ea-variant' must be one of {EA_VARIANTS}, got {self.variant!r}")
        need(
            self.secondary_timeout >= 0,
            f"run-config 'secondary-timeout' must be >= 0 (0 = no fallback), got {self.secondary_timeout}",
        )


@dataclass(frozen=True)
class PredictOptions:
    """Predict mode: a trained run's kept federation predicts new records (flat keys predict-*)."""

    run: str = opt("", 'predict mode: the trained run (under out-dir) whose kept federation predicts; "" = train')
    input: str = opt("", "predict mode: CSV of new primary records (the primary's own path)")
    output: str = opt("", "predict mode: where the predictions CSV goes")
    id_column: str = opt("", 'predict mode: a column of the input naming each record; "" = row number')
    explain: bool = opt(False, "predict mode: add each record's neighbours (opaque tokens), similarities, weights")
    unknown: str = opt("ignore", "predict mode: a category unseen in training: ignore | refuse")
    linkage: str = opt("", 'predict mode: the linkage service\'s answer to the query (npz); "" = link here')

    def check(self, need: Need) -> None:
        need(
            not self.run or plain_run_name(self.run),
            f"run-config 'predict-run' must be one plain run folder name, got {self.run!r}",
        )
        need(
            self.unknown in ("ignore", "refuse"),
            f"run-config 'predict-unknown' must be ignore or refuse, got {self.unknown!r}",
        )
        if self.run:
            need(bool(self.input), "run-config 'predict-run' needs 'predict-input': the CSV of new records")
            need(bool(self.output), "run-config 'predict-run' needs 'predict-output': where predictions go")


GROUPS = {
    "data": DataOptions,
    "train": TrainOptions,
    "model": ModelOptions,
    "link": LinkOptions,
    "exchange": ExchangeOptions,
    "runtime": RuntimeOptions,
    "ea": EntityAugOptions,
    "predict": PredictOptions,
}
_RENAMED_ATTRS = {("ea", "variant"): "ea_variant"}
# Keys of earlier versions, as kept runs and checkpoints may still carry them.
RENAMED = {"guest_timeout": "secondary_timeout"}
RETIRED = {
    "bench_floor": "the benchmark probe FEDSIM_PROBE_BENCH_FLOOR (app/probes.py)",
    "guest_delay": "the test probe FEDSIM_PROBE_SECONDARY_DELAY (app/probes.py)",
}


def flat_key(group: str, attr: str) -> str:
    """The flat (underscored) run-config name of a group's field: ``("predict", "input")`` -> ``predict_input``."""
    if group == "predict":
        return f"predict_{attr}"
    return _RENAMED_ATTRS.get((group, attr), attr)


# flat name -> (group, attribute), in the groups' order
FLAT = {flat_key(g, f.name): (g, f.name) for g, cls in GROUPS.items() for f in fields(cls)}
# flat name -> its type's name ("int", "float", "str", "bool")
KIND = {flat_key(g, f.name): f.type for g, cls in GROUPS.items() for f in fields(cls)}
# flat name -> its field (default, help, resumability: app/config_fields.py)
FIELDS = {flat_key(g, f.name): f for g, cls in GROUPS.items() for f in fields(cls)}
# the keys that may differ between a run and its resumption (paths, patience, bookkeeping)
MAY_CHANGE_ON_RESUME = tuple(k for k, f in FIELDS.items() if f.metadata[MAY_CHANGE])
# keys added since checkpoints were first written, and the value each had before it existed
ADDED = {k: f.metadata[BEFORE] for k, f in FIELDS.items() if BEFORE in f.metadata}


def split_flat(values: dict) -> dict[str, dict]:
    """Flat ``{name: value}`` -> ``{group: {attribute: value}}``; an unknown name raises KeyError."""
    groups: dict[str, dict] = {g: {} for g in GROUPS}
    for name, value in values.items():
        group, attr = FLAT[name]
        groups[group][attr] = value
    return groups
