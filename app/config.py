"""Run configuration: read once from ``context.run_config`` into a typed, validated dataclass.

Every key of ``[tool.flwr.app.config]`` in pyproject.toml is a field here. Numeric
"0" (or -1 for weight-decay / dropout / patience, "" for merge) means "the dataset's default"
from :data:`DATASET_DEFAULTS` (the paper's App. E / the reference's hyperparameters). A dataset
without tuned defaults (``csv``, the user's own) gets hdb's model and optimiser values, but
trains until validation stops improving: patience :data:`UNTUNED_PATIENCE`, at most
:data:`UNTUNED_EPOCHS` epochs. :meth:`RunConfig.hyperparameters` says where each value came from.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from strategies.vfl.gates import concrete_device
from strategies.vfl.methods import REGISTRY, Method, UnknownMethod, method
from strategies.vfl.model import ModelConfig


def plain_run_name(name: str) -> bool:
    from app.messages import PLAIN_NAME  # the one rule every party checks

    return bool(PLAIN_NAME.fullmatch(name)) and ".." not in name


class ConfigError(ValueError):
    """A run-config value of the wrong type or out of range; the message names the key."""


@dataclass(frozen=True)
class Settings:
    """Training hyperparameters: a dataset's defaults, or those resolved for one run."""

    k: int
    batch_size: int
    epochs: int
    lr: float
    weight_decay: float
    model: ModelConfig
    patience: int = 0  # > 0: stop after this many epochs without a better validation value; 0 = fixed epochs


DATASET_DEFAULTS: dict[str, Settings] = {
    "hdb": Settings(50, 128, 100, 1e-3, 1e-4, ModelConfig((200,), 100, (100,), 10, "cnn", 7, 8, 400, 0.2)),
    "synthetic": Settings(100, 32, 50, 1e-3, 1e-4, ModelConfig((100,), 50, (100,), 1, "avg", dropout=0.0)),
    "house": Settings(100, 128, 100, 1e-3, 1e-5, ModelConfig((200,), 100, (100,), 10, "cnn", 7, 8, 400, 0.3)),
    "house3": Settings(100, 128, 100, 1e-3, 1e-5, ModelConfig((200,), 100, (100,), 10, "cnn", 7, 8, 400, 0.3)),
    "game": Settings(50, 32, 50, 1e-3, 1e-5, ModelConfig((100,), 50, (100,), 10, "cnn", 5, 8, 400, 0.7)),
    "frog": Settings(100, 32, 100, 3e-3, 1e-3, ModelConfig((100,), 50, (100,), 10, "avg", dropout=0.0)),
}
# A dataset without tuned defaults trains with early stopping (the built-in ones: fixed epochs).
UNTUNED_EPOCHS, UNTUNED_PATIENCE = 200, 10
# The training methods of mode "vfl" (what each links, its model switches, its per-dataset
# hyperparameters with hparams = "paper") are registered in strategies/vfl/methods.py.
HPARAMS = ("dataset", "paper")
MERGES = ("", "cnn", "mlp", "avg")
MODES = ("vfl", "entity-aug")
TRANSPORTS = ("flower", "direct")  # how a run's steps travel (app/vfl/direct.py)
EA_VARIANTS = ("aligned", "augment", "full")  # as strategies.entity_aug.model.VARIANTS
LAYOUTS = ("independent", "chain")
ENCODINGS = ("raw", "bloom")


