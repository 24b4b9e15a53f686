"""Binding a fetched linkage to the run that trains on it: job id + digests of the primary's identifiers.

Three facts, each written by a different party, must agree before a run uses ``linkage-dir``:

1. primary.npz (written by the service) names its job and carries ``ids_sha256``, the digest of
   the primary identifiers the service linked (:func:`identifier_digest` of the upload).
2. ``upload-record.json`` (written by the primary's own client when it fetches primary.npz)
   names the job it uploaded to, the digest of what it uploaded, and ``raw_sha256``: the digest
   of the raw identifiers it encoded them from (the same digest when it uploaded raw ones). The
   record never leaves the primary's disk.
3. The run's own primary identifiers (rows in the run's order, after any n-rows subsampling).

Each secondary checks its own file's job id against the job the primary announces in hello.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from files.atomic import write_atomic
from linkage.contracts import LinkageError, LinkageResult, PrimaryLinkage, identifier_bytes

RECORD = "upload-record.json"


def identifier_digest(ids) -> str:
    """SHA-256 (hex) of one party's identifiers: their shape and canonical bytes (numbers as
    float64, strings joined, packed bits as they are), so int and float copies agree."""
    arr = np.asarray(ids)
    h = hashlib.sha256(f"{list(arr.shape)}|".encode())
    h.update(identifier_bytes(arr))
    return h.hexdigest()


def bind_result(result: LinkageResult, primary_ids) -> LinkageResult:
    """The result with the digest of the primary identifiers it was linked from."""
    primary = dataclasses.replace(result.primary, ids_sha256=identifier_digest(primary_ids))
    return dataclasses.replace(result, primary=primary)


@dataclass(frozen=True)
class UploadRecord:
    """What the primary uploaded to a job, kept beside the primary.npz it fetched."""

    job_id: str
    party: str
    ids_sha256: str  # the identifiers sent to the service (encoded in private mode)
    raw_sha256: str  # the raw identifiers they were encoded from (= ids_sha256 when sent raw)
    rows: int


def upload_record(job_id: str, party: str, uploaded, raw_sha256: str = "") -> UploadRecord:
    """The record of an upload; ``raw_sha256`` "" = the uploaded identifiers are the raw ones."""
    sent = identifier_digest(uploaded)
    return UploadRecord(job_id, party, sent, raw_sha256 or sent, len(uploaded))


def write_record(folder: Path, record: UploadRecord) -> Path:
    path = Path(folder) / RECORD
    write_atomic(path, json.dumps(dataclasses.asdict(record), indent=1).encode())
    return path


def read_record(folder: Path) -> UploadRecord:
    path = Path(folder) / RECORD
    if not path.exists():
        raise LinkageError(
            f"{folder} has no {RECORD}: the primary's record of what it uploaded, written when its client fetches "
            "primary.npz (`python -m linkage_server link ... --fetch DIR` or `--record DIR`, `deploy.commands link`); "
            "without it the linkage cannot be bound to this run's identifiers"
        )
    try:
        raw = json.loads(path.read_text())
        return UploadRecord(**{f.name: raw[f.name] for f in dataclasses.fields(UploadRecord)})
    except (ValueError, KeyError, TypeError) as e:
        raise LinkageError(f"{path}: not a valid upload record ({type(e).__name__}: {e})") from None


def check_binding(linkage: PrimaryLinkage, folder: Path, raw_ids) -> None:
    """Refuse a fetched primary linkage that is not the job the primary uploaded to, or that
    was linked from other identifiers than this run's primary identifiers ``raw_ids``."""
    rec = read_record(folder)
    if linkage.job_id != rec.job_id:
        raise LinkageError(
            f"{folder}: primary.npz is from linkage job {linkage.job_id}, but the primary's upload "
            f"recorded there went to job {rec.job_id}; fetch job {rec.job_id}'s result again"
        )
    if not linkage.ids_sha256:
        raise LinkageError(
            f"{folder}: primary.npz of linkage job {linkage.job_id} carries no digest of the "
            "identifiers it linked (written before this check existed); link again"
        )
    if linkage.ids_sha256 != rec.ids_sha256:
        raise LinkageError(
            f"linkage job {linkage.job_id}: upload digest differs: the service linked primary "
            f"identifiers {linkage.ids_sha256[:16]}, the primary's record says it uploaded "
            f"{rec.ids_sha256[:16]} (another upload to the job?); link again"
        )
    own = identifier_digest(raw_ids)
    if own != rec.raw_sha256:
        raise LinkageError(
            f"linkage job {linkage.job_id} (in {folder}): raw identifier digest differs: it was "
            f"linked from {rec.rows} primary identifiers with digest {rec.raw_sha256[:16]}, this run "
            f"has {len(raw_ids)} with digest {own[:16]} (another dataset, data-dir, n-rows or seed?); "
            "run with the data it was linked from, or link again"
        )


def query_record(answer: Path) -> Path:
    """Beside a query's answer (predict-linkage): what the primary queried, when it sent encoded
    identifiers (private mode), so the answer binds to the raw records predict reads."""
    answer = Path(answer)
    return answer.with_name(answer.stem + ".record.json")


def write_query_record(answer: Path, sent, raw_ids) -> None:
    """Record that the answer at ``answer`` was queried with ``sent``, encoded from ``raw_ids``."""
    body = {"ids_sha256": identifier_digest(sent), "raw_sha256": identifier_digest(raw_ids)}
    write_atomic(query_record(answer), json.dumps(body).encode())


def queried_raw_digest(answer: Path, linkage: PrimaryLinkage) -> str:
    """The digest of the raw identifiers an answer was queried for: the answer's own (raw query),
    or its query record's (encoded query) when that record names the identifiers the answer carries."""
    path = query_record(answer)
    if path.exists():
        rec = json.loads(path.read_text())
        if rec.get("ids_sha256") == linkage.ids_sha256:
            return str(rec.get("raw_sha256", ""))
    return linkage.ids_sha256
