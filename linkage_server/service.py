"""The linkage service: a thin HTTP shell (FastAPI) around :class:`JobStore` and the pipeline.

Endpoints (JSON unless noted; ``Authorization: Bearer <secret>`` on every call):
  POST /jobs                                 admin token -> {job, secrets: {party: secret}}
  GET  /jobs/{job}                           a party of the job or the admin -> what that role may see
                                             (linkage_server.views: state, progress, parameters, ...)
  PUT  /jobs/{job}/parties/{p}/identifiers   party p, body: one .npy array -> upload summary
  PUT  /jobs/{job}/parties/{p}/train-rows    the primary, body: .npy int array (standardisation rows)
  PUT  /jobs/{job}/parties/{p}/floor         secondary p, {level, spacing_share, noise, exact, compose,
                                             draws}: the least protection its records get
                                             (linkage_server.floors), raised to the operator's
  POST /jobs/{job}/start                     the primary, {metric, k, tau, pool, layout, anchor}
  POST /jobs/{job}/cancel                    the primary or the admin -> the job's status (a queued job
                                             ends now, a running one at its next chunk: "failed",
                                             error "cancelled by ...")
  GET  /jobs/{job}/parties/{p}/result        party p -> .npz (primary: tokens+similarities;
                                             secondary: its token -> row map)
  POST /jobs/{job}/query                     the primary, body: .npy of new records' identifiers ->
                                             .npz as its result, for those records (linkage_server.queries)
  GET  /health

Request bodies (uploads, queries) are streamed to a 0600 file in the job's folder, never held in
memory, and validated memory-mapped off the event loop; the operator's limits
(linkage_server.limits: K, cells per job and per query, concurrent bodies per party) are
checked before any expensive work. Failed authentications are rate limited per client
address and per party (429 with Retry-After; linkage_server.ratelimit); a right secret is never
refused by those limits, whoever else failed from its address.
"""

from __future__ import annotations

import hmac
import json
import os
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from linkage_server.floors import Floors
from linkage_server.jobs import JobError, JobParams, JobStore, Worker
from linkage_server.limits import BodySlots, Limits, QueryLimits
from linkage_server.params import FINGERPRINT_HEADER
from linkage_server.queries import Queries, fingerprint_of
from linkage_server.ratelimit import AuthLimiter, RateLimited
from linkage_server.requestlog import event, refused
from linkage_server.uploads import UploadError


