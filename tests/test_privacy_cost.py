"""The privacy report made cheap without weakening it (issue 29 item 10): its sample of attacked
tokens is drawn from the job's secret, each rate comes with its 95 % interval, and that interval
holds the rate measured on every token; the dictionary attack's distances equal the search's."""

from __future__ import annotations

import numpy as np
import pytest

from linkage.pipeline import link, search
from linkage.privacy import privacy_report, report_lines, sample_tokens, token_counts

SECRET = b"planted-job-secret-0123456789abc"


@pytest.fixture(scope="module")
def planted():
    """Half the secondary's records spread over a wide square, half packed in a tight cluster;
    the primary holds a noisy copy of each. About 1,100 tokens are released, 300 attacked."""
    rng = np.random.default_rng(7)
    base = np.concatenate([rng.uniform(0, 100, (1000, 2)), 50 + rng.normal(0, 0.01, (1000, 2))])
    prim = base + rng.normal(0, 0.5, base.shape)
    res = link(prim, {"s": base}, k=10, tau=0.999, secret=SECRET, metric="euclidean", job_id="planted")
    full = privacy_report(res, prim, {"s": base}, "euclidean", max_tokens=10**9, secret=SECRET)
    return res, prim, base, full["parties"]["s"]


def test_a_sampled_report_holds_the_full_rate_within_its_stated_interval(planted):
    res, prim, base, full = planted
    assert full["tokens_attacked"] == full["tokens_attackable"] > 1000
    assert all(v["ci95"] == [next(iter(v.values()))] * 2 for v in full["attacks"].values())  # every token: exact
    covered, widths = [], []
    for draw in range(8):  # eight samples of 300 tokens, each keyed by another secret
        part = privacy_report(res, prim, {"s": base}, "euclidean", secret=SECRET + bytes([draw]))["parties"]["s"]
        assert part["tokens_attacked"] == 300 and part["tokens_attackable"] == full["tokens_attackable"]
        assert part["links_per_record"] == full["links_per_record"]  # counted on the whole release
        for name, v in part["attacks"].items():
            lo, hi = v["ci95"]
            rate, truth = next(iter(v.values())), next(iter(full["attacks"][name].values()))
            assert lo <= rate <= hi
            covered.append(lo <= truth <= hi)
            widths.append(hi - lo)
    assert np.mean(covered) >= 0.9 and max(widths) < 0.15, (np.mean(covered), max(widths))
    assert "95 % CI" in "\n".join(report_lines(privacy_report(res, prim, {"s": base}, "euclidean", secret=SECRET)))


def test_the_attacked_sample_is_drawn_from_the_job_secret(planted):
    res = planted[0]
    counts = token_counts(res.primary.links["s"])
    keyed = sample_tokens(counts, "s", 300, SECRET)
    np.testing.assert_array_equal(keyed, sample_tokens(counts, "s", 300, SECRET))  # the job measures alike
    assert len(np.intersect1d(keyed, sample_tokens(counts, "s", 300, b"another secret of 32 bytes!!!!!"))) < 150
    assert len(np.intersect1d(keyed, sample_tokens(counts, "s", 300))) < 150  # not what the release alone gives


@pytest.mark.parametrize(
    "metric", ["hamming", "euclidean", "qgram_cosine", "edit", "levenshtein_norm", "jaro_winkler", "token_sort"]
)
def test_pairwise_distances_are_the_searchs(metric):
    rng = np.random.default_rng(3)
    if metric == "hamming":
        q, b = rng.integers(0, 256, (40, 17), dtype=np.uint8), rng.integers(0, 256, (70, 17), dtype=np.uint8)
    elif metric == "euclidean":
        q, b = rng.normal(size=(40, 3)), rng.normal(size=(70, 3))
    else:

        def words(n):
            return np.array(
                [["".join(rng.choice(list("abcde "), rng.integers(1, 9))) for _ in range(2)] for _ in range(n)]
            )

        q, b = words(40), words(70)
    dist, col = search(q, b, metric=metric, k=len(b), party="t")
    every = np.empty_like(dist)
    np.put_along_axis(every, col, dist, axis=1)
    from linkage.pairwise import Pairwise

    rows, cand = np.array([5, 1, 30]), np.array([69, 0, 12, 12, 40])
    pairwise = Pairwise(metric, q, b, np.arange(40), np.arange(70))
    np.testing.assert_array_equal(pairwise(rows, cand), every[rows][:, cand])


def test_the_report_says_what_theorem_1s_epsilon_means():
    """A fresh-clone walk read 'Theorem 1 epsilon=4e+08' with nothing to say it guarantees nothing."""

    def line(eps):
        party = {"theorem1_epsilon": eps, "sigma": 1.0, "noise_per_distance": 0.1, "tokens_attacked": 1}
        party |= {"links_per_record": {"median": 1, "p90": 1, "max": 1}, "attacks": {}}
        report = {"tau": 1.0, "k": 5, "metric": "euclidean", "defences": {"radius": 0.5, "compose": True}}
        return report_lines(report | {"parties": {"s": party}})[-1]

    assert "epsilon=4e+08: no useful differential-privacy guarantee" in line(4e8)
    assert "epsilon=0.5 (differential privacy of each record's similarities" in line(0.5)
    assert "epsilon=none (no noise)" in line(None)
