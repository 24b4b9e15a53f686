"""Attacks on the linkage release (linkage/attacks.py, issue 19), against planted coordinates
linked by the real pipeline (linkage.pipeline.link): the attacks work without noise, the greedy
one does what the paper specifies, the aggregation one degrades as tau falls, and the attacker
gets nothing but the release and its own identifiers."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

from linkage import attacks
from linkage.attacks import (
    TokenGuess,
    aggregation_attack,
    best_fit,
    distances,
    greedy_attack,
    haversine_m,
    reidentification,
    trilaterate,
)
from linkage.contracts import PartyLink
from linkage.pipeline import link
from linkage.register_attacks import dictionary_attack

SECRET = b"attack-test-secret-0123456789abcdef"


def planted(seed: int, m: int, n: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """(m, 2) primary and (n, 2) secondary points uniform on a square of side scale."""
    rng = np.random.default_rng(seed)
    return rng.uniform(0, scale, (m, 2)), rng.uniform(0, scale, (n, 2))


def released(primary: np.ndarray, secondary: np.ndarray, k: int, tau: float) -> tuple[PartyLink, np.ndarray]:
    """The primary's view of a real job, and (n, 2) the true location of each token (scoring only)."""
    result = link(primary, {"s": secondary}, k=k, tau=tau, secret=SECRET)
    return result.primary.links["s"], secondary[result.secondaries["s"].row_of_token]


def errors(guess: TokenGuess, truth_of_token: np.ndarray) -> np.ndarray:
    return np.linalg.norm(guess.location - truth_of_token[guess.tokens], axis=1)  # (T,)


def test_trilateration_recovers_planted_locations_without_noise():
    primary, secondary = planted(0, 300, 40, 1.0)
    party_link, truth = released(primary, secondary, k=8, tau=1.0)
    guess = aggregation_attack(party_link, primary)
    solved = ~guess.fallback
    assert solved.sum() >= 35 and (guess.distinct[solved] >= 3).all()
    assert errors(guess, truth)[solved].max() < 1e-6
    assert guess.links.sum() == party_link.tokens.size


def test_three_links_on_one_side_do_not_end_in_the_mirror_image():
    rng = np.random.default_rng(0)
    n = 100
    pts = rng.uniform(0, 1, (n, 3, 2)) * [1.0, 0.1]  # per token 3 points near the line y = 0
    truth = np.stack([rng.uniform(0, 1, n), rng.uniform(0.3, 2, n)], axis=1)  # (n, 2) above it
    tok = np.repeat(np.arange(n), 3)
    flat = pts.reshape(-1, 2)
    dist = np.linalg.norm(flat - truth[tok], axis=1)
    centroid = pts.mean(axis=1)
    from_centroid = np.linalg.norm(trilaterate(tok, flat, dist, centroid) - truth, axis=1)
    assert (from_centroid > 0.1).sum() >= 20  # the centroid start alone often lands on the mirror image
    assert np.linalg.norm(best_fit(tok, flat, dist, centroid) - truth, axis=1).max() < 1e-6


def test_repeated_identifiers_count_as_one_draw():
    primary, secondary = planted(2, 120, 20, 1000.0)
    more = np.vstack([primary, primary[:40], primary[:40]])  # 40 records thrice: equal identifiers, equal noise
    once_link, _ = released(primary, secondary, k=5, tau=0.5)
    more_link, _ = released(more, secondary, k=5, tau=0.5)
    assert more_link.sigma > 0 and (more_link.sims[120:160] == more_link.sims[:40]).all()
    once, repeated = aggregation_attack(once_link, primary), aggregation_attack(more_link, more)
    assert (repeated.distinct == once.distinct).all() and repeated.links.sum() == once.links.sum() + 80 * 5
    assert np.allclose(repeated.location, once.location, rtol=0, atol=1e-4)  # repeats add nothing (1e-7 of the side)


def test_fallback_tokens_are_flagged_and_kept_at_their_links():
    primary, secondary = planted(3, 60, 30, 1.0)
    party_link, _ = released(primary, secondary, k=2, tau=1.0)
    guess = aggregation_attack(party_link, primary)
    few = guess.distinct < 3
    assert few.any() and (guess.fallback == few).all()
    one = np.flatnonzero(guess.distinct == 1)
    for t in one:  # one link: the record itself (the centroid of one point)
        row = np.flatnonzero((party_link.tokens == guess.tokens[t]).any(axis=1))[0]
        assert np.allclose(guess.location[t], primary[row])


def test_greedy_guess_lies_at_the_true_distance_and_locates_far_worse():
    primary, secondary = planted(0, 300, 40, 1.0)
    party_link, truth = released(primary, secondary, k=8, tau=1.0)
    greedy = greedy_attack(party_link, primary, np.random.default_rng(1))
    anchor = primary[greedy.anchor]  # (T, 2) the record each guess was made from
    true_r = np.linalg.norm(truth[greedy.tokens] - anchor, axis=1)
    assert np.abs(np.linalg.norm(greedy.location - anchor, axis=1) - true_r).max() < 1e-7
    # the pair used is the token's nearest linked record (the largest similarity)
    for t in range(len(greedy.tokens)):
        rows = np.flatnonzero((party_link.tokens == greedy.tokens[t]).any(axis=1))
        assert true_r[t] == pytest.approx(np.linalg.norm(primary[rows] - truth[greedy.tokens[t]], axis=1).min())
    radius = 0.005
    greedy_rate = (errors(greedy, truth) <= radius).mean()
    aggregation_rate = (errors(aggregation_attack(party_link, primary), truth) <= radius).mean()
    assert aggregation_rate == 1.0 and greedy_rate <= 0.25


