"""Attacks on what a linkage job releases to the primary: the paper's greedy attack and the
aggregation attack (trilateration) on coordinates (Euclidean). The attacks of a primary that
holds a register of every secondary identifier are linkage.register_attacks.

The attacker plays the primary with exactly what it holds: one secondary party's
:class:`~linkage.contracts.PartyLink` (tokens, noisy standardised similarities, and the job's
public sim_mean, sim_std and sigma) and its own identifiers. A released similarity is
    s_ij = (-dist_ij - sim_mean) / sim_std + N(0, sigma^2),
so dist_ij = -(sim_std * rho_ij + sim_mean) with rho_ij = E[s_ij]. Ground truth (the
secondary's identifiers) enters only :func:`haversine_m` / :func:`reidentification`, to score.

Array contracts (m primary records, K links per record, d identifier dims, T distinct tokens):
  distances(sims (m, K), link, shrink)       -> (m, K) float64 distance estimates
  greedy_attack(link, primary_ids (m, d), rng) -> TokenGuess: (T,) tokens, (T, d) locations
  aggregation_attack(link, primary_ids (m, d)) -> TokenGuess: (T,) tokens, (T, d) locations
  trilaterate(tok (L,), pts (L, d), dist (L,), start (T, d)) -> (T, d) least-squares points
  linear_start(tok (L,), pts (L, d), dist (L,), T) -> (T, d) closed-form (linearised) points
  best_fit(tok (L,), pts (L, d), dist (L,), start (T, d)) -> (T, d) the better of both starts
  haversine_m(a (T, 2), b (T, 2))             -> (T,) metres between [lat, lon] degree pairs
  reidentification(err_m (T,), radii_m)      -> {"n", "within": {radius: rate}, "median_m"}
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from linkage.contracts import LinkageError, PartyLink, identifier_bytes

# The mean Earth radius (IUGG): haversine on this sphere is within 0.5 % of the ellipsoid's distance
EARTH_RADIUS_M = 6_371_008.8
MIN_LINKS = 3  # distinct links a 2-D trilateration needs (d + 1 in general; the caller may raise it)


@dataclass(frozen=True)
class TokenGuess:
    """One attack's estimate per released token of one secondary party.

    tokens:   (T,) int64 the distinct tokens of the release, ascending.
    location: (T, d) float64 the estimated identifiers of each token's record.
    links:    (T,) int64 released (record, token) pairs per token.
    distinct: (T,) int64 distinct primary identifiers among them: records with equal identifiers
              get equal noise (linkage.noise.record_noise is keyed by them), so this is the
              number of independent noisy distances to the token.
    anchor:   (T,) int64 greedy: the primary record the guess was made from; else -1.
    fallback: (T,) bool aggregation: fewer than min_links distinct links, not trilaterated.
    """

    tokens: np.ndarray
    location: np.ndarray
    links: np.ndarray
    distinct: np.ndarray
    anchor: np.ndarray
    fallback: np.ndarray


def distances(sims: np.ndarray, link: PartyLink, *, shrink: bool) -> np.ndarray:
    """(..) distances estimated from released similarities (..) with the job's public statistics.

    shrink=True: the paper's greedy step 1 (Sec. 5.2, App. A eq. 8), the MAP estimate of the
    standardised distance under a N(0, 1) prior, rho = s / (1 + sigma^2); shrink=False: the
    unbiased rho = s. Then step 2, u = -sim_std * rho - sim_mean."""
    rho = np.asarray(sims, np.float64)
    if shrink:
        rho = rho / (1.0 + link.sigma**2)
    return -(link.sim_std * rho + link.sim_mean)


def _flat_release(link: PartyLink, primary_ids, only=None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The release as pairs: (L,) record row, (L,) token, (L,) similarity; and (m, ..) identifiers.
    only: a subset of tokens to keep (the pairs of every other token are dropped); None = all."""
    ids = np.asarray(primary_ids)
    ids = ids.astype(np.float64) if ids.dtype.kind in "iuf" and ids.dtype != np.uint8 else ids
    if ids.ndim not in (1, 2) or len(ids) != len(link.tokens) or link.tokens.shape != link.sims.shape:
        raise LinkageError(
            f"attack: identifiers {ids.shape} do not fit the release's tokens {link.tokens.shape} "
            f"and similarities {link.sims.shape} (one row per primary record)"
        )
    m, k = link.tokens.shape
    rows, tokens, sims = np.repeat(np.arange(m), k), link.tokens.ravel().astype(np.int64), link.sims.ravel()
    if only is not None:
        keep = np.isin(tokens, np.asarray(only, np.int64))
        rows, tokens, sims = rows[keep], tokens[keep], sims[keep]
    return rows, tokens, sims, ids


