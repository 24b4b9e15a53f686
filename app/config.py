"""Run configuration: read once from ``context.run_config`` into a typed, validated dataclass.

Every key of ``[tool.flwr.app.config]`` in pyproject.toml is a field of one of RunConfig's typed
groups (app/config_groups.py: data, train, model, link, runtime, ea, predict). Numeric
"0" (or -1 for weight-decay / dropout / patience, "" for merge) means "the dataset's default"
from app/dataset_defaults.py (the paper's App. E / the reference's hyperparameters). A dataset
without tuned defaults (``csv``, the user's own) gets hdb's model and optimiser values, but
trains until validation stops improving: patience :data:`UNTUNED_PATIENCE`, at most
:data:`UNTUNED_EPOCHS` epochs. :meth:`RunConfig.hyperparameters` says where each value came from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from app.config_groups import (
    FLAT,
    GROUPS,
    MODES,
    RENAMED,
    RETIRED,
    DataOptions,
    EntityAugOptions,
    ExchangeOptions,
    LinkOptions,
    ModelOptions,
    PredictOptions,
    RuntimeOptions,
    TrainOptions,
    split_flat,
)
from app.config_keys import ConfigError, did_you_mean, parse_pairs, refuse_old_keys, typed
from app.dataset_defaults import DATASET_DEFAULTS, DATASET_MISSING, HAND_CHOSEN, Settings, hand_chosen
from datasets.options import PLE_BINS
from strategies.stop_rule import StopRule
from strategies.vfl.methods import REGISTRY, Method

if TYPE_CHECKING:
    import torch

__all__ = ["MODES", "ConfigError", "RunConfig", "Settings", "DATASET_DEFAULTS", "parse_pairs"]


def dataset_defaults(dataset: str) -> Settings:
    """The dataset's settings; a dataset without tuned defaults (the user's own "csv") gets hdb's."""
    return DATASET_DEFAULTS.get(dataset, DATASET_DEFAULTS["hdb"])


# A dataset without tuned defaults trains with early stopping (the built-in ones: fixed epochs).
UNTUNED_EPOCHS, UNTUNED_PATIENCE = 200, 10
# The training methods of mode "vfl" (what each links, its model switches, its per-dataset
# hyperparameters with hparams = "paper") are registered in strategies/vfl/methods.py.