def test_greedy_uses_the_map_distance_under_noise():
    primary, secondary = planted(1, 200, 30, 1000.0)
    party_link, _ = released(primary, secondary, k=6, tau=0.5)
    assert party_link.sigma > 0
    greedy = greedy_attack(party_link, primary, np.random.default_rng(0))
    best = np.array([party_link.sims[party_link.tokens == t].max() for t in greedy.tokens], np.float64)  # (T,)
    want = np.maximum(-(party_link.sim_std * best / (1 + party_link.sigma**2) + party_link.sim_mean), 0)
    got = np.linalg.norm(greedy.location - primary[greedy.anchor], axis=1)
    assert np.allclose(got, want, rtol=1e-9, atol=1e-9)
    assert np.allclose(want, np.maximum(distances(best, party_link, shrink=True), 0))


def test_aggregation_error_grows_as_tau_falls():
    primary, secondary = planted(1, 400, 40, 1000.0)
    medians = []
    for tau in (1.0, 0.9, 0.5, 0.1, 0.03):
        party_link, truth = released(primary, secondary, k=10, tau=tau)
        guess = aggregation_attack(party_link, primary)
        medians.append(float(np.median(errors(guess, truth)[~guess.fallback])))
    assert medians[0] < 1e-4  # float32 similarities on a 1000-wide square
    assert all(b > 1.5 * a for a, b in zip(medians, medians[1:])), medians


def test_the_attacker_is_given_only_the_release_and_its_identifiers():
    assert [f.name for f in dataclasses.fields(PartyLink)] == [
        "tokens",
        "sims",
        "sigma",
        "sim_mean",
        "sim_std",
        "dp_sigma",
        "radius",
        "composed",
        "recall",
    ]  # no row map
    # ``pre``: linkage.attacks.released(link, primary_ids, only), the same release prepared once
    assert list(inspect.signature(greedy_attack).parameters) == ["link", "primary_ids", "rng", "only", "pre"]
    assert list(inspect.signature(aggregation_attack).parameters) == ["link", "primary_ids", "min_links", "only", "pre"]
    assert list(inspect.signature(attacks.released).parameters) == ["link", "primary_ids", "only"]
    # the dictionary attack adds the attacker's own prior: a register of candidate identifiers
    assert list(inspect.signature(dictionary_attack).parameters) == [
        "link",
        "primary_ids",
        "dictionary",
        "metric",
        "only",
        "max_links",
        "seeds",
        "pre",
    ]
    # tokens are opaque: renaming them (another permutation of the secondary's rows) renames the guesses
    primary, secondary = planted(4, 200, 30, 1.0)
    party_link, _ = released(primary, secondary, k=6, tau=1.0)
    rename = np.random.default_rng(5).permutation(len(secondary))
    other = dataclasses.replace(party_link, tokens=rename[party_link.tokens])
    a, b = aggregation_attack(party_link, primary), aggregation_attack(other, primary)
    order = np.argsort(rename[a.tokens])  # b's tokens are a's renamed, ascending
    assert (b.tokens == rename[a.tokens][order]).all()
    assert np.allclose(b.location, a.location[order], rtol=0, atol=1e-12)
    a, b = (greedy_attack(lk, primary, np.random.default_rng(0)) for lk in (party_link, other))
    assert (b.anchor == a.anchor[order]).all()  # the same pair; the direction is the attacker's own draw
    radius = [np.linalg.norm(g.location - primary[g.anchor], axis=1) for g in (a, b)]
    assert np.allclose(radius[1], radius[0][order], rtol=0, atol=1e-12)


def test_scoring_in_metres():
    a = np.array([[1.0, 103.8], [-37.8, 145.0]])
    north = a + [1.0, 0.0]  # one degree of latitude: pi R / 180
    assert haversine_m(a, north) == pytest.approx(np.full(2, np.pi * 6_371_008.8 / 180.0))
    east = a + [0.0, 0.001]  # equirectangular: R cos(lat) * 0.001 deg, within 1e-6 at this size
    assert haversine_m(a, east) == pytest.approx(
        np.pi * 6_371_008.8 / 180 * 0.001 * np.cos(np.radians(a[:, 0])), rel=1e-6
    )
    score = reidentification(np.array([10.0, 60.0, 200.0, 900.0]), (50, 100, 500))
    assert score == {"n": 4, "within": {50.0: 0.25, 100.0: 0.5, 500.0: 0.75}, "median_m": 130.0}


def test_a_release_prepared_once_gives_every_attack_the_same_answer():
    """The report prepares the release once for its four attacks (issue 29: the sorts over every
    pair were most of the report's cost); each attack's answer is the one it computes alone."""
    primary, secondary = planted(4, 300, 40, 1.0)
    party_link, _ = released(primary, secondary, k=6, tau=1.0)
    only = np.arange(0, 40, 3)
    pre = attacks.released(party_link, primary, only)
    for alone, shared in [
        (
            aggregation_attack(party_link, primary, only=only),
            aggregation_attack(party_link, primary, only=only, pre=pre),
        ),
        (
            greedy_attack(party_link, primary, np.random.default_rng(1), only=only),
            greedy_attack(party_link, primary, np.random.default_rng(1), only=only, pre=pre),
        ),
    ]:
        assert np.array_equal(alone.tokens, shared.tokens) and np.array_equal(alone.location, shared.location)
    assert np.array_equal(
        dictionary_attack(party_link, primary, secondary, "euclidean", only=only),
        dictionary_attack(party_link, primary, secondary, "euclidean", only=only, pre=pre),
    )
