"""The service's chunked search on Ray (linkage_server/chunk_search.py, issue 20): on a local Ray
it writes byte-identical results to the in-process path, resumes from its finished chunks, and a
job whose Ray worker is killed mid-search finishes, the same bytes (Ray runs the chunk again).
Every test stops the Ray it starts."""

from __future__ import annotations

import operator
import os
import signal
import threading
import time

import numpy as np
import pytest

from linkage_server import chunk_search
from linkage_server.jobs import JobParams, JobStore
from linkage_server.uploads import to_npy

RNG = np.random.default_rng(0)
QUERY, BASE = RNG.normal(size=(3000, 16)), RNG.normal(size=(4000, 16))  # 16-d: the matrix-product search


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield "local"
    ray.shutdown()


def job_bytes(
    root,
    ray: str,
    chunk_rows: int = 500,
    base: np.ndarray = BASE,
    query: np.ndarray = QUERY,
    params: JobParams = JobParams("euclidean", 10),
) -> tuple[JobStore, str, bytes]:
    store = JobStore(root, chunk_rows=chunk_rows, ray=ray)
    job, _ = store.create("p", ["s"])
    store.upload(job, "p", to_npy(query))
    store.upload(job, "s", to_npy(base))
    store.start(job, params)
    store.run(job)
    assert store.meta(job)["state"] == "done", store.meta(job)["error"]
    return store, job, (root / "jobs" / job / "results" / "primary.npz").read_bytes()


def neighbours(root, job) -> bytes:
    """The search's output (the release's tokens come from each job's own secret)."""
    chunks = sorted((root / "jobs" / job / "work" / "s").glob("*/*.npz"), key=lambda p: int(p.stem.split("-")[0]))
    return b"".join(p.read_bytes() for p in chunks)


def test_ray_equals_the_local_path_and_resumes_from_finished_chunks(local_ray, tmp_path):
    q2, b2 = QUERY[:, :2], BASE[:, :2]  # 2-d: the k-d tree, built once and shared through the object store
    _, local_job, _ = job_bytes(tmp_path / "local2", "", query=q2, base=b2)
    _, job, _ = job_bytes(tmp_path / "ray2", local_ray, query=q2, base=b2)
    assert neighbours(tmp_path / "ray2", job) == neighbours(tmp_path / "local2", local_job)
    _, local_job, _ = job_bytes(tmp_path / "local", "")
    store, job, _ = job_bytes(tmp_path / "ray", local_ray)
    assert neighbours(tmp_path / "ray", job) == neighbours(tmp_path / "local", local_job)  # byte-identical chunks
    work = sorted((tmp_path / "ray" / "jobs" / job / "work" / "s").glob("*/*.npz"))
    assert len(work) == 6
    stamps = {p: p.stat().st_mtime_ns for p in work}
    for p in work[2:]:  # a crash after 2 of 6 chunks
        p.unlink()
    before = neighbours(tmp_path / "local", local_job)
    store.update(job, state="running")
    JobStore(tmp_path / "ray", chunk_rows=500, ray=local_ray).run(job)
    assert neighbours(tmp_path / "ray", job) == before
    assert all(p.stat().st_mtime_ns == stamps[p] for p in work[:2])  # finished chunks were not searched again


def strings(rng, n: int) -> np.ndarray:
    words = np.array(["north", "south", "park", "hill", "road", "bay", "view", "lake", "st", "old", "new", "mill"])
    return np.array([" ".join(rng.choice(words, 3)) + f" {i % 97}" for i in range(n)])


def approximate_cases() -> list:
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 256, size=(2500, 32), dtype=np.uint8)  # 256-bit filters
    return [
        (QUERY, BASE, JobParams("euclidean", 10, search="hnsw")),
        (QUERY, BASE, JobParams("euclidean", 10, search="ivf", width=2)),
        (bits[:1500], bits[1500:], JobParams("hamming", 10, search="ivf", width=2)),
        (bits[:1500], bits[1500:], JobParams("hamming", 10, search="hnsw")),
        (strings(rng, 1200), strings(rng, 900), JobParams("jaro_winkler", 5, search="qgram")),
    ]


class OnlyOnRay:
    """A search that refuses to run in the service's process and unpickles (in Ray's workers) as
    the real one: a job that searched its chunks here instead of on Ray fails."""

    def __init__(self, find) -> None:
        self.find = find

    def __call__(self, q):
        raise AssertionError("a chunk was searched in the service's process, not on Ray")

    def __reduce__(self):
        return operator.itemgetter(0), ((self.find,),)


def test_an_approximate_search_on_ray_equals_the_local_path(local_ray, tmp_path, monkeypatch):
    """The index (faiss's float and binary ones, the q-gram one) is built once here and pickled
    into Ray's object store; Ray's workers search every chunk, and their bytes are the local path's."""
    for i, (query, base, params) in enumerate(approximate_cases()):
        _, local_job, _ = job_bytes(tmp_path / f"local{i}", "", query=query, base=base, params=params)
        with monkeypatch.context() as m:
            real = chunk_search.PartySearch.build
            m.setattr(chunk_search.PartySearch, "build", lambda self: OnlyOnRay(real(self)))
            _, job, _ = job_bytes(tmp_path / f"ray{i}", local_ray, query=query, base=base, params=params)
        assert neighbours(tmp_path / f"ray{i}", job) == neighbours(tmp_path / f"local{i}", local_job), params


def stall_first_call(find, marker: str):
    """The search, except that its first call (in whichever Ray worker runs it) writes that worker's
    pid to ``marker`` and hangs: a worker caught mid-chunk whatever the machine's load. A closure,
    so Ray's cloudpickle carries it by value (the tests folder is not on the workers' path)."""

    def search(q):
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:  # the marker is there: the retry (or any later chunk) searches
            return find(q)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        time.sleep(600)  # killed long before: the test waits at most 120 s for the marker

    return search


def test_a_job_whose_ray_worker_is_killed_finishes_with_the_same_result(local_ray, tmp_path, monkeypatch):
    _, local_job, _ = job_bytes(tmp_path / "local", "", chunk_rows=500)
    marker, killed = tmp_path / "busy-worker.pid", []

    def kill_the_busy_worker() -> None:
        deadline = time.monotonic() + 120  # Ray starting workers on a loaded 2-core machine: seconds
        while not killed and time.monotonic() < deadline:
            text = marker.read_text() if marker.exists() else ""
            if text:
                os.kill(int(text), signal.SIGKILL)
                killed.append(int(text))
            time.sleep(0.01)

    killer = threading.Thread(target=kill_the_busy_worker)
    killer.start()
    real = chunk_search.PartySearch.build
    monkeypatch.setattr(chunk_search.PartySearch, "build", lambda self: stall_first_call(real(self), str(marker)))
    _, job, _ = job_bytes(tmp_path / "ray", local_ray, chunk_rows=500)
    killer.join()
    assert killed, "the stalled chunk's worker never wrote its pid"
    assert neighbours(tmp_path / "ray", job) == neighbours(tmp_path / "local", local_job)
