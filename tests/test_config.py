"""Run config: typed, validated, every bad value named."""

import tomllib
from pathlib import Path

import pytest

from app.config import ConfigError, RunConfig


def pyproject_config():
    return tomllib.loads(Path(__file__).parents[1].joinpath("pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def test_every_pyproject_key_is_a_field_and_parses():
    cfg = RunConfig.from_flower(pyproject_config())
    assert cfg.dataset == "hdb" and cfg.steps_per_exchange >= 1


def test_dataclass_defaults_match_pyproject():
    """RunConfig() is used outside Flower (tests, benches); it must mean what `flwr run .` means."""
    assert RunConfig.from_flower(pyproject_config()) == RunConfig()


def test_dataset_defaults_and_overrides_resolve():
    s = RunConfig.from_flower({"dataset": "hdb"}).resolve()
    assert (s.k, s.batch_size, s.lr, s.model.merge, s.model.k_conv) == (50, 128, 1e-3, "cnn", 7)
    s = RunConfig.from_flower({"dataset": "hdb", "k": 10, "lr": 0.01, "merge": "mlp", "sort-gate": False}).resolve()
    assert (s.k, s.lr, s.model.merge, s.model.sort_gate) == (10, 0.01, "mlp", False)
    assert RunConfig.from_flower({"lr": 1}).lr == 1.0  # an int is a fine float


@pytest.mark.parametrize(
    "cfg,match",
    [
        ({"k": "ten"}, "run-config 'k' must be int, got str 'ten'"),
        ({"batch-size": 1.5}, "run-config 'batch-size' must be int, got float 1.5"),
        ({"weight-gate": 1}, "run-config 'weight-gate' must be bool, got int 1"),
        ({"lr": "fast"}, "run-config 'lr' must be float, got str 'fast'"),
        ({"seed": True}, "run-config 'seed' must be int, got bool True"),
        ({"kk": 3}, r"unknown run-config key\(s\) \['kk'\]"),
        ({"method": "magic"}, "run-config 'method' must be one of"),
        ({"tau": 0.0}, r"run-config 'tau' must be in \(0, 1\]"),
        ({"steps-per-exchange": 0}, "run-config 'steps-per-exchange' must be >= 1"),
        ({"device": "tpu"}, "run-config 'device' must be auto, cpu or cuda"),
    ],
)
def test_bad_config_values_are_named(cfg, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig.from_flower(cfg)
