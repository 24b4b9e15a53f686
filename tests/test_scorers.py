"""Every string metric's top-K against a brute-force oracle (the scorer per pair, in Python), several
columns, and the pipeline's contract over all of them."""

from collections import Counter

import numpy as np
import pytest
from rapidfuzz import fuzz
from rapidfuzz.distance import JaroWinkler, Levenshtein

import linkage.scorers as S
from linkage.contracts import DEFAULT_STRING_METRIC, METRICS, STRING_METRICS, LinkageError
from linkage.job_secret import operator_secret
from linkage.pipeline import check_identifiers, link
from linkage.qgram import qgrams


def cosine_distance(a: str, b: str) -> float:
    ca, cb = Counter(qgrams(a, S.QGRAM, S.PAD)), Counter(qgrams(b, S.QGRAM, S.PAD))
    dot = sum(n * cb[g] for g, n in ca.items())
    return 1.0 - dot / np.sqrt(sum(n * n for n in ca.values()) * sum(n * n for n in cb.values()))


PAIR = {  # the metric's distance of one pair, as rapidfuzz's scorers (or the definition) give it
    "edit": Levenshtein.distance,
    "levenshtein_norm": Levenshtein.normalized_distance,
    "jaro_winkler": JaroWinkler.normalized_distance,
    "token_sort": lambda a, b: 1.0 - fuzz.token_sort_ratio(a, b) / 100.0,
    "qgram_cosine": cosine_distance,
}


def words(rng, n, lo=1, hi=4):
    pool = ["anna", "bob", "lee", "smith", "o'brien", "main st", "12", "zoe", "kim", "park lane", "x", ""]
    return [" ".join(rng.choice(pool, rng.integers(lo, hi))) for _ in range(n)]


def typo(rng, s):
    i = int(rng.integers(len(s) + 1))
    return s[:i] + "q" + s[i + 1 :]


