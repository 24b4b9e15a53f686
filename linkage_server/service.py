"""The linkage service: a thin HTTP shell (FastAPI) around :class:`JobStore` and the pipeline.

Endpoints (JSON unless noted; ``Authorization: Bearer <secret>`` on every call):
  POST /jobs                                 admin token -> {job, secrets: {party: secret}}
  GET  /jobs/{job}                           any party of the job -> state, progress, parameters
  PUT  /jobs/{job}/parties/{p}/identifiers   party p, body: one .npy array -> upload summary
  PUT  /jobs/{job}/parties/{p}/train-rows    the primary, body: .npy int array (standardisation rows)
  POST /jobs/{job}/start                     the primary, {metric, k, tau, seed, pool, layout, anchor}
  GET  /jobs/{job}/parties/{p}/result        party p -> .npz (primary: tokens+similarities;
                                             secondary: its token -> row map)
  GET  /health
"""

from __future__ import annotations

import hmac
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse

from linkage_server.jobs import JobError, JobParams, JobStore, Worker
from linkage_server.uploads import UploadError


def _secret(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else None


async def _body(request: Request, cap: int) -> bytes:
    """The request body, refused as soon as it passes `cap` bytes (nothing is kept)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise JobError(413, f"upload of {int(declared)} bytes exceeds the service's cap of {cap} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise JobError(413, f"upload exceeds the service's cap of {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(data_dir: Path, admin_token: str, *, max_upload_bytes: int = 512 << 20,
               max_rows: int = 50_000_000, chunk_rows: int = 20_000) -> FastAPI:
    if len(admin_token) < 16:
        raise ValueError("the admin token must be at least 16 characters")
    store = JobStore(Path(data_dir), max_rows=max_rows, chunk_rows=chunk_rows)
    worker = Worker(store)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        worker.start()  # also re-queues jobs a previous process left queued or running
        yield
        worker.stop()

    app = FastAPI(title="FedSim linkage service", lifespan=lifespan)
    app.state.store, app.state.worker = store, worker

    @app.exception_handler(JobError)
    async def job_error(_: Request, e: JobError):
        return JSONResponse({"detail": e.message}, status_code=e.status)

    @app.exception_handler(UploadError)
    async def upload_error(_: Request, e: UploadError):
        return JSONResponse({"detail": str(e)}, status_code=422)

    def party_of(request: Request, job: str, party: str) -> dict:
        return store.authenticate(job, party, _secret(request))

    @app.get("/health")
    def health() -> dict:
        return {"ok": True}

    @app.post("/jobs")
    async def create_job(request: Request) -> dict:
        if not hmac.compare_digest(_secret(request) or "", admin_token):
            raise JobError(403, "creating a job needs the service's admin token")
        try:
            body = await request.json()
            primary, secondaries = body["primary"], list(body["secondaries"])
        except (ValueError, KeyError, TypeError) as e:
            raise JobError(422, f"expected JSON {{primary, secondaries: [...]}}: {e}") from None
        job, keys = store.create(primary, secondaries, body.get("duplicates", "allow"))
        return {"job": job, "secrets": keys}

    @app.get("/jobs/{job}")
    def status(job: str, request: Request) -> dict:
        meta = store.meta(job)
        secret = _secret(request) or ""
        if not (hmac.compare_digest(secret, admin_token) or any(
                _ok(store, job, p, secret) for p in meta["secret_sha256"])):
            raise JobError(403, "job status is for the job's parties (or the admin)")
        return store.public(meta)

    @app.put("/jobs/{job}/parties/{party}/identifiers")
    async def upload(job: str, party: str, request: Request) -> dict:
        party_of(request, job, party)
        return store.upload(job, party, await _body(request, max_upload_bytes))

    @app.put("/jobs/{job}/parties/{party}/train-rows")
    async def upload_train_rows(job: str, party: str, request: Request) -> dict:
        party_of(request, job, party)
        return store.upload(job, party, await _body(request, max_upload_bytes), train_rows=True)

    @app.post("/jobs/{job}/start")
    async def start(job: str, request: Request) -> dict:
        meta = store.meta(job)
        party_of(request, job, meta["primary"])  # only the primary starts its job
        try:
            body = await request.json()
        except ValueError:
            raise JobError(422, "expected a JSON body {metric, k, tau, seed, pool}") from None
        if not isinstance(body, dict):
            raise JobError(422, "expected a JSON object {metric, k, tau, seed, pool}")
        meta = store.start(job, JobParams.parse(body))
        worker.submit(job)
        return store.public(meta)

    @app.get("/jobs/{job}/parties/{party}/result")
    def result(job: str, party: str, request: Request):
        party_of(request, job, party)
        return FileResponse(store.result_path(job, party), media_type="application/octet-stream")

    return app


def _ok(store: JobStore, job: str, party: str, secret: str) -> bool:
    try:
        store.authenticate(job, party, secret)
        return True
    except JobError:
        return False

