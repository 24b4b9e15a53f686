"""topk_edit against the brute-force oracle on small random strings with planted near-duplicates."""

import numpy as np
import pytest
from rapidfuzz.distance import Levenshtein

import linkage.strings as S
from linkage.contracts import LinkageError


def rand_strings(rng, n, alphabet="abcde ", lo=0, hi=14):
    return ["".join(rng.choice(list(alphabet), rng.integers(lo, hi))) for _ in range(n)]


def edit(rng, s):
    i = int(rng.integers(len(s) + 1))
    return s[:i] + "x" + s[i + 1 :]


def check_exact(query, base, k, **kw):
    dist, idx = S.topk_edit(query, base, k, **kw)
    de, _ = S.topk_edit_exact(query, base, k)
    assert dist.shape == idx.shape == (len(query), k) and dist.dtype == np.float64 and idx.dtype == np.int64
    assert (dist == de).all() and S.tie_aware_recall(dist, de) == 1.0
    assert (np.diff(dist, axis=1) >= 0).all()
    assert all(len(set(row)) == k for row in idx)  # no base index twice
    got = [[Levenshtein.distance(q, base[j]) for j in row] for q, row in zip(query, idx)]
    assert (np.array(got) == dist).all()
    return dist, idx


@pytest.mark.parametrize("pilot, guess", [(S.PILOT, S.GUESS), (50, 0.01)])  # 2nd: guesses too low, rows redone
def test_matches_exact(monkeypatch, pilot, guess):
    monkeypatch.setattr(S, "PILOT", pilot)
    monkeypatch.setattr(S, "GUESS", guess)
    rng = np.random.default_rng(0)
    planted = rand_strings(rng, 40, "abcdefghijklmnopqrstuvwxyz", 20, 30)
    base = planted + rand_strings(rng, 400) + ["a" * 70, "b" * 80 + "a"]  # > 64 chars: cdist's non-SIMD side
    base += base[30:80]  # exact duplicates: each copy is its own neighbour
    query = [edit(rng, s) for s in planted] + rand_strings(rng, 60) + ["a" * 69, ""]
    dist, idx = check_exact(query, base, 25)
    assert (dist[:40, 0] <= 1).all() and (idx[:40, 0] == np.arange(40)).all()  # each finds its source
    assert all({i, 412 + i} <= set(row[:2]) for i, row in zip(range(30, 40), idx[30:40]))  # and its copy


def test_k_equals_len_base_and_small_blocks():
    rng = np.random.default_rng(1)
    base = rand_strings(rng, 30) + ["same"] * 5
    query = rand_strings(rng, 20)
    dist, idx = check_exact(query, base, len(base), mem_cap_mb=0, workers=1)
    assert (np.sort(idx, axis=1) == np.arange(len(base))).all()
    check_exact(query, base, 1)


def test_progress_and_normalize():
    seen = []
    S.topk_edit(["ab", "abc"], ["ab", "b", "c"], 2, progress=lambda done, m: seen.append((done, m)))
    assert seen[-1] == (2, 2)
    assert S.normalize_strings(["  Half-Life\t 2 ", "ＦＵＬＬ　Ｗｉｄｔｈ"]) == ["half-life 2", "full width"]


def test_tie_aware_recall():
    exact = np.array([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
    assert S.tie_aware_recall(np.array([[0.0, 2.0, 2.0], [1.0, 1.0, 3.0]]), exact) == 5 / 6


@pytest.mark.parametrize(
    "query, base, k, match",
    [
        (["a"], ["a", "b"], 3, "k=3 must be an integer in 1..len"),
        (["a"], ["a", "b"], 0, "k=0"),
        ([], ["a"], 1, "query is empty"),
        (["a"], [], 1, "base is empty"),
        (["a", None], ["a"], 1, r"query\[1\] is None"),
        (["a"], ["a", 3], 1, r"base\[1\] is 3 \(int\)"),
    ],
)
def test_errors(query, base, k, match):
    for f in (S.topk_edit, S.topk_edit_exact):
        with pytest.raises(LinkageError, match=match):
            f(query, base, k)
    if None in query:
        with pytest.raises(LinkageError, match="not a string"):
            S.normalize_strings(query)
