"""Persisting a linkage job as separate files per party: primary.npz, secondary-<party>.npz.

These files are the service's download format too: the primary fetches ``primary.npz``, each
secondary its own ``secondary-<party>.npz``, and training reads them from one folder
(``linkage-dir`` in the run config) or from each party's own copy.
"""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import numpy as np

from linkage.contracts import (
    LinkageError,
    LinkageResult,
    PartyLink,
    PrimaryLinkage,
    SecondaryLinkage,
)


def npz_bytes(**arrays) -> bytes:
    """An uncompressed .npz archive in memory."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def primary_bytes(p: PrimaryLinkage) -> bytes:
    meta = {"job_id": p.job_id, "k": p.k, "tau": p.tau, "metric": p.metric, "layout": p.layout,
            "ids_sha256": p.ids_sha256,
            "parties": sorted(p.links),
            "stats": {q: {"sigma": l.sigma, "sim_mean": l.sim_mean, "sim_std": l.sim_std, "dp_sigma": l.dp_sigma,
                          "radius": l.radius, "composed": l.composed, "recall": l.recall}
                      for q, l in p.links.items()}}
    arrays = {}
    for q, l in p.links.items():
        arrays[f"tokens__{q}"], arrays[f"sims__{q}"] = l.tokens, l.sims
    return npz_bytes(meta=json.dumps(meta), **arrays)


def secondary_bytes(s: SecondaryLinkage) -> bytes:
    return npz_bytes(row_of_token=s.row_of_token, job_id=s.job_id, party=s.party)


def save_job(result: LinkageResult, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / "primary.npz", primary_bytes(result.primary))
    for party, s in result.secondaries.items():
        write_atomic(folder / f"secondary-{party}.npz", secondary_bytes(s))
    return folder


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary name, then rename: a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{threading.get_ident()}")
    tmp.write_bytes(data)
    tmp.replace(path)


def read_primary(source) -> PrimaryLinkage:
    with np.load(source, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        links = {q: PartyLink(z[f"tokens__{q}"], z[f"sims__{q}"], **meta["stats"][q]) for q in meta["parties"]}
    return PrimaryLinkage(meta["job_id"], meta["k"], meta["tau"], links, meta.get("metric", "euclidean"),
                          meta.get("layout", "independent"), meta.get("ids_sha256", ""))


def read_secondary(source, party: str) -> SecondaryLinkage:
    with np.load(source, allow_pickle=False) as z:
        if "party" in z and str(z["party"]) != party:
            raise LinkageError(f"this linkage file is for party {str(z['party'])!r}, not {party!r}")
        return SecondaryLinkage(str(z["job_id"]), party, z["row_of_token"])


PRIVACY = "privacy.json"  # the job's privacy report (linkage.privacy), beside primary.npz


def save_privacy(report: dict | None, folder: Path) -> None:
    """Write the job's privacy report into its folder; None removes a stale one (a report never
    outlives the job it measured)."""
    path = Path(folder) / PRIVACY
    if report is None:
        path.unlink(missing_ok=True)
        return
    write_atomic(path, json.dumps(report, indent=2).encode())


def load_privacy(folder: Path, job_id: str) -> dict | None:
    """The job's privacy report from its folder, or None when there is none; a report of another
    job is refused by name."""
    path = Path(folder) / PRIVACY
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    if report.get("job_id") != job_id:
        raise LinkageError(f"{path} is the privacy report of job {report.get('job_id')!r}, not of this "
                           f"linkage's job {job_id!r}")
    return report


def load_primary(folder: Path) -> PrimaryLinkage:
    path = Path(folder) / "primary.npz"
    if not path.exists():
        raise LinkageError(f"no primary linkage at {path}")
    return read_primary(path)


def load_secondary(folder: Path, party: str) -> SecondaryLinkage:
    path = Path(folder) / f"secondary-{party}.npz"
    if not path.exists():
        raise LinkageError(f"no linkage for party {party!r} at {path}")
    return read_secondary(path, party)
