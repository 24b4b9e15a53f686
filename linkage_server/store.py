"""Persisting a linkage job as separate files per party: primary.npz, secondary-<party>.npz."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from linkage_server.pipeline import LinkageError, LinkageResult, PrimaryLinkage, SecondaryLinkage


def save_job(result: LinkageResult, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = result.primary
    meta = {"job_id": p.job_id, "k": p.k, "tau": p.tau, "sigma": p.sigma, "sim_mean": p.sim_mean, "sim_std": p.sim_std,
            "parties": sorted(p.tokens)}
    np.savez(folder / "primary.npz", sims=p.sims, meta=json.dumps(meta),
             **{f"tokens__{party}": t for party, t in p.tokens.items()})
    for party, s in result.secondaries.items():
        np.savez(folder / f"secondary-{party}.npz", row_of_token=s.row_of_token, job_id=s.job_id)
    return folder


def load_primary(folder: Path) -> PrimaryLinkage:
    path = folder / "primary.npz"
    if not path.exists():
        raise LinkageError(f"no primary linkage at {path}")
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        tokens = {party: z[f"tokens__{party}"] for party in meta["parties"]}
        return PrimaryLinkage(meta["job_id"], tokens, z["sims"], meta["k"], meta["tau"], meta["sigma"],
                              meta["sim_mean"], meta["sim_std"])


def load_secondary(folder: Path, party: str) -> SecondaryLinkage:
    path = folder / f"secondary-{party}.npz"
    if not path.exists():
        raise LinkageError(f"no linkage for party {party!r} at {path}")
    with np.load(path) as z:
        return SecondaryLinkage(str(z["job_id"]), party, z["row_of_token"])
