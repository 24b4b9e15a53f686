"""Oracle: exact Hamming top-K equals a numpy brute force (tie-aware), plus input errors."""

import numpy as np
import pytest

from linkage.contracts import LinkageError
from linkage.hamming import popcount_floor_seconds, topk_hamming


def brute(q, b):  # (m, B), (n, B) uint8 -> (m, n) Hamming distances
    return np.unpackbits(q[:, None, :] ^ b[None, :, :], axis=2).sum(axis=2)


@pytest.mark.parametrize("nbytes", [1, 5, 8, 16, 128])
@pytest.mark.parametrize("k", [1, 7, 40])
def test_topk_hamming_equals_brute_force(nbytes, k):
    rng = np.random.default_rng(nbytes * 100 + k)
    q = np.packbits(rng.random((60, nbytes * 8)) < 0.3, axis=1)
    b = np.packbits(rng.random((90, nbytes * 8)) < 0.3, axis=1)
    dist, idx = topk_hamming(q, b, k)
    full = brute(q, b)
    assert dist.shape == idx.shape == (60, k) and dist.dtype == np.float64 and idx.dtype == np.int64
    np.testing.assert_array_equal(dist, np.sort(full, axis=1)[:, :k])  # ties: any order among equals
    np.testing.assert_array_equal(np.take_along_axis(full, idx, axis=1), dist)
    assert all(len(set(r)) == k for r in idx)


def test_planted_neighbours_are_found_and_blocks_do_not_change_result():
    rng = np.random.default_rng(0)
    b = np.packbits(rng.random((500, 1024)) < 1 / 3, axis=1)
    rows = rng.choice(500, 40, replace=False)
    q = b[rows].copy()
    q[:, 0] ^= 1  # one flipped bit: the planted row is at distance 1, everything else far
    dist, idx = topk_hamming(q, b, 5)
    assert (idx[:, 0] == rows).all() and (dist[:, 0] == 1).all()
    seen = []
    d2, i2 = topk_hamming(q, b, 5, mem_cap_mb=1e-4, progress=lambda done, m: seen.append((done, m)))
    np.testing.assert_array_equal(d2, dist)
    np.testing.assert_array_equal(i2, idx)
    assert seen[-1] == (40, 40) and len(seen) > 1


def test_all_ties_and_k_equal_to_n():
    b = np.zeros((10, 4), np.uint8)
    dist, idx = topk_hamming(np.zeros((3, 4), np.uint8), b, 10)
    assert (dist == 0).all() and (np.sort(idx, axis=1) == np.arange(10)).all()


def test_bad_inputs_raise():
    q, b = np.zeros((3, 8), np.uint8), np.zeros((5, 8), np.uint8)
    with pytest.raises(LinkageError, match="uint8"):
        topk_hamming(q.astype(np.int64), b, 2)
    with pytest.raises(LinkageError, match="2-D"):
        topk_hamming(q[0], b, 2)
    with pytest.raises(LinkageError, match="bytes per filter differ"):
        topk_hamming(q, b[:, :4], 2)
    with pytest.raises(LinkageError, match="K=6"):
        topk_hamming(q, b, 6)
    with pytest.raises(LinkageError, match="empty"):
        topk_hamming(q[:0], b, 1)


def test_floor_seconds_is_a_positive_time():
    rng = np.random.default_rng(0)
    q = np.packbits(rng.random((50, 1024)) < 0.3, axis=1)
    assert 0 < popcount_floor_seconds(q, q) < 5
