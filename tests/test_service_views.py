"""The linkage service's names and views as an attacker or a careless party would use them:
party names that collide or are unknown, what each role's status shows, and a failure's text."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from linkage.pipeline import fit_standardizer, similarity, topk_bruteforce
from linkage_server.floors import Floors
from linkage_server.jobs import JobError, JobParams, JobStore
from linkage_server.uploads import to_npy
from tests.test_service_security import ADMIN, _auth, neighbours_of, points, two_party_app


@pytest.fixture
def app(tmp_path):
    yield from two_party_app(tmp_path)


@pytest.mark.parametrize(
    "primary, secondaries",
    [
        ("p\n", ["s"]),
        ("p", ["s\n"]),
        ("p", ["P"]),
        ("p", [".hidden"]),
        ("p", ["a/b"]),
    ],
)
def test_party_names_are_matched_in_full_and_cannot_collide(tmp_path, primary, secondaries):
    with pytest.raises(JobError, match="party name") as e:
        JobStore(tmp_path).create(primary, secondaries)
    assert e.value.status == 422


def test_a_secondary_named_like_a_primary_file_overwrites_nothing(tmp_path):
    query, base = points(80, 40, seed=4)
    train = np.arange(0, 80, 3)
    store = JobStore(tmp_path, floors=Floors("off"))  # an exact release: brute force compares
    job, _ = store.create("p", ["p.train"])
    store.upload(job, "p", to_npy(query))
    store.upload(job, "p", to_npy(train), train_rows=True)
    store.upload(job, "p.train", to_npy(base))
    store.start(job, JobParams.parse({"metric": "euclidean", "k": 3}))
    store.run(job)
    meta = store.meta(job)
    assert meta["state"] == "done", meta["error"]
    dist, idx = topk_bruteforce(query, base, 3)
    mean, std = fit_standardizer(similarity(dist), train)  # standardised on the primary's training rows
    assert meta["stats"]["p.train"]["sim_mean"] == pytest.approx(mean, rel=1e-9)
    assert meta["stats"]["p.train"]["sim_std"] == pytest.approx(std, rel=1e-9)
    np.testing.assert_array_equal(neighbours_of(tmp_path / "jobs" / job / "results", "p.train"), idx)


def test_an_unknown_party_is_refused_without_naming_the_jobs_parties(app):
    c, job, keys = app
    for headers in ({}, _auth("whatever"), _auth(keys["bob"])):
        r = c.put(f"/jobs/{job}/parties/mallory/identifiers", content=b"x", headers=headers)
        assert r.status_code == 404 and "mallory" in r.json()["detail"]
        assert not any(name in r.text for name in ("alice", "bob", "carol")), r.text


# ----------------------------------------------------------------------------- item 2: role-based status


def _keys_of(obj, prefix="") -> set[str]:
    if isinstance(obj, dict):
        return {f"{prefix}{k}" for k in obj} | {x for k, v in obj.items() for x in _keys_of(v, f"{prefix}{k}.")}
    return set()


def test_status_shows_each_role_only_what_it_needs(app, tmp_path):
    c, job, keys = app
    rng = np.random.default_rng(5)
    ids = {p: rng.uniform(0, 10, (n, 2)) for p, n in (("alice", 50), ("bob", 30), ("carol", 20))}
    for party, x in ids.items():
        r = c.put(f"/jobs/{job}/parties/{party}/identifiers", content=to_npy(x), headers=_auth(keys[party]))
        assert r.is_success, r.text
    assert c.put(
        f"/jobs/{job}/parties/alice/train-rows", content=to_npy(np.arange(25)), headers=_auth(keys["alice"])
    ).is_success
    assert c.post(
        f"/jobs/{job}/start", json={"metric": "euclidean", "k": 3, "tau": 0.9}, headers=_auth(keys["alice"])
    ).is_success
    views = {}
    for _ in range(200):
        views = {
            who: c.get(f"/jobs/{job}", headers=_auth(key)).json() for who, key in (("admin", ADMIN), *keys.items())
        }
        if views["admin"]["state"] in ("done", "failed"):
            break
        time.sleep(0.05)
    prim, bob, admin = views["alice"], views["bob"], views["admin"]
    assert admin["state"] == "done", admin["error"]

    # the primary: what it set, its own upload, which parties are in, the statistics training needs
    assert prim["role"] == "primary" and prim["params"]["k"] == 3 and prim["secondaries"] == ["bob", "carol"]
    assert set(prim["uploads"]) == {"alice"} and prim["uploads"]["alice"]["rows"] == 50
    assert prim["uploaded"] == ["alice", "bob", "carol"] and prim["train_rows"] == 25
    assert set(prim["stats"]) == {"bob", "carol"} and prim["stats"]["bob"]["sigma"] > 0
    # a secondary: state, the job's parameters and its own upload only; no progress counts, whose
    # total (chunks x searched secondaries, here 2 x 2) would tell it how many secondaries there are
    assert bob["role"] == "secondary" and bob["party"] == "bob" and bob["state"] == "done"
    assert admin["progress"] == {"done": 4, "total": 4} and prim["progress"] == admin["progress"]
    assert bob["uploads"] == {"bob": admin["uploads"]["bob"]} and bob["progress"] == {}
    assert bob["params"]["metric"] == "euclidean" and bob["uploads"]["bob"]["rows"] == 30
    assert set(bob) == {"job", "role", "party", "state", "progress", "error", "params", "uploads", "privacy"}
    # the privacy report (linkage/privacy.py): the primary's covers every secondary, a secondary's only itself
    assert set(prim["privacy"]["parties"]) == {"bob", "carol"} and list(bob["privacy"]["parties"]) == ["bob"]
    assert set(bob["privacy"]["parties"]["bob"]) == {"attacks", "strongest"}  # not the job's statistics
    assert "alice" not in json.dumps(bob) and "carol" not in json.dumps(bob)
    # the admin: everything, with row counts of every party
    assert admin["role"] == "admin" and {p: u["rows"] for p, u in admin["uploads"].items()} == {
        "alice": 50,
        "bob": 30,
        "carol": 20,
    }
    # nobody ever sees a secret, its hash, or a seed
    secret = (tmp_path / "svc" / "jobs" / job / "secret.key").read_bytes()
    for who, view in views.items():
        assert not any("secret" in k or "seed" in k for k in _keys_of(view)), (who, _keys_of(view))
        text = json.dumps(view)
        assert not any(k in text for k in keys.values()) and secret.hex() not in text and ADMIN not in text
    # a stranger sees nothing
    assert c.get(f"/jobs/{job}", headers=_auth("nobody's secret")).status_code == 403


def _numbers(tree) -> list:
    """Every number in a JSON-like tree."""
    if isinstance(tree, dict):
        return [n for value in tree.values() for n in _numbers(value)]
    if isinstance(tree, list):
        return [n for value in tree for n in _numbers(value)]
    return [tree] if isinstance(tree, (int, float)) and not isinstance(tree, bool) else []


def test_a_secondary_never_reads_a_failures_text(tmp_path):
    """A job's error may name other parties or the primary's size: a secondary learns only that it
    failed, from the status and from the result endpoint alike; the primary sees why."""
    store = JobStore(tmp_path)
    job, _ = store.create("p", ["s", "t"])
    rng = np.random.default_rng(0)
    store.upload(job, "p", to_npy(rng.uniform(0, 10, (40, 2))))
    store.upload(job, "p", to_npy(np.array([0, 77])), train_rows=True)  # row 77 of 40: the job fails
    for party in ("s", "t"):
        store.upload(job, party, to_npy(rng.uniform(0, 10, (30, 2))))
    store.start(job, JobParams("euclidean", 3, layout="chain", anchor="t"))
    store.run(job)
    meta = store.meta(job)
    assert meta["state"] == "failed" and "40 rows" in meta["error"]
    seen = store.public(meta, "secondary", "s")
    # the job id and digests are random hex: look for the primary's size in the text and the numbers
    assert "40" not in seen["error"] and "40 rows" not in json.dumps(seen)
    assert 40 not in _numbers(seen) and "anchor" not in seen["params"]
    with pytest.raises(JobError) as refused:
        store.result_path(job, "s")
    assert "40" not in refused.value.message.replace(job, "") and "failed" in refused.value.message  # id: random hex
    with pytest.raises(JobError, match="40 rows"):
        store.result_path(job, "p")
