"""Run config: typed, validated, every bad value named."""

import tomllib
from pathlib import Path

import pytest

from app.config import ConfigError, RunConfig


def pyproject_config():
    return tomllib.loads(Path(__file__).parents[1].joinpath("pyproject.toml").read_text())["tool"]["flwr"]["app"][
        "config"
    ]


def test_every_pyproject_key_is_a_field_and_parses():
    cfg = RunConfig.from_flower(pyproject_config())
    assert cfg.data.dataset == "hdb" and cfg.train.steps_per_exchange >= 1


def test_pyproject_table_is_the_rendering_of_the_fields():
    """Each key's one home is its field (default, help, resumability): pyproject.toml's table is
    rendered from them (`python -m app.config_table --write`), never edited by hand."""
    from app.config_table import PYPROJECT, with_table

    text = PYPROJECT.read_text()
    assert text == with_table(text), "pyproject.toml's run-config table differs: python -m app.config_table --write"


def test_dataclass_defaults_match_pyproject():
    """RunConfig.of() is used outside Flower (tests, benches); it must mean what `flwr run .` means."""
    assert RunConfig.from_flower(pyproject_config()) == RunConfig.of()


def test_dataset_defaults_and_overrides_resolve():
    s = RunConfig.from_flower({"dataset": "hdb"}).resolve()
    assert (s.k, s.batch_size, s.lr, s.model.merge, s.model.k_conv) == (50, 128, 1e-3, "cnn", 7)
    s = RunConfig.from_flower({"dataset": "hdb", "k": 10, "lr": 0.01, "merge": "mlp", "sort-gate": False}).resolve()
    assert (s.k, s.lr, s.model.merge, s.model.sort_gate) == (10, 0.01, "mlp", False)
    assert RunConfig.from_flower({"lr": 1}).train.lr == 1.0  # an int is a fine float


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


def test_a_dataset_without_tuned_defaults_trains_until_validation_stops_improving():
    """Before: the user's own data ("csv") trained the demo's 2 epochs, hdb's settings unsaid."""
    stop = lambda **kw: (lambda s: (s.epochs, s.patience))(RunConfig.of(**kw).resolve())  # noqa: E731
    assert stop(dataset="csv") == (200, 10) and stop(dataset="hdb") == (100, 0) and stop(dataset="synthetic") == (50, 0)
    assert stop(dataset="csv", epochs=30) == (30, 10) and stop(dataset="csv", patience=0) == (200, 0)
    assert stop(dataset="hdb", patience=5) == (100, 5) and stop(dataset="hdb", epochs=2) == (2, 0)
    with pytest.raises(ConfigError, match="run-config 'patience' must be >= 0"):
        RunConfig.from_flower({"patience": -2})


def test_every_hyperparameter_names_where_it_came_from():
    src = lambda **kw: {k: v["source"] for k, v in RunConfig.of(**kw).hyperparameters().items()}  # noqa: E731
    hdb = src(dataset="hdb", lr=0.01)
    assert hdb["lr"] == "run config" and hdb["k"] == "dataset default (hdb, paper App. E)"
    assert hdb["epochs"] == hdb["patience"] == "dataset default (hdb, paper App. E)"
    own = src(dataset="csv")
    assert own["k"] == own["lr"] == "fallback: hdb's defaults — dataset has no tuned defaults"
    assert own["epochs"] == own["patience"] == "fallback: early stopping — dataset has no tuned defaults"
    top1 = src(dataset="hdb", method="top1sim", hparams="paper", merge="mlp")
    assert top1["batch_size"] == top1["lr"] == "paper per-method (hdb top1sim, App. E)"
    assert top1["merge"] == "method top1sim" and top1["k"] == "method top1sim: one neighbour"
    values = RunConfig.of(dataset="hdb", method="top1sim", hparams="paper").hyperparameters()
    assert (values["k"]["value"], values["batch_size"]["value"], values["merge"]["value"]) == (1, 4096, "avg")


def test_the_hamming_kernels_are_cached_in_a_user_cache_folder(tmp_path):
    """Before: numba cached them next to the installed package (linkage/__pycache__)."""
    import os
    import subprocess
    import sys

    show = "import linkage.hamming as h; from numba.core import config; print(config.CACHE_DIR)"
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"} | {"XDG_CACHE_HOME": str(tmp_path)}

    def run(code: str, **extra: str) -> str:
        return subprocess.run(
            [sys.executable, "-c", code],
            env=env | extra,
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parents[1],
        ).stdout.strip()

    assert run(show) == str(tmp_path / "fedsim" / "numba")
    assert run("import numba; " + show) == str(tmp_path / "fedsim" / "numba")  # numba imported first
    assert run(show, NUMBA_CACHE_DIR=str(tmp_path / "mine")) == str(tmp_path / "mine")


# ---------------------------------------------------------------------------- typed groups


def test_every_flat_key_lives_in_exactly_one_group_and_round_trips():
    cfg = RunConfig.from_flower({"tau": 0.5, "predict-unknown": "refuse", "ea-variant": "full", "k": 7, "lr": 0.01})
    assert (cfg.link.tau, cfg.predict.unknown, cfg.ea.variant, cfg.link.k, cfg.train.lr) == (
        0.5,
        "refuse",
        "full",
        7,
        0.01,
    )
    assert RunConfig.of(**cfg.flat()) == cfg  # kept runs and checkpoints hold the flat names
    assert sorted(k.replace("_", "-") for k in cfg.flat()) == sorted(pyproject_config())
    assert cfg.replace(seed=3).train.seed == 3 and cfg.train.seed == 0  # a copy; frozen groups


def test_a_kept_run_of_an_earlier_version_still_reads_but_a_user_is_told():
    """Runs kept before the groups wrote guest_timeout, guest_delay and bench_floor."""
    old = RunConfig.of(dataset="synthetic", guest_timeout=1.5, guest_delay=2.0, bench_floor=3)
    assert old.ea.secondary_timeout == 1.5 and "guest_delay" not in old.flat() and "bench_floor" not in old.flat()
    with pytest.raises(ConfigError, match="'bench-floor' is no longer a run-config key: it is the benchmark probe"):
        RunConfig.from_flower({"bench-floor": 3})
    with pytest.raises(TypeError, match="RunConfig has no key"):
        RunConfig.of(tua=0.5)
    with pytest.raises(TypeError, match=r"RunConfig has no key\(s\) \['bench_floor'\]"):
        old.replace(bench_floor=2)  # a change is never dropped silently


@pytest.mark.parametrize("raw", ["-1", "soon", "nan"])
def test_a_probe_with_a_bad_value_is_refused_by_its_name(monkeypatch, raw):
    from app import probes

    monkeypatch.setenv(probes.SECONDARY_DELAY, raw)
    with pytest.raises(ValueError, match=f"FEDSIM_PROBE_SECONDARY_DELAY={raw!r}: expected a non-negative float"):
        probes.secondary_delay()
    monkeypatch.setenv(probes.BENCH_FLOOR, "2")
    assert probes.bench_floor() == 2
