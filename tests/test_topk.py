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


def test_the_matrix_product_search_holds_a_bounded_block_of_distances():
    """Above 8 dimensions the exact search computes (rows, n) distance blocks: their rows are
    sized to a memory budget (pipeline.BLOCK_BYTES), not a fixed 4096, which against a million
    secondary records would be 33 GB a block. Here 2000 x 20,000 (a 320 MB block before)."""
    import tracemalloc

    from linkage.pipeline import BLOCK_BYTES

    rng = np.random.default_rng(2)
    q, b = rng.normal(size=(2000, 16)), rng.normal(size=(20_000, 16))
    tracemalloc.start()
    try:
        got = topk_euclidean(q, b, 10)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * BLOCK_BYTES + q.nbytes + 2 * b.nbytes, f"{peak / 1e6:.0f} MB"
    want = topk_bruteforce(q, b, 10, chunk=2000)  # one block of every row
    np.testing.assert_array_equal(got[1], want[1])
    # BLAS may sum a row's dot products in another order in a block of another height (it did,
    # in 23 of 20,000 distances, by 1.3e-15, once under load): the same distances to rounding
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=0)
