"""The metric registry (linkage.metrics, issue 30): every registered metric keeps the pipeline's
one contract, and a metric nobody registered is refused by name wherever a job names one."""

from __future__ import annotations

import numpy as np
import pytest

from linkage.approx import METHODS
from linkage.contracts import METRICS, STRING_METRICS, LinkageError
from linkage.job import JobSpec
from linkage.job_secret import operator_secret
from linkage.metrics import DEFAULT_OF_KIND, KINDS, REGISTRY, metric
from linkage.pipeline import check_identifiers, link, topk
from linkage_server.params import JobError, JobParams
from linkage_server.uploads import KIND_OF_METRIC


def planted(kind: str, n: int = 50) -> np.ndarray:
    """n distinct identifiers of the kind, far enough apart that each is its own nearest."""
    rng = np.random.default_rng(7)
    if kind == "numbers":
        return np.arange(n, dtype=np.float64)[:, None] * [3.0, -2.0] + rng.uniform(0, 0.1, (n, 2))
    if kind == "bits":
        return np.packbits(rng.random((n, 256)) < 0.5, axis=1)  # (n, 32) uint8, ~128 bits apart
    return np.array([f"record {i:03d} {'abcdefgh'[i % 8] * (1 + i % 5)}" for i in range(n)])


def test_the_names_follow_from_the_registry():
    numbers = tuple(m.name for m in REGISTRY.values() if m.kind == "numbers")
    assert METRICS == tuple(REGISTRY) == (*numbers, *STRING_METRICS, "hamming") and numbers[0] == "euclidean"
    assert {m.kind for m in REGISTRY.values()} == set(KINDS) and set(KIND_OF_METRIC) == set(METRICS)
    assert all(metric(name).kind == kind for kind, name in DEFAULT_OF_KIND.items())
    assert all(set(m.approx) <= set(METHODS) and m.auto(10**6) in ("exact", *m.approx) for m in REGISTRY.values())


@pytest.mark.parametrize("name", METRICS)
def test_every_registered_metric_keeps_the_pipelines_contract(name):
    """The contract over all metrics: its identifiers in, the planted row as every record's top
    token, similarities standardised and descending; its exact top-K as the pipeline's."""
    m = metric(name)
    base = planted(m.kind)
    perm = np.random.default_rng(1).permutation(len(base))
    query = base[perm].copy()
    res = link(query, {"s": base}, k=3, tau=1.0, secret=operator_secret(0, "test"), metric=name)
    top = res.secondaries["s"].row_of_token[res.primary.tokens["s"][:, 0]]
    np.testing.assert_array_equal(top, perm)
    assert res.primary.metric == name and (np.diff(res.primary.sims, axis=1) <= 0).all()
    assert abs(float(res.primary.sims.mean())) < 1e-5
    dist, idx = topk(name, *check_identifiers(query, base, 3, "s", name), 3)
    assert dist.dtype == np.float64 and idx.dtype == np.int64 and (idx[:, 0] == perm).all()
    other = planted("strings" if m.kind == "numbers" else "numbers")
    with pytest.raises(LinkageError, match=f"{m.label or name} identifiers must be"):
        m.identifiers(other, "primary")


NUMBERS = [m.name for m in REGISTRY.values() if m.kind == "numbers"]


@pytest.mark.parametrize("name", NUMBERS)
@pytest.mark.parametrize("d", [2, 12])  # the k-d tree (d <= 8) and the distance blocks above
def test_a_numeric_metrics_distance_is_its_own_everywhere(name, d):
    """Oracle: the exact search, the service's searcher and the privacy report's pairwise scores
    all measure the metric's own distance (scipy's Minkowski of its order, brute force), so a
    numeric metric is its registry entry; ties aside, the neighbours are the brute force's."""
    from scipy.spatial.distance import cdist

    from linkage.pairwise import Pairwise
    from linkage.search import searcher

    rng = np.random.default_rng(d)
    query, base = rng.normal(size=(60, d)), rng.normal(size=(90, d))
    want = cdist(query, base, "minkowski", p=metric(name).p)  # (60, 90)
    want_idx = np.argsort(want, axis=1, kind="stable")[:, :5]
    for dist, idx in (topk(name, query, base, 5), searcher(base, metric=name, k=5, party="s")(query)):
        np.testing.assert_allclose(dist, np.take_along_axis(want, want_idx, 1), rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(idx, want_idx)  # continuous draws: no ties
    pairs = Pairwise(name, query, base, np.arange(60), np.arange(90))
    np.testing.assert_allclose(pairs(np.arange(60), np.arange(90)), want, rtol=1e-9, atol=1e-12)
    if name != "euclidean":  # a different geometry: another order of neighbours than Euclidean's
        assert not np.array_equal(want_idx, np.argsort(cdist(query, base), axis=1, kind="stable")[:, :5])


def test_an_unknown_metric_is_refused_by_name():
    known = r"unknown metric 'cosine'; known: \['euclidean'"
    with pytest.raises(LinkageError, match=known):
        metric("cosine")
    with pytest.raises(LinkageError, match=known):
        check_identifiers(planted("numbers"), planted("numbers"), 3, "s", "cosine")
    with pytest.raises(LinkageError, match=known):
        JobSpec("cosine", 3)
    with pytest.raises(JobError, match=known):
        JobParams.parse({"metric": "cosine", "k": 3})


def test_each_metric_names_the_searches_it_has():
    for name in METRICS:
        for search in ("hnsw", "ivf", "qgram"):
            body = {"metric": name, "k": 3, "search": search}
            if search in metric(name).approx:
                assert JobParams.parse(body).search == search
            else:
                with pytest.raises(JobError, match=f"search '{search}' is not one of"):
                    JobParams.parse(body)
    assert (
        metric("euclidean").coordinate_attacks(planted("numbers"))
        and not metric("hamming").coordinate_attacks(planted("bits"))
        and not metric("edit").coordinate_attacks(planted("strings"))
    )


def test_searches_and_scores_read_the_registry_not_a_metrics_name():
    """Issue 30: how linkage.approx, linkage.scorers and linkage.pairwise search and score a metric
    comes from its entry (faiss, exact, scorer, sort_words, integer); none of them compares a
    metric with a registered name, so a new metric is one entry in linkage/metrics.py."""
    import re
    from pathlib import Path

    from linkage.scorers import scorer

    for m in REGISTRY.values():
        assert bool(m.faiss) == bool({"hnsw", "ivf"} & set(m.approx)) and m.faiss in ("", "float", "binary")
        if m.strings and m.exact != "qgram":
            assert callable(scorer(m.name))  # a rapidfuzz distance
    root = Path(__file__).resolve().parents[1] / "linkage"
    names = "|".join(map(re.escape, METRICS))
    for module in ("approx.py", "scorers.py", "pairwise.py", "exact.py"):
        text = (root / module).read_text()
        assert not re.search(rf"""metric\s*(==|!=|in|not in)\s*\(?["']({names})["']""", text), module
