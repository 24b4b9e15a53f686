"""Party-side privacy encodings: identifiers -> packed bit vectors (np.packbits rows, uint8).

Each party runs this module locally on its own identifiers; the linkage service only ever receives
the bits and compares them by Hamming distance (:mod:`linkage.hamming`).

  bloom_strings(strings (n,), secret)                      -> (n, bits // 8) uint8    q-gram Bloom filters
  federal_numbers(values (n, d), secret, bits_per_dim, t)  -> (n, d * bits_per_dim // 8) uint8
  federal_params(values (n, d), k)                         -> dict(t, lo, hi, bits_per_dim, ...) to agree on
  federal_key(values (n, d), k)                            -> the "federal" section of a parties' key (lists)
  encode_with_key(ids (n,) | (n, c) str | (n, d) float, key) -> (n, bytes) uint8, Bloom or FEDERAL by the ids' type
                                                             (c string columns: one filter of the joined row)
  key_fingerprint(key)                                     -> 64 hex: the key and its parameters, revealing neither

Privacy assumptions (honest-but-curious service, as in FEDERAL, FedSim App. I):
  * ``secret`` is shared by the data parties (primary and secondaries) and never by the service.
    Bloom filter bit positions are keyed: HMAC-SHA256(secret, q-gram), so the service cannot hash a
    dictionary of likely q-grams/names and match them against the filters. The numeric pivots are drawn
    from a generator seeded by HMAC(secret, ...), so the service does not know which interval a bit
    stands for.
  * What still leaks to the service, by design: the Hamming distance between any two filters, i.e. an
    estimate of the q-gram set similarity of two strings (or of the clipped L1 distance of two numbers),
    and the number of ones of each filter (roughly the number of distinct q-grams, i.e. string length).
    Frequent strings give identical filters, so frequency analysis on exact duplicates stays possible,
    and a known plaintext (a record the service knows) locates its neighbours. Numeric filters have the
    same expected number of ones for every value in [lo, hi] (pivots also cover [lo - t, hi + t]), the
    FEDERAL indistinguishability property; values outside [lo, hi] get fewer ones.
  * The parties must use the same secret and parameters (q, bits, hashes / bits_per_dim, t, lo, hi);
    parameters are not secret but are best exchanged among the parties, not through the service.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from typing import Sequence

import numpy as np

from linkage.contracts import LinkageError


def _check_secret(secret: bytes) -> None:
    if not isinstance(secret, (bytes, bytearray)) or len(secret) == 0:
        raise LinkageError(f"secret must be non-empty bytes shared by the parties; got {type(secret).__name__}")


# ----------------------------------------------------------------------------- strings


def bloom_strings(
    strings: Sequence[str],
    secret: bytes,
    *,
    bits: int = 1024,
    q: int = 2,
    hashes: int = 30,
    normalize: bool = True,
    chunk: int = 65536,
) -> np.ndarray:
    """Keyed q-gram Bloom filters: (n,) strings -> (n, bits // 8) uint8, np.packbits order.

    Each string is (optionally) case-folded with runs of whitespace collapsed, padded with q - 1 '_' on
    both ends (so a 1-character string still has q-grams and first/last characters weigh as much as
    inner ones), split into its set of q-grams, and each q-gram sets ``hashes`` bits at
    (h1 + i * h2) mod bits, i < hashes, with h1, h2 taken from HMAC-SHA256(secret, q-gram).

    Defaults: bits = 1024 (128 B per record, the size the Hamming top-K kernel is tuned for), q = 2
    (bigrams: robust to typos in short names; trigrams give too few q-grams for 10-20 character titles),
    hashes = 30: a typical game title (median 15-16 characters -> ~16 distinct padded bigrams) fills
    1 - exp(-30 * 16 / 1024) ~ 37% of the bits; 25-character strings fill ~50%. Fill near 1/3-1/2
    keeps the filters informative (Hamming distance ~ twice the number of differing q-grams x hashes)
    without saturating on long strings.
    Cost: every distinct q-gram is hashed once; bits are set with numpy (~1-2 s per 100k titles).
    """
    _check_secret(secret)
    if bits <= 0 or bits % 8:
        raise LinkageError(f"bits must be a positive multiple of 8; got {bits}")
    if q < 1 or hashes < 1:
        raise LinkageError(f"q and hashes must be >= 1; got q={q}, hashes={hashes}")
    strings = list(strings)
    pad = "_" * (q - 1)
    vocab: dict[str, int] = {}  # q-gram -> id
    ids: list[int] = []  # q-gram id of each (record, q-gram) pair
    counts = np.empty(len(strings), np.int64)  # distinct q-grams per record
    for r, s in enumerate(strings):
        if not isinstance(s, str):
            raise LinkageError(f"string identifiers only: row {r} is {type(s).__name__} ({s!r})")
        s = pad + (" ".join(s.casefold().split()) if normalize else s) + pad
        grams = {s[i : i + q] for i in range(len(s) - q + 1)}
        ids.extend(vocab.setdefault(g, len(vocab)) for g in grams)
        counts[r] = len(grams)

    # positions (V, hashes) of each distinct q-gram, by double hashing of its HMAC
    digests = b"".join(hmac.digest(secret, g.encode("utf-8"), hashlib.sha256) for g in vocab)
    h = np.frombuffer(digests, dtype="<u8").reshape(len(vocab), 4)  # (V, 4) 64-bit words of each digest
    h1, h2 = h[:, 0] % bits, (h[:, 1] % bits) | 1  # odd stride: distinct positions when bits is a power of 2
    pos = (h1[:, None] + np.arange(hashes, dtype=np.uint64)[None, :] * h2[:, None]) % np.uint64(bits)

    ids_arr = np.asarray(ids, dtype=np.int64)  # (G,)
    rows = np.repeat(np.arange(len(strings)), counts)  # (G,) record of each q-gram
    starts = np.concatenate([[0], np.cumsum(counts)])
    out = np.empty((len(strings), bits // 8), np.uint8)
    for r0 in range(0, len(strings), chunk):  # bound the (chunk, bits) bool scratch
        r1 = min(len(strings), r0 + chunk)
        g0, g1 = starts[r0], starts[r1]
        flat = np.zeros((r1 - r0) * bits, bool)
        flat[((rows[g0:g1] - r0) * bits)[:, None] + pos[ids_arr[g0:g1]].astype(np.int64)] = True
        out[r0:r1] = np.packbits(flat.reshape(r1 - r0, bits), axis=1)
    return out


# ----------------------------------------------------------------------------- numbers


def _per_dim(x, d: int, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim > 1 or (arr.ndim == 1 and len(arr) != d):
        raise LinkageError(f"{name} must be a scalar or one value per dimension ({d}); got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise LinkageError(f"{name} must be finite; got {arr.tolist()}")
    return np.broadcast_to(arr, (d,)).copy()


def federal_numbers(
    values: np.ndarray,
    secret: bytes,
    *,
    bits_per_dim: int,
    t: float | Sequence[float],
    lo: float | Sequence[float],
    hi: float | Sequence[float],
    chunk: int = 16384,
) -> np.ndarray:
    """FEDERAL interval encoding (FedSim App. I): values (n, d) -> (n, d * bits_per_dim // 8) uint8.

    Per dimension, N = bits_per_dim pivots r_i ~ U[lo - t, hi + t] come from a generator seeded by the
    shared secret (every party derives the same pivots); bit i = 1 iff |x - r_i| <= t. For x, y in
    [lo, hi] every filter has ~N * 2t / (hi - lo + 2t) ones, and per dimension
        E[Hamming(x, y)] = 2N * min(|x - y|, 2t) / (hi - lo + 2t),
    an L1 distance that saturates at |x - y| = 2t. Resolution is 2N / (hi - lo + 2t) bits per unit; pick
    t above the distances that matter for the top-K (see :func:`federal_params`). The reference code's
    N = ceil(2 * range * ln(1/delta) / (t * eps^2)) runs to MBs per record; N = 1024 per dimension
    (128 B) already gives the fill-concentration property (std of the number of ones ~ sqrt(N p)).
    """
    _check_secret(secret)
    values = np.asarray(values)
    if values.ndim != 2 or values.dtype.kind not in "fiu":
        raise LinkageError(
            f"numeric identifiers must be a 2-D numeric array (rows, dims); "
            f"got dtype {values.dtype} with shape {values.shape}"
        )
    bad = ~np.isfinite(values).all(axis=1)
    if bad.any():
        raise LinkageError(
            f"{int(bad.sum())} identifier row(s) are NaN/inf (first: {np.flatnonzero(bad)[:5].tolist()})"
        )
    if bits_per_dim <= 0 or bits_per_dim % 8:
        raise LinkageError(f"bits_per_dim must be a positive multiple of 8; got {bits_per_dim}")
    n, d = values.shape
    t, lo, hi = _per_dim(t, d, "t"), _per_dim(lo, d, "lo"), _per_dim(hi, d, "hi")
    if (t <= 0).any() or (hi <= lo).any():
        raise LinkageError(
            f"need t > 0 and hi > lo per dimension; got t={t.tolist()}, lo={lo.tolist()}, hi={hi.tolist()}"
        )

    seed = int.from_bytes(hmac.digest(secret, b"federal-pivots/%d/%d" % (d, bits_per_dim), hashlib.sha256), "big")
    rng = np.random.default_rng(seed)
    pivots = rng.uniform(lo - t, hi + t, size=(bits_per_dim, d)).T  # (d, N)
    out = np.empty((n, d * bits_per_dim // 8), np.uint8)
    for r0 in range(0, n, chunk):
        x = values[r0 : r0 + chunk, :, None].astype(np.float64)  # (c, d, 1)
        hit = np.abs(x - pivots[None]) <= t[None, :, None]  # (c, d, N)
        out[r0 : r0 + chunk] = np.packbits(hit.reshape(len(x), -1), axis=1)
    return out


def federal_params(
    values: np.ndarray,
    *,
    k: int = 100,
    bits_per_dim: int = 1024,
    t_mult: float = 4.0,
    lo=None,
    hi=None,
    sample: int = 5000,
    seed: int = 0,
) -> dict:
    """Suggest FEDERAL parameters from one party's own values (n, d), e.g. the secondary party's.

    t = t_mult x the median per-dimension offset |x_j - y_j| of the k-th nearest neighbour (Euclidean,
    on a sample of rows), capped at (hi - lo) / 4 so filters stay <= ~1/3 full: distances inside the
    top-K range stay below the 2t saturation point. lo/hi default to the values' min/max: the parties
    should agree on public bounds (e.g. a city's bounding box) and on the returned t.
    Also returns ``bits_at_kth``: the expected Hamming distance (summed over dims) at the median k-th
    neighbour; below ~10 bits the top-K is dominated by ties and noise: raise bits_per_dim.
    """
    from scipy.spatial import cKDTree

    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or len(values) <= k or not np.isfinite(values).all():
        raise LinkageError(f"federal_params needs finite values (n, d) with n > k={k}; got shape {values.shape}")
    lo = values.min(axis=0) if lo is None else _per_dim(lo, values.shape[1], "lo")
    hi = values.max(axis=0) if hi is None else _per_dim(hi, values.shape[1], "hi")
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(values), size=min(sample, len(values)), replace=False)
    _, nn = cKDTree(values).query(values[rows], k=k + 1)  # (s, k+1), column 0 is the row itself
    off = np.abs(values[nn[:, -1]] - values[rows])  # (s, d) per-dim offset of the k-th neighbour
    t = np.minimum(t_mult * np.median(off, axis=0), (hi - lo) / 4)
    t = np.maximum(t, 1e-12 * np.maximum(hi - lo, 1.0))
    bits_at_kth = float(np.sum(2 * bits_per_dim * np.median(off, axis=0) / (hi - lo + 2 * t)))
    return dict(
        t=t,
        lo=lo,
        hi=hi,
        bits_per_dim=bits_per_dim,
        bits_at_kth=bits_at_kth,
        fill=(2 * t / (hi - lo + 2 * t)).tolist(),
        bytes_per_record=math.ceil(values.shape[1] * bits_per_dim / 8),
    )


# ----------------------------------------------------------------------------- the parties' key


def federal_key(values: np.ndarray, *, k: int = 100, bits_per_dim: int = 1024, lo=None, hi=None) -> dict:
    """The "federal" section of the parties' key (JSON-ready lists) from one party's numbers (n, d),
    plus ``bits_at_kth`` (see federal_params) for the caller to report."""
    p = federal_params(values, k=k, bits_per_dim=bits_per_dim, lo=lo, hi=hi)
    section = {
        "bits_per_dim": p["bits_per_dim"],
        "t": np.asarray(p["t"]).tolist(),
        "lo": np.asarray(p["lo"]).tolist(),
        "hi": np.asarray(p["hi"]).tolist(),
    }
    return {**section, "bits_at_kth": p["bits_at_kth"], "bytes_per_record": p["bytes_per_record"]}


def encode_with_key(ids: np.ndarray, key: dict) -> np.ndarray:
    """What each party runs before uploading: its identifiers -> packed bits with the parties' key
    ``{"secret": str | bytes, "bloom": {...} (optional), "federal": {bits_per_dim, t, lo, hi}}``.
    Strings get keyed q-gram Bloom filters (several columns: one filter of each row's columns
    joined with a space, as plaintext linkage reads them; on FEBRL4 it found more true links at
    rank 1 than one filter per column, docs/benchmarks.md "String scorers"), numbers (n, d)
    FEDERAL interval filters."""
    secret = key["secret"].encode() if isinstance(key["secret"], str) else key["secret"]
    if ids.dtype.kind in "UO":  # several columns (n, c): one filter of each row's columns joined with a space
        from linkage.scorers import joined  # lazy: rapidfuzz, for strings only (app/ imports this module per message)

        return bloom_strings(joined(ids), secret, **key.get("bloom", {}))
    f = key.get("federal")
    if not f:
        raise LinkageError(
            "the parties' key has no 'federal' section, which numeric identifiers need "
            "(make one with federal_key / `python -m linkage_server.cli make-key --csv`)"
        )
    return federal_numbers(ids, secret, **{n: f[n] for n in ("bits_per_dim", "t", "lo", "hi")})


BLOOM_DEFAULTS = {"bits": 1024, "q": 2, "hashes": 30, "normalize": True}  # bloom_strings' defaults


def key_fingerprint(key: dict) -> str:
    """HMAC-SHA256 under the parties' secret of a fixed label and the encoding parameters (Bloom
    with its defaults filled in, FEDERAL's bits_per_dim, t, lo, hi): two encodings share it iff
    they come from the same secret and parameters. It reveals neither the secret nor the
    parameters, so a party may send it to the service, which checks that a query was encoded
    as the job's training upload was."""
    secret = key["secret"].encode() if isinstance(key["secret"], str) else key["secret"]
    _check_secret(secret)
    bloom = {**BLOOM_DEFAULTS, **{n: v for n, v in key.get("bloom", {}).items() if n in BLOOM_DEFAULTS}}
    f = key.get("federal")
    federal = {n: np.asarray(f[n], dtype=np.float64).tolist() for n in ("bits_per_dim", "t", "lo", "hi")} if f else None
    params = json.dumps({"bloom": bloom, "federal": federal}, sort_keys=True)
    return hmac.new(secret, b"fedsim-linkage-encoding-fingerprint|" + params.encode(), hashlib.sha256).hexdigest()
