"""Oracle: the fast exact top-K equals a naive brute force on random data."""

import numpy as np
import pytest

from linkage.pipeline import topk_bruteforce, topk_euclidean, topk_kdtree


def naive_topk(q, b, k):
    d = np.linalg.norm(q[:, None, :] - b[None, :, :], axis=-1)  # (m, n)
    idx = np.argsort(d, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d, idx, axis=1), idx


@pytest.mark.parametrize("d", [1, 2, 5, 16, 30])
@pytest.mark.parametrize("k", [1, 7, 50])
def test_fast_topk_equals_brute_force(d, k):
    rng = np.random.default_rng(d * 100 + k)
    q, b = rng.normal(size=(300, d)), rng.normal(size=(120, d))
    want_d, want_i = naive_topk(q, b, k)
    for fn in (topk_euclidean, topk_kdtree, topk_bruteforce):
        got_d, got_i = fn(q, b, k)
        assert got_i.shape == (300, k) and got_d.shape == (300, k)
        np.testing.assert_array_equal(got_i, want_i, err_msg=fn.__name__)
        np.testing.assert_allclose(got_d, want_d, rtol=1e-9, atol=1e-9, err_msg=fn.__name__)


def test_topk_with_k_equal_to_party_size_returns_every_row_sorted():
    rng = np.random.default_rng(0)
    q, b = rng.normal(size=(40, 3)), rng.normal(size=(9, 3))
    for fn in (topk_kdtree, topk_bruteforce):
        dist, idx = fn(q, b, 9)
        assert (np.sort(idx, axis=1) == np.arange(9)).all()
        assert (np.diff(dist, axis=1) >= 0).all()


def test_bruteforce_chunking_does_not_change_the_result():
    rng = np.random.default_rng(1)
    q, b = rng.normal(size=(1000, 12)), rng.normal(size=(300, 12))
    a = topk_bruteforce(q, b, 10, chunk=4096)
    c = topk_bruteforce(q, b, 10, chunk=37)
    np.testing.assert_array_equal(a[1], c[1])