def _secret(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if not auth.lower().startswith("bearer "):
        return None
    if not auth.isascii():  # headers arrive as latin-1: anything else is not a secret this service issued
        raise JobError(401, "malformed credentials: the bearer token must be ASCII")
    return auth[7:].strip() or None


def _address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


class Gate:
    """Who a request is, with failed authentications counted and limited (per address and party).

    Failures (401/403/404) count against the client address and the party (or the admin) they
    tried. An address or a party over the limit answers further failures 429 (Retry-After), but
    a request that holds a right secret is always served: the limits are checked only after a
    failure, so nobody can lock a party, the admin or a shared address (loopback, a NAT) out by
    sending wrong secrets. See :class:`linkage_server.ratelimit.AuthLimiter`."""

    def __init__(self, store: JobStore, admin_token: str, limiter: AuthLimiter) -> None:
        self.store, self._admin, self.limiter = store, admin_token.encode(), limiter

    def _guarded(self, request: Request, attempt: Callable[[], object], tried: Callable[[], list[str]]):
        """attempt() -> its result, or raises a JobError; tried() -> the party keys it tried."""
        address = _address(request)
        try:
            result = attempt()
        except JobError as e:
            if e.status not in (401, 403, 404):
                raise
            keys = tried() if e.status != 404 else []  # an unknown job or party: the address only
            try:  # an address or party under attack: further failures get 429; every failure still counts
                self.limiter.check(address, keys)
            finally:
                self.limiter.failed(address, keys)
            raise
        return result  # a right secret is never refused: not by its party's limit, nor its address's

    def _is_admin(self, secret: str | None) -> bool:
        return hmac.compare_digest((secret or "").encode(), self._admin)

    def admin(self, request: Request) -> None:
        def attempt():
            if not self._is_admin(_secret(request)):
                raise JobError(403, "creating a job needs the service's admin token")

        self._guarded(request, attempt, lambda: ["admin"])

    def party(self, request: Request, job: str, party: str | None = None) -> dict:
        """The job's metadata if the request holds `party`'s secret (None: the primary's)."""

        def attempt():
            who = self.store.meta(job)["primary"] if party is None else party
            return self.store.authenticate(job, who, _secret(request))

        return self._guarded(request, attempt, lambda: [f"{job}/{party or self.store.meta(job)['primary']}"])

    def primary(self, request: Request, job: str, what: str) -> dict:
        """As :meth:`party` for the primary, with a secondary's secret or the admin token refused
        by name (`what`: the primary's right they asked for)."""

        def attempt():
            meta, secret = self.store.meta(job), _secret(request)
            if secret and self._is_admin(secret):
                raise JobError(403, f"only the job's primary party may {what}; this is the admin token")
            if secret and self.store.party_with_secret(meta, secret) not in (None, meta["primary"]):
                raise JobError(403, f"only the job's primary party may {what}; this is a secondary party's secret")
            return self.store.authenticate(job, meta["primary"], secret)

        return self._guarded(request, attempt, lambda: [f"{job}/{self.store.meta(job)['primary']}"])

    def status(self, request: Request, job: str) -> dict:
        """The job's status as the requester's role may see it (admin, primary or a secondary)."""

        def attempt():
            meta, secret = self.store.meta(job), _secret(request)
            if secret is None:
                raise JobError(401, "missing credentials: send 'Authorization: Bearer <party secret>'")
            if self._is_admin(secret):
                return self.store.public(meta, "admin")
            party = self.store.party_with_secret(meta, secret)
            if party is None:
                raise JobError(403, "job status is for the job's parties (or the admin)")
            role = "primary" if party == meta["primary"] else "secondary"
            return self.store.public(meta, role, party)

        return self._guarded(request, attempt, lambda: [])  # no one party was tried: the address counts


SMALL_JSON = 64 << 10  # the largest JSON body a party sends (a job's parameters, a floor)


async def small_json(request: Request):
    """A small JSON body, read at most SMALL_JSON bytes (413 past it), parsed (422 if it is not JSON)."""
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > SMALL_JSON:
            raise JobError(413, f"a JSON body of more than {SMALL_JSON} bytes; this request's is at most that")
    try:
        return json.loads(bytes(data))
    except ValueError:
        raise JobError(422, "expected a JSON body") from None
    except RecursionError:  # under the cap, thousands of '[' deep: the parser's own stack
        raise JobError(422, "a JSON body nested deeper than the parser allows; expected a flat object") from None


async def _body_file(request: Request, cap: int, path: Path) -> Path:
    """The request body streamed to ``path`` (created 0600, never over a file; written 1 MiB at a
    time off the event loop), refused as soon as it passes ``cap`` bytes. The caller removes it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise JobError(413, f"upload of {int(declared)} bytes exceeds the service's cap of {cap} bytes")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            pending, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > cap:
                    raise JobError(413, f"upload exceeds the service's cap of {cap} bytes")
                pending.append(chunk)
                if sum(map(len, pending)) >= 1 << 20:
                    await run_in_threadpool(f.writelines, pending)
                    pending = []
            await run_in_threadpool(f.writelines, pending)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


@asynccontextmanager
async def _received(store: JobStore, slots: BodySlots, cap: int, job: str, party: str, request: Request):
    """A party's request body as a file (:func:`_body_file`), under one of its body slots (429
    past the operator's limit, before any byte is read); the file is removed afterwards (an
    upload has renamed it into place)."""
    with slots.hold(job, party):
        path = await _body_file(request, cap, store.body_path(job))
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)


def _error_handlers(app: FastAPI) -> None:
    """Refusals as JSON {detail}: a JobError's status, 422 for a bad upload, 429 + Retry-After."""

    @app.exception_handler(JobError)
    async def job_error(request: Request, e: JobError):
        refused(request.method, request.url.path, e.status, e.message)
        return JSONResponse({"detail": e.message}, status_code=e.status)

    @app.exception_handler(UploadError)
    async def upload_error(request: Request, e: UploadError):
        refused(request.method, request.url.path, 422, str(e))
        return JSONResponse({"detail": str(e)}, status_code=422)

    @app.exception_handler(RateLimited)
    async def rate_limited(request: Request, e: RateLimited):
        refused(request.method, request.url.path, 429, str(e))
        return JSONResponse({"detail": str(e)}, status_code=429, headers={"Retry-After": str(e.retry_after)})