@dataclass(frozen=True)
class RunConfig:
    """A run's configuration in typed groups (app/config_groups.py); Flower's flat run config,
    kept runs and checkpoints speak the flat names (:meth:`of`, :meth:`flat`)."""

    data: DataOptions = field(default_factory=DataOptions)
    train: TrainOptions = field(default_factory=TrainOptions)
    model: ModelOptions = field(default_factory=ModelOptions)
    link: LinkOptions = field(default_factory=LinkOptions)
    exchange: ExchangeOptions = field(default_factory=ExchangeOptions)
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    ea: EntityAugOptions = field(default_factory=EntityAugOptions)
    predict: PredictOptions = field(default_factory=PredictOptions)

    @classmethod
    def of(cls, **flat) -> "RunConfig":
        """From flat (underscored) names, unchecked: ``RunConfig.of(dataset="hdb", tau=0.5)``. Keys an
        earlier version wrote (:data:`RENAMED`, :data:`RETIRED`) are read as they are now."""
        return cls._grouped({RENAMED.get(k, k): v for k, v in flat.items() if k not in RETIRED})

    @classmethod
    def _grouped(cls, values: dict) -> "RunConfig":
        """From today's flat names only; any other name raises TypeError. With ``hparams =
        "dataset"`` the keys it leaves unset hold the hand-chosen recipe (app/dataset_defaults.py)."""
        unknown = sorted(set(values) - set(FLAT))
        if unknown:
            raise TypeError(f"RunConfig has no key(s) {unknown}{did_you_mean(unknown, FLAT)}")
        return cls(**{g: GROUPS[g](**kw) for g, kw in split_flat(hand_chosen(values)).items()})

    def flat(self) -> dict[str, object]:
        """The flat (underscored) names and values, as Flower's run config and kept runs hold them."""
        return {name: getattr(getattr(self, g), attr) for name, (g, attr) in FLAT.items()}

    def replace(self, **flat) -> "RunConfig":
        """A copy with some flat-named values changed: ``cfg.replace(tau=0.5, out_dir="x")``. Only
        today's names: a retired one is refused, never dropped."""
        return RunConfig._grouped({**self.flat(), **flat})

    @classmethod
    def from_flower(cls, run_config: dict) -> "RunConfig":
        known = {name.replace("_", "-"): name for name in FLAT}
        refuse_old_keys(run_config)
        unknown = sorted(set(run_config) - set(known))
        if unknown:
            raise ConfigError(
                f"unknown run-config key(s) {unknown}{did_you_mean(unknown, known)}; known: {sorted(known)}"
            )
        values = {known[key]: typed(key, value) for key, value in run_config.items()}
        cfg = cls.of(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(msg)

        for group in GROUPS:
            getattr(self, group).check(need)
        train, link, m = self.train, self.link, self.training_method
        need(
            not (link.encoding == "bloom" and m.links == "known"),
            "run-config encoding='bloom' does not apply to method 'combine' (it uses the true rows, no linkage)",
        )
        need(
            not train.resume or bool(self.runtime.run_name),
            "run-config 'resume' needs 'run-name': the run whose checkpoint to go on from",
        )
        need(
            not (train.resume and train.mode == "entity-aug"),
            "run-config 'resume' is not supported with mode='entity-aug' (it does not checkpoint)",
        )
        need(
            not (link.layout == "chain" and m.per_party_linkage),
            f"run-config layout='chain' does not apply to method {train.method!r} (its linkage is per party)",
        )
        if self.predicting():
            need(not train.resume, "run-config 'predict-run' and 'resume' exclude each other")
            need(
                train.mode == "vfl" or not (self.predict.explain or self.predict.linkage),
                "run-config 'predict-explain' / 'predict-linkage' are FedSim's (mode 'vfl'); Entity Augmentation "
                "predicts entities named by id, with no linkage",
            )

    def predicting(self) -> bool:
        return bool(self.predict.run)

    # ------------------------------------------------------------------ resolved values

    @property
    def training_method(self) -> Method:
        """The run's registered method (strategies/vfl/methods.py): what it links, its model switches."""
        return REGISTRY[self.train.method]

    def tuned(self) -> bool:
        """Has the dataset tuned defaults (in :data:`DATASET_DEFAULTS`)?"""
        return self.data.dataset in DATASET_DEFAULTS

    def defaults(self) -> Settings:
        return dataset_defaults(self.data.dataset)

    def stopping(self, tuned_epochs: int | None) -> tuple[int, int]:
        """(maximum epochs, patience) for either mode: the run config's, else the dataset's fixed
        ``tuned_epochs``, else (None: no tuned defaults) early stopping with the UNTUNED values."""
        fallback = tuned_epochs is None
        patience = self.train.patience if self.train.patience >= 0 else (UNTUNED_PATIENCE if fallback else 0)
        return self.train.epochs or (UNTUNED_EPOCHS if fallback else tuned_epochs), patience

    def stop_rule(self, epochs: int, patience: int) -> StopRule:
        """Either mode's stop rule: the maximum ``epochs`` and ``patience`` as resolved
        (:meth:`stopping`), with the run config's max-steps and max-minutes."""
        return StopRule(epochs, patience, self.train.max_steps, self.train.max_minutes)

    def _paper(self) -> dict:
        return self.training_method.paper.get(self.data.dataset, {}) if self.train.hparams == "paper" else {}

    def resolve(self) -> "Settings":
        d = self.defaults()
        model = d.model
        if self.model.merge:
            model = dataclasses.replace(model, merge=self.model.merge)
        if self.model.dropout >= 0:
            model = dataclasses.replace(model, dropout=self.model.dropout)
        model = dataclasses.replace(
            model,
            weight_gate=self.model.weight_gate,
            sort_gate=self.model.sort_gate,
            attention_start=self.model.attention_start or model.attention_start,
            attention_lr=self.model.attention_lr or model.attention_lr,
        )
        model = dataclasses.replace(model, **self.training_method.model)
        paper = self._paper()
        if "agg_hidden" in paper:
            model = dataclasses.replace(model, agg_hidden=paper["agg_hidden"])
        epochs, patience = self.stopping(d.epochs if self.tuned() else None)
        return Settings(
            k=1 if self.training_method.one_neighbour else self.link.k or d.k,
            batch_size=self.train.batch_size or paper.get("batch_size", d.batch_size),
            epochs=epochs,
            lr=self.train.lr or paper.get("lr", d.lr),
            weight_decay=self.train.weight_decay
            if self.train.weight_decay >= 0
            else paper.get("weight_decay", d.weight_decay),
            model=model,
            patience=patience,
        )

    def hyperparameters(self) -> dict[str, dict]:
        """Each resolved training hyperparameter and where it came from: {name: {"value", "source"}},
        the source one of "run config", "dataset default (<dataset>, paper App. E)", "fallback: ...",
        "paper per-method (...)" or "method <method>" (a baseline's switch)."""
        s, paper, chosen = self.resolve(), self._paper(), self.training_method.model
        base = (
            f"dataset default ({self.data.dataset}, paper App. E)"
            if self.tuned()
            else "fallback: hdb's defaults — dataset has no tuned defaults"
        )
        stop = base if self.tuned() else "fallback: early stopping — dataset has no tuned defaults"

        def source(given: bool, key: str) -> str:
            if key in chosen:  # the method's switch wins over the run config (resolve)
                return f"method {self.train.method}"
            if given:
                return "run config"
            return f"paper per-method ({self.data.dataset} {self.train.method}, App. E)" if key in paper else base

        m = s.model
        rows = {
            "k": (
                s.k,
                f"method {self.train.method}: one neighbour"
                if self.training_method.one_neighbour
                else source(self.link.k > 0, "k"),
            ),
            "batch_size": (s.batch_size, source(self.train.batch_size > 0, "batch_size")),
            "epochs": (s.epochs, "run config" if self.train.epochs else stop),
            "patience": (s.patience, "run config" if self.train.patience >= 0 else stop),
            "lr": (s.lr, source(self.train.lr > 0, "lr")),
            "weight_decay": (s.weight_decay, source(self.train.weight_decay >= 0, "weight_decay")),
            "dropout": (m.dropout, source(self.model.dropout >= 0, "dropout")),
            "merge": (m.merge, source(bool(self.model.merge), "merge")),
            "local_hidden": (list(m.local_hidden), base),
            "cut_dim": (m.cut_dim, base),
            "agg_hidden": (list(m.agg_hidden), source(False, "agg_hidden")),
            **self._recipe_rows(m.attention_start if m.attention else ""),
            **({"attention_lr": (m.attention_lr, self._attention_lr_source(m.attention_lr))} if m.attention else {}),
        }
        return {name: {"value": value, "source": src} for name, (value, src) in rows.items()}

    def _recipe_rows(self, attention_start: str) -> dict[str, tuple]:
        """:meth:`hyperparameters`' rows for the recipe's choices: the input recipe, how a numeric NaN
        is filled, the learning-rate schedule and where fedsim_attn's attention starts."""
        return {
            "input_scale": (
                self.data.scale,
                self._given("input_scale", self.data.scale) if self.data.input_scale else "default",
            ),
            **(
                {"ple_bins": (self.data.ple_bins, "run config" if self.data.ple_bins != PLE_BINS else "default")}
                if self.data.scale == "ple"
                else {}
            ),
            "missing": (
                self.data.missing_values,
                "run config"
                if self.data.missing
                else "dataset default"
                if self.data.dataset in DATASET_MISSING
                else "fallback: mean",
            ),
            "lr_schedule": (
                f"x {self.train.lr_decay} after {self.train.lr_patience} epochs without a better validation value"
                if self.train.lr_decay < 1.0
                else "constant",
                "run config" if self.train.lr_decay < 1.0 else "default (the paper's)",
            ),
            **self._start_row(attention_start),
        }

    def _start_row(self, attention_start: str) -> dict[str, tuple]:
        """Where fedsim_attn's attention starts; no row for a method without attention ("")."""
        if not attention_start:
            return {}
        return {
            "attention_start": (
                attention_start,
                self._given("attention_start", attention_start) if self.model.attention_start else "default",
            ),
        }

    def _attention_lr_source(self, value: float) -> str:
        return self._given("attention_lr", value) if self.model.attention_lr > 0 else "default"

    def _given(self, key: str, value) -> str:
        """Where a recipe value the run holds came from: hparams "dataset"'s hand-chosen recipe, or the run config."""
        if self.train.hparams == "dataset" and HAND_CHOSEN.get(self.data.dataset, {}).get(key) == value:
            return f'hparams "dataset" ({self.data.dataset}, chosen by hand on its validation: docs/fedsim-attn.md)'
        return "run config"

    def exchange_level(self) -> str:
        """The privacy level of what training exchanges: ``exchange-privacy``, else ``privacy``."""
        return self.exchange.exchange_privacy or self.link.privacy

    def torch_device(self) -> torch.device:
        import torch  # lazy: a ClientApp process answering a handshake reads its config and needs no torch (~1.2 s)

        from strategies.vfl.gates import concrete_device  # lazy: torch's, as torch

        if self.runtime.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("run-config device='cuda' but no CUDA device is available")
        if self.runtime.device == "cpu" or not torch.cuda.is_available():
            return torch.device("cpu")
        return concrete_device(torch.device("cuda"))

    def torch_dtype(self) -> torch.dtype:
        import torch  # lazy: as torch_device

        return torch.float64 if self.runtime.dtype == "float64" else torch.float32

    def party_subset(self) -> list[str]:
        return [p.strip() for p in self.data.parties.split(",") if p.strip()]

    def out_path(self) -> Path:
        return Path(self.runtime.out_dir).expanduser().resolve() if self.runtime.out_dir else Path.cwd() / "runs"
