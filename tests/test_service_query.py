"""The service's query endpoint (predict, issue 15): ``POST /jobs/{job}/query`` on a real
`python -m linkage_server serve` process.

Oracle: the job's own training records, queried, get the job's release byte for byte (a
predicted record tells the primary no more than a training record did), and new records get
linkage.query.query's answer under the job's secret (a chain's: its anchor's). Refusals by name: a job
not finished, a secondary's secret or the admin token, another kind or width, NaN, the per-query
cap and the job's budget (kept across a restart), and Bloom queries whose key or parameters
differ from the training upload's, or cannot be checked.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from linkage.encode import bloom_strings, key_fingerprint
from linkage.errors import LinkageError
from linkage.job_secret import read_secret
from linkage.query import QueryJob, query
from linkage.store import load_primary, load_secondary, read_primary
from linkage_server.client import LinkageClient, ServiceError, create_job
from linkage_server.local import free_port
from linkage_server.params import JobParams
from linkage_server.uploads import to_npy
from tests.test_service import ADMIN, planted, service
from tests.test_service_cli import TITLES, cli

KEYS: dict[str, dict[str, str]] = {}  # job -> its parties' secrets


def _job(url, secondaries=("a", "b")) -> tuple[str, LinkageClient, dict[str, LinkageClient]]:
    made = create_job(url, ADMIN, "p", list(secondaries))
    job, keys = made["job"], made["secrets"]
    KEYS[job] = keys
    return job, LinkageClient(url, job, "p", keys["p"]), {s: LinkageClient(url, job, s, keys[s]) for s in secondaries}


def _linked(url, prim_ids, bases: dict, **params) -> tuple[str, LinkageClient, dict[str, LinkageClient]]:
    job, prim, secs = _job(url, tuple(bases))
    prim.upload(prim_ids)
    for party, ids in bases.items():
        secs[party].upload(ids)
    prim.start(JobParams("euclidean", **params))
    prim.wait(timeout=60)
    return job, prim, secs


def test_a_query_of_the_training_records_is_the_jobs_release_and_new_records_the_in_process_query(tmp_path):
    primary, base_a = planted(m=200, n=80, seed=0)
    _, base_b = planted(m=200, n=60, seed=1)
    bases = {"a": base_a, "b": base_b}
    data = tmp_path / "svc"
    with service(data, free_port()) as url:
        job, prim, secs = _job(url)
        prim.upload(primary)
        prim.upload_train_rows(np.arange(0, 200, 2))
        for party, ids in bases.items():
            secs[party].upload(ids)
        prim.start(JobParams("euclidean", 4, tau=0.9, pool=9))
        prim.wait(timeout=60)
        prim.fetch(tmp_path / "trained")
        for s in secs.values():
            s.fetch(tmp_path / "trained")
        got = prim.query(primary, out=tmp_path / "again.npz")
        new = np.random.default_rng(7).uniform(0, 10, (25, 2))
        answered = prim.query(new, out=tmp_path / "new.npz")
        assert prim.query_budget == {"budget": 1_000_000, "left": 1_000_000 - 225 * 4 * 2}  # records x K x parties
        assert prim.status()["queried"] == {"records": 225, "queries": 2, "cells": 1800}
    released = load_primary(tmp_path / "trained")
    assert released.links["a"].sigma > 0  # the noise is on
    # the training records, asked again: the release itself, noise, statistics and digest included
    assert (tmp_path / "again.npz").read_bytes() == (tmp_path / "trained" / "primary.npz").read_bytes()
    assert all(np.array_equal(got.links[p].sims, released.links[p].sims) for p in bases)
    # new records: linkage.query.query in process, under the job's secret, maps and pool
    maps = {p: load_secondary(tmp_path / "trained", p).row_of_token for p in bases}
    want = query(new, QueryJob(bases, released, maps, pool=9), secret=read_secret(data / "jobs" / job / "secret.key"))
    assert read_primary(tmp_path / "new.npz").job_id == job
    for party in bases:
        np.testing.assert_array_equal(answered.links[party].tokens, want.links[party].tokens)
        np.testing.assert_array_equal(answered.links[party].sims, want.links[party].sims)
        assert answered.links[party].sim_mean == released.links[party].sim_mean  # the job's statistics
        assert answered.links[party].sigma == released.links[party].sigma


def test_queries_are_refused_by_name(tmp_path):
    primary, base = planted(m=60, n=40)
    data, port = tmp_path / "svc", free_port()
    with service(data, port, "--query-budget", "30", "--query-max-records", "6") as url:  # cells: records x K x parties
        job, prim, secs = _job(url, ("s",))
        prim.upload(primary)
        secs["s"].upload(base)
        with pytest.raises(ServiceError, match="is created: only a finished \\(done\\) job answers queries") as e:
            prim.query(primary[:2])
        assert e.value.status == 409
        prim.start(JobParams("euclidean", 3))
        prim.wait(timeout=60)
        with pytest.raises(ServiceError, match="only the job's primary party may query it; this is a secondary"):
            LinkageClient(url, job, "p", KEYS[job]["s"]).query(primary[:2])
        with pytest.raises(ServiceError, match="only the job's primary party may query it; this is the admin"):
            LinkageClient(url, job, "p", ADMIN).query(primary[:2])
        refusals = {
            "width differs: the query has 3 identifier dimensions, the job's training upload has 2": np.zeros((2, 3)),
            "1 identifier row\\(s\\) are NaN/inf": np.array([[1.0, np.nan], [1.0, 2.0]]),
            "the query holds strings identifiers": np.array(["x", "y"]),
            "a query of 7 records exceeds the service's cap of 6 records per query": primary[:7],
        }
        for message, ids in refusals.items():
            with pytest.raises(ServiceError, match=message):
                prim.query(ids)
        with pytest.raises(ServiceError, match="X-Encoding-Fingerprint header must be 64 lowercase hex"):
            _refusal(prim, job, primary[:2], {"X-Encoding-Fingerprint": "zz"})
        prim.query(primary[:6])
        assert prim.query_budget == {"budget": 30, "left": 12}  # K = 3: 6 records are 18 cells
        with pytest.raises(
            ServiceError,
            match=r"a query of 5 records \(15 cells, records x K x secondaries\) exceeds job .* query "
            "budget: 18 of 30 cells used, 12 left",
        ) as e:
            prim.query(primary[:5])
        assert e.value.status == 429
        assert prim.status()["queried"] == {"records": 6, "queries": 1, "cells": 18}  # refused ones not counted
    with service(data, port, "--query-budget", "30", "--query-max-records", "6") as url:  # a restart
        prim = LinkageClient(url, job, "p", KEYS[job]["p"])
        with pytest.raises(ServiceError, match="18 of 30 cells used, 12 left"):
            prim.query(primary[:5])
        prim.query(primary[:4])
        with pytest.raises(ServiceError, match="30 of 30 cells used, 0 left"):
            prim.query(primary[:1])


def _refusal(client: LinkageClient, job: str, ids, headers: dict):
    from linkage_server.client import _check

    return _check(client._http.post(f"/jobs/{job}/query", content=to_npy(ids), headers=headers))


def test_a_chain_job_answers_its_training_records_with_its_release_whatever_its_anchor(tmp_path):
    """A chain (paper App. C) searches only its anchor, here "b" (not the first by name), and
    hands every party the anchor's link: its training records, queried, are its release byte for
    byte, and new records the in-process query of that anchor."""
    primary, base_a = planted(m=120, n=50, seed=2)
    _, base_b = planted(m=120, n=40, seed=3)
    bases = {"a": base_a, "b": base_b}
    data = tmp_path / "svc"
    with service(data, free_port()) as url:
        job, prim, secs = _linked(url, primary, bases, k=3, layout="chain", anchor="b")
        prim.fetch(tmp_path / "trained")
        for s in secs.values():
            s.fetch(tmp_path / "trained")
        prim.query(primary, out=tmp_path / "again.npz")
        new = np.random.default_rng(8).uniform(0, 10, (9, 2))
        answered = prim.query(new, out=tmp_path / "new.npz")
    assert (tmp_path / "again.npz").read_bytes() == (tmp_path / "trained" / "primary.npz").read_bytes()
    released = load_primary(tmp_path / "trained")
    maps = {p: load_secondary(tmp_path / "trained", p).row_of_token for p in bases}
    secret = read_secret(data / "jobs" / job / "secret.key")
    want = query(new, QueryJob(bases, released, maps, pool=released.k, anchor="b"), secret=secret)
    for party in bases:
        np.testing.assert_array_equal(answered.links[party].tokens, want.links[party].tokens)
        np.testing.assert_array_equal(answered.links[party].sims, want.links[party].sims)
    with pytest.raises(LinkageError, match="party 'a': its token map covers 40 rows"):  # the tokens are b's rows
        query(new, QueryJob(bases, released, maps, pool=released.k, anchor="a"), secret=secret)


def test_a_service_without_queries_refuses_by_name(tmp_path):
    primary, base = planted(m=60, n=40)
    with service(tmp_path / "svc", free_port(), "--query-budget", "0") as url:
        _, other, _ = _linked(url, primary, {"a": base, "b": base}, k=3)
        with pytest.raises(ServiceError, match="this service answers no queries \\(its query budget is 0"):
            other.query(primary[:2])


def test_bloom_queries_need_the_training_uploads_key_and_parameters(tmp_path):
    key, other_key = {"secret": "the parties' key"}, {"secret": "another key"}
    titles = np.array(TITLES)
    respelt = np.array([t.upper() + "!" for t in TITLES[::-1]])
    new = np.array(["portal two", "the witcher iii", "celest"])
    with service(tmp_path / "svc", free_port()) as url:
        job, prim, secs = _job(url, ("s",))
        prim.upload(bloom_strings(titles, key["secret"].encode()), fingerprint=key_fingerprint(key))
        secs["s"].upload(bloom_strings(respelt, key["secret"].encode()), fingerprint=key_fingerprint(key))
        prim.start(JobParams("hamming", 2))
        prim.wait(timeout=60)
        got = prim.query(bloom_strings(new, key["secret"].encode()), fingerprint=key_fingerprint(key))
        secs["s"].fetch(tmp_path / "out")  # the secondary resolves the tokens with the map it holds
        top1 = load_secondary(tmp_path / "out", "s").row_of_token[got.links["s"].tokens[:, 0]]
        assert [respelt[r] for r in top1] == ["PORTAL 2!", "THE WITCHER 3 WILD HUNT!", "CELESTE!"]
        for bits, fingerprint in (
            (bloom_strings(new, b"another key"), key_fingerprint(other_key)),
            (bloom_strings(new, b"the parties' key", hashes=20), key_fingerprint({**key, "bloom": {"hashes": 20}})),
        ):
            with pytest.raises(
                ServiceError,
                match="the query's identifiers were encoded with a different key or "
                "parameters than the job's training upload",
            ):
                prim.query(bits, fingerprint=fingerprint)
        with pytest.raises(ServiceError, match="carries no encoding fingerprint .*cannot be checked"):
            prim.query(bloom_strings(new, key["secret"].encode()))
        with pytest.raises(
            ServiceError, match="width differs: the query has 512 Bloom filter bits, the job's training upload has 1024"
        ):
            prim.query(bloom_strings(new, key["secret"].encode(), bits=512), fingerprint=key_fingerprint(key))

        job2, prim2, secs2 = _job(url, ("s",))  # a training upload without a fingerprint (an older client)
        prim2.upload(bloom_strings(titles, key["secret"].encode()))
        secs2["s"].upload(bloom_strings(respelt, key["secret"].encode()))
        prim2.start(JobParams("hamming", 2))
        prim2.wait(timeout=60)
        with pytest.raises(
            ServiceError,
            match=f"job {job2}'s training upload carries no encoding fingerprint, "
            "so a query of encoded \\(Bloom\\) identifiers cannot be checked",
        ):
            prim2.query(bloom_strings(new, key["secret"].encode()), fingerprint=key_fingerprint(key))


def test_the_cli_queries_with_the_key_it_linked_with(tmp_path):
    """link --key-file sends the key's fingerprint; query --key-file too; another key is refused."""
    import pandas as pd

    pd.DataFrame({"title": TITLES}).to_csv(tmp_path / "p.csv", index=False)
    pd.DataFrame({"name": [t.upper() for t in TITLES[::-1]]}).to_csv(tmp_path / "s.csv", index=False)
    pd.DataFrame({"title": ["portal two", "hades ii"]}).to_csv(tmp_path / "new.csv", index=False)
    for name, secret in (("k.json", "the parties' key"), ("other.json", "another key")):
        (tmp_path / name).write_text(json.dumps({"secret": secret}))
    with service(tmp_path / "svc", free_port()) as url:
        made = create_job(url, ADMIN, "p", ["s"])
        job = made["job"]
        for party, secret in made["secrets"].items():
            (tmp_path / f"{party}.secret").write_text(secret)

        def party(name: str, *args: str, check: bool = True):
            return cli(
                *args,
                "--url",
                url,
                "--job",
                job,
                "--party",
                name,
                "--secret-file",
                str(tmp_path / f"{name}.secret"),
                "--kind",
                "strings",
                check=check,
            )

        party(
            "s", "link", "--csv", str(tmp_path / "s.csv"), "--columns", "name", "--key-file", str(tmp_path / "k.json")
        )
        party(
            "p",
            "link",
            "--csv",
            str(tmp_path / "p.csv"),
            "--columns",
            "title",
            "--key-file",
            str(tmp_path / "k.json"),
            "--start",
            "--metric",
            "hamming",
            "--k",
            "2",
            "--wait",
        )
        out = party(
            "p",
            "query",
            "--csv",
            str(tmp_path / "new.csv"),
            "--columns",
            "title",
            "--key-file",
            str(tmp_path / "k.json"),
            "--out",
            str(tmp_path / "query.npz"),
        )
        assert json.loads(out.stdout)["query_budget"]["left"] == 1_000_000 - 2 * 2  # 2 records x K = 2
        assert read_primary(tmp_path / "query.npz").links["s"].tokens.shape == (2, 2)
        wrong = party(
            "p",
            "query",
            "--csv",
            str(tmp_path / "new.csv"),
            "--columns",
            "title",
            "--key-file",
            str(tmp_path / "other.json"),
            "--out",
            str(tmp_path / "wrong.npz"),
            check=False,
        )
        assert wrong.returncode != 0 and "encoded with a different key or parameters" in wrong.stderr
        assert not (tmp_path / "wrong.npz").exists()
