"""Run names never collide with folders the tool writes itself: a run-name of a folder the out-dir
keeps for the linkage (`linkage/`, `linkage-service/`) is refused, and an ensemble never trains a
member over a run of the same name that is not its member."""

from __future__ import annotations

import json

import pytest

from app.config import ConfigError, RunConfig
from fedsim import ensemble_step


@pytest.mark.parametrize("name", ["linkage", "linkage-service"])
def test_a_run_named_like_the_out_dirs_linkage_folders_is_refused(name):
    with pytest.raises(ConfigError, match=f"run-name.*{name}.*keeps"):
        RunConfig.from_flower({"run-name": name})


def test_an_ensemble_does_not_train_a_member_over_a_users_run_of_that_name(tmp_path, capsys):
    """`fedsim train --budget ... --run-name x` next to a run the user named x.member1 replaced it."""
    (tmp_path / "x").mkdir()
    mine = tmp_path / "x.member1"
    mine.mkdir()
    (mine / "config.json").write_text(json.dumps({"run": {"member": 0, "run_name": "x.member1"}}))
    (mine / "summary.json").write_text('{"mine": true}')
    trained = []
    code = ensemble_step.run({"run-name": "x"}, tmp_path / "x", 1, lambda values, folder: trained.append(folder) or 0)
    assert code != 0 and trained == [] and (mine / "summary.json").read_text() == '{"mine": true}'
    assert "x.member1" in capsys.readouterr().err
