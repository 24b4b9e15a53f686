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
from pathlib import Path

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
    store._update(job, state="running")
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
            real = chunk_search._searcher
            m.setattr(chunk_search, "_searcher", lambda *a: OnlyOnRay(real(*a)))
            _, job, _ = job_bytes(tmp_path / f"ray{i}", local_ray, query=query, base=base, params=params)
        assert neighbours(tmp_path / f"ray{i}", job) == neighbours(tmp_path / f"local{i}", local_job), params


def busy_workers() -> list[int]:
    """PIDs of Ray workers running a chunk (Ray titles a busy worker after its task)."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if b"_search_chunk" in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:  # gone meanwhile
            continue
    return pids


def test_a_job_whose_ray_worker_is_killed_finishes_with_the_same_result(local_ray, tmp_path):
    big = RNG.normal(size=(40_000, 16))  # ~30 ms a chunk: a window to catch a worker busy
    _, local_job, _ = job_bytes(tmp_path / "local", "", chunk_rows=100, base=big)
    killed = []

    def kill_a_busy_worker() -> None:
        deadline = time.monotonic() + 60
        while not killed and time.monotonic() < deadline:
            for pid in busy_workers()[:1]:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.005)

    killer = threading.Thread(target=kill_a_busy_worker)
    killer.start()
    _, job, _ = job_bytes(tmp_path / "ray", local_ray, chunk_rows=100, base=big)
    killer.join()
    assert killed, "no busy Ray worker was seen to kill"
    assert neighbours(tmp_path / "ray", job) == neighbours(tmp_path / "local", local_job)
