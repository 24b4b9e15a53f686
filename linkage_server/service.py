"""The linkage service: a thin HTTP shell (FastAPI) around :class:`JobStore` and the pipeline.

Endpoints (JSON unless noted; ``Authorization: Bearer <secret>`` on every call):
  POST /jobs                                 admin token -> {job, secrets: {party: secret}}
  GET  /jobs/{job}                           a party of the job or the admin -> what that role may see
                                             (linkage_server.views: state, progress, parameters, ...)
  PUT  /jobs/{job}/parties/{p}/identifiers   party p, body: one .npy array -> upload summary
  PUT  /jobs/{job}/parties/{p}/train-rows    the primary, body: .npy int array (standardisation rows)
  POST /jobs/{job}/start                     the primary, {metric, k, tau, pool, layout, anchor}
  GET  /jobs/{job}/parties/{p}/result        party p -> .npz (primary: tokens+similarities;
                                             secondary: its token -> row map)
  POST /jobs/{job}/query                     the primary, body: .npy of new records' identifiers ->
                                             .npz as its result, for those records (linkage_server.queries)
  GET  /health

Uploads are validated off the event loop. Failed authentications are rate limited per client
address and per party (429 with Retry-After; linkage_server.ratelimit).
"""

from __future__ import annotations

import hmac
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from linkage_server.jobs import JobError, JobParams, JobStore, Worker
from linkage_server.params import FINGERPRINT_HEADER
from linkage_server.queries import Queries, QueryLimits, fingerprint_of
from linkage_server.ratelimit import AuthLimiter, RateLimited
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
    tried. An address over the limit is answered 429 whatever it sends; a party over the limit
    answers further wrong secrets 429, but never refuses its right secret (so nobody can lock a
    party or the admin out). See :class:`linkage_server.ratelimit.AuthLimiter`."""

    def __init__(self, store: JobStore, admin_token: str, limiter: AuthLimiter) -> None:
        self.store, self._admin, self.limiter = store, admin_token.encode(), limiter

    def _guarded(self, request: Request, attempt: Callable[[], object], tried: Callable[[], list[str]]):
        """attempt() -> its result, or raises a JobError; tried() -> the party keys it tried."""
        address = _address(request)
        self.limiter.check(address, [])  # an address over the limit is refused outright
        try:
            result = attempt()
        except JobError as e:
            if e.status not in (401, 403, 404):
                raise
            keys = tried() if e.status != 404 else []  # an unknown job or party: the address only
            try:  # a party under attack: further wrong secrets get 429; every failure still counts
                self.limiter.check(address, keys)
            finally:
                self.limiter.failed(address, keys)
            raise
        return result  # a right secret is never refused by a party's limit

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


async def _body(request: Request, cap: int) -> list[bytes]:
    """The request body's chunks, refused as soon as it passes `cap` bytes (nothing is kept).
    Joined by the caller off the event loop."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise JobError(413, f"upload of {int(declared)} bytes exceeds the service's cap of {cap} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise JobError(413, f"upload exceeds the service's cap of {cap} bytes")
        chunks.append(chunk)
    return chunks


def _error_handlers(app: FastAPI) -> None:
    """Refusals as JSON {detail}: a JobError's status, 422 for a bad upload, 429 + Retry-After."""
    @app.exception_handler(JobError)
    async def job_error(_: Request, e: JobError):
        return JSONResponse({"detail": e.message}, status_code=e.status)

    @app.exception_handler(UploadError)
    async def upload_error(_: Request, e: UploadError):
        return JSONResponse({"detail": str(e)}, status_code=422)

    @app.exception_handler(RateLimited)
    async def rate_limited(_: Request, e: RateLimited):
        return JSONResponse({"detail": str(e)}, status_code=429, headers={"Retry-After": str(e.retry_after)})


def _job_routes(app: FastAPI, store: JobStore, gate: Gate) -> None:
    """GET /health, POST /jobs (admin), GET /jobs/{job} (a party or the admin)."""
    @app.get("/health")
    async def health() -> dict:  # on the event loop itself: no thread needed
        return {"ok": True}

    @app.post("/jobs")
    async def create_job(request: Request) -> dict:
        gate.admin(request)
        try:
            body = await request.json()
            primary, secondaries = body["primary"], list(body["secondaries"])
        except (ValueError, KeyError, TypeError) as e:
            raise JobError(422, f"expected JSON {{primary, secondaries: [...]}}: {e}") from None
        job, keys = store.create(primary, secondaries, body.get("duplicates", "allow"))
        return {"job": job, "secrets": keys}

    @app.get("/jobs/{job}")
    async def status(job: str, request: Request) -> dict:  # one small file read: no thread hop
        return gate.status(request, job)