def identifier_groups(ids: np.ndarray) -> np.ndarray:
    """(n,) int64: equal codes for rows with equal identifiers (numbers, strings or bit rows)."""
    ids = np.asarray(ids)
    if ids.dtype.kind == "O":  # Python objects: by their canonical bytes (fixed-width strings below compare alike)
        import pandas as pd

        keys = [identifier_bytes(ids[i : i + 1]) for i in range(len(ids))]
        return pd.factorize(pd.Series(keys, dtype=object))[0].astype(np.int64)
    return np.unique(ids.reshape(len(ids), -1), axis=0, return_inverse=True)[1].ravel().astype(np.int64)


@dataclass(frozen=True)
class Released:
    """The release as pairs and its per-token counts, computed once for every attack of a report
    (:func:`released`): rows, tokens, sims (L,), ids (m, ..); uniq (T,), tok_idx (L,), links (T,),
    first (L,), distinct (T,) as :func:`_counts` returns them."""

    rows: np.ndarray
    tokens: np.ndarray
    sims: np.ndarray
    ids: np.ndarray
    uniq: np.ndarray
    tok_idx: np.ndarray
    links: np.ndarray
    first: np.ndarray
    distinct: np.ndarray


def released(link: PartyLink, primary_ids, only=None) -> Released:
    """:func:`_flat_release` and :func:`_counts` in one bundle; pass it as ``pre`` to the attacks
    that read the same release (the sorts over every pair are most of their cost)."""
    rows, tokens, sims, ids = _flat_release(link, primary_ids, only)
    return Released(rows, tokens, sims, ids, *_counts(rows, tokens, ids))


def _counts(rows: np.ndarray, tokens: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, ...]:
    """(T,) tokens, (L,) token index of each pair, (T,) pairs per token, (L,) first-of-a-draw mask,
    (T,) distinct identifiers per token. A draw = one (identifier value, token): repeats of it
    carry the same noise and add nothing."""
    uniq, tok_idx, links = np.unique(tokens, return_inverse=True, return_counts=True)
    group = identifier_groups(ids)  # (m,) one code per identifier value
    key = group[rows] * len(uniq) + tok_idx  # (L,) int64
    first = np.zeros(len(key), bool)
    first[np.unique(key, return_index=True)[1]] = True
    distinct = np.bincount(tok_idx[first], minlength=len(uniq))
    return uniq, tok_idx, links, first, distinct


