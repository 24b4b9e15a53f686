"""What an authenticated party can make the service hold is bounded by what it sends, and a
refused request costs its sender nothing: JSON bodies capped before they are held, uploads of
any dtype validated a block at a time, a query's cheap checks (records, cells, kind, width,
budget) before any of its values is read."""

from __future__ import annotations

import tracemalloc

import numpy as np

from linkage_server.uploads import parse_npy, to_npy, validate
from tests.test_service_limits import ADMIN, _app, _auth, _until, _uploaded_job


def test_a_json_body_over_its_cap_is_refused_413_as_it_streams(tmp_path):
    """256 MiB of JSON to POST /jobs (admin) or /start (the primary) held +768 MB before."""
    with _app(tmp_path) as c:
        big = b'{"primary": "p", "secondaries": ["s"], "pad": "' + b"x" * (1 << 20) + b'"}'
        r = c.post("/jobs", content=big, headers={**_auth(ADMIN), "content-type": "application/json"})
        assert r.status_code == 413, r.text
        job, keys = _uploaded_job(c, 40, 20)
        r = c.post(f"/jobs/{job}/start", content=big, headers={**_auth(keys["p"]), "content-type": "application/json"})
        assert r.status_code == 413, r.text
        assert c.get(f"/jobs/{job}", headers=_auth(ADMIN)).json()["state"] == "created"


def test_a_json_body_nested_past_the_parsers_depth_is_refused_422_naming_it(tmp_path):
    """60,000 '[' (under the cap): json.loads raises RecursionError, which the service answered
    with a 500 and no reason, to the admin, a job's primary and a secondary alike."""
    deep = b"[" * 60_000
    with _app(tmp_path) as c:
        r = c.post("/jobs", content=deep, headers={**_auth(ADMIN), "content-type": "application/json"})
        assert r.status_code == 422 and "nested" in r.text, r.text
        job, keys = _uploaded_job(c, 40, 20)
        for method, path, who in (("post", f"/jobs/{job}/start", "p"), ("put", f"/jobs/{job}/parties/s/floor", "s")):
            r = getattr(c, method)(path, content=deep, headers={**_auth(keys[who]), "content-type": "application/json"})
            assert r.status_code == 422 and "nested" in r.text, (path, r.text)
        assert c.get(f"/jobs/{job}", headers=_auth(ADMIN)).json()["state"] == "created"


def test_an_int8_upload_is_validated_in_about_its_own_size(tmp_path):
    """int8 identifiers were checked as float64: 13.5 x the upload's bytes (measured before the fix);
    now a block at a time: 2.1 x (np.unique's sort of the rows for the duplicate count). Bound 4 x:
    twice the measured figure, for numpy's allocator on another machine."""
    arr = np.random.default_rng(0).integers(-100, 100, (2_000_000, 2)).astype(np.int8)
    path = tmp_path / "u.npy"
    path.write_bytes(to_npy(arr))
    mapped = parse_npy(path)
    tracemalloc.start()
    try:
        validate(mapped)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * path.stat().st_size, peak / path.stat().st_size


def test_a_query_is_refused_for_its_width_or_budget_before_its_values_are_read(tmp_path):
    with _app(tmp_path) as c:
        job, keys = _uploaded_job(c, 60, 30)
        assert c.post(f"/jobs/{job}/start", json={"metric": "euclidean", "k": 3}, headers=_auth(keys["p"])).is_success
        assert _until(c, job)["state"] == "done"
        wide = np.full((5, 3), np.nan)  # NaN everywhere: reading the values would name them first
        r = c.post(f"/jobs/{job}/query", content=to_npy(wide), headers=_auth(keys["p"]))
        assert r.status_code == 422 and "width differs" in r.text, r.text
        assert c.get(f"/jobs/{job}", headers=_auth(keys["p"])).json().get("queried") in (
            None,
            {"records": 0, "queries": 0, "cells": 0},
        )
        nan = np.full((5, 2), np.nan)
        r = c.post(f"/jobs/{job}/query", content=to_npy(nan), headers=_auth(keys["p"]))
        assert r.status_code == 422 and "NaN" in r.text  # refused, and its reservation given back
        assert c.get(f"/jobs/{job}", headers=_auth(keys["p"])).json()["queried"]["cells"] == 0


def test_a_string_job_of_few_cells_but_costly_comparisons_is_not_in_the_small_lane(tmp_path):
    """The small lane is for jobs of small *cost*: 100 cells of 900-character strings against 2,000
    records (the search compares 200,000 long pairs) go to the large lane; a 10 x 10 coordinate job
    stays small. Strings over 1,000 characters are refused at upload, by name."""
    import pytest

    from linkage_server.jobs import JobParams, JobStore
    from linkage_server.scheduler import Worker
    from linkage_server.uploads import UploadError

    store = JobStore(tmp_path)
    rng = np.random.default_rng(0)
    words = np.array(["".join(rng.choice(list("abcdefgh"), 900)) for _ in range(20)])
    strings, _ = store.create("p", ["s"])
    store.upload(strings, "p", to_npy(words[rng.integers(0, 20, 100)]))
    store.upload(strings, "s", to_npy(words[rng.integers(0, 20, 2000)]))
    store.start(strings, JobParams("edit", 1))
    numbers, _ = store.create("p", ["s"])
    store.upload(numbers, "p", to_npy(rng.uniform(0, 1, (10, 2))))
    store.upload(numbers, "s", to_npy(rng.uniform(0, 1, (10, 2))))
    store.start(numbers, JobParams("euclidean", 10))
    worker = Worker(store, small_cells=1_000_000)
    assert store.meta(strings)["uploads"]["p"]["chars"] == 900.0
    assert worker.lane(strings) == "large" and worker.lane(numbers) == "small"
    too_long, _ = store.create("p", ["s"])
    with pytest.raises(UploadError, match="longer than 1000 characters"):
        store.upload(too_long, "s", to_npy(np.array(["x" * 1001, "y"])))