def _party_routes(app: FastAPI, store: JobStore, worker: Worker, gate: Gate, max_upload_bytes: int) -> None:
    """A party's uploads and result, and the primary's start."""
    async def _upload(job: str, party: str, request: Request, train_rows: bool) -> dict:
        gate.party(request, job, party)
        fingerprint = fingerprint_of(request.headers.get(FINGERPRINT_HEADER))  # optional: encoded uploads
        chunks = await _body(request, max_upload_bytes)
        # parsing, validation and the file write take seconds for a large upload: off the event loop
        return await run_in_threadpool(lambda: store.upload(job, party, b"".join(chunks), train_rows=train_rows,
                                                            fingerprint=fingerprint))

    @app.put("/jobs/{job}/parties/{party}/identifiers")
    async def upload(job: str, party: str, request: Request) -> dict:
        return await _upload(job, party, request, train_rows=False)

    @app.put("/jobs/{job}/parties/{party}/train-rows")
    async def upload_train_rows(job: str, party: str, request: Request) -> dict:
        return await _upload(job, party, request, train_rows=True)

    @app.post("/jobs/{job}/start")
    async def start(job: str, request: Request) -> dict:
        gate.party(request, job)  # only the primary starts its job
        try:
            body = await request.json()
        except ValueError:
            raise JobError(422, "expected a JSON body {metric, k, tau, pool, layout, anchor}") from None
        if not isinstance(body, dict):
            raise JobError(422, "expected a JSON object {metric, k, tau, pool, layout, anchor}")
        meta = store.start(job, JobParams.parse(body))
        worker.submit(job)
        return store.public(meta, "primary", meta["primary"])

    @app.get("/jobs/{job}/parties/{party}/result")
    def result(job: str, party: str, request: Request):
        gate.party(request, job, party)
        return FileResponse(store.result_path(job, party), media_type="application/octet-stream")


def _query_route(app: FastAPI, queries: Queries, gate: Gate, max_upload_bytes: int) -> None:
    """POST /jobs/{job}/query: the primary's new records -> their tokens and noisy similarities."""
    @app.post("/jobs/{job}/query")
    async def query(job: str, request: Request) -> Response:
        gate.primary(request, job, "query it")
        fingerprint = fingerprint_of(request.headers.get(FINGERPRINT_HEADER))
        chunks = await _body(request, max_upload_bytes)
        # parsing, the search and the release take seconds for a large query: off the event loop
        data, budget = await run_in_threadpool(lambda: queries.answer(job, b"".join(chunks), fingerprint))
        return Response(data, media_type="application/octet-stream",
                        headers={"X-Query-Budget": str(budget["budget"]), "X-Query-Records-Left": str(budget["left"])})


def create_app(data_dir: Path, admin_token: str, *, max_upload_bytes: int = 512 << 20,
               max_rows: int = 50_000_000, chunk_rows: int = 20_000, operator_seed: int | None = None,
               auth_failures: int = 10, auth_window_s: float = 60.0,
               query_limits: QueryLimits = QueryLimits(), ray: str = "") -> FastAPI:
    if len(admin_token) < 16:
        raise ValueError("the admin token must be at least 16 characters")
    store = JobStore(Path(data_dir), max_rows=max_rows, chunk_rows=chunk_rows, operator_seed=operator_seed, ray=ray)
    worker = Worker(store)
    gate = Gate(store, admin_token, AuthLimiter(auth_failures, auth_window_s))

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        worker.start()  # also re-queues jobs a previous process left queued or running
        yield
        worker.stop()

    app = FastAPI(title="FedSim linkage service", lifespan=lifespan)
    app.state.store, app.state.worker = store, worker
    _error_handlers(app)
    _job_routes(app, store, gate)
    _party_routes(app, store, worker, gate, max_upload_bytes)
    _query_route(app, Queries(store, query_limits), gate, max_upload_bytes)
    return app
