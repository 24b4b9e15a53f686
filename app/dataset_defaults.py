"""Each built-in dataset's defaults for FedSim's mode, in one table (:data:`BUILT_IN`): K, batch,
epochs, learning rate, weight decay and the model's shape and dropout, the paper's App. E / the
reference code's values. A dataset without a row (the user's own ``csv``) gets hdb's model and
optimiser values and trains until validation stops improving (app/config.py). Entity
Augmentation's datasets keep theirs in app/entity_aug/parties.py; a method's own per-dataset
values (the baselines') in strategies/vfl/methods.py.

The recipe (input encoding, method, where fedsim_attn's attention starts) is no dataset's default:
`fedsim train` chooses it on the run's own rows (fedsim/recipe_search.py), on a built-in set as on
a user's. :data:`HAND_CHOSEN` keeps the recipes this project chose by hand on each built-in set's
validation (docs/fedsim-attn.md), the lab's setting ``hparams = "dataset"``; a run kept before the
search decided the built-in sets recorded that value and reads back with them.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.vfl.model_config import ModelConfig


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


@dataclass(frozen=True)
class DatasetDefaults:
    """A built-in dataset's row: its training settings and how its parties fill a numeric NaN."""

    settings: Settings
    missing: str = ""  # datasets/options.py MISSING; "" = "mean"


# ModelConfig's defaults are the paper's hdb model (local 200 -> cut 100, pairs 100 -> 10, CNN merge)
_SMALL = dict(local_hidden=(100,), cut_dim=50)  # game, frog, synthetic: the reference's narrower parties
BUILT_IN: dict[str, DatasetDefaults] = {
    "hdb": DatasetDefaults(Settings(50, 128, 100, 1e-3, 1e-4, ModelConfig(dropout=0.2))),
    "synthetic": DatasetDefaults(
        Settings(100, 32, 50, 1e-3, 1e-4, ModelConfig(**_SMALL, r=1, merge="avg", dropout=0.0))
    ),
    "house": DatasetDefaults(Settings(100, 128, 100, 1e-3, 1e-5, ModelConfig(dropout=0.3))),
    "house3": DatasetDefaults(Settings(100, 128, 100, 1e-3, 1e-5, ModelConfig(dropout=0.3))),
    "game": DatasetDefaults(Settings(50, 32, 50, 1e-3, 1e-5, ModelConfig(**_SMALL, k_conv=5, dropout=0.7))),
    "frog": DatasetDefaults(Settings(100, 32, 100, 3e-3, 1e-3, ModelConfig(**_SMALL, merge="avg", dropout=0.0))),
}

# hparams = "dataset": run-config values (flat names) chosen by hand on each set's validation. ple:
# better on both seeds of all four ("Piecewise-linear encodings"); house and game: the attention
# starts silent (at the paper's FedSim; house 5 seeds to convergence, game 10, "The attention's
# start per dataset"); house's attention branch learns at 0.3 of the rate (attn_lr_house*.toml)
HAND_CHOSEN: dict[str, dict[str, object]] = {
    "hdb": {"input_scale": "ple"},
    "house": {"input_scale": "ple", "attention_start": "silent", "attention_lr": 0.3},
    "game": {"input_scale": "ple", "attention_start": "silent"},
    "frog": {"input_scale": "ple"},
}

# the table's columns, by the names their readers use
DATASET_DEFAULTS: dict[str, Settings] = {name: d.settings for name, d in BUILT_IN.items()}
DATASET_MISSING: dict[str, str] = {name: d.missing for name, d in BUILT_IN.items() if d.missing}


def hand_chosen(flat: dict) -> dict:
    """``flat`` (a run config, flat names) with the hand-chosen recipe filled in where it is
    ``hparams = "dataset"`` and leaves a key unset ("" or 0.0); any other run as it is."""
    if flat.get("hparams") != "dataset":
        return flat
    chosen = HAND_CHOSEN.get(str(flat.get("dataset", "")), {})
    return {**flat, **{k: v for k, v in chosen.items() if flat.get(k) in (None, "", 0.0)}}
