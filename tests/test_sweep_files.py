"""Every sweep file the project ships is a valid plan: each of its runs (full and --quick) is a run
config the runner accepts, so a typo is found here and not minutes into a lent GPU's time."""

from pathlib import Path

import pytest

from app.config import RunConfig
from experiments.sweep import applies, load_sweep, run_values

SWEEPS = sorted((Path(__file__).resolve().parent.parent / "conf" / "sweeps").glob("*.toml"))


def test_the_sweep_files_are_found():
    assert len(SWEEPS) > 40  # conf/sweeps holds every preset the docs cite


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_run_of_a_sweep_file_is_a_valid_run_config(path, quick):
    sweep = load_sweep(path, quick)
    runs = 0
    for dataset in sweep["datasets"]:
        for variant in sweep["variants"]:
            if not applies(sweep, dataset, variant):
                continue
            for seed in sweep["seeds"]:
                cfg = RunConfig.from_flower({**run_values(sweep, dataset, variant, seed), "out-dir": "unused"})
                cfg.resolve()  # the dataset's settings under the run's overrides
                runs += 1
    assert runs > 0, f"{path.name}: no (dataset, variant, seed) applies"


def test_a_misspelt_key_in_a_sweep_file_is_refused(tmp_path):
    """The check above can fail: a sweep with an unknown key is refused by name."""
    path = tmp_path / "typo.toml"
    path.write_text('datasets = ["house"]\nseeds = [0]\n[set]\nepoch = 3\n[variants]\nfedsim = { method = "fedsim" }\n')
    sweep = load_sweep(path, quick=False)
    with pytest.raises(ValueError, match="'epoch'"):
        RunConfig.from_flower(run_values(sweep, "house", "fedsim", 0))
