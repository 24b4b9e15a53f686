"""Party-side encodings: keyed Bloom filters for strings, FEDERAL intervals for numbers."""

import numpy as np
import pytest

from linkage.contracts import LinkageError
from linkage.encode import bloom_strings, federal_numbers, federal_params

SECRET = b"shared by the parties, not the service"


def ham(a, b):  # (n, B), (n, B) uint8 -> (n,) row-wise Hamming distances
    return np.unpackbits(a ^ b, axis=1).sum(axis=1)


def test_bloom_shape_fill_and_identity():
    names = ["The Witcher 3: Wild Hunt", "Portal 2", "a", ""]
    f = bloom_strings(names, SECRET)
    assert f.shape == (4, 128) and f.dtype == np.uint8
    fill = np.unpackbits(f, axis=1).mean(axis=1)
    assert 0.3 < fill[0] < 0.6 and fill[3] > 0  # short strings still get q-grams from the padding
    np.testing.assert_array_equal(bloom_strings(names[:1] * 3, SECRET), np.repeat(f[:1], 3, axis=0))
    np.testing.assert_array_equal(bloom_strings(["PORTAL  2"], SECRET), f[1:2])  # case/space folded


def test_bloom_similar_strings_are_closer_than_dissimilar():
    a = bloom_strings(["Grand Theft Auto V", "Counter-Strike", "Stardew Valley"], SECRET)
    near = bloom_strings(["Grand Theft Auto 5", "Counter Strike", "Stardew Valey"], SECRET)
    far = bloom_strings(["Hollow Knight", "Terraria", "Dark Souls III"], SECRET)
    assert (ham(a, near) < ham(a, far)).all()


def test_bloom_secret_changes_bits_and_is_required():
    a = bloom_strings(["Hollow Knight"], SECRET)
    b = bloom_strings(["Hollow Knight"], b"another secret")
    assert ham(a, b)[0] > 100
    with pytest.raises(LinkageError, match="secret"):
        bloom_strings(["x"], b"")
    with pytest.raises(LinkageError, match="row 1"):
        bloom_strings(["x", None], SECRET)
    with pytest.raises(LinkageError, match="multiple of 8"):
        bloom_strings(["x"], SECRET, bits=100)


def test_federal_distance_grows_with_gap_then_saturates():
    N, t = 4096, 0.05
    x = np.full((1, 1), 0.5)
    gaps = np.array([0.0, 0.01, 0.03, 0.06, 0.09, 0.2, 0.4])
    fx = federal_numbers(x, SECRET, bits_per_dim=N, t=t, lo=0.0, hi=1.0)
    fy = federal_numbers(0.5 + gaps[:, None], SECRET, bits_per_dim=N, t=t, lo=0.0, hi=1.0)
    d = ham(np.repeat(fx, len(gaps), axis=0), fy)
    expected = 2 * N * np.minimum(gaps, 2 * t) / (1.0 + 2 * t)
    assert d[0] == 0 and (np.diff(d[:5]) > 0).all()
    np.testing.assert_allclose(d, expected, rtol=0.2, atol=15)
    assert abs(d[5] - d[6]) < 0.1 * d[6]  # beyond 2t: saturated


def test_federal_pivots_come_from_the_secret_and_fill_is_even():
    v = np.random.default_rng(0).uniform(0, 1, size=(200, 2))
    a = federal_numbers(v, SECRET, bits_per_dim=512, t=[0.1, 0.2], lo=0, hi=1)
    np.testing.assert_array_equal(a, federal_numbers(v, SECRET, bits_per_dim=512, t=[0.1, 0.2], lo=0, hi=1))
    assert a.shape == (200, 128)
    assert (ham(a, federal_numbers(v, b"other", bits_per_dim=512, t=[0.1, 0.2], lo=0, hi=1)) > 0).all()
    ones = np.unpackbits(a[:, :64], axis=1).sum(axis=1)  # dim 0: expected 512 * 0.2 / 1.2 ~ 85 for all x
    assert abs(ones.mean() - 512 * 0.2 / 1.2) < 5 and ones.std() < 15


def test_federal_bad_inputs_raise():
    ok = dict(bits_per_dim=64, t=0.1, lo=0.0, hi=1.0)
    with pytest.raises(LinkageError, match="NaN"):
        federal_numbers(np.array([[0.1], [np.nan]]), SECRET, **ok)
    with pytest.raises(LinkageError, match="2-D"):
        federal_numbers(np.zeros(3), SECRET, **ok)
    with pytest.raises(LinkageError, match="one value per dimension"):
        federal_numbers(np.zeros((3, 2)), SECRET, **{**ok, "t": [0.1, 0.2, 0.3]})
    with pytest.raises(LinkageError, match="multiple of 8"):
        federal_numbers(np.zeros((3, 2)), SECRET, **{**ok, "bits_per_dim": 10})
    with pytest.raises(LinkageError, match="hi > lo"):
        federal_numbers(np.zeros((3, 2)), SECRET, **{**ok, "lo": 1.0})


def test_federal_params_keeps_topk_below_saturation():
    v = np.random.default_rng(0).uniform(0, 1, size=(3000, 2))
    p = federal_params(v, k=20, bits_per_dim=1024)
    assert p["t"].shape == (2,) and (p["t"] > 0).all() and (p["t"] <= 0.25).all()
    assert p["bits_at_kth"] > 10 and p["bytes_per_record"] == 256
