"""Each organisation its own data folder (issue 32): with dataset csv and the linkage service's
result (run-config linkage-dir), the primary's side of a run reads only parties.toml and its own
CSV; each secondary reads only parties.toml and its own. A secondary's file the primary does need
(it links in process, without linkage-dir) is named when missing, with why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from app.config import RunConfig
from datasets import DatasetError
from linkage.contracts import LinkageError
from tests.test_byo import SPEC, write_parties

TWO = (
    SPEC
    + """[secondaries.cafes]
file = "cafes.csv"
identifiers = ["y", "x"]
numeric = ["seats"]
"""
)
RUN = {"dataset": "csv", "method": "fedsim", "k": 3, "epochs": 2, "max_steps": 6, "batch_size": 32}


def _folders(tmp_path: Path) -> dict[str, Path]:
    """The whole dataset (for the linkage, made first), then one folder per party holding
    parties.toml and that party's own CSV only."""
    full = tmp_path / "full"
    full.mkdir()
    write_parties(full, TWO)
    cafes = (full / "shops.csv").read_text().replace("rent", "seats")  # a second secondary, same places
    (full / "cafes.csv").write_text(cafes)
    own = {"primary": "sales.csv", "shops": "shops.csv", "cafes": "cafes.csv"}
    folders = {"full": full}
    for party, file in own.items():
        folders[party] = tmp_path / party
        folders[party].mkdir()
        for name in ("parties.toml", file):
            shutil.copy(full / name, folders[party] / name)
    return folders


def _linked(folders: dict[str, Path], tmp_path: Path) -> Path:
    """The linkage job over the whole dataset (on the service's behalf, as `fedsim link` does),
    its files in one folder: the primary's run reads its primary.npz from there."""
    from app.data import load_data
    from app.vfl.linking import linkage_job

    cfg = RunConfig.of(**RUN, data_dir=str(folders["full"]), out_dir=str(tmp_path / "service"))
    _, folder = linkage_job(load_data(cfg), cfg, cfg.resolve())
    return folder


def _own_engine(secondary_dirs: dict[str, Path]):
    """The primary's driver (app/vfl/server.py drive) with each secondary reading its own folder
    (as a deployed SuperNode does with its node config's data-dir) behind an in-process channel."""
    from app.vfl.engine import Engine
    from app.vfl.secondary import SecondaryParty
    from app.vfl.server import link
    from strategies.vfl.channel import LocalChannel

    def connect(ds, cfg, settings):
        linkage, job, seconds, privacy = link(ds, cfg, settings, "[primary]")
        parties = {
            p: SecondaryParty(cfg.replace(data_dir=str(secondary_dirs[p])), p, str(job)) for p in sorted(secondary_dirs)
        }
        return linkage, LocalChannel(parties), seconds, privacy

    return Engine("inprocess", "[primary]", connect)


def test_the_primary_trains_with_only_its_own_csv_and_parties_toml(tmp_path):
    from app.modes import run_experiment
    from app.vfl.server import drive

    folders = _folders(tmp_path)
    job = _linked(folders, tmp_path)
    base = RunConfig.of(**RUN, linkage_dir=str(job), out_dir=str(tmp_path / "runs"))
    whole = run_experiment(base.replace(data_dir=str(folders["full"])), tmp_path / "whole")
    own = base.replace(data_dir=str(folders["primary"]))
    engine = _own_engine({p: folders[p] for p in ("shops", "cafes")})
    alone = drive(own, tmp_path / "own", engine)
    assert sorted(p.name for p in folders["primary"].iterdir()) == ["parties.toml", "sales.csv"]
    assert alone["test"] == pytest.approx(whole["test"], rel=1e-6)  # the same run, from the primary's own file
    assert alone["val"] == pytest.approx(whole["val"], rel=1e-6)
    summary = json.loads((tmp_path / "own" / "summary.json").read_text())
    assert sorted(summary["preprocessing"]["secondaries"]) == ["cafes", "shops"]
    kept = json.loads((tmp_path / "own" / "kept" / "federation.json").read_text())
    assert sorted(kept["secondaries"]) == ["cafes", "shops"]
    assert (
        kept["primary"]["features_sha256"]
        == json.loads((tmp_path / "whole" / "kept" / "federation.json").read_text())["primary"]["features_sha256"]
    )


def test_predict_on_the_primarys_side_opens_the_run_with_its_own_csv_only(tmp_path):
    """What the ServerApp's predict reads of the data (app/vfl/predict_server.py: open_kept with
    only the primary's digests checked): the primary's file alone."""
    from app import run_status
    from app.vfl.predict import open_kept
    from app.vfl.server import drive

    folders = _folders(tmp_path)
    job = _linked(folders, tmp_path)
    own = RunConfig.of(**RUN, data_dir=str(folders["primary"]), linkage_dir=str(job), out_dir=str(tmp_path / "runs"))
    with run_status.tracked(tmp_path / "runs" / "r", "inprocess"):  # predict opens finished runs only
        drive(own, tmp_path / "runs" / "r", _own_engine({p: folders[p] for p in ("shops", "cafes")}))
    kept = open_kept(tmp_path / "runs" / "r", check=("primary",))
    assert sorted(kept.meta["secondaries"]) == ["cafes", "shops"] and kept.ds.primary.n_rows == 400


