"""The noise's calibration against the attacks (linkage.contracts.Defences, issue 19): the privacy
radius is Theorem 2 in other units; composed noise is the plain noise times sqrt(links of the
secondary record), reproduced by a query of the training records, and it cuts what aggregating
many links to one record recovers; both are job parameters of the service and the run config."""

from __future__ import annotations

import numpy as np
import pytest

from app.config import ConfigError, RunConfig
from app.vfl.linking import job_defences
from linkage.attacks import aggregation_attack
from linkage.contracts import Defences, LinkageError
from linkage.pipeline import job_id_of, link
from linkage.query import QueryJob, query
from linkage_server.params import JobError, JobParams

SECRET = b"defences-test-secret-0123456789abcdef"
RNG = np.random.default_rng(0)
PRIMARY = RNG.uniform(0, 1, (800, 2))  # a unit square: on it Theorem 2's half unit is the whole map
BASE = RNG.uniform(0, 1, (60, 2))


def test_the_radius_is_theorem_2_in_other_units():
    with pytest.raises(LinkageError, match="tau=0.5 is unreachable"):
        link(PRIMARY, {"s": BASE}, k=5, tau=0.5, secret=SECRET)
    r = 0.005
    small = link(PRIMARY, {"s": BASE}, k=5, tau=0.5, secret=SECRET, defences=Defences(radius=r))
    scaled = link(PRIMARY * (0.5 / r), {"s": BASE * (0.5 / r)}, k=5, tau=0.5, secret=SECRET)  # radius 0.5 there
    a, b = small.primary.links["s"], scaled.primary.links["s"]
    assert a.radius == r and b.radius == 0.5 and a.sigma > 0
    assert a.sigma == pytest.approx(b.sigma, rel=1e-9)  # the same noise relative to the similarities' spread
    assert job_id_of(PRIMARY, {"s": BASE}, 5, 0.5, defences=Defences(radius=r)) != job_id_of(
        PRIMARY, {"s": BASE}, 5, 0.5
    )
    with pytest.raises(LinkageError, match="radius must be a positive number"):
        Defences(radius=0.0)


def pairs(result) -> dict:
    """{(record, token): released similarity} of party s."""
    party_link = result.primary.links["s"]
    m, k = party_link.tokens.shape
    return dict(zip(zip(np.repeat(np.arange(m), k), party_link.tokens.ravel().tolist()), party_link.sims.ravel()))


def test_composed_noise_is_the_plain_noise_times_sqrt_links():
    d = Defences(radius=0.005)
    clean = pairs(link(PRIMARY, {"s": BASE}, k=5, tau=1.0, secret=SECRET))
    plain_job = link(PRIMARY, {"s": BASE}, k=5, tau=0.5, secret=SECRET, defences=d, pool=5)
    composed_job = link(
        PRIMARY, {"s": BASE}, k=5, tau=0.5, secret=SECRET, defences=Defences(0.005, compose=True), pool=5
    )
    plain, composed = pairs(plain_job), pairs(composed_job)
    assert plain.keys() == composed.keys() == clean.keys()  # one secret: the same tokens; pool = K: the same links
    rows = composed_job.secondaries["s"].row_of_token
    links = np.bincount(rows[composed_job.primary.links["s"].tokens.ravel()], minlength=len(BASE))
    assert links.max() > 50 and composed_job.primary.links["s"].composed
    for (i, tok), s0 in list(clean.items())[::97]:
        want = (plain[i, tok] - s0) * np.sqrt(links[rows[tok]])
        assert composed[i, tok] - s0 == pytest.approx(want, rel=1e-4, abs=1e-4)


def test_a_query_of_the_training_records_reproduces_the_composed_release():
    d = Defences(radius=0.005, compose=True)
    job = link(PRIMARY, {"s": BASE}, k=5, tau=0.5, secret=SECRET, defences=d, train_rows=np.arange(600))
    got = query(PRIMARY, QueryJob({"s": BASE}, job.primary, {"s": job.secondaries["s"].row_of_token}), secret=SECRET)
    assert np.array_equal(got.links["s"].tokens, job.primary.links["s"].tokens)
    assert np.array_equal(got.links["s"].sims, job.primary.links["s"].sims)
    # a composed job over a wider pool (issue 28: the default under noise) reproduces too
    wide = link(PRIMARY, {"s": BASE}, k=5, tau=0.5, secret=SECRET, defences=d, pool=8)
    got = query(
        PRIMARY, QueryJob({"s": BASE}, wide.primary, {"s": wide.secondaries["s"].row_of_token}, pool=8), secret=SECRET
    )
    assert np.array_equal(got.links["s"].tokens, wide.primary.links["s"].tokens)
    assert np.array_equal(got.links["s"].sims, wide.primary.links["s"].sims)


def test_composition_cuts_what_trilateration_recovers():
    def median_error(compose: bool) -> float:
        job = link(PRIMARY, {"s": BASE}, k=5, tau=0.5, secret=SECRET, defences=Defences(0.005, compose=compose))
        guess = aggregation_attack(job.primary.links["s"], PRIMARY)
        truth = BASE[job.secondaries["s"].row_of_token[guess.tokens]]
        return float(np.median(np.linalg.norm(guess.location - truth, axis=1)))

    plain, composed = median_error(False), median_error(True)
    assert plain < 0.005 < composed  # ~65 links per record: trilateration beats the radius until composed
    assert composed > 5 * plain


def test_the_service_and_the_run_config_take_the_defences_and_refuse_bad_ones():
    p = JobParams.parse({"metric": "euclidean", "k": 5, "radius": 0.001, "compose": True})
    assert p.spec().defences == Defences(0.001, True)
    for body, match in [({"compose": 1}, "'compose' must be bool"), ({"radius": -1}, "radius must be >= 0")]:
        with pytest.raises(JobError, match=match):
            JobParams.parse({"metric": "euclidean", "k": 5, **body})
    off = RunConfig.of(privacy="off", privacy_radius=0.001, privacy_compose=True)
    assert job_defences(off, {"s": BASE}, "euclidean", "s") == Defences(0.001, True)
    with pytest.raises(ConfigError, match="'privacy-radius' must be >= 0"):
        RunConfig.of(privacy_radius=-1.0).validate()
    with pytest.raises(ConfigError, match="with 'linkage-dir' the linkage service already linked"):
        RunConfig.of(privacy_compose=True, linkage_dir="/somewhere").validate()
