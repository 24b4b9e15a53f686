"""Attacks of a primary that holds a *register*: a list containing every true identifier of a
secondary (a public register, or the parties' shared encoding key plus such a register) — the
strongest prior the privacy report assumes. Each names, per released token, the register row it
takes for the token's record; a guess with the true identifier is a hit (duplicates included).

- :func:`dictionary_attack` matches each token's released *similarities* (its noisy distances to
  the primary records that link it) against each candidate's true ones.
- :func:`membership_attack` ignores the similarities and matches *which* primary records link the
  token: the attacker computes every record's top-K in the register itself, so each register row
  has the set of primary records it would be linked to; a token's set is nearest (Jaccard) to its
  own record's. Noise on similarities does not touch it; only noise in *which* K are kept
  (release.noisy_choice) or tokens that do not group a record's links can.

Array contracts (m primary records, K links per record, n register rows, T distinct tokens):
  dictionary_attack(link, primary_ids (m, ..), dictionary (n, ..), metric) -> (T,) register rows
  membership_attack(link, primary_ids (m, ..), dictionary (n, ..), metric) -> (T,) register rows
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

from linkage.attacks import Released, identifier_groups, released
from linkage.contracts import PartyLink
from linkage.pairwise import Pairwise
from linkage.release import default_pool, edge_penalty, kept_columns

DICT_LINKS = 64  # distinct links per token a dictionary attack scores its candidates on
DICT_SEEDS = 3  # links whose top-K in the dictionary are a token's candidates
DRAWS = 32  # noisy choices the membership attack simulates per record to estimate what it keeps
OUTSIDE = 1e-6  # the chance the attacker grants a row outside a record's pool (its search may differ)
BLOCK_CELLS = 1 << 15  # pool cells the membership attack holds at a time (~10 arrays of them: a few MB)


def dictionary_attack(
    link: PartyLink,
    primary_ids,
    dictionary,
    metric: str,
    *,
    only=None,
    max_links: int = DICT_LINKS,
    seeds: int = DICT_SEEDS,
    pre: Released | None = None,
) -> np.ndarray:
    """(T,) per released token the dictionary row the attacker names as its record (any metric).

    The attacker holds a dictionary of candidate identifiers (a public register; with the key the
    parties share, the candidates encoded as the parties encode: linkage.encode) and matches each
    token's *similarity profile*: candidates are the top-K dictionary rows of the token's `seeds`
    most similar linked records (where the token's record must be, as it was linked among them),
    and the one whose standardised similarities to up to `max_links` distinct linked records
    (the most similar first) are nearest in squared error to the released ones is named. Without
    noise the true record has error 0; with noise this is the maximum-likelihood candidate. Tokens
    in ascending order, as :class:`TokenGuess`'s."""
    from linkage.search import check_identifiers, search  # lazy: scipy/numba, only when attacked

    r = pre or released(link, primary_ids, only)  # ``pre``: the same (link, ids, only), computed once
    rows, sims, ids, uniq, tok_idx, first = r.rows, r.sims, r.ids, r.uniq, r.tok_idx, r.first
    k = min(link.tokens.shape[1], len(dictionary))
    ids, base = check_identifiers(ids, dictionary, k, "dictionary", metric)  # once: the loop trusts them
    sel = np.flatnonzero(first)
    sel = sel[np.lexsort((-sims[sel].astype(np.float64), tok_idx[sel]))]  # by token, most similar first
    starts = np.searchsorted(tok_idx[sel], np.arange(len(uniq) + 1))
    seed_pairs = [sel[starts[t] : starts[t + 1]][:seeds] for t in range(len(uniq))]  # each (<= seeds,)
    near = search(ids[rows[np.concatenate(seed_pairs)]], base, metric=metric, k=k, party="dictionary")[1]  # one index
    first_seed = np.cumsum([0] + [len(x) for x in seed_pairs])  # token t's seeds: near[first_seed[t]:..[t + 1]]
    scored = [sel[starts[t] : starts[t + 1]][:max_links] for t in range(len(uniq))]  # (L_t,) distinct draws each
    pairwise = Pairwise(metric, ids, base, rows[np.concatenate(scored)], near.ravel())  # only the rows scored
    guess = np.empty(len(uniq), np.int64)
    for t, pairs in enumerate(scored):
        cand = np.unique(near[first_seed[t] : first_seed[t + 1]])  # (C,) the seeds' top-K in the dictionary
        pred = -(pairwise(rows[pairs], cand) + link.sim_mean) / link.sim_std  # (L_t, C) every distance
        guess[t] = cand[np.argmin(((pred - sims[pairs, None]) ** 2).sum(0))]
    return guess


def membership_attack(
    link: PartyLink,
    primary_ids,
    dictionary,
    metric: str,
    *,
    only=None,
    pre: Released | None = None,
    linked_only: bool = False,
) -> np.ndarray:
    """(T,) per released token the register row most likely to have been linked to exactly the
    primary records that link the token.

    The attacker links its own records to the register as the service does: each record's pool
    (its P nearest register rows, P the release's default pool) and, :data:`DRAWS` times with noise
    of its own, the K kept under the release's public selection noise (release.noisy_choice's
    score, sigma = the release's), which estimates p_ic, the chance that record i keeps row c.
    A token linked to the records O_t is named as the row c maximising the log-likelihood
    sum_{i in O_t} log p_ic + sum_{i not in O_t} log(1 - p_ic) (rows outside a record's pool
    have p = :data:`OUTSIDE`), counting records with equal identifiers once (they keep the same K:
    the release's choice is keyed by the pool). Without noise this names every record whose link
    set no other row shares, whatever the noise on the similarities. The universe is the primary records given (a
    release restricted to some tokens' records gives a lower bound on the whole release's).
    Tokens in ascending order."""
    r = pre or released(link, primary_ids, only)
    ids, members = r.ids, r.rows  # (m, ..) the universe, (L,) each pair's record in it
    if linked_only:  # the records that link an attacked token: less work, a weaker attack
        keep, members = np.unique(r.rows, return_inverse=True)
        ids = ids[keep]
    group = identifier_groups(ids)  # (m,) records with equal identifiers keep the same K: one draw
    _, one = np.unique(group, return_index=True)  # (u,) a record of each identifier, by group code
    seen = sparse.csc_matrix((np.ones(len(members)), (r.tok_idx, group[members])), shape=(len(r.uniq), len(one)))
    seen.data[:] = 1.0  # an identifier linking a token from several records is one member
    score, absent = _likelihoods(seen, ids[one], dictionary, metric, link)
    loglik = score.data + absent[score.col]  # less the members' log(1 - p), which the gain's logit holds
    best = np.lexsort((score.col, -loglik, score.row))  # per token: the most likely first, then the lowest row
    first = np.unique(score.row[best], return_index=True)[1]
    guess = np.zeros(len(r.uniq), np.int64)  # every token has a linked record, so every row has a candidate
    guess[score.row[best][first]] = score.col[best][first]
    return guess


def _likelihoods(seen, ids, dictionary, metric: str, link: PartyLink) -> tuple[sparse.coo_matrix, np.ndarray]:
    """(T, n) sum over each token's linked identifiers of logit(p_ic) - logit(OUTSIDE), where
    some has c in its pool, and (n,) sum over every identifier of log(1 - p_ic): ``seen`` (T, u)
    the tokens' linked identifiers ``ids`` (u, ..). The pools a block of BLOCK_CELLS at a time,
    so the attack's memory is bounded whatever the universe (a job's report runs it)."""
    from linkage.search import searcher  # lazy: scipy/numba, only when attacked

    n, k = len(dictionary), link.tokens.shape[1]
    p = min(default_pool(0, k, 1.0, noisy=link.sigma > 0), n)
    find = searcher(dictionary, metric=metric, k=p, party="dictionary")
    rng = np.random.default_rng(0)  # the attacker's own simulation of the choice: it protects no party
    score, absent = sparse.csr_matrix((seen.shape[0], n)), np.zeros(n)
    step = max(1, BLOCK_CELLS // p)
    for lo in range(0, len(ids), step):
        dist, near = find(ids[lo : lo + step])  # (b, P) the pools
        kept = kept_rate(dist, link, k, p < n, rng)  # (b, P) p_ic; the attacker's own draws
        rows = np.repeat(np.arange(len(dist)), p)
        gain = sparse.csr_matrix((_logit(kept).ravel() - _logit(OUTSIDE), (rows, near.ravel())), shape=(len(dist), n))
        absent += np.bincount(near.ravel(), np.log1p(-kept).ravel(), minlength=n)  # every identifier keeps c out
        score = score + seen[:, lo : lo + len(dist)] @ gain  # where some linked identifier has c in its pool
    return score.tocoo(), absent


def kept_rate(dist: np.ndarray, link: PartyLink, k: int, edge: bool, rng: np.random.Generator) -> np.ndarray:
    """(m, P) the share of :data:`DRAWS` noisy choices of K of each pool (m, P) that keep each
    candidate, smoothed into (0, 1): release.noisy_choice with the attacker's own noise."""
    if link.sigma <= 0 or dist.shape[1] <= k:
        return np.full(dist.shape, (DRAWS + 0.5) / (DRAWS + 1.0))  # the K nearest, always
    count = np.zeros(dist.shape)
    penalty = edge_penalty(dist, link.sim_std, link.sigma) if edge else 0.0
    for _ in range(DRAWS):
        noise = link.sigma * rng.standard_normal(dist.shape, np.float32)  # (m, P) the attacker's own draw
        kept = np.zeros(dist.shape)
        np.put_along_axis(kept, kept_columns(dist, noise, link.sim_std, penalty, k), 1.0, axis=1)
        count += kept
    return (count + 0.5) / (DRAWS + 1.0)


def _logit(p) -> np.ndarray:
    p = np.asarray(p, np.float64)
    return np.log(p) - np.log1p(-p)