def test_the_primarys_data_check_before_flower_starts_needs_only_its_own_csv(tmp_path):
    """`fedsim train`'s check (fedsim/train.py) loads what the ServerApp will: the primary's view."""
    from fedsim.train import check

    folders = _folders(tmp_path)
    job = _linked(folders, tmp_path)
    values = {"dataset": "csv", "data-dir": str(folders["primary"]), "linkage-dir": str(job), "k": 3}
    cfg, nodes = check(values)
    assert nodes == 2 and cfg.data.data_dir == str(folders["primary"])
    # a fetched linkage that does not fit the run: named here, not in the ServerApp after Flower started
    with pytest.raises(LinkageError, match="has K=3 but this run uses k=4"):
        check({**values, "k": 4})
    with pytest.raises(LinkageError, match="raw identifier digest differs"):
        check({**values, "n-rows": 300})


def test_without_linkage_dir_a_missing_secondary_csv_is_named_with_why(tmp_path):
    """Linking in process (no linkage-dir) needs every party's identifiers: the missing file is
    named, with the reason and the way out."""
    from app.data import load_data

    folders = _folders(tmp_path)
    cfg = RunConfig.of(**RUN, data_dir=str(folders["primary"]), out_dir=str(tmp_path / "runs"))
    missing = str(folders["primary"] / "cafes.csv")
    with pytest.raises(DatasetError, match=rf"party 'cafes'.*{missing}.*linkage-dir") as err:
        load_data(cfg)
    assert "every party's" in str(err.value)


def test_the_primarys_view_reads_no_secondary_file(tmp_path, monkeypatch):
    """The primary's view of the data: its own table, the secondaries by name (parties.toml)."""
    import pandas as pd

    from app.data import primary_data

    folders = _folders(tmp_path)
    read, real = [], pd.read_csv
    monkeypatch.setattr(pd, "read_csv", lambda path, **kw: read.append(Path(path).name) or real(path, **kw))
    cfg = RunConfig.of(**RUN, data_dir=str(folders["full"]), linkage_dir=str(tmp_path / "job"))
    ds = primary_data(cfg)
    assert ds.party_names == ["shops", "cafes"] and ds.secondaries == {}  # parties.toml's order
    assert set(read) <= {"sales.csv"} and np.isfinite(ds.primary.features).all()
    assert primary_data(cfg.replace(parties="shops")).party_names == ["shops"]


@pytest.mark.slow
def test_a_deployment_with_one_data_folder_per_party(tmp_path, monkeypatch):
    """A real deployment on loopback (tests/test_deploy.py's): each SuperNode's node config names
    its own folder, and `flwr run` gives the primary's ServerApp a folder with only parties.toml
    and sales.csv. The linkage is made first from the whole folder (standing in for each party
    uploading its own identifiers to the service)."""
    from deploy import commands as deploy

    folders = _folders(tmp_path)
    real_start = deploy.start_node

    def own_folder(dep, party, key=None, port=0):  # the node config's data-dir: the party's own folder
        dep.data_dir = str(folders[party])
        try:
            return real_start(dep, party, key, port)
        finally:
            dep.data_dir = str(folders["full"])

    monkeypatch.setattr(deploy, "start_node", own_folder)
    root = tmp_path / "dep"
    dep = deploy.up(root, "csv", str(folders["full"]), ["shops", "cafes"])
    try:
        deploy.link(dep, deploy.LinkRequest(k=3))
        dep.data_dir = str(folders["primary"])  # the run config's data-dir: the primary's own folder
        run = {"k": 3, "epochs": 1, "batch-size": 64, "run-name": "own", "node-timeout": 60.0}
        r = deploy.flwr_run(dep, run, timeout=900)
        summary = root / "runs" / "own" / "summary.json"
        assert summary.exists(), (r.stdout + r.stderr)[-5000:]
        assert json.loads(summary.read_text())["test"]["rmse"] > 0
        assert "secondaries {'shops': 'on its own host', 'cafes': 'on its own host'}" in r.stdout + r.stderr
    finally:
        deploy.down(root)


def test_with_entity_ids_the_primarys_view_needs_every_partys_ids_and_says_why(tmp_path):
    """parties.toml's entity_id: validation and test are entities every party holds, so the
    primary's view reads each party's ids (same split as the whole dataset); a missing file is named."""
    from datasets.csv_parties import load_csv_parties
    from datasets.csv_views import load_primary_view
    from datasets.options import DatasetOptions
    from tests.test_own_data import write_entities

    write_entities(tmp_path)
    view, whole = load_primary_view(tmp_path, DatasetOptions()), load_csv_parties(tmp_path, DatasetOptions())
    assert view.party_names == ["a", "b"] and view.secondaries == {}
    assert np.array_equal(view.split.test, whole.split.test) and view.true_match.keys() == whole.true_match.keys()
    (tmp_path / "b.csv").unlink()
    with pytest.raises(DatasetError, match=rf"party 'b' \(b.csv\): file {tmp_path / 'b.csv'} not found.*entity_id"):
        load_primary_view(tmp_path, DatasetOptions())