def planted(seed=0, m=40, n=160):
    """Base strings with some exact copies, queries = typo'd copies of the first m // 2 plus noise."""
    rng = np.random.default_rng(seed)
    base = words(rng, n) + ["anna smith"] * 3 + ["", "a"]
    query = [typo(rng, base[i]) for i in range(m // 2)] + words(rng, m // 2) + ["", "anna smith"]
    return query, base


def oracle(metric, query, base, k):
    full = np.array([[PAIR[metric](q, b) for b in base] for q in query])  # (m, n)
    return np.sort(full, axis=1)[:, :k], full


def test_every_string_metric_is_named_in_the_contract():
    assert STRING_METRICS == ("edit", "levenshtein_norm", "jaro_winkler", "token_sort", "qgram_cosine")
    assert set(STRING_METRICS) <= set(METRICS) and DEFAULT_STRING_METRIC in STRING_METRICS
    assert set(PAIR) == set(STRING_METRICS)


@pytest.mark.parametrize("metric", STRING_METRICS)
@pytest.mark.parametrize("k", [1, 7])
def test_top_k_equals_the_brute_force_oracle(metric, k):
    query, base = planted()
    dist, idx = S.topk_strings(metric, query, base, k, workers=1)
    assert dist.shape == idx.shape == (len(query), k) and dist.dtype == np.float64 and idx.dtype == np.int64
    want, full = oracle(metric, query, base, k)
    np.testing.assert_allclose(dist, want, atol=1e-6)  # the k smallest distances, ascending
    np.testing.assert_allclose(np.take_along_axis(full, idx, 1), dist, atol=1e-6)  # and they are idx's
    assert all(len(set(row)) == k for row in idx)
    if metric != "edit":
        assert (dist >= 0).all() and (dist <= 1).all()
    if metric != "edit":  # (edit orders its ties by base string length first)
        tie = np.diff(dist, axis=1) == 0
        assert (np.diff(idx, axis=1)[tie] > 0).all()  # among equal distances, lower base rows first
    if k == 7:  # "anna smith" finds its three copies at distance 0
        assert {160, 161, 162} <= set(idx[-1]) and (dist[-1, :3] == 0).all()


@pytest.mark.parametrize("metric", STRING_METRICS)
def test_k_equal_to_the_base_and_small_blocks(metric):
    query, base = planted(seed=1, m=10, n=30)
    dist, idx = S.topk_strings(metric, query, base, len(base), mem_cap_mb=0, workers=1)
    assert (np.sort(idx, axis=1) == np.arange(len(base))).all()
    np.testing.assert_allclose(dist, oracle(metric, query, base, len(base))[0], atol=1e-6)


def test_qgram_cosine_when_few_base_strings_share_a_qgram():
    """Rows sharing no q-gram are at distance 1, lowest rows first, after the ones that share some."""
    base = ["xyz", "abc", "uvw", "abd", "rst"]
    dist, idx = S.topk_strings("qgram_cosine", ["abc"], base, 4)
    assert list(idx[0]) == [1, 3, 0, 2] and dist[0, 0] == 0 and (dist[0, 2:] == 1).all()
    assert 0 < dist[0, 1] < 1


def test_smallest_is_exact_with_ties():
    rng = np.random.default_rng(3)
    d = rng.integers(0, 5, (50, 400)).astype(np.float32)  # massive ties
    dist, idx = S.smallest(d, 30)
    np.testing.assert_array_equal(dist, np.sort(d, axis=1)[:, :30])
    np.testing.assert_array_equal(np.take_along_axis(d, idx, 1), dist)
    order = np.lexsort((idx, dist), axis=1)  # among equal distances, lower columns first
    np.testing.assert_array_equal(order, np.tile(np.arange(30), (50, 1)))
    assert (idx[:, 0] == np.argmin(d, axis=1)).all()


@pytest.mark.parametrize("metric", STRING_METRICS)
def test_several_columns_are_joined_with_a_space(metric):
    rng = np.random.default_rng(2)
    names, streets = words(rng, 60, 1, 3), words(rng, 60, 1, 3)
    base = np.array([names, streets]).T  # (60, 2)
    query = np.array([[typo(rng, n) for n in names[:20]], streets[:20]]).T  # (20, 2)
    d2, i2 = S.topk_strings(metric, query, base, 5, workers=1)
    d1, i1 = S.topk_strings(metric, [" ".join(r) for r in query], [" ".join(r) for r in base], 5, workers=1)
    np.testing.assert_array_equal(d2, d1)
    np.testing.assert_array_equal(i2, i1)
    with pytest.raises(LinkageError, match="string columns differ: the query has 2, the base 1"):
        S.topk_strings(metric, query, names, 5)


def test_a_second_column_tells_apart_what_the_first_cannot():
    base = np.array([["anna smith", "1 park lane"], ["anna smith", "12 main st"], ["bob lee", "12 main st"]])
    query = np.array([["anna smyth", "12 main street"]])
    for metric in STRING_METRICS:
        assert S.topk_strings(metric, query, base, 1)[1][0, 0] == 1, metric
        assert (
            S.topk_strings(metric, query[:, :1], base[:, :1], 1)[0][0, 0]
            == S.topk_strings(metric, query[:, :1], base[:, :1], 2)[0][0, 1]
        )  # on names alone rows 0 and 1 tie


@pytest.mark.parametrize("metric", STRING_METRICS)
def test_the_pipeline_links_string_columns_by_every_metric(metric):
    """The contract over all metrics: (n, c) strings in, the planted row as every record's top token,
    similarities standardised from -distance."""
    rng = np.random.default_rng(4)
    base = np.array([words(rng, 50, 2, 4), words(rng, 50, 1, 3)]).T
    base[:, 0] = [f"{s} {i}" for i, s in enumerate(base[:, 0])]  # every row distinct
    perm = rng.permutation(50)
    query = base[perm].copy()
    res = link(query, {"s": base}, k=3, tau=1.0, secret=operator_secret(0, "test"), metric=metric)
    top = res.secondaries["s"].row_of_token[res.primary.tokens["s"][:, 0]]
    np.testing.assert_array_equal(top, perm)
    assert res.primary.metric == metric and (np.diff(res.primary.sims, axis=1) <= 0).all()
    assert abs(float(res.primary.sims.mean())) < 1e-5  # standardised over the K similarities
    with pytest.raises(LinkageError, match="string columns differ: primary has 2, party 's' has 1"):
        check_identifiers(query, base[:, 0], 3, "s", metric)
    with pytest.raises(LinkageError, match="identifiers must be a 1-D array of strings"):
        check_identifiers(np.ones((3, 2)), base, 3, "s", metric)
    with pytest.raises(LinkageError, match=r"1 identifier\(s\) are not strings .*first rows: \[1\]"):
        check_identifiers(np.array([["a", "b"], ["c", None]], dtype=object), base, 3, "s", metric)


def test_bloom_encoding_of_several_columns_is_the_joined_string():
    from linkage.encode import bloom_strings, encode_with_key

    ids = np.array([["anna", "main st"], ["bob", ""]])
    got = encode_with_key(ids, {"secret": "s"})
    np.testing.assert_array_equal(got, bloom_strings(["anna main st", "bob "], b"s"))


def test_the_service_takes_string_columns_and_infers_the_metric_from_the_kind():
    from linkage_server.uploads import KIND_OF_METRIC, METRIC_OF_KIND, UploadError, validate

    s = validate(np.array([["anna", "main st"], ["anna", "main st"], ["bob", ""]]))  # an empty cell is fine
    assert (s.kind, s.shape, s.duplicates) == ("strings", (3, 2), 1)
    with pytest.raises(UploadError, match=r"1 identifier\(s\) are empty strings \(first rows: \[1\]\)"):
        validate(np.array([["a", "b"], ["", ""]]))  # an empty row is not
    with pytest.raises(UploadError, match=r"strings identifiers must be a 1-D \(rows,\) or 2-D"):
        validate(np.array([[["a"]]]))
    assert {KIND_OF_METRIC[m] for m in STRING_METRICS} == {"strings"}
    assert METRIC_OF_KIND == {"numbers": "euclidean", "bits": "hamming", "strings": DEFAULT_STRING_METRIC}


def test_qgram_cosine_chunks_of_queries_reuse_the_base_index():
    """A service job searches its base chunk by chunk: the base's index is built once, and the
    chunks' results are the whole's. Query q-grams no base string has still count in the norm."""
    from linkage import qgram

    query, base = planted(seed=6)
    whole = S.topk_strings("qgram_cosine", query, base, 5)
    index = qgram.base_index(S.joined(base), S.QGRAM, S.PAD)
    parts = [S.topk_strings("qgram_cosine", query[lo : lo + 13], base, 5) for lo in range(0, len(query), 13)]
    assert qgram.base_index(S.joined(base), S.QGRAM, S.PAD) is index  # not rebuilt
    for got, want in zip((np.concatenate([p[j] for p in parts]) for j in (0, 1)), whole):
        np.testing.assert_array_equal(got, want)
    d, _ = S.topk_strings("qgram_cosine", ["zzzz", "ab zz"], ["ab", "abc"], 2)
    assert (d[0] == 1).all() and d[1, 0] == pytest.approx(cosine_distance("ab zz", "ab"))
