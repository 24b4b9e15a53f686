"""The linkage service over loopback: a real `python -m linkage_server serve` process.

Register, upload, link, download; restart the process and download the same bytes; refusals of
wrong secrets, other parties' results and bad uploads; the result equals the in-process pipeline.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest

from linkage.job_secret import read_secret
from linkage.pipeline import link
from linkage.protection import defences_from
from linkage.store import load_primary, load_secondary
from linkage_server.client import LinkageClient, ServiceError, create_job
from linkage_server.floors import Floors
from linkage_server.jobs import JobError, JobParams, JobStore
from linkage_server.local import free_port, local_service
from linkage_server.uploads import to_npy

ADMIN = "admin-token-for-tests-0123456789"


@contextlib.contextmanager
def service(data_dir: Path, port: int, *extra: str, floor: str = "off"):
    """A `serve` process; its operator's privacy floor ``floor``: "off" by default here, so that
    these tests of the service's mechanics compare exact releases (tests/test_privacy_floors.py
    and test_service_query's floor tests run at the product's default, "standard")."""
    with local_service(data_dir, port, ADMIN, "--privacy-floor", floor, *extra) as url:
        yield url


def planted(m=300, n=120, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.uniform(0, 10, size=(n, 2))
    query = np.concatenate([base[rng.permutation(n)] + rng.normal(0, 0.01, (n, 2)), rng.uniform(0, 10, (m - n, 2))])
    return query, base


def test_service_round_trip_restart_and_refusals(tmp_path):
    query, base = planted()
    train = np.arange(0, 300, 2)
    data, port = tmp_path / "svc", free_port()
    with service(data, port, "--max-upload-mb", "0.05", "--chunk-rows", "64") as url:
        with pytest.raises(ServiceError, match="admin token"):
            create_job(url, "not-the-admin-token-xxxxxxxx", "p", ["s"])
        made = create_job(url, ADMIN, "p", ["s"])
        job, keys = made["job"], made["secrets"]
        prim = LinkageClient(url, job, "p", keys["p"])
        sec = LinkageClient(url, job, "s", keys["s"])

        # bad uploads: each refused with a message naming the problem, nothing stored
        with pytest.raises(ServiceError, match="malformed upload"):
            _put(prim, job, "p", b"not numpy")
        with pytest.raises(ServiceError, match="NaN"):
            prim.upload(np.array([[1.0, np.nan], [0.0, 0.0]]))
        with pytest.raises(ServiceError, match="exceeds the service's cap") as big:
            prim.upload(np.zeros((10_000, 2)))
        assert big.value.status == 413
        with pytest.raises(ServiceError, match="2-D"):
            prim.upload(np.zeros(5))
        with pytest.raises(ServiceError, match="wrong secret for party 'p'"):
            LinkageClient(url, job, "p", keys["s"]).upload(query)
        with pytest.raises(ServiceError, match="unknown party 'x'"):
            LinkageClient(url, job, "x", keys["s"]).upload(query)
        with pytest.raises(ServiceError, match="waiting for uploads from \\['p', 's'\\]"):
            prim.start(JobParams("euclidean", 5))
        assert prim.status()["uploads"] == {}  # the refused uploads left nothing behind

        prim.upload(query)
        prim.upload_train_rows(train)
        sec.upload(base)
        with pytest.raises(ServiceError, match="wrong secret for party 'p'"):
            sec.start(JobParams("euclidean", 5))  # only the primary starts
        with pytest.raises(ServiceError, match=r"K=500 must be between 1 and the size of party 's' \(120 rows\)"):
            prim.start(JobParams("euclidean", 500))
        with pytest.raises(ServiceError, match="needs bits identifiers"):
            prim.start(JobParams("hamming", 5))
        prim.start(JobParams("euclidean", 5, tau=0.9))
        st = prim.wait(timeout=60)
        assert st["progress"] == {"done": 5, "total": 5} and st["stats"]["s"]["sigma"] > 0
        with pytest.raises(ServiceError, match="uploads are closed"):
            sec.upload(base)
        first = tmp_path / "first"
        prim.fetch(first)
        sec.fetch(first)
        with pytest.raises(ServiceError, match="wrong secret for party 'p'"):
            LinkageClient(url, job, "p", keys["s"]).fetch(tmp_path / "stolen")  # s reading p's result
        with pytest.raises(ServiceError, match="wrong secret for party 's'"):
            LinkageClient(url, job, "s", keys["p"]).fetch(tmp_path / "stolen")  # p reading s's row map
        assert not (tmp_path / "stolen").exists()

    with service(data, port) as url:  # a new process on the same folder
        again = tmp_path / "again"
        LinkageClient(url, job, "p", keys["p"]).fetch(again)
        LinkageClient(url, job, "s", keys["s"]).fetch(again)
        for name in ("primary.npz", "secondary-s.npz"):
            assert (again / name).read_bytes() == (first / name).read_bytes()

    # the oracle: the service's result is the in-process pipeline's, bit for bit
    secret = read_secret(data / "jobs" / job / "secret.key")  # the operator's view of the job's randomness
    recorded = json.loads((data / "jobs" / job / "job.json").read_text())["defences"]  # tau's radius: from the data
    want = link(
        query, {"s": base}, k=5, tau=0.9, secret=secret, train_rows=train, job_id=job, defences=defences_from(recorded)
    )
    got = load_primary(first)
    np.testing.assert_array_equal(got.tokens["s"], want.primary.tokens["s"])
    np.testing.assert_array_equal(got.sims, want.primary.sims)
    np.testing.assert_array_equal(load_secondary(first, "s").row_of_token, want.secondaries["s"].row_of_token)


def _put(client: LinkageClient, job: str, party: str, data: bytes):
    from linkage_server.client import _check

    return _check(client._http.put(f"/jobs/{job}/parties/{party}/identifiers", content=data))


def test_an_interrupted_job_resumes_from_its_finished_chunks(tmp_path):
    query, base = planted(m=250)
    store = JobStore(tmp_path, chunk_rows=50)
    job, _ = store.create("p", ["s"])
    store.upload(job, "p", to_npy(query))
    store.upload(job, "s", to_npy(base))
    store.start(job, JobParams("euclidean", 4))
    store.run(job)
    done = (tmp_path / "jobs" / job / "results" / "primary.npz").read_bytes()
    # simulate a crash after 3 of 5 chunks: drop the results and two chunks, leave the job 'running'
    work = sorted((tmp_path / "jobs" / job / "work" / "s").glob("*/*.npz"), key=lambda p: int(p.stem.split("-")[0]))
    assert len(work) == 5  # work/s/<cache key>/<lo>-<hi>.npz
    stamps = {p: p.stat().st_mtime_ns for p in work}
    for p in work[3:]:
        p.unlink()
    (tmp_path / "jobs" / job / "results" / "primary.npz").unlink()
    store.update(job, state="running")
    restarted = JobStore(tmp_path, chunk_rows=50)
    assert restarted.pending() == [job]
    restarted.run(job)
    assert restarted.meta(job)["state"] == "done"
    assert (tmp_path / "jobs" / job / "results" / "primary.npz").read_bytes() == done
    assert all(p.stat().st_mtime_ns == stamps[p] for p in work[:3])  # finished chunks were not recomputed


def test_a_failing_job_reports_why_and_can_be_restarted(tmp_path):
    query, base = planted()
    store = JobStore(tmp_path, floors=Floors("off"))  # it restarts as an exact release
    job, _ = store.create("p", ["s"])
    store.upload(job, "p", to_npy(query))
    store.upload(job, "s", to_npy(base))
    store.start(job, JobParams("euclidean", 4, tau=0.01))  # unreachable on this data (Theorem 2's floor)
    store.run(job)
    meta = store.meta(job)
    assert meta["state"] == "failed" and "unreachable" in meta["error"]
    store.start(job, JobParams("euclidean", 4, tau=1.0))
    store.run(job)
    assert store.meta(job)["state"] == "done"


def test_fedsim_trains_from_the_services_output(tmp_path, monkeypatch):
    """Upload a dataset's identifiers through the service, fetch, train from the files: the
    losses and final weights equal a run that links in-process (to 1e-5, as the twin oracles).
    Both linkers draw their noise from the same operator seed (the operator runs both)."""
    monkeypatch.setenv("FEDSIM_LINKAGE_OPERATOR_SEED", "5")
    from app.config import RunConfig
    from app.data import load_data
    from app.vfl.inprocess import max_param_gap, run_in_process

    base_cfg = RunConfig.of(
        dataset="synthetic",
        n_rows=600,
        epochs=1,
        max_steps=6,
        steps_per_exchange=2,
        out_dir=str(tmp_path / "runs"),
        tau=0.9,
    )
    ds, settings = load_data(base_cfg), base_cfg.resolve()
    ((party, table),) = ds.secondaries.items()
    fetched = tmp_path / "fetched"
    with service(tmp_path / "svc", free_port(), "--operator-seed", "5", floor="standard") as url:  # both defaults
        made = create_job(url, ADMIN, "primary", [party])
        with (
            LinkageClient(url, made["job"], "primary", made["secrets"]["primary"]) as p,
            LinkageClient(url, made["job"], party, made["secrets"][party]) as s,
        ):
            p.upload(ds.primary.identifiers)
            p.upload_train_rows(ds.split.train)
            s.upload(table.identifiers)
            p.start(JobParams("euclidean", settings.k, tau=0.9))
            p.wait(timeout=60)
            p.fetch(fetched)
            s.fetch(fetched)
            assert list(s.status()["privacy"]["parties"]) == [party]  # a secondary learns what attacks on it learn

    from app.vfl.linking import link_and_report
    from linkage.store import load_privacy

    # the service's privacy report (scored with the uploads) is the in-process linker's, fetched beside the job
    report = load_privacy(fetched, load_primary(fetched).job_id)
    assert report == json.loads(json.dumps(link_and_report(ds, base_cfg, settings)[1])) | {"job_id": report["job_id"]}
    assert report["parties"][party]["sigma"] > 0

    from_service = run_in_process(base_cfg.replace(linkage_dir=str(fetched)))
    in_process = run_in_process(base_cfg)
    # the same tolerance as the twin oracles: CPU scatter-adds do not sum in a fixed order
    np.testing.assert_allclose(from_service.losses, in_process.losses, rtol=0, atol=1e-5)
    assert max_param_gap(from_service.primary, in_process.primary) < 1e-5

    with pytest.raises(Exception, match="has K=.* but this run uses k=7"):
        run_in_process(base_cfg.replace(linkage_dir=str(fetched), k=7))


def test_a_chain_job_equals_the_in_process_chain_linkage(tmp_path):
    """Paper App. C through the job store: secondaries b, c chained one-to-one to anchor a."""
    from linkage.pipeline import link_chain

    query, base = planted(m=120, n=60)
    rng = np.random.default_rng(5)
    ids = {"a": base, "b": base[rng.permutation(60)], "c": base[rng.permutation(60)] + 1e-6}
    store = JobStore(tmp_path, chunk_rows=50, floors=Floors("off"))  # at the default: tests/test_job_spec.py
    job, _ = store.create("p", sorted(ids))
    store.upload(job, "p", to_npy(query))
    for party, x in ids.items():
        store.upload(job, party, to_npy(x))
    store.start(job, JobParams("euclidean", 4, layout="chain"))
    store.run(job)
    assert store.meta(job)["state"] == "done", store.meta(job).get("error")
    got = load_primary(tmp_path / "jobs" / job / "results")
    want = link_chain(
        query, ids, anchor="a", k=4, tau=1.0, secret=read_secret(tmp_path / "jobs" / job / "secret.key"), job_id=job
    )
    assert got.layout == "chain"
    for party in ids:
        np.testing.assert_array_equal(got.tokens[party], want.primary.tokens[party])
        np.testing.assert_array_equal(
            load_secondary(tmp_path / "jobs" / job / "results", party).row_of_token,
            want.secondaries[party].row_of_token,
        )
    np.testing.assert_array_equal(got.sims, want.primary.sims)
    with pytest.raises(JobError, match="layout must be"):
        JobParams.parse({"metric": "euclidean", "k": 3, "layout": "ring"})


def test_waiting_on_a_killed_service_fails_clearly_within_the_timeout(tmp_path):
    import time

    port = free_port()
    with service(tmp_path / "data", port) as url:
        keys = create_job(url, ADMIN, "p", ["s"])
        job = keys["job"]
        prim = LinkageClient(url, job, "p", keys["secrets"]["p"])
    import socket

    held = socket.socket()  # the port held, not listening: another worker's service cannot take it
    held.bind(("127.0.0.1", port))  # (one did, once, and answered "unknown job")
    t0 = time.monotonic()  # the service process has been stopped here
    with held, pytest.raises(ServiceError, match=f"linkage service at .* unreachable while waiting for job {job}"):
        prim.wait(timeout=2.0)
    assert time.monotonic() - t0 < 10
