"""A deployment in private mode (`fedsim deploy link --private`): every party uploads keyed
Bloom / FEDERAL filters of its identifiers (a key the service never sees, each party's copy 0600 in
its own folder), training runs on the Hamming linkage, and predict encodes the new records with
the primary's copy of the key: the test split predicted as new records gets the run's test metric."""

import json

import pytest

from deploy import commands as deploy
from deploy.private_mode import KEY
from linkage.store import load_primary
from tests.test_deploy import RUN, _down, _predict_on_the_deployment

pytestmark = pytest.mark.slow


def test_a_private_deployment_trains_and_predicts_on_encoded_identifiers(tmp_path):
    root = tmp_path / "dep"
    dep = deploy.up(root, "house3", parties=["airbnb_a"])
    try:
        deploy.link(dep, k=RUN["k"], n_rows=RUN["n-rows"], private=True)
        assert load_primary(dep.linkage_dir("primary")).metric == "hamming"  # linked on the filters
        keys = {p: (dep.party_dir(p) / KEY).read_text() for p in ("primary", "airbnb_a")}
        assert len(set(keys.values())) == 1 and "secret" in json.loads(keys["primary"])
        assert not list((root / "linkage-service").rglob(KEY))  # the service holds no key
        r = deploy.flwr_run(dep, {**RUN, "parties": "airbnb_a", "epochs": 1, "run-name": "ok"}, timeout=900)
        summary_file = root / "runs" / "ok" / "summary.json"
        assert summary_file.exists(), (r.stdout + r.stderr)[-5000:]
        _predict_on_the_deployment(dep, json.loads(summary_file.read_text()), tmp_path)
        from tests.test_private_files import _readable_by_others

        public = [p for p in root.rglob("*") if p.suffix in (".crt", ".pub")]
        assert _readable_by_others(root, skip=tuple(public)) == []  # the keys too: 0600 in 0700
    finally:
        _down(root)
