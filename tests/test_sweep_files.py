"""Every sweep file the project ships is a valid plan: its keys are the runner's, and each of its
runs (full and --quick) is a run config the runner accepts, so a typo is found here and not
minutes into a lent GPU's time."""

import tomllib
from pathlib import Path

import pytest

from app.config import RunConfig
from experiments.sweep import applies, load_sweep, run_values

SWEEPS = sorted((Path(__file__).resolve().parent.parent / "conf" / "sweeps").glob("*.toml"))
TOP = {"datasets", "seeds", "set", "variants", "quick", "x", "engine", "name"}  # what experiments.sweep reads
QUICK = {"seeds", "set"}


def check_sweep_file(path: Path) -> int:
    """Raise on a key the runner would ignore or refuse; return the number of runs checked."""
    raw = tomllib.loads(path.read_text())
    stray = sorted(set(raw) - TOP) + sorted(f"quick.{k}" for k in set(raw.get("quick", {})) - QUICK)
    if stray:
        raise ValueError(f"{path.name}: keys the sweep runner does not read: {stray}")
    per_dataset = {k for k, v in raw.get("set", {}).items() if isinstance(v, dict)}
    if per_dataset - set(raw["datasets"]):
        raise ValueError(f"{path.name}: [set.<dataset>] for datasets it does not run: {sorted(per_dataset)}")
    runs = 0
    for quick in (False, True):
        sweep = load_sweep(path, quick)
        for dataset in sweep["datasets"]:
            for variant in (v for v in sweep["variants"] if applies(sweep, dataset, v)):
                for seed in sweep["seeds"]:
                    values = run_values(sweep, dataset, variant, seed)
                    RunConfig.from_flower({**values, "out-dir": "unused"}).resolve()
                    runs += 1
    return runs


def test_the_sweep_files_are_found():
    assert len(SWEEPS) > 40  # conf/sweeps holds every preset the docs cite


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_run_of_a_sweep_file_is_a_valid_run_config(path):
    assert check_sweep_file(path) > 0, f"{path.name}: no (dataset, variant, seed) applies"


@pytest.mark.parametrize(
    "text, problem",
    [
        ("[set]\nepoch = 3\n", "'epoch'"),  # a misspelt run-config key
        ('[set]\ninput-scale = "nope"\n', "nope"),  # a value the run config refuses
        ("epochs = 3\n[set]\n", "'epochs'"),  # a key above [set]: the runner would ignore it
        ("[sett]\nepochs = 3\n", "'sett'"),
        ("[quick]\nseed = [0]\n", "quick.seed"),
        ("[set.frog]\nepochs = 3\n", "frog"),  # a dataset the sweep does not run
    ],
)
def test_a_typo_in_a_sweep_file_is_refused_by_name(tmp_path, text, problem):
    """The check above can fail: each kind of typo is refused, naming it."""
    path = tmp_path / "typo.toml"
    path.write_text('datasets = ["house"]\nseeds = [0]\n' + text + '[variants]\nfedsim = { method = "fedsim" }\n')
    with pytest.raises(ValueError, match=problem):
        check_sweep_file(path)
