"""Entity Augmentation across separate hosts (lab/entity_aug.py) on three organisations' own CSVs
(examples/digits: the label holder and two guests, each image named by the same id): each on its
own network-namespace host as its own user, its home holding parties.toml and its own CSV only,
TLS and SuperNode authentication, the direct transport; the guests' ids meet the label holder's in
a private set intersection (app/entity_aug/id_exchange.py). Oracle: the run equals the same run
config trained in one process on every file, step by step (float64; privacy off, so no party's own
noise enters), and each guest's best-epoch state stays in its own home. Needs root and `ip netns`;
slow (about a minute)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from app.config import RunConfig
from app.kept import kept_attempt, party_kept_file
from app.modes import run_experiment
from lab.entity_aug import GUESTS, train_ea_across_hosts
from lab.hosts import Lab
from lab.training import PRIMARY
from tests.test_hosts import _leftovers, _why_not, read_by_others

pytestmark = [pytest.mark.slow, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits"
VALUES = {"n-rows": 300, "epochs": 2, "dtype": "float64", "privacy": "off"}
OWN = {PRIMARY: "labels.csv", "left": "left.csv", "right": "right.csv"}  # examples/digits/parties.toml


def test_entity_augmentation_across_hosts_equals_one_process(tmp_path):
    base = Path(tempfile.mkdtemp(prefix="fsl-lab-ea-", dir="/tmp"))  # not under pytest's 0700 tmp
    logs = Path(tempfile.mkdtemp(prefix="fsl-lab-ea-logs-"))
    try:
        with Lab(base, [PRIMARY, *GUESTS]) as lab:
            run = train_ea_across_hosts(lab, "csv", EXAMPLE, GUESTS, VALUES, logs)
            for party, own in OWN.items():  # its own CSV in its home, no other party's
                held = {p.name for p in (lab.hosts[party].home / "data").iterdir()}
                assert held == {"parties.toml", own}, (party, held)
            for guest in GUESTS:  # each guest's best epoch in its own home, readable by no other host
                home = lab.hosts[guest].home
                kept = home / "models" / "lab" / guest / party_kept_file(kept_attempt(run.run_dir))
                assert kept.exists() and not (run.run_dir / guest).exists()
                assert read_by_others(lab, lab.hosts[guest], [kept]) == []
            assert {t.name for t in lab.transfers} <= {"ca.crt"} | {f"nodekeys/{g}.pub" for g in GUESTS}
            losses = np.load(run.run_dir / "step_losses.npy")  # read before the lab's homes go
        assert not _leftovers(lab)
        flat = {k.replace("-", "_"): v for k, v in VALUES.items()}
        every = RunConfig.of(mode="entity-aug", dataset="csv", data_dir=str(EXAMPLE), **flat, out_dir=str(tmp_path))
        twin = run_experiment(every, tmp_path / "twin")  # one process, every party's file
        np.testing.assert_allclose(  # across hosts == one process, step by step (float64)
            losses, np.load(tmp_path / "twin" / "step_losses.npy"), rtol=1e-9
        )
        assert run.summary["test"] == twin["test"] and run.summary["best_epoch"] == twin["best_epoch"]
        assert run.summary["exchange"]["bytes_up"] > 0  # the guests' activations crossed hosts
        assert run.summary["entities"] == twin["entities"]  # the exchange met the ids one folder joins
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)
