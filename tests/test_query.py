"""Linkage for new records against a finished job (linkage/query.py): with no noise and the
training records as the query it equals the job's release; noise is the job's sigma, keyed by
the record so repeated queries cannot be averaged; maps and jobs that do not match are refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from linkage.contracts import LinkageError
from linkage.job_secret import new_secret
from linkage.noise import record_noise
from linkage.pipeline import link, link_chain
from linkage.query import QueryJob, query

RNG = np.random.default_rng(0)
PRIMARY = RNG.uniform(0, 10, (300, 2))
BASE = {"a": RNG.uniform(0, 10, (120, 2)), "b": RNG.uniform(0, 10, (90, 2))}


def _job(tau: float = 1.0, pool: int = 0, k: int = 5):
    secret = new_secret()
    job = link(PRIMARY, BASE, k=k, tau=tau, secret=secret, train_rows=np.arange(200), pool=pool)
    maps = {p: s.row_of_token for p, s in job.secondaries.items()}
    return job, maps, secret


@pytest.mark.parametrize("pool", [0, 12])
def test_without_noise_the_training_records_get_the_jobs_release(pool):
    job, maps, secret = _job(pool=pool)
    got = query(PRIMARY, QueryJob(BASE, job.primary, maps, pool=pool), secret=new_secret())
    for party, released in job.primary.links.items():
        assert np.array_equal(got.links[party].tokens, released.tokens)
        assert np.array_equal(got.links[party].sims, released.sims)
    # a part of them, in another order, gets the same rows (the k-d tree answers per record)
    some = np.array([299, 3, 150, 7])
    part = query(PRIMARY[some], QueryJob(BASE, job.primary, maps, pool=pool), secret=secret)
    assert np.array_equal(part.links["a"].tokens, job.primary.links["a"].tokens[some])


def test_with_noise_the_training_records_get_the_jobs_release_too():
    """Asking again for a training record gives the numbers the job released for it, noise
    included: no second draw to average with the first."""
    job, maps, secret = _job(tau=0.9)
    assert job.primary.links["a"].sigma > 0
    got = query(PRIMARY, QueryJob(BASE, job.primary, maps), secret=secret)
    for party, released in job.primary.links.items():
        assert np.array_equal(got.links[party].tokens, released.tokens)
        assert np.array_equal(got.links[party].sims, released.sims)


def test_a_records_noise_is_the_jobs_sigma_and_the_same_in_any_batch():
    job, maps, secret = _job(tau=0.9)
    sigma = job.primary.links["a"].sigma
    assert sigma > 0
    alone = query(PRIMARY[[5]], QueryJob(BASE, job.primary, maps), secret=secret)
    batch = query(PRIMARY[[9, 5, 1]], QueryJob(BASE, job.primary, maps), secret=secret)
    assert np.array_equal(alone.links["a"].sims[0], batch.links["a"].sims[1])  # no fresh draw to average out
    fixed = b"query-test: a fixed secret, 32 b"  # the statistics below on fixed draws: pass or fail, never by chance
    noise = record_noise(fixed, "a", PRIMARY, (300, 40), sigma)
    assert abs(noise.std() / sigma - 1) < 0.03 and abs(noise.mean()) < 0.03 * sigma
    other = record_noise(b"query-test: another fixed secret", "a", PRIMARY, (300, 40), sigma)
    assert abs(np.corrcoef(noise.ravel(), other.ravel())[0, 1]) < 0.05  # another secret: other noise
    assert not np.array_equal(record_noise(fixed, "b", PRIMARY, (300, 40), sigma), noise)  # per party


def test_a_map_or_identifiers_from_another_job_are_refused():
    job, maps, secret = _job()
    with pytest.raises(LinkageError, match="party 'a': its token map covers 120 rows, not a permutation of its 119"):
        query(PRIMARY[:3], QueryJob({**BASE, "a": BASE["a"][:119]}, job.primary, maps), secret=secret)
    with pytest.raises(LinkageError, match=r"names parties \['a'\] .* but job .* linked \['a', 'b'\]"):
        query(PRIMARY[:3], QueryJob({"a": BASE["a"]}, job.primary, {"a": maps["a"]}), secret=secret)
    with pytest.raises(LinkageError, match="NaN"):
        query(np.array([[np.nan, 1.0]]), QueryJob(BASE, job.primary, maps), secret=secret)
    chain = link_chain(PRIMARY, BASE, anchor="a", k=3, tau=1.0, secret=secret)
    chain_maps = {p: s.row_of_token for p, s in chain.secondaries.items()}
    broken = dataclasses.replace(
        chain.primary, links={**chain.primary.links, "b": job.primary.links["b"]}
    )  # b's tokens are not the anchor's
    with pytest.raises(LinkageError, match="do not share the anchor's tokens"):
        query(PRIMARY[:3], QueryJob(BASE, broken, chain_maps), secret=secret)


def test_a_chain_job_is_queried_through_its_anchor():
    """Paper App. C: the training records queried again get the chain's release, every party the
    anchor's tokens, which each party's own map resolves to the row chained to the anchor's."""
    job, _, secret = _job()
    chain = link_chain(PRIMARY, BASE, anchor="a", k=3, tau=1.0, secret=secret)
    maps = {p: s.row_of_token for p, s in chain.secondaries.items()}
    got = query(PRIMARY, QueryJob(BASE, chain.primary, maps), secret=secret)
    assert got.layout == "chain"
    for party in ("a", "b"):
        np.testing.assert_array_equal(got.links[party].tokens, chain.primary.links[party].tokens)
        np.testing.assert_array_equal(got.links[party].sims, chain.primary.links[party].sims)


def test_under_noise_the_default_pool_chooses_the_k_and_a_query_reproduces_it_composed_too():
    """Default pool under noise: 4 K candidates, K chosen under noise (the set carries the noise);
    a query of the training records gives the release bit for bit, composed noise included."""
    from linkage.contracts import Defences

    secret = new_secret()
    for d in (Defences(radius=0.2), Defences(radius=0.2, compose=True)):
        job = link(PRIMARY, BASE, k=5, tau=0.5, secret=secret, train_rows=np.arange(200), defences=d)
        exact = link(PRIMARY, BASE, k=5, tau=0.5, secret=secret, train_rows=np.arange(200), defences=d, pool=5)
        maps = {p: s.row_of_token for p, s in job.secondaries.items()}
        rows = maps["a"][job.primary.links["a"].tokens]
        assert not np.array_equal(np.sort(rows, 1), np.sort(maps["a"][exact.primary.links["a"].tokens], 1))
        assert job.primary.links["a"].sigma == exact.primary.links["a"].sigma  # the same statistics and sigma
        got = query(PRIMARY, QueryJob(BASE, job.primary, maps), secret=secret)
        for party, released in job.primary.links.items():
            assert np.array_equal(got.links[party].tokens, released.tokens)
            assert np.array_equal(got.links[party].sims, released.sims)
