"""One party cannot exhaust the shared linkage service (issue 28 item 5).

The operator's limits (K, cells per job, per search chunk and per query, concurrent bodies per
party) refuse by name before any expensive work; request bodies go to disk, not memory; a
composed job's queries do not load its release; a job can be cancelled; a small job is not
stuck behind a large one. Every check is by order and progress, never by wall time.
"""

from __future__ import annotations

import threading
import time
import tracemalloc
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from linkage.query import QueryJob
from linkage.query import query as in_process_query
from linkage.store import read_primary, read_secondary
from linkage_server import job_run
from linkage_server.floors import Floors
from linkage_server.jobs import JobParams, JobStore
from linkage_server.limits import Limits, QueryLimits
from linkage_server.local import free_port, local_service
from linkage_server.queries import Queries
from linkage_server.service import ServiceOptions, create_app
from linkage_server.uploads import to_npy

ADMIN = "admin-token-for-limits-tests-0123"
WAIT = 120  # seconds an event may take on a loaded machine before the test gives up


def _auth(secret: str) -> dict:
    return {"Authorization": f"Bearer {secret}"}


def _app(tmp_path, **kw):
    return TestClient(create_app(tmp_path / "svc", ADMIN, ServiceOptions(**kw)), raise_server_exceptions=False)


def _uploaded_job(c, m: int, n: int, seed: int = 0, secondaries=("s",)) -> tuple[str, dict]:
    made = c.post("/jobs", json={"primary": "p", "secondaries": list(secondaries)}, headers=_auth(ADMIN)).json()
    rng = np.random.default_rng(seed)
    for party, rows in (("p", m), *((s, n) for s in secondaries)):
        r = c.put(
            f"/jobs/{made['job']}/parties/{party}/identifiers",
            content=to_npy(rng.uniform(0, 10, (rows, 2))),
            headers=_auth(made["secrets"][party]),
        )
        assert r.is_success, r.text
    return made["job"], made["secrets"]


def _state(c, job: str) -> dict:
    return c.get(f"/jobs/{job}", headers=_auth(ADMIN)).json()


def _until(c, job: str, states=("done", "failed")) -> dict:
    deadline = time.monotonic() + WAIT
    while (st := _state(c, job))["state"] not in states:
        assert time.monotonic() < deadline, st
        time.sleep(0.05)
    return st


# ----------------------------------------------------------------------------- K and cells


def test_k_and_a_jobs_cells_over_the_operators_limits_are_refused_by_name_before_it_is_queued(tmp_path):
    with _app(tmp_path, limits=Limits(max_k=8, max_cells=1000)) as c:
        job, keys = _uploaded_job(c, 100, 50, secondaries=("s", "t"))
        for body, words in (
            ({"k": 9}, "k=9 exceeds the service's limit of 8 neighbours per record (the operator's serve --max-k)"),
            ({"k": 2, "pool": 33}, "pool=33 exceeds the service's limit of 32 candidates"),
            (
                {"k": 2},  # under the default floor's noise the pool is 4 K: 100 x 8 x 2
                "the job is 1,600 cells (primary records x candidates x secondaries), more than the "
                "service's limit of 1,000 (the operator's serve --max-cells)",
            ),
        ):
            r = c.post(f"/jobs/{job}/start", json={"metric": "euclidean", **body}, headers=_auth(keys["p"]))
            assert r.status_code == 422 and words in r.json()["detail"], r.text
        assert _state(c, job)["state"] == "created"  # nothing was queued
        r = c.post(f"/jobs/{job}/start", json={"metric": "euclidean", "k": 1}, headers=_auth(keys["p"]))
        assert r.is_success, r.text  # 100 x 4 (the pool under noise) x 2 = 800 cells: under the limit
        assert _until(c, job)["state"] == "done"


