"""What each role sees of a job's status (``GET /jobs/{job}``): only what it needs.

  primary    state, progress, error, the parameters it set, the party names (training reads
             their tokens), which parties have uploaded, its own upload summary and training
             rows, timings, the per-party statistics training uses (sigma, sim_mean, ...), and
             the records and queries its queries used (linkage_server.queries)
  secondary  state, the job's parameters (not the chain's anchor), its own upload summary; no
             progress counts (chunks x searched secondaries: they would tell how many other
             secondaries the job has); of a failure only that it failed (its text may name other
             parties or sizes)
  admin      the job's metadata, every upload summary included
No view holds a secret, a secret's hash or a seed.
"""

from __future__ import annotations

import copy

from linkage.privacy import secondary_view

ROLES = ("primary", "secondary", "admin")
HIDDEN_FAILURE = "the job failed (the primary or the service's operator can see why)"


def _safe(obj):
    """A deep copy without any key that names a secret or a seed."""
    if isinstance(obj, dict):
        return {k: _safe(v) for k, v in obj.items() if "secret" not in k and "seed" not in k}
    return copy.deepcopy(obj)


def _common(meta: dict, role: str, party: str | None) -> dict:
    return {
        "job": meta["job"],
        "role": role,
        "party": party,
        "state": meta["state"],
        "progress": meta["progress"],
        "error": meta["error"],
        "params": meta["params"],
        "uploads": {party: meta["uploads"][party]} if party in meta["uploads"] else {},
    }


def status_view(meta: dict, role: str, party: str | None = None) -> dict:
    """The status `role` (as `party`; None for the admin) may see."""
    if role == "admin":
        return _safe(meta) | {"role": "admin", "party": None}
    if role == "primary":
        return _safe(
            _common(meta, role, party)
            | {
                "primary": meta["primary"],
                "secondaries": meta["secondaries"],
                "duplicates": meta["duplicates"],
                "uploaded": sorted(meta["uploads"]),
                "train_rows": meta.get("train_rows"),
                "seconds": meta["seconds"],
                "stats": meta.get("stats"),
                "queried": meta.get("queried"),
                "privacy": meta.get("privacy"),
            }
        )
    if role == "secondary":  # a failure's text may name other parties or sizes: only that it failed
        view = _safe(_common(meta, role, party))
        view["privacy"] = secondary_view(meta.get("privacy"), party)
        view["error"] = view["error"] and HIDDEN_FAILURE
        view["progress"] = {}  # its total counts the searched secondaries: another party's business
        if view["params"]:
            view["params"] = {k: v for k, v in view["params"].items() if k != "anchor"}  # another party's name
        return view
    raise ValueError(f"unknown role {role!r}; known: {ROLES}")