@dataclass(frozen=True)
class RunConfig:
    dataset: str = "hdb"
    data_dir: str = ""
    out_dir: str = ""
    run_name: str = ""
    method: str = "fedsim_attn"  # the paper's model plus attention (docs/fedsim-attn.md); "fedsim" = the paper's
    k: int = 0
    batch_size: int = 0
    epochs: int = 0  # the maximum with patience > 0; 0 = the dataset's default
    patience: int = -1  # epochs without a better validation value before stopping; 0 = fixed epochs; -1 = default
    lr: float = 0.0
    weight_decay: float = -1.0
    dropout: float = -1.0
    merge: str = ""
    weight_gate: bool = True
    sort_gate: bool = True
    tau: float = 1.0
    encoding: str = "raw"  # "bloom": the parties link on keyed Bloom filters (strings) / FEDERAL filters (numbers), by Hamming
    privacy_report: bool = True  # attack the job's release and report the success (linkage/privacy.py)
    privacy_radius: float = 0.5  # Theorem 2's success radius, identifier units (linkage.contracts.Defences)
    privacy_compose: bool = False  # noise on a link scaled by sqrt(the secondary record's links) (Defences)
    linkage_dir: str = ""  # a linkage service's results (primary.npz, secondary-<party>.npz); "" = link here
    layout: str = "independent"  # several secondaries: each linked to the primary, or "chain" (paper App. C)
    hparams: str = "dataset"  # "dataset": every method uses the dataset's FedSim values; "paper": per method
    parties: str = ""  # comma-separated subset of the dataset's secondaries to train with; "" = all
    seed: int = 0
    steps_per_exchange: int = 8
    pipeline: bool = False  # request the next window's embeddings before computing this one (strategies/vfl/protocol.py)
    transport: str = "flower"  # "direct": the steps go over each party worker's own link (app/vfl/worker.py)
    device: str = "auto"
    dtype: str = "float32"
    n_rows: int = 0
    sigma_cf: float = 0.0
    max_steps: int = 0
    eval_chunk: int = 50_000
    bench_floor: int = 0
    node_timeout: float = 120.0
    checkpoint: bool = True  # every party saves its state after each epoch (app/vfl/checkpoint.py)
    resume: bool = False  # go on from the last checkpoint of run `run-name`
    mode: str = "vfl"  # vfl (FedSim and its baselines) | entity-aug (app/entity_aug/server.py)
    overlap: float = 0.05  # entity-aug: fraction of training entities held by every guest
    ea_variant: str = "augment"  # entity-aug: aligned | augment | full (strategies/entity_aug/model.py)
    guest_timeout: float = 0.0  # entity-aug: s to wait for a guest before reusing its last activation; 0 = no fallback
    guest_delay: float = 0.0  # entity-aug fault injection (tests): the first guest sleeps this long on odd steps
    predict_run: str = ""  # predict mode: the trained run (under out-dir) whose kept federation predicts
    predict_input: str = ""  # predict mode: CSV of new primary records (entity-aug: entity ids; primary's own path)
    predict_output: str = ""  # predict mode: where the predictions CSV goes (the primary's own path)
    predict_id_column: str = ""  # predict mode: a column of the input naming each record ("" = row number)
    predict_explain: bool = False  # predict mode: add each record's neighbours, similarities and weights
    predict_unknown: str = "ignore"  # predict mode: an unseen category: ignore (no one-hot set) | refuse
    predict_linkage: str = ""  # predict mode: the linkage service's answer to the query (npz); "" = link here

    @classmethod
    def from_flower(cls, run_config: dict) -> "RunConfig":
        known = {f.name.replace("_", "-"): f for f in fields(cls)}
        unknown = sorted(set(run_config) - set(known))
        if unknown:
            raise ConfigError(f"unknown run-config key(s) {unknown}{did_you_mean(unknown, known)}; "
                              f"known: {sorted(known)}")
        values = {}
        for key, value in run_config.items():
            f = known[key]
            want = {"int": int, "float": float, "str": str, "bool": bool}[f.type]
            ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                value, ok = float(value), True
            if not ok:
                raise ConfigError(f"run-config {key!r} must be {f.type}, got {type(value).__name__} {value!r}")
            values[f.name] = value
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(msg)

        try:
            method(self.method)  # refused by name, the registered methods listed
        except UnknownMethod as e:
            raise ConfigError(str(e)) from None
        need(self.merge in MERGES, f"run-config 'merge' must be one of {MERGES[1:]} or empty, got {self.merge!r}")
        need(self.layout in LAYOUTS, f"run-config 'layout' must be one of {LAYOUTS}, got {self.layout!r}")
        need(self.encoding in ENCODINGS, f"run-config 'encoding' must be one of {ENCODINGS}, got {self.encoding!r}")
        need(not (self.encoding == "bloom" and self.training_method.links == "known"),
             "run-config encoding='bloom' does not apply to method 'combine' (it uses the true rows, no linkage)")
        need(not (self.encoding == "bloom" and self.linkage_dir),
             "run-config encoding='bloom' encodes before linking here; with 'linkage-dir' the linkage service "
             "already linked (the parties encode for it with `python -m linkage_server.cli --key-file`)")
        need(self.hparams in HPARAMS, f"run-config 'hparams' must be one of {HPARAMS}, got {self.hparams!r}")
        need(self.device in ("auto", "cpu", "cuda"), f"run-config 'device' must be auto, cpu or cuda, got {self.device!r}")
        need(self.dtype in ("float32", "float64"), f"run-config 'dtype' must be float32 or float64, got {self.dtype!r}")
        need(self.patience >= -1, f"run-config 'patience' must be >= 0 (-1 = the dataset's default), got {self.patience}")
        for key in ("k", "batch_size", "epochs", "n_rows", "max_steps", "bench_floor"):
            need(getattr(self, key) >= 0, f"run-config {key.replace('_', '-')!r} must be >= 0, got {getattr(self, key)}")
        need(self.steps_per_exchange >= 1, f"run-config 'steps-per-exchange' must be >= 1, got {self.steps_per_exchange}")
        need(self.eval_chunk >= 1, f"run-config 'eval-chunk' must be >= 1, got {self.eval_chunk}")
        need(0.0 < self.tau <= 1.0, f"run-config 'tau' must be in (0, 1], got {self.tau}")
        need(0.0 < self.privacy_radius < float("inf"),
             f"run-config 'privacy-radius' must be a positive number, got {self.privacy_radius}")
        need(not ((self.privacy_compose or self.privacy_radius != 0.5) and self.linkage_dir),
             "run-config 'privacy-radius' / 'privacy-compose' set the noise of a linkage linked here; with "
             "'linkage-dir' the linkage service already linked (pass --radius / --compose to its start command)")
        need(self.sigma_cf >= 0.0, f"run-config 'sigma-cf' must be >= 0, got {self.sigma_cf}")
        need(self.lr >= 0.0, f"run-config 'lr' must be >= 0 (0 = dataset default), got {self.lr}")
        need(not self.run_name or plain_run_name(self.run_name),
             f"run-config 'run-name' must be one plain folder name (letters, digits, _ . + = , @ -), "
             f"got {self.run_name!r}: the parties are told only this name")
        need(not self.resume or bool(self.run_name),
             "run-config 'resume' needs 'run-name': the run whose checkpoint to go on from")
        need(not (self.resume and self.mode == "entity-aug"),
             "run-config 'resume' is not supported with mode='entity-aug' (it does not checkpoint)")
        need(not (self.layout == "chain" and self.training_method.per_party_linkage),
             f"run-config layout='chain' does not apply to method {self.method!r} (its linkage is per party)")
        need(self.transport in TRANSPORTS, f"run-config 'transport' must be one of {TRANSPORTS}, got {self.transport!r}")
        need(self.transport == "flower" or self.mode == "vfl",
             f"run-config transport='direct' carries FedSim's steps (mode 'vfl'), not mode {self.mode!r}")
        need(self.node_timeout > 0, f"run-config 'node-timeout' must be > 0, got {self.node_timeout}")
        need(self.mode in MODES, f"run-config 'mode' must be one of {MODES}, got {self.mode!r}")
        need(0.0 < self.overlap <= 1.0, f"run-config 'overlap' must be in (0, 1], got {self.overlap}")
        need(self.ea_variant in EA_VARIANTS, f"run-config 'ea-variant' must be one of {EA_VARIANTS}, got {self.ea_variant!r}")
        need(self.guest_timeout >= 0, f"run-config 'guest-timeout' must be >= 0 (0 = no fallback), got {self.guest_timeout}")
        need(self.guest_delay >= 0, f"run-config 'guest-delay' must be >= 0, got {self.guest_delay}")
        need(self.dropout == -1.0 or 0.0 <= self.dropout < 1.0, f"run-config 'dropout' must be in [0, 1), got {self.dropout}")
        self._validate_predict(need)

    def _validate_predict(self, need) -> None:
        need(not self.predict_run or plain_run_name(self.predict_run),
             f"run-config 'predict-run' must be one plain run folder name, got {self.predict_run!r}")
        need(self.predict_unknown in ("ignore", "refuse"),
             f"run-config 'predict-unknown' must be ignore or refuse, got {self.predict_unknown!r}")
        if not self.predict_run:
            return
        need(bool(self.predict_input), "run-config 'predict-run' needs 'predict-input': the CSV of new records")
        need(bool(self.predict_output), "run-config 'predict-run' needs 'predict-output': where predictions go")
        need(not self.resume, "run-config 'predict-run' and 'resume' exclude each other")
        need(self.mode == "vfl" or not (self.predict_explain or self.predict_linkage),
             "run-config 'predict-explain' / 'predict-linkage' are FedSim's (mode 'vfl'); Entity Augmentation "
             "predicts entities named by id, with no linkage")

    def predicting(self) -> bool:
        return bool(self.predict_run)

    # ------------------------------------------------------------------ resolved values

    @property
    def training_method(self) -> Method:
        """The run's registered method (strategies/vfl/methods.py): what it links, its model switches."""
        return REGISTRY[self.method]

    def tuned(self) -> bool:
        """Has the dataset tuned defaults (in :data:`DATASET_DEFAULTS`)?"""
        return self.dataset in DATASET_DEFAULTS

    def defaults(self) -> Settings:
        # A dataset without tuned defaults (the user's own "csv") gets hdb's
        return DATASET_DEFAULTS.get(self.dataset, DATASET_DEFAULTS["hdb"])

    def stopping(self, tuned_epochs: int | None) -> tuple[int, int]:
        """(maximum epochs, patience) for either mode: the run config's, else the dataset's fixed
        ``tuned_epochs``, else (None: no tuned defaults) early stopping with the UNTUNED values."""
        fallback = tuned_epochs is None
        patience = self.patience if self.patience >= 0 else (UNTUNED_PATIENCE if fallback else 0)
        return self.epochs or (UNTUNED_EPOCHS if fallback else tuned_epochs), patience

    def _paper(self) -> dict:
        return self.training_method.paper.get(self.dataset, {}) if self.hparams == "paper" else {}

    def resolve(self) -> "Settings":
        d = self.defaults()
        model = d.model
        if self.merge:
            model = dataclasses.replace(model, merge=self.merge)
        if self.dropout >= 0:
            model = dataclasses.replace(model, dropout=self.dropout)
        model = dataclasses.replace(model, weight_gate=self.weight_gate, sort_gate=self.sort_gate)
        model = dataclasses.replace(model, **self.training_method.model)
        paper = self._paper()
        if "agg_hidden" in paper:
            model = dataclasses.replace(model, agg_hidden=paper["agg_hidden"])
        epochs, patience = self.stopping(d.epochs if self.tuned() else None)
        return Settings(
            k=1 if self.training_method.one_neighbour else self.k or d.k,
            batch_size=self.batch_size or paper.get("batch_size", d.batch_size),
            epochs=epochs,
            lr=self.lr or paper.get("lr", d.lr),
            weight_decay=self.weight_decay if self.weight_decay >= 0 else paper.get("weight_decay", d.weight_decay),
            model=model,
            patience=patience,
        )

    def hyperparameters(self) -> dict[str, dict]:
        """Each resolved training hyperparameter and where it came from: {name: {"value", "source"}},
        the source one of "run config", "dataset default (<dataset>, paper App. E)", "fallback: ...",
        "paper per-method (...)" or "method <method>" (a baseline's switch)."""
        s, paper, chosen = self.resolve(), self._paper(), self.training_method.model
        base = (f"dataset default ({self.dataset}, paper App. E)" if self.tuned()
                else "fallback: hdb's defaults — dataset has no tuned defaults")
        stop = base if self.tuned() else "fallback: early stopping — dataset has no tuned defaults"

        def source(given: bool, key: str) -> str:
            if key in chosen:  # the method's switch wins over the run config (resolve)
                return f"method {self.method}"
            if given:
                return "run config"
            return f"paper per-method ({self.dataset} {self.method}, App. E)" if key in paper else base

        m = s.model
        rows = {"k": (s.k, f"method {self.method}: one neighbour" if self.training_method.one_neighbour
                      else source(self.k > 0, "k")),
                "batch_size": (s.batch_size, source(self.batch_size > 0, "batch_size")),
                "epochs": (s.epochs, "run config" if self.epochs else stop),
                "patience": (s.patience, "run config" if self.patience >= 0 else stop),
                "lr": (s.lr, source(self.lr > 0, "lr")),
                "weight_decay": (s.weight_decay, source(self.weight_decay >= 0, "weight_decay")),
                "dropout": (m.dropout, source(self.dropout >= 0, "dropout")),
                "merge": (m.merge, source(bool(self.merge), "merge")),
                "local_hidden": (list(m.local_hidden), base), "cut_dim": (m.cut_dim, base),
                "agg_hidden": (list(m.agg_hidden), source(False, "agg_hidden"))}
        return {name: {"value": value, "source": src} for name, (value, src) in rows.items()}

    def defences(self):
        """The linkage's noise calibration (linkage.contracts.Defences)."""
        from linkage.contracts import Defences

        return Defences(radius=self.privacy_radius, compose=self.privacy_compose)

    def torch_device(self) -> torch.device:
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("run-config device='cuda' but no CUDA device is available")
        if self.device == "cpu" or not torch.cuda.is_available():
            return torch.device("cpu")
        return concrete_device(torch.device("cuda"))

    def torch_dtype(self) -> torch.dtype:
        return torch.float64 if self.dtype == "float64" else torch.float32

    def party_subset(self) -> list[str]:
        return [p.strip() for p in self.parties.split(",") if p.strip()]

    def out_path(self) -> Path:
        return Path(self.out_dir).expanduser().resolve() if self.out_dir else Path.cwd() / "runs"


def did_you_mean(unknown: list[str], known) -> str:
    """" (did you mean 'batch-size'?)" for the unknown keys close to a known one, else ""."""
    import difflib

    close = {u: difflib.get_close_matches(u.replace("_", "-"), list(known), n=1) for u in unknown}
    hints = [f"{m[0]!r} for {u!r}" for u, m in close.items() if m]
    return f" (did you mean {', '.join(hints)}?)" if hints else ""


def parse_pairs(pairs: list[str]) -> dict[str, object]:
    """`key=value` strings: values read as TOML (numbers, true/false, "quoted"), else as text."""
    values: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"-c {pair!r}: expected KEY=VALUE")
        try:
            values[key.strip()] = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            values[key.strip()] = raw.strip()
    return values