def _job_routes(app: FastAPI, store: JobStore, gate: Gate) -> None:
    """GET /health, POST /jobs (admin), GET /jobs/{job} (a party or the admin)."""

    @app.get("/health")
    async def health() -> dict:  # on the event loop itself: no thread needed
        return {"ok": True}

    @app.post("/jobs")
    async def create_job(request: Request) -> dict:
        gate.admin(request)
        body = await small_json(request)
        try:
            primary, secondaries = body["primary"], list(body["secondaries"])
        except (ValueError, KeyError, TypeError) as e:
            raise JobError(422, f"expected JSON {{primary, secondaries: [...]}}: {e}") from None
        job, keys = store.create(primary, secondaries, body.get("duplicates", "allow"))
        event(f"job {job} created: primary {primary!r}, secondaries {secondaries}")
        return {"job": job, "secrets": keys}

    @app.get("/jobs/{job}")
    async def status(job: str, request: Request) -> dict:  # one small file read: no thread hop
        return gate.status(request, job)


def _party_routes(app: FastAPI, store: JobStore, worker: Worker, gate: Gate, bodies) -> None:
    """A party's uploads and result, and the primary's start."""

    async def _upload(job: str, party: str, request: Request, train_rows: bool) -> dict:
        gate.party(request, job, party)
        fingerprint = fingerprint_of(request.headers.get(FINGERPRINT_HEADER))  # optional: encoded uploads
        async with bodies(job, party, request) as body:
            # parsing, validation and the rename take seconds for a large upload: off the event loop
            got = await run_in_threadpool(
                lambda: store.upload(job, party, body, train_rows=train_rows, fingerprint=fingerprint)
            )
        event(
            f"job {job}: party {party!r} uploaded "
            + ("training rows" if train_rows else f"{got['rows']} {got['kind']} identifier row(s)")
        )
        return got

    @app.put("/jobs/{job}/parties/{party}/identifiers")
    async def upload(job: str, party: str, request: Request) -> dict:
        return await _upload(job, party, request, train_rows=False)

    @app.put("/jobs/{job}/parties/{party}/floor")
    async def floor(job: str, party: str, request: Request) -> dict:
        gate.party(request, job, party)
        body = await small_json(request)
        got = store.set_floor(job, party, body)
        event(f"job {job}: secondary {party!r} stated its privacy floor ({got['level']})")
        return got

    @app.put("/jobs/{job}/parties/{party}/train-rows")
    async def upload_train_rows(job: str, party: str, request: Request) -> dict:
        return await _upload(job, party, request, train_rows=True)

    @app.post("/jobs/{job}/start")
    async def start(job: str, request: Request) -> dict:
        gate.party(request, job)  # only the primary starts its job
        body = await small_json(request)
        if not isinstance(body, dict):
            raise JobError(422, "expected a JSON object {metric, k, tau, pool, layout, anchor}")
        meta = store.start(job, JobParams.parse(body))
        worker.submit(job)
        event(f"job {job} started by the primary (metric {meta['params'].get('metric')}, k {meta['params'].get('k')})")
        return store.public(meta, "primary", meta["primary"])

    @app.post("/jobs/{job}/cancel")
    async def cancel(job: str, request: Request) -> dict:
        seen = gate.status(request, job)  # a party of the job or the admin; failures counted
        if seen["role"] == "secondary":
            raise JobError(403, "only the job's primary party or the service's admin may cancel it")
        meta = store.cancel(job, "the admin" if seen["role"] == "admin" else "the primary")
        event(f"job {job} cancelled by {'the admin' if seen['role'] == 'admin' else 'the primary'}")
        return store.public(meta, seen["role"], seen["party"])

    @app.get("/jobs/{job}/parties/{party}/result")
    def result(job: str, party: str, request: Request):
        gate.party(request, job, party)
        path = store.result_path(job, party)
        event(f"job {job}: party {party!r} fetched its result")
        return FileResponse(path, media_type="application/octet-stream")