def test_at_a_large_k_the_search_chunks_shrink_to_the_cell_bound_and_the_release_is_unchanged(tmp_path):
    rng = np.random.default_rng(3)
    query, base = rng.uniform(0, 10, (230, 2)), rng.uniform(0, 10, (90, 2))
    released = {}
    for name, limits in (("wide", Limits()), ("narrow", Limits(chunk_cells=1000))):
        store = JobStore(  # one secret for both; tau's noise with pool = K (no floor), as measured
            tmp_path / name, chunk_rows=100, limits=limits, operator_seed=3, floors=Floors("off")
        )
        job, _ = store.create("p", ["s"])
        store.upload(job, "p", to_npy(query))
        store.upload(job, "s", to_npy(base))
        store.start(job, JobParams.parse({"metric": "euclidean", "k": 40, "pool": 40, "tau": 0.9, "radius": 0.01}))
        store.run(job)
        meta = store.meta(job)
        assert meta["state"] == "done", meta["error"]
        chunks = sorted((tmp_path / name / "jobs" / job / "work" / "s").rglob("*.npz"))
        rows = [int(p.stem.split("-")[1]) - int(p.stem.split("-")[0]) for p in chunks]
        release = read_primary(tmp_path / name / "jobs" / job / "results" / "primary.npz").links["s"]
        released[name] = (rows, release.tokens, release.sims)
    assert max(released["wide"][0]) == 100 and len(released["wide"][0]) == 3
    assert max(released["narrow"][0]) == 25 and len(released["narrow"][0]) == 10  # 25 rows x 40 = 1000 cells
    for narrow, wide in zip(released["narrow"][1:], released["wide"][1:]):  # the release does not depend on the chunks
        np.testing.assert_array_equal(narrow, wide)


# ----------------------------------------------------------------------------- queries


def _composed_store(tmp_path, m: int, n: int) -> tuple[JobStore, str, np.ndarray]:
    rng = np.random.default_rng(7)
    query, base = rng.uniform(0, 10, (m, 2)), rng.uniform(0, 10, (n, 2))
    store = JobStore(tmp_path, chunk_rows=10_000, floors=Floors("off"))  # tau's noise with pool = K, no floor
    job, _ = store.create("p", ["s"])
    store.upload(job, "p", to_npy(query))
    store.upload(job, "s", to_npy(base))
    store.start(
        job, JobParams.parse({"metric": "euclidean", "k": 20, "pool": 20, "tau": 0.9, "radius": 0.01, "compose": True})
    )
    store.run(job)
    assert store.meta(job)["state"] == "done", store.meta(job)["error"]
    return store, job, base


def test_a_composed_jobs_query_does_not_load_the_release(tmp_path):
    store, job, base = _composed_store(tmp_path, 40_000, 2_000)
    queries, folder = Queries(store, QueryLimits()), tmp_path / "jobs" / job
    new = np.random.default_rng(8).uniform(0, 10, (3, 2))
    first = queries.answer(job, to_npy(new), None)[0]  # counts the release's links per row once
    release = read_primary(folder / "results" / "primary.npz")
    tracemalloc.start()
    again = queries.answer(job, to_npy(new), None)[0]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    tokens_bytes = release.links["s"].tokens.nbytes  # 40,000 x 20 int64: 6.4 MB, the sims 3.2 MB more
    assert peak < tokens_bytes / 4, (peak, tokens_bytes)
    assert again == first
    # the same answer as the in-process query over the whole release
    from linkage.job_secret import read_secret

    row_of_token = {"s": read_secondary(folder / "results" / "secondary-s.npz", "s").row_of_token}
    want = in_process_query(
        new, QueryJob({"s": base}, release, row_of_token, pool=20), secret=read_secret(folder / "secret.key")
    )
    got = read_primary(__import__("io").BytesIO(again))
    np.testing.assert_array_equal(got.links["s"].tokens, want.links["s"].tokens)
    np.testing.assert_array_equal(got.links["s"].sims, want.links["s"].sims)
    counts = folder / "query-counts" / "s.npy"
    assert counts.stat().st_mode & 0o777 == 0o600


def test_a_query_over_the_cells_cap_is_refused_before_its_search(tmp_path, monkeypatch):
    store, job, _ = _composed_store(tmp_path, 300, 100)
    searched = []
    monkeypatch.setattr("linkage_server.queries.query", lambda *a, **kw: searched.append(1))
    queries = Queries(store, QueryLimits(max_cells=100))  # K = 20: five records
    from linkage_server.params import JobError

    with pytest.raises(
        JobError,
        match=r"a query of 6 records is 120 cells \(records x candidates x secondaries\), more "
        r"than the service's cap of 100 per query \(serve --query-max-cells\)",
    ) as e:
        queries.answer(job, to_npy(np.zeros((6, 2))), None)
    assert e.value.status == 413 and not searched
    assert store.meta(job).get("queried", {}).get("records", 0) == 0  # nothing of the budget spent


# ----------------------------------------------------------------------------- bodies


def _service_rss(pid: int, field: str) -> int:
    return int(Path(f"/proc/{pid}/status").read_text().split(f"{field}:")[1].split()[0]) * 1024


def _service_pid(port: int) -> int:
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmd = p.read_bytes()
        except OSError:
            continue
        if b"linkage_server\x00serve" in cmd and f"\x00{port}\x00".encode() in cmd:
            return int(p.parent.name)
    raise AssertionError("no service process")