def _on_sphere(n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """(n, d) directions uniform on the unit sphere (the unit circle for d = 2)."""
    v = rng.standard_normal((n, d))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def greedy_attack(
    link: PartyLink, primary_ids: np.ndarray, rng: np.random.Generator, *, only=None, pre: Released | None = None
) -> TokenGuess:
    """The paper's greedy attacker (Sec. 5.2, App. A) with |Q| = 1, its optimum (eq. 14).

    Per token it uses one (record, token) pair: the one with the largest released similarity,
    i.e. the record the attacker believes nearest. The paper's bound holds for any single pair;
    for a guess on a circle the nearest pair is the attacker's best choice (a circle of radius r
    puts a guess within R of the truth with a chance ~ R / (pi r), so the smallest circle wins).
    Step 1-2: the MAP distance u (``distances(shrink=True)``, clipped at 0); step 3: a point
    drawn uniformly among those at distance u from the record, a circle for 2-D coordinates, in
    the identifiers' own units (the metric the job linked by). ``rng``: the attacker's own."""
    r = pre or released(link, primary_ids, only)  # ``pre``: the same (link, ids, only), computed once
    rows, sims, ids, uniq, tok_idx, links, distinct = r.rows, r.sims, r.ids, r.uniq, r.tok_idx, r.links, r.distinct
    best = most_similar_pair(tok_idx, sims)  # (T,) flat index of each token's most similar pair, in token order
    radius = np.maximum(distances(sims[best], link, shrink=True), 0.0)  # (T,)
    location = ids[rows[best]] + radius[:, None] * _on_sphere(len(uniq), ids.shape[1], rng)
    return TokenGuess(uniq, location, links, distinct, rows[best], np.zeros(len(uniq), bool))


def most_similar_pair(tok_idx: np.ndarray, sims: np.ndarray) -> np.ndarray:
    """(T,) per token index 0..T-1 (each present in ``tok_idx`` (L,)) the flat index of its pair of
    largest similarity, the first on ties: a hash group-by, O(L) (a lexsort of every pair was most
    of the greedy attack's cost)."""
    import pandas as pd

    return pd.Series(np.asarray(sims, np.float64)).groupby(tok_idx, sort=True).idxmax().to_numpy(np.int64)


def aggregation_attack(
    link: PartyLink, primary_ids: np.ndarray, *, min_links: int = MIN_LINKS, only=None, pre: Released | None = None
) -> TokenGuess:
    """Locate every token from all the similarities that share it: trilateration.

    Each distinct draw (identifier value, token) gives an *unbiased* distance (``distances(
    shrink=False)``): d_hat = dist + sim_std * N(0, sigma^2). The MAP shrinkage of the greedy
    attack pulls every distance of a token towards the job's mean distance by the same factor
    1 / (1 + sigma^2), a bias that no number of links averages away; with many draws the data
    outweighs the prior. Every draw has the same variance (sim_std * sigma)^2, so the weight
    1 / variance is equal for all, and least squares over the distinct draws is the maximum-
    likelihood location given which records link to the token. Repeated draws (records with equal
    identifiers share noise) are counted once: weighting them by their multiplicity would
    overweight one noise draw. The fit (:func:`best_fit`) starts from the plain centroid of the
    distinct linked identifiers (the links alone, no similarity) and from the linearised solution
    (:func:`linear_start`) and keeps, per token, the one of lower cost: from the centroid alone a
    token whose linked records lie on one side of it (3 or 4 near-collinear links) often ends in
    the mirror-image local minimum. Tokens with fewer than ``min_links`` distinct links keep the
    centroid (their own record for one link) and are flagged ``fallback``."""
    r = pre or released(link, primary_ids, only)  # ``pre``: the same (link, ids, only), computed once
    rows, sims, ids, uniq, tok_idx, links, first, distinct = (
        r.rows,
        r.sims,
        r.ids,
        r.uniq,
        r.tok_idx,
        r.links,
        r.first,
        r.distinct,
    )
    tok, pts = tok_idx[first], ids[rows[first]]  # (L',) (L', d) one pair per draw
    dist = distances(sims[first], link, shrink=False)  # (L',)
    start = centroids(tok, pts, len(uniq))  # (T, d)
    fallback = distinct < max(min_links, 1)
    keep = ~fallback[tok]
    location = start.copy()
    if keep.any():
        solved = best_fit(tok[keep], pts[keep], dist[keep], start)
        location[~fallback] = solved[~fallback]
    return TokenGuess(uniq, location, links, distinct, np.full(len(uniq), -1), fallback)


def centroids(tok: np.ndarray, pts: np.ndarray, n_tokens: int) -> np.ndarray:
    """(T, d) mean of the points (L, d) of each token tok (L,) in [0, T); 0 for a token without one."""
    count = np.maximum(np.bincount(tok, minlength=n_tokens), 1)
    return np.stack([np.bincount(tok, pts[:, a], n_tokens) for a in range(pts.shape[1])], axis=1) / count[:, None]


def linear_start(tok: np.ndarray, pts: np.ndarray, dist: np.ndarray, n_tokens: int) -> np.ndarray:
    """(T, d) the closed-form least-squares trilateration: |x - p_i|^2 = dist_i^2 less its mean
    over the token's pairs is linear in x, -2 q_i . y = dist_i^2 - mean(dist^2) - |q_i|^2 +
    mean(|q|^2), with q = p - c, y = x - c about the token's centroid c. Exact without noise for
    d + 1 points in general position; a start for :func:`trilaterate` otherwise."""
    c = centroids(tok, pts, n_tokens)  # (T, d)
    q = pts - c[tok]  # (L, d)
    count = np.maximum(np.bincount(tok, minlength=n_tokens), 1)
    q2, d2 = (q * q).sum(1), dist * dist  # (L,) each
    b = d2 - (np.bincount(tok, d2, n_tokens) / count)[tok] - q2 + (np.bincount(tok, q2, n_tokens) / count)[tok]
    d = pts.shape[1]
    ata = np.empty((n_tokens, d, d))
    for a in range(d):
        for c_ in range(a, d):
            ata[:, a, c_] = ata[:, c_, a] = np.bincount(tok, 4.0 * q[:, a] * q[:, c_], n_tokens)
    atb = np.stack([np.bincount(tok, -2.0 * q[:, a] * b, n_tokens) for a in range(d)], axis=1)  # (T, d)
    ridge = 1e-12 * np.maximum(np.trace(ata, axis1=1, axis2=2), 1e-300)[:, None, None] * np.eye(d)
    return c + np.linalg.solve(ata + ridge, atb[..., None])[..., 0]


def best_fit(tok: np.ndarray, pts: np.ndarray, dist: np.ndarray, start: np.ndarray) -> np.ndarray:
    """(T, d) per token the lower-cost of :func:`trilaterate` from ``start`` and from
    :func:`linear_start`."""
    fits = [trilaterate(tok, pts, dist, x0) for x0 in (start, linear_start(tok, pts, dist, len(start)))]
    cost = [_cost(x, tok, pts, dist)[2] for x in fits]  # each (T,)
    return np.where((cost[1] < cost[0])[:, None], fits[1], fits[0])


def _cost(x: np.ndarray, tok: np.ndarray, pts: np.ndarray, dist: np.ndarray) -> tuple[np.ndarray, ...]:
    """Residuals (L,) |x_tok - p| - dist, unit directions (L, d), and each token's cost (T,)."""
    diff = x[tok] - pts  # (L, d)
    r = np.linalg.norm(diff, axis=1)  # (L,)
    unit = diff / np.maximum(r, 1e-300)[:, None]  # at r = 0 the direction is 0: no pull from that point
    res = r - dist
    return res, unit, np.bincount(tok, res * res, len(x))


def trilaterate(
    tok: np.ndarray, pts: np.ndarray, dist: np.ndarray, start: np.ndarray, *, iters: int = 200, tol: float = 1e-13
) -> np.ndarray:
    """(T, d) per token the point x minimising sum over its pairs (|x - p| - dist)^2.

    tok (L,) token index in [0, T), pts (L, d) the linked points, dist (L,) their distances,
    start (T, d). All tokens at once: Levenberg-Marquardt with one damping per token (a d x d
    normal system per token from bincounts), a step kept only where it lowers that token's cost.
    Solved in coordinates centred and scaled on the points, so tol is relative to their spread."""
    shift, scale = pts.mean(axis=0), max(float(np.ptp(pts, axis=0).max()), 1e-300)
    p, dd, x = (pts - shift) / scale, dist / scale, (start - shift) / scale
    n, d = x.shape
    lam = np.full(n, 1e-3)
    res, unit, cost = _cost(x, tok, p, dd)
    for _ in range(iters):
        jtj = np.empty((n, d, d))
        for a in range(d):
            for b in range(a, d):
                jtj[:, a, b] = jtj[:, b, a] = np.bincount(tok, unit[:, a] * unit[:, b], n)
        jtr = np.stack([np.bincount(tok, unit[:, a] * res, n) for a in range(d)], axis=1)  # (T, d)
        damp = jtj + (lam[:, None, None] * (jtj * np.eye(d)) + 1e-12 * np.eye(d))  # (T, d, d)
        step = -np.linalg.solve(damp, jtr[..., None])[..., 0]  # (T, d)
        res_new, unit_new, cost_new = _cost(x + step, tok, p, dd)
        better = cost_new < cost  # (T,)
        x = np.where(better[:, None], x + step, x)
        lam = np.where(better, lam / 10.0, lam * 10.0).clip(1e-12, 1e12)
        take = better[tok]
        res, unit = np.where(take, res_new, res), np.where(take[:, None], unit_new, unit)
        cost = np.where(better, cost_new, cost)
        moved = np.abs(np.where(better[:, None], step, 0.0)).max()
        searching = ~better & (lam < 1e12) & (cost > 0)  # (T,) a rejected step, a smaller one may still help
        if moved < tol and not searching.any():
            break
    return x * scale + shift


# ----------------------------------------------------------------------------- scoring (ground truth)


def haversine_m(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(T,) great-circle metres between (T, 2) [latitude, longitude] points in degrees, on a
    sphere of EARTH_RADIUS_M."""
    la1, lo1, la2, lo2 = (np.radians(np.asarray(v, np.float64)) for v in (a[:, 0], a[:, 1], b[:, 0], b[:, 1]))
    h = np.sin((la2 - la1) / 2) ** 2 + np.cos(la1) * np.cos(la2) * np.sin((lo2 - lo1) / 2) ** 2
    return 2.0 * EARTH_RADIUS_M * np.arcsin(np.sqrt(np.clip(h, 0.0, 1.0)))


def reidentification(err_m: np.ndarray, radii_m) -> dict:
    """How well an attack located the tokens: errors (T,) in metres -> the share within each
    radius (a token counts as re-identified when its estimate lies within the radius of its true
    location) and the median error."""
    err = np.asarray(err_m, np.float64)
    if err.size == 0:
        return {"n": 0, "within": {float(r): float("nan") for r in radii_m}, "median_m": float("nan")}
    return {
        "n": int(err.size),
        "within": {float(r): float((err <= r).mean()) for r in radii_m},
        "median_m": float(np.median(err)),
    }
