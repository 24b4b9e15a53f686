"""What a party's client accepts of the linkage service's answers (linkage_server/client.py): the
service, or a proxy in front of it, may be broken or hostile. A status must hold the fields the
client reads; a fetched result must be this job's and this party's linkage, with the members,
dtypes and shapes its format has (linkage/store.py) and finite similarities; a query's answer
must read as a primary linkage of this job. A refusal says what was wrong, and the caller writes
nothing in place of the party's previous good file until its answer passed.

    field(answer, key, what) -> value
    check_result(path, role, job, party)   # raises MalformedAnswer
    read_answer(content, job, records) -> PrimaryLinkage
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np

from linkage.contracts import PrimaryLinkage
from linkage.store import npy_blocks, npy_header, read_primary

BLOCK = 1 << 20  # values read at a time when checking a fetched result's similarities
ROLES = ("primary", "secondary")


class ServiceError(RuntimeError):
    """The service refused a request; the message is the service's explanation."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"linkage service answered {status}: {detail}")
        self.status, self.detail = status, detail


class MalformedAnswer(ServiceError):
    """An answer of the service that is not what the client asked for (a failure: exit 1)."""

    def __init__(self, detail: str) -> None:
        super().__init__(502, detail)
        self.args = (f"the linkage service's answer {detail}",)


def field(answer, key: str, what: str):
    """``answer[key]`` of a JSON object the service answered ``what`` with."""
    if not isinstance(answer, dict) or key not in answer:
        raise MalformedAnswer(f"to {what} lacks {key!r}: {json.dumps(answer)[:200]}")
    return answer[key]


def _header(zf: zipfile.ZipFile, name: str) -> tuple[tuple, np.dtype]:
    """(shape, dtype) of one .npy member, read from its header alone."""
    with zf.open(name) as f:
        shape, _, dtype = npy_header(f)
    return shape, dtype


def _finite(zf: zipfile.ZipFile, name: str) -> bool:
    """Whether a float member's values are all finite, read a block at a time."""
    with zf.open(name) as f:
        return all(np.isfinite(block).all() for block in npy_blocks(f, BLOCK))


def _primary(zf: zipfile.ZipFile, job: str) -> str:
    """'' when the archive is job ``job``'s primary.npz, else what is wrong."""
    meta = json.loads(str(np.load(io.BytesIO(zf.read("meta.npy")), allow_pickle=False)))
    parties, k = list(meta["parties"]), int(meta["k"])
    if meta["job_id"] != job:
        return f"is job {meta['job_id']!r}'s result, not job {job!r}'s"
    want = {"meta.npy"} | {f"{kind}__{q}.npy" for q in parties for kind in ("tokens", "sims")}
    if set(zf.namelist()) != want:
        return f"holds {sorted(zf.namelist())}, expected {sorted(want)}"
    rows = set()
    for q in parties:
        (ts, td), (ss, sd) = _header(zf, f"tokens__{q}.npy"), _header(zf, f"sims__{q}.npy")
        if td.kind not in "iu" or sd.kind != "f" or len(ts) != 2 or ts != ss or ts[1] != k:
            return f"holds party {q!r}'s tokens {td} {ts} and similarities {sd} {ss}, expected (m, K = {k}) of integers and floats"
        if not _finite(zf, f"sims__{q}.npy"):
            return f"holds non-finite similarities for party {q!r}"
        rows.add(ts[0])
    return "" if len(rows) <= 1 else f"holds parties of different record counts {sorted(rows)}"


def _secondary(zf: zipfile.ZipFile, job: str, party: str) -> str:
    """'' when the archive is job ``job``'s token map for ``party``, else what is wrong."""
    if set(zf.namelist()) != {"row_of_token.npy", "job_id.npy", "party.npy"}:
        return f"holds {sorted(zf.namelist())}, expected row_of_token, job_id and party"
    got = {n: str(np.load(io.BytesIO(zf.read(f"{n}.npy")), allow_pickle=False)) for n in ("job_id", "party")}
    if (got["job_id"], got["party"]) != (job, party):
        return f"is party {got['party']!r}'s map of job {got['job_id']!r}, not party {party!r}'s of job {job!r}"
    shape, dtype = _header(zf, "row_of_token.npy")
    return (
        "" if dtype.kind in "iu" and len(shape) == 1 else f"holds a token map {dtype} {shape}, expected (T,) integers"
    )


def check_result(path: Path, role: str, job: str, party: str) -> None:
    """Refuse a downloaded result (at ``path``, not yet in place) that is not this job's and party's."""
    try:
        with zipfile.ZipFile(path) as zf:
            wrong = _primary(zf, job) if role == "primary" else _secondary(zf, job, party)
    except (zipfile.BadZipFile, KeyError, ValueError, TypeError, OSError) as e:
        wrong = f"is not a linkage result ({type(e).__name__}: {e})"
    if wrong:
        raise MalformedAnswer(f"to the fetch of {party!r}'s result {wrong}; the previous result, if any, is kept")


def read_answer(content: bytes, job: str, records: int) -> PrimaryLinkage:
    """A query's answer (primary.npz bytes) as this job's primary linkage of the ``records``
    records queried, checked as a fetched result is (members, dtypes, (m, K), finite similarities)."""
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as zf:
            wrong = _primary(zf, job)
        got = None if wrong else read_primary(io.BytesIO(content))
    except (zipfile.BadZipFile, KeyError, ValueError, TypeError, OSError) as e:
        raise MalformedAnswer(f"to the query is not a linkage ({type(e).__name__}: {str(e)[:200]})") from None
    if wrong:
        raise MalformedAnswer(f"to the query {wrong}")
    rows = sorted({len(link.tokens) for link in got.links.values()})
    if rows != [records]:
        raise MalformedAnswer(f"to the query links {rows} record(s), where {records} were queried")
    return got
