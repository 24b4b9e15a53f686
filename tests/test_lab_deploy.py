"""Issue 32's CI test: the whole lifecycle across separate hosts (lab/lifecycle.py): the
linkage service, the primary and house3's three secondaries each in its own network namespace, as
its own OS user, with only its own data (a parties.toml and its own CSV); link through the service over
verified HTTPS, train two epochs (SuperLink + SuperNode, TLS + node authentication, the direct
transport), predict; then no file of one organisation is readable by another's user, and only
public certificates, each secondary's public node key and each party's own job secret crossed. Slow (minutes);
needs root and `ip netns` (CI runs as root)."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import pytest

from lab import lifecycle
from lab.hosts import Lab
from lab.lifecycle import PRIMARY, SERVICE
from tests.test_hosts import _why_not, read_by_others

pytestmark = [pytest.mark.slow, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]
DATA = Path(os.environ.get("FEDSIM_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture(scope="module")
def deployed():
    base, tmp = Path(tempfile.mkdtemp(dir="/tmp")), Path(tempfile.mkdtemp())
    try:
        exported = lifecycle.export_parties("house3", DATA, tmp / "data", n_rows=1000)
        assert len(exported.parties) == 3
        with Lab(base, [SERVICE, PRIMARY, *exported.parties]) as lab:
            yield lab, exported, lifecycle.lifecycle(lab, exported, tmp, epochs=2, k=5)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


def _link_train_and_predict_finish_across_hosts(deployed):
    _, exported, out = deployed
    summary = out["summary"]
    assert summary["dataset"] == "csv" and summary["epochs_run"] == 2
    assert sorted(summary["exchange_privacy"]["attacks"]) == exported.parties  # every secondary trained
    assert all(math.isfinite(v) for v in summary["test"].values())
    predictions = pd.read_csv(out["predictions"])
    assert len(predictions) == 20 and predictions.iloc[:, -1].notna().all()


def _each_home_holds_only_its_own_data(deployed):
    lab, exported, _ = deployed
    everyone = [PRIMARY, *exported.parties]
    for party in everyone:
        home = lab.hosts[party].home
        csvs = sorted(str(p.relative_to(home)) for p in home.rglob("*.csv"))
        own = {f"data/{party}.csv"} | ({"new-records.csv", "predictions.csv"} if party == PRIMARY else set())
        assert set(csvs) <= own | {c for c in csvs if c.startswith("runs/")}, csvs
        assert not [c for c in csvs if any(f"{o}.csv" in c for o in everyone if o != party)], csvs
    assert not list(lab.hosts[SERVICE].home.rglob("*.csv"))  # the service never holds a party's file


def _no_file_crosses_users_and_only_public_material_travelled(deployed):
    lab, exported, _ = deployed
    for owner, host in lab.hosts.items():
        files = [p for p in host.home.rglob("*") if p.is_file()]
        assert files and lab.readable_by(host, files[0])  # the owner reads its own: the check can fail
        assert read_by_others(lab, host, files) == [], owner
    travelled = sorted({(t.sender, t.receiver, t.name) for t in lab.transfers})
    allowed_names = {"service-ca.crt", "job.secret", "ca.crt"} | {f"nodekeys/{p}.pub" for p in exported.parties}
    assert {name for _, _, name in travelled} <= allowed_names, travelled
    secrets = [(s, r) for s, r, n in travelled if n == "job.secret"]
    assert sorted(secrets) == sorted((SERVICE, h) for h in [PRIMARY, *exported.parties])  # each its own, once


def test_the_lifecycle_across_hosts(deployed):
    """One test, every check on one lab (a module fixture is built again on every xdist worker that runs one of its tests)."""
    for check in (
        _link_train_and_predict_finish_across_hosts,
        _each_home_holds_only_its_own_data,
        _no_file_crosses_users_and_only_public_material_travelled,
    ):
        check(deployed)
