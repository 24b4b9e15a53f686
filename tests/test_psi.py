"""The entity-id PSI (linkage/psi.py): the intersection equals the one a brute-force join of the
plain ids gives; nothing sent is an id's plain hash; a peer's non-points are refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from linkage.psi import Blinder, PsiError, hash_to_point, matches


def _exchange(label_ids, guest_ids):
    """The label holder's view: for each of its ids the guest's row, as app/entity_aug/id_exchange.py runs it."""
    label, guest = Blinder(), Blinder()
    sent = label.blind(label_ids)  # label holder -> guest
    answer_own, answer_theirs = guest.blind(guest_ids), guest.reblind(sent, "guest's peer")  # guest -> label holder
    return matches(answer_theirs, label.reblind(answer_own, "guest")), sent, answer_own


def test_the_intersection_equals_a_plain_join_of_the_ids():
    rng = np.random.default_rng(3)
    label_ids = [f"id{v}" for v in rng.permutation(300)[:200]]
    guest_ids = [f"id{v}" for v in rng.permutation(300)[:120]]
    got, _, _ = _exchange(label_ids, guest_ids)
    want = np.array([guest_ids.index(i) if i in guest_ids else -1 for i in label_ids])
    assert (want >= 0).sum() > 40 and (want < 0).sum() > 40  # planted: both kinds present
    np.testing.assert_array_equal(got, want)


def test_what_crosses_is_neither_an_ids_hash_nor_the_same_from_one_run_to_the_next():
    ids = ["17", "A7", "a7"]
    _, sent_1, own_1 = _exchange(ids, ids)
    _, sent_2, _ = _exchange(ids, ids)
    plain = {hash_to_point(i) for i in ids}
    assert not plain & {bytes(p) for p in np.concatenate([sent_1, own_1])}
    assert not {bytes(p) for p in sent_1} & {bytes(p) for p in sent_2}  # a fresh secret per exchange
    assert len({bytes(p) for p in sent_1}) == 3  # "A7" and "a7" are different ids


def test_a_peers_non_points_are_refused_naming_it():
    me = Blinder()
    with pytest.raises(PsiError, match=r"guest 'left': blinded ids must be \(n, 32\) uint8"):
        me.reblind(np.zeros((2, 31), np.uint8), "guest 'left'")
    with pytest.raises(PsiError, match=r"guest 'left': blinded ids must be"):
        me.reblind(np.zeros((2, 32), np.float64), "guest 'left'")
    small = np.zeros((2, 32), np.uint8)  # u = 0 (and u = 1 below): points of small order
    small[1, 0] = 1
    with pytest.raises(PsiError, match="guest 'left': blinded id 0 is not a point of large order"):
        me.reblind(small, "guest 'left'")


def test_a_repeated_id_on_the_other_side_is_refused():
    me = Blinder()
    twice = me.blind(["x", "x"])
    with pytest.raises(PsiError, match="repeated id"):
        matches(twice[:1], twice)