def test_an_upload_is_streamed_to_a_private_file_not_held_in_memory(tmp_path):
    port = free_port()
    body = to_npy(np.random.default_rng(0).uniform(0, 10, (5_000_000, 2)))  # 80 MB
    with local_service(tmp_path / "svc", port, ADMIN) as url:
        made = httpx.post(f"{url}/jobs", json={"primary": "p", "secondaries": ["s"]}, headers=_auth(ADMIN)).json()
        job, keys = made["job"], made["secrets"]
        put = f"{url}/jobs/{job}/parties/p/identifiers"
        assert httpx.put(put, content=to_npy(np.zeros((3, 2))), headers=_auth(keys["p"])).is_success  # warm
        pid = _service_pid(port)
        before = _service_rss(pid, "VmRSS")
        r = httpx.put(
            put,
            content=(body[i : i + (1 << 20)] for i in range(0, len(body), 1 << 20)),
            headers=_auth(keys["p"]),
            timeout=300,
        )
        assert r.is_success, r.text
        grew = _service_rss(pid, "VmHWM") - before
        # before: the body's chunks, their join, the parsed array and its validation: 5.2x the
        # body; now the file memory-mapped and the validation (np.unique's copies): 3.3x
        assert grew < 4 * len(body), grew / len(body)
        folder = tmp_path / "svc" / "jobs" / job
        assert (folder / "uploads" / "p.npy").read_bytes() == body
        assert (folder / "uploads" / "p.npy").stat().st_mode & 0o777 == 0o600
        assert not list((folder / "incoming").iterdir())  # the body was renamed into place
        r = httpx.put(put, content=b"x" * 100, headers=_auth(keys["p"]))
        assert r.status_code == 422 and not list((folder / "incoming").iterdir())  # a refused body is removed


def test_a_party_may_have_only_so_many_bodies_in_flight(tmp_path):
    release, sent = threading.Event(), []
    data = to_npy(np.random.default_rng(1).uniform(0, 10, (1000, 2)))

    def slow_body():
        yield data[:100]
        sent.append(1)
        release.wait(WAIT)
        yield data[100:]

    with local_service(tmp_path / "svc", free_port(), ADMIN, "--max-uploads-per-party", "2") as url:
        made = httpx.post(f"{url}/jobs", json={"primary": "p", "secondaries": ["s"]}, headers=_auth(ADMIN)).json()
        job, keys = made["job"], made["secrets"]
        put = f"{url}/jobs/{job}/parties/p/identifiers"
        results = []
        senders = [
            threading.Thread(
                target=lambda: results.append(
                    httpx.put(
                        put,
                        content=slow_body(),
                        headers=_auth(keys["p"]) | {"Content-Length": str(len(data))},
                        timeout=WAIT,
                    )
                )
            )
            for _ in range(2)
        ]
        try:
            for t in senders:
                t.start()
            incoming, deadline = tmp_path / "svc" / "jobs" / job / "incoming", time.monotonic() + WAIT
            while len(list(incoming.glob("*"))) < 2:  # both bodies are being received, each in its slot
                assert time.monotonic() < deadline, (sent, [r.status_code for r in results])
                time.sleep(0.05)
            third = httpx.put(put, content=data, headers=_auth(keys["p"]))
            assert third.status_code == 429, third.text
            assert "already has 2 uploads or queries in progress" in third.json()["detail"]
            assert "serve --max-uploads-per-party" in third.json()["detail"]
            other = httpx.put(f"{url}/jobs/{job}/parties/s/identifiers", content=data, headers=_auth(keys["s"]))
            assert other.is_success  # another party is not held up
        finally:
            release.set()
            for t in senders:
                t.join()
        assert [r.status_code for r in results] == [200, 200]
        assert httpx.put(put, content=data, headers=_auth(keys["p"])).is_success  # a slot is free again


# ----------------------------------------------------------------------------- cancel and the scheduler


class Held:
    """Holds the named jobs' search after their first chunk, until released (a test hook around
    job_run.chunked_search): a large job made slow by order, not by size."""

    def __init__(self, monkeypatch) -> None:
        self.jobs, self.reached, self.release = set(), threading.Event(), threading.Event()
        real = job_run.chunked_search

        def held(cache, query, search, chunks, tick, ray=""):
            def paused():
                tick()
                if any(job in str(cache) for job in self.jobs):
                    self.reached.set()
                    assert self.release.wait(WAIT)

            return real(cache, query, search, chunks, paused, ray)

        monkeypatch.setattr(job_run, "chunked_search", held)


