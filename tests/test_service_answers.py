"""What a party's client accepts of the linkage service's answers: a broken or hostile service (or
a proxy in front of it) gets its answer refused, naming what was wrong, and never replaces a
party's previous good result. Before, a fetch wrote any body as the party's primary.npz and said
"fetched" (exit 0), a query wrote its body to --out before reading it, and an answer without a
field the client reads crashed the command with a Python traceback."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from linkage.contracts import PartyLink, PrimaryLinkage, SecondaryLinkage
from linkage.store import npz_bytes, primary_bytes, secondary_bytes
from linkage_server.client import LinkageClient, ServiceError

GOOD = PrimaryLinkage(
    "job1", 2, 0.5, {"s": PartyLink(np.arange(6).reshape(3, 2), np.ones((3, 2), np.float32), 1.0, 0.0, 1.0)}
)
META = {
    "job_id": "job1",
    "k": 2,
    "tau": 0.5,
    "parties": ["s"],
    "stats": {"s": {"sigma": 1.0, "sim_mean": 0.0, "sim_std": 1.0}},
}


def _client(routes: dict) -> LinkageClient:
    """A client whose service answers ``routes``: {(method, path suffix): (status, headers, body)}."""

    def answer(request: httpx.Request) -> httpx.Response:
        for (method, suffix), (status, headers, body) in routes.items():
            if request.method == method and request.url.path.endswith(suffix):
                return httpx.Response(status, headers=headers, content=body)
        return httpx.Response(404, json={"detail": "no such route"})

    client = LinkageClient("http://service", "job1", "p", "secret")
    client._http = httpx.Client(base_url="http://service", transport=httpx.MockTransport(answer))
    return client


def _status(**fields) -> tuple:
    return 200, {"content-type": "application/json"}, json.dumps(fields).encode()


BAD_RESULTS = {
    "an HTML page": b"<html>502 bad gateway</html>",
    "another job's result": npz_bytes(
        meta=json.dumps({**META, "job_id": "other"}),
        tokens__s=np.zeros((3, 2), np.int64),
        sims__s=np.zeros((3, 2), np.float32),
    ),
    "float tokens and 1-D similarities": npz_bytes(
        meta=json.dumps(META), tokens__s=np.full((3, 2), 1e300), sims__s=np.zeros(7)
    ),
    "a stray member only": npz_bytes(junk=np.zeros(10)),
    "K other than the job's": npz_bytes(
        meta=json.dumps(META), tokens__s=np.zeros((3, 5), np.int64), sims__s=np.zeros((3, 5), np.float32)
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_RESULTS))
def test_a_fetched_result_that_is_not_this_jobs_linkage_is_refused_and_the_previous_one_kept(case, tmp_path):
    (tmp_path / "primary.npz").write_bytes(primary_bytes(GOOD))
    client = _client(
        {("GET", "/jobs/job1"): _status(role="primary", state="done"), ("GET", "/result"): (200, {}, BAD_RESULTS[case])}
    )
    with pytest.raises(ServiceError, match="the linkage service's answer"):
        client.fetch(tmp_path)
    assert (tmp_path / "primary.npz").read_bytes() == primary_bytes(GOOD)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["primary.npz"]  # no partial file left


def test_a_secondarys_fetched_map_of_another_job_or_party_is_refused(tmp_path):
    other = secondary_bytes(SecondaryLinkage("other", "p", np.arange(4)))
    client = _client(
        {("GET", "/jobs/job1"): _status(role="secondary", state="done"), ("GET", "/result"): (200, {}, other)}
    )
    with pytest.raises(ServiceError, match="the linkage service's answer"):
        client.fetch(tmp_path)
    assert not (tmp_path / "secondary-p.npz").exists()


def test_an_honest_fetch_writes_the_result(tmp_path):
    client = _client(
        {
            ("GET", "/jobs/job1"): _status(role="primary", state="done"),
            ("GET", "/result"): (200, {}, primary_bytes(GOOD)),
        }
    )
    assert client.fetch(tmp_path).read_bytes() == primary_bytes(GOOD)


@pytest.mark.parametrize("status", [{"state": "done"}, {"role": "admin", "state": "done"}, ["a", "list"]])
def test_a_status_without_the_role_or_state_the_client_reads_is_refused_by_name(status, tmp_path):
    body = (200, {"content-type": "application/json"}, json.dumps(status).encode())
    client = _client({("GET", "/jobs/job1"): body, ("GET", "/result"): (200, {}, primary_bytes(GOOD))})
    with pytest.raises(ServiceError, match="the linkage service's answer"):
        client.fetch(tmp_path)
    if isinstance(status, dict) and "state" in status:
        return
    with pytest.raises(ServiceError, match="the linkage service's answer"):
        client.wait(timeout=1)


BUDGET = {"x-query-budget": "100", "x-query-cells-left": "50"}


@pytest.mark.parametrize("case", ["not an npz", "no budget headers"])
def test_a_query_answer_that_cannot_be_read_is_refused_and_the_previous_answer_kept(case, tmp_path):
    out = tmp_path / "answer.npz"
    out.write_bytes(primary_bytes(GOOD))
    body, headers = (b"<html>proxy error</html>", BUDGET) if case == "not an npz" else (primary_bytes(GOOD), {})
    client = _client({("POST", "/query"): (200, headers, body)})
    with pytest.raises(ServiceError, match="the linkage service's answer"):
        client.query(np.zeros((2, 2)), out=out)
    assert out.read_bytes() == primary_bytes(GOOD)


def test_a_service_trickling_its_status_cannot_hold_wait_past_its_timeout():
    """httpx's timeout is per read: one byte every 0.5 s under a 1 s read timeout held wait(2 s)
    for the whole body (27 s here; days at the command's 600 s). The bound: the wait's timeout,
    plus one read timeout, plus a margin of 2 s for a loaded machine."""
    import socket
    import threading
    import time

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    body = b'{"role": "primary", "state": "running", "progress": {}}'

    def trickle() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                try:
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                    )
                    for byte in body:
                        conn.sendall(bytes([byte]))
                        time.sleep(0.5)
                except OSError:
                    pass

    threading.Thread(target=trickle, daemon=True).start()
    t0 = time.monotonic()
    try:
        with LinkageClient(f"http://127.0.0.1:{server.getsockname()[1]}", "job1", "p", "s", timeout=1.0) as client:
            with pytest.raises(TimeoutError, match="job job1"):
                client.wait(timeout=2.0, poll=0.1)
    finally:
        server.close()
    assert time.monotonic() - t0 < 2.0 + 1.0 + 2.0


QUERY_BAD = {
    **{k: v for k, v in BAD_RESULTS.items() if k != "an HTML page"},
    "non-finite similarities": npz_bytes(
        meta=json.dumps(META), tokens__s=np.zeros((3, 2), np.int64), sims__s=np.full((3, 2), np.nan, np.float32)
    ),
    "other records than queried": primary_bytes(GOOD),  # 3 rows for the 5 records asked
}


@pytest.mark.parametrize("case", sorted(QUERY_BAD))
def test_a_query_answer_that_is_not_a_linkage_of_the_queried_records_is_refused(case, tmp_path):
    """The client checked a query's answer for its job only: float tokens, NaN similarities, another
    K or a row count other than the records queried went to predict (and to --out)."""
    out = tmp_path / "answer.npz"
    out.write_bytes(primary_bytes(GOOD))
    client = _client({("POST", "/query"): (200, BUDGET, QUERY_BAD[case])})
    with pytest.raises(ServiceError, match="the linkage service's answer"):
        client.query(np.zeros((5, 2)), out=out)
    assert out.read_bytes() == primary_bytes(GOOD)


def test_an_honest_query_answer_is_taken():
    client = _client({("POST", "/query"): (200, BUDGET, primary_bytes(GOOD))})
    assert client.query(np.zeros((3, 2))).job_id == "job1" and client.query_budget == {"budget": 100, "left": 50}
