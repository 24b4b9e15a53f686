"""The run config's typed groups: what a run trains on, how, with which model and linkage, where.

``[tool.flwr.app.config]`` is flat (Flower's run config is one table of keys); each key belongs
to exactly one group here, under the same name (``tau`` -> ``cfg.link.tau``), except the
prefixed ones: ``predict-input`` -> ``cfg.predict.input``, ``ea-variant`` -> ``cfg.ea.variant``.
:data:`GROUPS` maps group names to their classes; :func:`flat_key` and :func:`split_flat` go
between the two shapes. Each group checks its own values (``check``); the rules that tie two
groups together live in :meth:`app.config.RunConfig.validate`.

Benchmark and fault-injection knobs are not here: they are probes read from the environment
(app/probes.py), never part of a product run's config.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, fields

from app.messages import PLAIN_NAME
from datasets.options import DATASET_MISSING, DATASET_SCALES, MISSING, PLE_BINS, PLE_BINS_RANGE, SCALES, Recipe
from linkage.protection import DEFAULT_LEVEL, LEVELS
from strategies.vfl.methods import UnknownMethod, method

Need = Callable[[bool, str], None]

HPARAMS = ("dataset", "paper")
MERGES = ("", "cnn", "mlp", "avg")
MODES = ("vfl", "entity-aug")
TRANSPORTS = ("auto", "flower", "direct")  # how a run's steps travel (app/direct_links.py); auto = direct
EA_VARIANTS = ("aligned", "augment", "full")  # as strategies.entity_aug.model.VARIANTS
LAYOUTS = ("independent", "chain")
ENCODINGS = ("raw", "bloom")


def plain_run_name(name: str) -> bool:
    return bool(PLAIN_NAME.fullmatch(name)) and ".." not in name


def _nonnegative(need: Need, group, *names: str) -> None:
    for name in names:
        value = getattr(group, name)
        need(value >= 0, f"run-config {name.replace('_', '-')!r} must be >= 0, got {value}")


@dataclass(frozen=True)
class DataOptions:
    """Which data: the dataset, its folder, and how much of it."""

    dataset: str = "hdb"
    data_dir: str = ""
    n_rows: int = 0  # subsample the primary (synthetic: generate) to this many rows; 0 = all
    parties: str = ""  # comma-separated subset of the dataset's secondaries to train with; "" = all
    sigma_cf: float = 0.0  # noise on the secondary's identifiers (synthetic, frog)
    # every party's numeric inputs: standard | quantile | ple (datasets/transform.py); "" = the
    # dataset's (datasets.options.DATASET_SCALES, else standard)
    input_scale: str = ""
    # a numeric NaN: "mean" (the training mean) | "indicator" (also a 0/1 "was missing" feature per
    # such column); "" = the dataset's (datasets.options.DATASET_MISSING, else mean)
    missing: str = ""
    ple_bins: int = PLE_BINS  # input-scale ple: bins per numeric column (cut at its training quantiles)
    search_fold: int = (
        0  # > 0: a recipe search's run (its "test" a tenth of the training rows; datasets/base.py split_primary)
    )

    @property
    def recipe(self) -> Recipe:
        """Every party's input recipe (the shipped datasets; csv: each party's own, parties.toml)."""
        return Recipe(self.scale, self.missing_values, self.ple_bins)

    @property
    def scale(self) -> str:
        """The input recipe the parties use: the run config's, else the dataset's."""
        return self.input_scale or DATASET_SCALES.get(self.dataset, "standard")

    @property
    def missing_values(self) -> str:
        """How the parties fill a numeric NaN: the run config's, else the dataset's."""
        return self.missing or DATASET_MISSING.get(self.dataset, "mean")

    def check(self, need: Need) -> None:
        _nonnegative(need, self, "n_rows", "sigma_cf", "search_fold")
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

    mode: str = "vfl"  # vfl (FedSim and its baselines) | entity-aug (app/entity_aug/server.py)
    method: str = "fedsim_attn"  # the paper's model plus attention (docs/fedsim-attn.md); "fedsim" = the paper's
    hparams: str = "dataset"  # "dataset": every method uses the dataset's FedSim values; "paper": per method
    batch_size: int = 0
    epochs: int = 0  # the maximum with patience > 0; 0 = the dataset's default
    patience: int = -1  # epochs without a better validation value before stopping; 0 = fixed epochs; -1 = default
    lr: float = 0.0
    # every party's lr times lr-decay after lr-patience epochs without a better validation value
    # (strategies/records.py lr_scale); lr-decay 1 = a constant rate (the paper's)
    lr_decay: float = 1.0
    lr_patience: int = 3
    weight_decay: float = -1.0
    seed: int = 0
    # an ensemble member: the same split and linkage as `seed`, its own initial weights, dropout and
    # batch order (:attr:`model_seed`); 0 = the run's own, as before
    member: int = 0
    steps_per_exchange: int = 1  # exact split learning; more: a stale window (docs/reference.md "Steps per exchange")
    pipeline: bool = (
        False  # request the next window's embeddings before computing this one (strategies/vfl/protocol.py)
    )
    max_steps: int = 0
    checkpoint: bool = True  # every party saves its state after each epoch (app/vfl/checkpoint.py)
    resume: bool = False  # go on from the last checkpoint of run `run-name`

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
        _nonnegative(need, self, "batch_size", "epochs", "max_steps", "member")
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
    """Switches of FedSim's model over the dataset's defaults (app/config.py DATASET_DEFAULTS)."""

    merge: str = ""  # cnn | mlp | avg; "" = the dataset's
    dropout: float = -1.0  # merge-gate dropout; -1 = the dataset's
    weight_gate: bool = True
    sort_gate: bool = True
    # fedsim_attn's attention branch starts at Top1Sim ("top1") or adds nothing at first ("silent":
    # the paper's FedSim); "" = the dataset's (app/config.py DATASET_DEFAULTS, chosen on validation)
    attention_start: str = ""
    attention_lr: float = 0.0  # the attention branch's learning rate as a fraction of the model's; 0 = the dataset's

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
class LinkOptions:
    """The linkage: top-K, its privacy (tau and the noise calibration), how identifiers travel."""

    k: int = 0
    tau: float = 1.0
    privacy: str = DEFAULT_LEVEL  # off | standard | strict: the floors (a simulation's), the exchange's defences
    encoding: str = "raw"  # "bloom": the parties link on keyed Bloom filters (strings) / FEDERAL filters (numbers)
    layout: str = "independent"  # several secondaries: each linked to the primary, or "chain" (paper App. C)
    linkage_dir: str = ""  # a linkage service's results (primary.npz, secondary-<party>.npz); "" = link here
    privacy_report: bool = True  # attack the job's release and report the success (linkage/privacy.py)
    privacy_radius: float = 0.0  # Theorem 2's success radius, identifier units; 0 = half each secondary's spacing
    privacy_compose: bool = False  # noise on a link scaled by sqrt(the secondary record's links) (Defences)

    def check(self, need: Need) -> None:
        _nonnegative(need, self, "k")
        need(0.0 < self.tau <= 1.0, f"run-config 'tau' must be in (0, 1], got {self.tau}")
        need(self.layout in LAYOUTS, f"run-config 'layout' must be one of {LAYOUTS}, got {self.layout!r}")
        need(self.encoding in ENCODINGS, f"run-config 'encoding' must be one of {ENCODINGS}, got {self.encoding!r}")
        need(
            0.0 <= self.privacy_radius < float("inf"),
            f"run-config 'privacy-radius' must be >= 0 (0: half the secondary's spacing), got {self.privacy_radius}",
        )
        need(self.privacy in LEVELS, f"run-config 'privacy' must be one of {list(LEVELS)}, got {self.privacy!r}")
        need(
            not (self.encoding == "bloom" and self.linkage_dir),
            "run-config encoding='bloom' encodes before linking here; with 'linkage-dir' the linkage service "
            "already linked (the parties encode for it with `python -m linkage_server.cli --key-file`)",
        )
        need(
            not ((self.privacy_compose or self.privacy_radius) and self.linkage_dir),
            "run-config 'privacy-radius' / 'privacy-compose' set the noise of a linkage linked here; with "
            "'linkage-dir' the linkage service already linked (pass --radius / --compose to its start command)",
        )


@dataclass(frozen=True)
class ExchangeOptions:
    """Defences of what training exchanges (strategies/vfl/defences.py, docs/privacy.md) and the
    report of the attacks on it (strategies/vfl/exchange_observer.py)."""

    grad_clip: float = 0.0  # the primary clips each record's cut-layer gradients to this L2 norm; 0 = the level's
    grad_noise: float = 0.0  # ... and adds Gaussian noise of std grad-noise * grad-clip to the blocks it sends
    marvell: float = 0.0  # binary labels: Marvell's noise, power budget in units of |Delta|^2; 0 = off
    label_dp: float = 0.0  # epsilon of randomised training labels (label DP); 0 = off
    embedding_clip: float = 0.0  # each secondary clips each embedding it sends to this L2 norm; 0 = its level's
    embedding_noise: float = 0.0  # ... and adds Gaussian noise of std embedding-noise * embedding-clip
    exchange_report: bool = True  # score label attacks on the exchanged gradients (summary.json exchange_privacy)
    exchange_privacy: str = ""  # the exchange's level when it differs from `privacy` ("" = the same)

    def check(self, need: Need) -> None:
        need(
            self.exchange_privacy in ("", *LEVELS),
            f"run-config 'exchange-privacy' must be one of {['', *LEVELS]}, got {self.exchange_privacy!r}",
        )
        _nonnegative(need, self, "grad_clip", "grad_noise", "marvell", "label_dp", "embedding_clip", "embedding_noise")
        for clip, noise in (("grad_clip", "grad_noise"), ("embedding_clip", "embedding_noise")):
            need(
                getattr(self, clip) > 0 or getattr(self, noise) == 0,
                f"run-config {noise.replace('_', '-')!r} is in units of {clip.replace('_', '-')!r}: set both",
            )


@dataclass(frozen=True)
class RuntimeOptions:
    """Where and on what a run executes: its folder and name, transport, device, timeouts."""

    out_dir: str = ""
    run_name: str = ""
    transport: str = "auto"  # "direct": the steps go over each party worker's own link (app/party_worker.py)
    device: str = "auto"
    dtype: str = "float32"
    eval_chunk: int = 50_000
    node_timeout: float = 120.0
    threads: int = 0  # torch / BLAS threads of every party's process; 0 = chosen per process (app/threads.py)

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


@dataclass(frozen=True)
class EntityAugOptions:
    """Entity Augmentation's own settings (mode "entity-aug")."""

    overlap: float = 0.05  # fraction of training entities held by every secondary
    variant: str = "augment"  # aligned | augment | full (strategies/entity_aug/model.py); flat key ea-variant
    secondary_timeout: float = 0.0  # s to wait for a secondary before reusing its last activation; 0 = no fallback

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

    run: str = ""  # the trained run (under out-dir) whose kept federation predicts; "" = train
    input: str = ""  # CSV of new primary records (entity-aug: entity ids; primary's own path)
    output: str = ""  # where the predictions CSV goes (the primary's own path)
    id_column: str = ""  # a column of the input naming each record ("" = row number)
    explain: bool = False  # add each record's neighbours, similarities and weights
    unknown: str = "ignore"  # an unseen category: ignore (no one-hot set) | refuse
    linkage: str = ""  # the linkage service's answer to the query (npz); "" = link here

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


def split_flat(values: dict) -> dict[str, dict]:
    """Flat ``{name: value}`` -> ``{group: {attribute: value}}``; an unknown name raises KeyError."""
    groups: dict[str, dict] = {g: {} for g in GROUPS}
    for name, value in values.items():
        group, attr = FLAT[name]
        groups[group][attr] = value
    return groups
