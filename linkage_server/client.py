"""A party's client for the linkage service (httpx); the CLI is a thin layer over it."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import httpx
import numpy as np

from files.atomic import atomic_path, write_atomic
from linkage.binding import UploadRecord, upload_record, write_record
from linkage.contracts import LinkageError, PrimaryLinkage
from linkage.store import save_privacy
from linkage_server.answers import ROLES, MalformedAnswer, ServiceError, check_result, field, read_answer
from linkage_server.params import FINGERPRINT_HEADER, JobParams
from linkage_server.uploads import to_npy


def _check(r: httpx.Response) -> httpx.Response:
    if r.is_success:
        return r
    try:
        detail = r.json().get("detail", r.text)
    except ValueError:
        detail = r.text
    raise ServiceError(r.status_code, str(detail))


RETRIES_429 = 5  # a 429 with Retry-After is retried this many times (the service's auth limits)
MAX_RETRY_WAIT = 60.0  # seconds waited for one Retry-After, at most


def retry_after(r: httpx.Response) -> float | None:
    """Seconds to wait before sending again, when the service answered 429 with Retry-After
    (its limit on failed authentications); None for any other answer (a 429 without it, e.g. a
    spent query budget, is final)."""
    value = r.headers.get("retry-after", "") if r.status_code == 429 else ""
    try:
        return min(max(float(value), 0.0), MAX_RETRY_WAIT) if value else None
    except ValueError:
        return None


def send(request: Callable[[], httpx.Response], retries: int = RETRIES_429) -> httpx.Response:
    """``request()`` again after each 429 with Retry-After, at most ``retries`` times, waiting as
    told; the last answer otherwise (the caller checks it)."""
    for _ in range(retries):
        r = request()
        wait = retry_after(r)
        if wait is None:
            return r
        r.close()
        time.sleep(wait)
    return request()


def create_job(
    url: str,
    admin_token: str,
    primary: str,
    secondaries: list[str],
    *,
    duplicates: str = "allow",
    verify: bool | str = True,
) -> dict:
    """Admin: a new job and one secret per party, to hand to each party out of band."""
    r = send(
        lambda: httpx.post(
            f"{url}/jobs",
            json={"primary": primary, "secondaries": secondaries, "duplicates": duplicates},
            headers={"Authorization": f"Bearer {admin_token}"},
            verify=verify,
            timeout=30,
        )
    )
    return _check(r).json()


def cancel_job(url: str, job: str, token: str, *, verify: bool | str = True) -> dict:
    """Cancel a queued or running job: ``token`` is its primary's secret or the admin token. A
    queued job ends now, a running one at its next chunk ("failed", "cancelled by ...")."""
    r = send(
        lambda: httpx.post(
            f"{url}/jobs/{job}/cancel", headers={"Authorization": f"Bearer {token}"}, verify=verify, timeout=30
        )
    )
    return _check(r).json()


def _pieces(body: bytes, on_sent: Callable[[int, int], None] | None, size: int = 1 << 20):
    """The body in 1 MiB pieces, reporting each as sent (the request carries its Content-Length)."""
    for lo in range(0, len(body), size):
        yield body[lo : lo + size]
        if on_sent is not None:
            on_sent(min(lo + size, len(body)), len(body))


STATUS_BYTES = 1 << 20  # the largest status answer a client reads


class LinkageClient:
    """One party of one job."""

    def __init__(
        self, url: str, job: str, party: str, secret: str, *, verify: bool | str = True, timeout: float = 600.0
    ) -> None:
        self.job, self.party = job, party
        self.uploaded: UploadRecord | None = None  # what this client uploaded (job id, digests)
        self.query_budget: dict | None = None  # after a query: the job's {"budget", "left"} in cells (records x K)
        self._http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {secret}"}, verify=verify, timeout=timeout
        )

    def __enter__(self) -> "LinkageClient":
        return self

    def __exit__(self, *exc) -> None:
        self._http.close()

    def _request(self, method: str, url: str, **kwargs) -> httpx.Response:
        """One request, sent again after a 429 with Retry-After (:func:`send`), checked. A
        ``content`` that is a callable makes a fresh body for each attempt."""
        body = kwargs.pop("content", None)
        return _check(
            send(lambda: self._http.request(method, url, content=body() if callable(body) else body, **kwargs))
        )

    def _encoding(self, fingerprint: str) -> dict:
        """The header carrying the encoding key's fingerprint (linkage.encode.key_fingerprint),
        bound to this job: the service compares a query's with the training upload's, and cannot
        tell that two jobs used one key."""
        if not fingerprint:
            return {}
        bound = hmac.new(fingerprint.encode(), f"fedsim-linkage-job|{self.job}".encode(), hashlib.sha256)
        return {FINGERPRINT_HEADER: bound.hexdigest()}

    def upload(
        self,
        identifiers: np.ndarray,
        raw_sha256: str = "",
        *,
        fingerprint: str = "",
        on_sent: Callable[[int, int], None] | None = None,
    ) -> dict:
        """Upload this party's identifiers. ``raw_sha256``: in private mode, the digest
        (binding.identifier_digest) of the raw identifiers they were encoded from; "" = the
        identifiers are raw. Kept on this side only (:meth:`write_upload_record`).
        ``fingerprint``: in private mode, the key's (linkage.encode.key_fingerprint); the primary's
        later queries of encoded identifiers are checked against it. ``on_sent(bytes sent, total)``
        is called as the body goes out."""
        arr = np.asarray(identifiers)
        body = to_npy(arr)
        headers = {**self._encoding(fingerprint), "Content-Length": str(len(body))}
        out = self._request(
            "PUT",
            f"/jobs/{self.job}/parties/{self.party}/identifiers",
            content=lambda: _pieces(body, on_sent),
            headers=headers,
        ).json()
        self.uploaded = upload_record(self.job, self.party, arr, raw_sha256)
        return out

    def write_upload_record(self, folder: Path) -> Path:
        """Record beside the results what this party uploaded (job id, digests): a run binds the
        primary's fetched linkage to its own identifiers by it (linkage.binding)."""
        if self.uploaded is None:
            raise LinkageError(f"party {self.party!r} has not uploaded to job {self.job} with this client")
        return write_record(Path(folder), self.uploaded)

    def upload_train_rows(self, rows: np.ndarray) -> dict:
        data = to_npy(np.asarray(rows, dtype=np.int64))
        return self._request("PUT", f"/jobs/{self.job}/parties/{self.party}/train-rows", content=data).json()

    def start(self, params: JobParams) -> dict:
        """Start the job (the primary) with ``params``, as the service checks them (tau 0: none
        asked, the secondaries' privacy floors set the noise; linkage_server.floors). Its
        randomness is the service's own secret: no seed here."""
        body = dataclasses.asdict(params)
        return self._request("POST", f"/jobs/{self.job}/start", json=body).json()

    def set_floor(self, level: str = "standard", **fields) -> dict:
        """(A secondary) the least protection its records get (linkage_server.floors): a level and
        any field of linkage.protection.Floor in place of the level's."""
        body = {"level": level, **{k: v for k, v in fields.items() if v is not None}}
        return self._request("PUT", f"/jobs/{self.job}/parties/{self.party}/floor", json=body).json()

    def query(self, identifiers: np.ndarray, *, fingerprint: str = "", out: Path | None = None) -> PrimaryLinkage:
        """(The primary) new records' tokens and noisy similarities from the finished job, as its
        release gave them for training records (linkage_server.queries); written atomically to
        ``out`` (a primary.npz-format file) when given. ``fingerprint``: as for :meth:`upload`,
        needed when the identifiers are encoded."""
        r = self._request(
            "POST",
            f"/jobs/{self.job}/query",
            content=to_npy(np.asarray(identifiers)),
            headers=self._encoding(fingerprint),
        )
        budget = {k: r.headers.get(h, "") for k, h in (("budget", "x-query-budget"), ("left", "x-query-cells-left"))}
        if not all(v.isdigit() for v in budget.values()):
            raise MalformedAnswer(
                f"to the query lacks its budget headers (x-query-budget, x-query-cells-left): {budget}"
            )
        # read before it is written: a bad answer never replaces a good one
        got = read_answer(r.content, self.job, len(identifiers))
        self.query_budget = {k: int(v) for k, v in budget.items()}
        if out is not None:
            write_atomic(Path(out), r.content)
        return got

    def status(self) -> dict:
        return self._request("GET", f"/jobs/{self.job}").json()

    def cancel(self) -> dict:
        """(The primary) cancel the job (:func:`cancel_job`); returns its status."""
        return self._request("POST", f"/jobs/{self.job}/cancel").json()

    def wait(
        self,
        timeout: float = 3600.0,
        poll: float = 0.2,
        on_progress: Callable[[dict], None] | None = None,
        *,
        until_started: bool = False,
    ) -> dict:
        """Block until the job is done (returns its status) or failed (raises with its error).

        A job not started yet is an error, unless ``until_started`` (a secondary waiting for the
        primary to start it). A service that stops answering is retried (it resumes its jobs when
        restarted) until ``timeout``, then reported as unreachable: never a hang."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                st = self._status_by(deadline, timeout)
            except httpx.TransportError as e:
                if time.monotonic() > deadline:
                    raise ServiceError(
                        503,
                        f"linkage service at {self._http.base_url} unreachable while waiting "
                        f"for job {self.job} ({timeout} s): {e}",
                    ) from None
                time.sleep(max(poll, 0.5))
                continue
            state = field(st, "state", f"the status of job {self.job}")
            if on_progress is not None:
                on_progress(st)
            if state == "done":
                return st
            if state == "failed":
                raise ServiceError(409, f"job {self.job} failed: {st.get('error')}")
            if state == "created" and not until_started:
                raise ServiceError(409, f"job {self.job} has not been started by the primary")
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {self.job} still {state} after {timeout} s ({st.get('progress')})")
            time.sleep(poll)

    def _status_by(self, deadline: float, timeout: float) -> dict:
        """The job's status, whole by ``deadline`` (time.monotonic()): httpx's timeout is per read,
        so a service that trickles its answer could otherwise hold :meth:`wait` past its timeout."""
        body = bytearray()
        with self._stream(f"/jobs/{self.job}") as r:
            for chunk in r.iter_bytes():
                body += chunk
                if time.monotonic() > deadline or len(body) > STATUS_BYTES:
                    raise TimeoutError(
                        f"job {self.job}: the linkage service's status answer was not whole within the "
                        f"wait's {timeout} s (or passed {STATUS_BYTES} bytes)"
                    )
        try:
            return json.loads(bytes(body))
        except ValueError:
            raise MalformedAnswer(f"to the status of job {self.job} is not JSON: {bytes(body[:200])!r}") from None

    @contextmanager
    def _stream(self, url: str):
        """GET url, its body left to stream; sent again after a 429 with Retry-After (as
        :func:`send` does every request), any other refusal raised (:func:`_check`)."""
        for attempt in range(RETRIES_429 + 1):
            with self._http.stream("GET", url) as r:
                wait = retry_after(r) if attempt < RETRIES_429 else None
                if wait is None:
                    if not r.is_success:
                        r.read()
                        _check(r)
                    yield r
                    return
            time.sleep(wait)

    def _download(self, url: str, path: Path, check: Callable[[Path], None]) -> None:
        """GET url into path, 1 MiB at a time (a 10M-record primary.npz is gigabytes), under a
        temporary name renamed when whole and ``check``ed: a failed or refused download leaves
        the old file, or none."""
        with self._stream(url) as r, atomic_path(path) as tmp:  # the folder made once the service answered
            with open(tmp, "wb") as f:
                for block in r.iter_bytes(1 << 20):
                    f.write(block)
            check(tmp)

    def fetch(self, folder: Path) -> Path:
        """Download this party's result into `folder` under the name training reads; the primary,
        when this client uploaded its identifiers, also writes its upload record there."""
        st = self.status()
        role = field(st, "role", f"the status of job {self.job}")
        if role not in ROLES:
            raise MalformedAnswer(f"to the status of job {self.job} names role {role!r}, not one of {ROLES}")
        path = Path(folder) / ("primary.npz" if role == "primary" else f"secondary-{self.party}.npz")
        check = lambda tmp: check_result(tmp, role, self.job, self.party)  # noqa: E731 - the download's one check
        self._download(f"/jobs/{self.job}/parties/{self.party}/result", path, check)
        if path.name == "primary.npz":
            save_privacy(st.get("privacy"), Path(folder))  # the job's privacy report, or none (removes a stale one)
            if self.uploaded is not None:
                self.write_upload_record(folder)
        return path
