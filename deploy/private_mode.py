"""A local deployment's private mode (`fedsim deploy link --private`): the parties agree on one
encoding key, which the linkage service never sees, and every party uploads its identifiers as
keyed Bloom filters (strings) or FEDERAL interval filters (numbers); the service links them by
Hamming distance and checks each later query's key fingerprint against the uploads.

The local tool plays every party, so it writes the key into each party's own folder (0600 from
its first byte); across organisations one party makes it (`fedsim make-key`) and hands it over out
of band. FEDERAL's parameters come from the identifiers as the simulation's private mode draws
them (app.vfl.linking.parties_key), the secret from the OS's CSPRNG."""

from __future__ import annotations

import json
import secrets

import numpy as np

from deploy.deployment import PRIMARY, Deployment
from files.private import create_secret
from linkage.binding import identifier_digest
from linkage.encode import encode_with_key, key_fingerprint

KEY = "parties.key"  # in each party's own folder, beside its linkage secret


def make_key(dep: Deployment, ds, metric: str, k: int) -> dict:
    """A fresh parties' key for ``ds``'s identifiers, written to every party's folder."""
    from app.vfl.linking import parties_key  # lazy: torch and flwr, for a private link only

    ids = {p: ds.secondaries[p].identifiers for p in dep.parties}
    key = parties_key(ds.primary.identifiers, ids, metric, k, secrets.token_urlsafe(32))  # the parties' own secret
    if "federal" in key:
        key["federal"] = {n: _plain(key["federal"][n]) for n in ("bits_per_dim", "t", "lo", "hi")}
    for party in (PRIMARY, *dep.parties):
        path = dep.party_dir(party) / KEY
        path.unlink(missing_ok=True)  # a new link, a new key (create_secret never overwrites)
        create_secret(path, json.dumps(key), "key")
    return key


def party_key(dep: Deployment, party: str) -> dict | None:
    """The parties' key as ``party`` holds it, or None (the deployment links raw identifiers)."""
    path = dep.party_dir(party) / KEY
    return json.loads(path.read_text()) if path.exists() else None


def as_uploaded(key: dict | None, ids: np.ndarray) -> tuple[np.ndarray, str, str]:
    """(what leaves the party, the raw identifiers' digest for the binding, the key's fingerprint):
    raw identifiers as they are (""s), or encoded with the key."""
    if key is None:
        return ids, "", ""
    return encode_with_key(ids, key), identifier_digest(ids), key_fingerprint(key)


def forget_key(dep: Deployment) -> None:
    """A raw link: no party keeps a key of an earlier private link (predict would encode with it)."""
    for party in (PRIMARY, *dep.parties):
        (dep.party_dir(party) / KEY).unlink(missing_ok=True)


def _plain(value):
    return value.tolist() if isinstance(value, np.ndarray) else value