def test_a_job_is_cancelled_by_its_primary_or_the_admin_queued_or_running(tmp_path, monkeypatch):
    hold = Held(monkeypatch)
    with _app(tmp_path, chunk_rows=10) as c:
        running, keys = _uploaded_job(c, 100, 30)
        queued, keys2 = _uploaded_job(c, 40, 30, seed=1)
        hold.jobs.add(running)
        assert c.post(
            f"/jobs/{running}/start", json={"metric": "euclidean", "k": 3}, headers=_auth(keys["p"])
        ).is_success
        assert hold.reached.wait(WAIT)  # the first job is running, held after its first chunk
        assert c.post(
            f"/jobs/{queued}/start", json={"metric": "euclidean", "k": 3}, headers=_auth(keys2["p"])
        ).is_success  # behind it, in its lane
        assert _state(c, queued)["state"] == "queued"

        r = c.post(f"/jobs/{running}/cancel", headers=_auth(keys["s"]))
        assert r.status_code == 403 and "primary party or the service's admin" in r.json()["detail"]
        r = c.post(f"/jobs/{running}/cancel", headers=_auth(keys["p"]))
        assert r.is_success and r.json()["state"] == "running"  # it stops at its next chunk
        r = c.post(f"/jobs/{queued}/cancel", headers=_auth(ADMIN))
        assert r.is_success and r.json()["state"] == "failed" and r.json()["error"] == "cancelled by the admin"

        hold.release.set()
        st = _until(c, running)
        assert st["state"] == "failed" and st["error"] == "cancelled by the primary"
        assert st["progress"]["done"] < st["progress"]["total"] == 10
        r = c.get(f"/jobs/{running}/parties/p/result", headers=_auth(keys["p"]))
        assert r.status_code == 409 and "cancelled by the primary" in r.json()["detail"]
        r = c.post(f"/jobs/{running}/cancel", headers=_auth(keys["p"]))
        assert r.status_code == 409 and "only a queued or running job can be cancelled" in r.json()["detail"]
        assert _state(c, queued)["progress"] == {"done": 0, "total": 0}  # the cancelled queued job never ran
        # a cancelled job can be started again, and runs to the end
        assert c.post(
            f"/jobs/{queued}/start", json={"metric": "euclidean", "k": 3}, headers=_auth(keys2["p"])
        ).is_success
        assert _until(c, queued)["state"] == "done"


def test_fedsim_cancel_cancels_through_the_service(tmp_path, monkeypatch, capsys):
    from fedsim.cli import main

    with _app(tmp_path) as c:
        job, keys = _uploaded_job(c, 20, 10)
        monkeypatch.setattr(
            "linkage_server.client.httpx.post",
            lambda url, headers, **kw: c.post(url.removeprefix("http://testserver"), headers=headers),
        )
        (tmp_path / "admin").write_text(ADMIN)
        (tmp_path / "p.secret").write_text(keys["p"])
        base = ["cancel", "--url", "http://testserver", "--job", job]
        assert main([*base, "--secret-file", str(tmp_path / "p.secret")]) == 1  # not started: nothing to cancel
        assert "job " + job + " is created: only a queued or running job can be cancelled" in capsys.readouterr().err
        c.app.state.worker.stop()  # no worker from here: a started job stays queued
        time.sleep(0.2)
        assert c.post(f"/jobs/{job}/start", json={"metric": "euclidean", "k": 2}, headers=_auth(keys["p"])).is_success
        assert main([*base, "--admin-token-file", str(tmp_path / "admin")]) == 0
        assert '"error": "cancelled by the admin"' in capsys.readouterr().out
        assert _state(c, job)["state"] == "failed"


def test_a_small_job_finishes_while_a_large_one_is_still_running(tmp_path, monkeypatch):
    hold = Held(monkeypatch)
    with _app(tmp_path, chunk_rows=10, limits=Limits(small_cells=500)) as c:
        large, keys = _uploaded_job(c, 100, 50)  # 100 x K=10: 1000 cells, the large lane
        small, keys2 = _uploaded_job(c, 10, 10, seed=1)  # 10 x K=10: 100 cells, the small lane
        hold.jobs.add(large)
        try:
            assert c.post(
                f"/jobs/{large}/start", json={"metric": "euclidean", "k": 10}, headers=_auth(keys["p"])
            ).is_success
            assert hold.reached.wait(WAIT)
            assert c.post(
                f"/jobs/{small}/start", json={"metric": "euclidean", "k": 10}, headers=_auth(keys2["p"])
            ).is_success
            assert _until(c, small)["state"] == "done"
            st = _state(c, large)
            assert st["state"] == "running" and st["progress"]["done"] < st["progress"]["total"]
        finally:
            hold.release.set()
        assert _until(c, large)["state"] == "done"
