"""One place decides what a linkage job is (linkage.job.JobSpec, issue 30).

The in-process linker (app/vfl/parties.py) and the linkage service (linkage_server/jobs.py) both
name a job by its JobSpec: for the same identifiers, training rows and parameters they derive the
same content id, so under one operator seed the same secret, and release the same linkage.
(tests/test_service.py checks the same through a real service process and a training run.)
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from app.config import RunConfig
from app.data import load_data
from app.vfl.linking import job_kind, link_and_report
from linkage.approx import Approx
from linkage.contracts import Defences, LinkageError
from linkage.job import JobSpec
from linkage.job_secret import OPERATOR_SEED_ENV, operator_secret
from linkage.pipeline import chain_tag, job_id_of, link_exact
from linkage.protection import defences_from
from linkage.runner import run_job
from linkage.store import load_primary, load_secondary
from linkage_server.jobs import JobParams, JobStore
from linkage_server.uploads import to_npy

SEED = 0x5EED


def _service(tmp_path, ds, params: JobParams) -> tuple[str, JobStore]:
    """The dataset's identifiers and training rows linked by a job store under the operator seed."""
    store = JobStore(tmp_path / "svc", operator_seed=SEED, chunk_rows=128)
    job, _ = store.create("primary", sorted(ds.secondaries))
    store.upload(job, "primary", to_npy(ds.primary.identifiers))
    store.upload(job, "primary", to_npy(np.asarray(ds.split.train, np.int64)), train_rows=True)
    for party, table in ds.secondaries.items():
        store.upload(job, party, to_npy(table.identifiers))
    store.start(job, params)
    store.run(job)
    assert store.meta(job)["state"] == "done", store.meta(job).get("error")
    return job, store


@pytest.mark.parametrize("dataset, layout, tau", [("synthetic", "independent", 0.7), ("house3", "chain", 1.0)])
def test_the_simulation_and_the_service_name_and_release_a_job_alike(tmp_path, monkeypatch, dataset, layout, tau):
    monkeypatch.setenv(OPERATOR_SEED_ENV, str(SEED))
    cfg = RunConfig.of(dataset=dataset, n_rows=300, k=3, tau=tau, layout=layout, seed=1, out_dir=str(tmp_path / "runs"))
    ds, settings = load_data(cfg), cfg.resolve()
    simulated, _ = link_and_report(ds, cfg, settings, report=False)
    params = JobParams("euclidean", settings.k, tau=tau if tau < 1 else 0.0, layout=layout)  # 0: none asked
    job, store = _service(tmp_path, ds, params)

    ids = {p: t.identifiers for p, t in ds.secondaries.items()}
    recorded = defences_from(store.meta(job)["defences"])  # the floors, sized from the secondaries' data
    content = params.spec(recorded).content_id(ds.primary.identifiers, ids, ds.split.train)
    assert simulated.primary.job_id == content  # the same job id, so the same secret under the operator seed
    assert recorded.noisy and recorded.compose  # both at the default level: standard
    off = dataclasses.replace(cfg.link, privacy="off")
    if layout == "chain":  # at privacy "off", the id today's jobs were named by, unchanged
        plain = link_and_report(ds, dataclasses.replace(cfg, link=off), settings, report=False)[0]
        assert plain.primary.job_id == job_id_of(
            ds.primary.identifiers, ids, 3, tau, chain_tag("euclidean", min(ids)), 0, ds.split.train
        )
    results = store.root / job / "results"
    served = load_primary(results)
    assert served.layout == simulated.primary.layout
    for party in ids:
        np.testing.assert_array_equal(served.links[party].tokens, simulated.primary.links[party].tokens)
        np.testing.assert_array_equal(served.links[party].sims, simulated.primary.links[party].sims)
        np.testing.assert_array_equal(
            load_secondary(results, party).row_of_token, simulated.secondaries[party].row_of_token
        )


def test_a_spec_runs_each_kind_under_its_own_content_id():
    rng = np.random.default_rng(0)
    base = rng.uniform(0, 10, (40, 2))
    query = np.concatenate([base[:20], rng.uniform(0, 10, (10, 2))])
    ids, secret = {"s": base}, operator_secret(1, "x" * 16)
    exact = JobSpec("euclidean", 1, kind=job_kind("exact"))
    assert exact.content_id(query, ids) == job_id_of(query, ids, 1, 1.0, "euclidean-exact", 0)
    got, want = run_job(exact, query, ids, secret=secret), link_exact(query, ids, secret=secret)
    np.testing.assert_array_equal(got.primary.tokens["s"], want.primary.tokens["s"])
    assert got.primary.job_id == want.primary.job_id
    # the defences and the approximate search are part of a top-K job's id, as the service names it
    plain = JobSpec("euclidean", 3, 0.5)
    assert plain.content_id(query, ids) == job_id_of(query, ids, 3, 0.5)
    assert dataclasses.replace(plain, defences=Defences(radius=0.1)).content_id(query, ids) != plain.content_id(
        query, ids
    )
    assert dataclasses.replace(plain, approx=Approx("hnsw")).content_id(query, ids) != plain.content_id(query, ids)
    known = JobSpec("", 1, kind=job_kind("combine"))
    res = run_job(known, None, {"s": np.arange(30) % 40}, secret=secret, job_id="true-x", sizes={"s": 40})
    assert res.primary.job_id == "true-x" and job_kind("fedsim") == "topk"
    with pytest.raises(LinkageError, match="its caller names it"):
        known.content_id(query, ids)


def test_a_spec_refuses_what_no_job_is():
    with pytest.raises(LinkageError, match="unknown job kind 'fuzzy'"):
        JobSpec("euclidean", 3, kind="fuzzy")
    with pytest.raises(LinkageError, match="layout must be"):
        JobSpec("euclidean", 3, layout="ring")
    with pytest.raises(LinkageError, match="unknown metric 'cosine'"):
        JobSpec("cosine", 3)
    with pytest.raises(LinkageError, match="a chain searches exactly"):
        JobSpec("euclidean", 3, layout="chain", approx=Approx("auto"))