def _query_route(app: FastAPI, queries: Queries, gate: Gate, bodies) -> None:
    """POST /jobs/{job}/query: the primary's new records -> their tokens and noisy similarities."""

    @app.post("/jobs/{job}/query")
    async def query(job: str, request: Request) -> Response:
        meta = gate.primary(request, job, "query it")
        fingerprint = fingerprint_of(request.headers.get(FINGERPRINT_HEADER))
        async with bodies(job, meta["primary"], request) as body:
            # parsing, the search and the release take seconds for a large query: off the event loop
            data, budget = await run_in_threadpool(lambda: queries.answer(job, body, fingerprint))
        event(f"job {job}: query answered ({budget['left']} of {budget['budget']} cells left)")
        return Response(
            data,
            media_type="application/octet-stream",
            headers={"X-Query-Budget": str(budget["budget"]), "X-Query-Cells-Left": str(budget["left"])},
        )


@dataclass(frozen=True)
class ServiceOptions:
    """The operator's settings of a service (``python -m linkage_server serve``'s options):
    ``limits`` (linkage_server.limits), ``query_limits`` (the query budget, linkage_server.queries),
    ``floors`` (the operator's privacy floor, linkage_server.floors; None: the "standard" level), the
    rows of a search chunk, an operator seed (experiments only), the authentication failures a
    client may make in a window, and where Ray runs the search ("" here)."""

    max_upload_bytes: int = 512 << 20
    max_rows: int = 50_000_000
    chunk_rows: int = 20_000
    operator_seed: int | None = None
    auth_failures: int = 10
    auth_window_s: float = 60.0
    query_limits: QueryLimits = QueryLimits()
    ray: str = ""
    limits: Limits = Limits()
    floors: Floors | None = None


def create_app(data_dir: Path, admin_token: str, options: ServiceOptions = ServiceOptions()) -> FastAPI:
    """The service's app, under the operator's ``options``."""
    if len(admin_token) < 16:
        raise ValueError("the admin token must be at least 16 characters")
    o = options
    store = JobStore(
        Path(data_dir),
        max_rows=o.max_rows,
        chunk_rows=o.chunk_rows,
        operator_seed=o.operator_seed,
        ray=o.ray,
        limits=o.limits,
        floors=o.floors,
    )
    worker = Worker(store)
    bodies = partial(_received, store, BodySlots(o.limits.max_uploads_per_party), o.max_upload_bytes)
    gate = Gate(store, admin_token, AuthLimiter(o.auth_failures, o.auth_window_s))

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        worker.start()  # also re-queues jobs a previous process left queued or running
        yield
        worker.stop()

    app = FastAPI(title="FedSim linkage service", lifespan=lifespan)
    app.state.store, app.state.worker = store, worker
    _error_handlers(app)
    _job_routes(app, store, gate)
    _party_routes(app, store, worker, gate, bodies)
    _query_route(app, Queries(store, o.query_limits), gate, bodies)
    return app
