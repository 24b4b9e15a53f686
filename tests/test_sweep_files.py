"""Every sweep file the project ships is a valid plan: the runner reads it (experiments.sweep
load_sweep refuses keys it would ignore), and each of its runs (full and --quick) is a run config
the runner accepts, so a typo is found here and not minutes into a lent GPU's time."""

from pathlib import Path

import pytest

from app.config import ConfigError, RunConfig
from experiments.sweep import applies, load_sweep, run_values

SWEEPS = sorted((Path(__file__).resolve().parent.parent / "conf" / "sweeps").glob("*.toml"))


def check_sweep_file(path: Path) -> int:
    """Raise on a key the runner would ignore or refuse; return the number of runs checked."""
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
    "text, problem, error",
    [
        ("[set]\nepoch = 3\n", "'epoch'", ConfigError),  # a misspelt run-config key
        ('[set]\ninput-scale = "nope"\n', "nope", ConfigError),  # a value the run config refuses
        ("epochs = 3\n[set]\n", "'epochs'", SystemExit),  # a key above [set]: the runner refuses it
        ("[sett]\nepochs = 3\n", "'sett'", SystemExit),
        ("[quick]\nseed = [0]\n", "quick.seed", SystemExit),
        ("[set.frog]\nepochs = 3\n", "frog", SystemExit),  # a dataset the sweep does not run
    ],
)
def test_a_typo_in_a_sweep_file_is_refused_by_name(tmp_path, text, problem, error):
    """The check above can fail: each kind of typo is refused, naming it (the file's keys by the
    runner itself, before any run; the run config's values by RunConfig)."""
    path = tmp_path / "typo.toml"
    path.write_text('datasets = ["house"]\nseeds = [0]\n' + text + '[variants]\nfedsim = { method = "fedsim" }\n')
    with pytest.raises(error, match=problem):
        check_sweep_file(path)
