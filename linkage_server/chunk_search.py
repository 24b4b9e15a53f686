"""The service's resumable chunked top-K search, in this process or on Ray.

    chunked_search(cache, query (m, ..), PartySearch(party, base (n, ..), metric, k, approx), chunks, tick, ray="")
        -> ChunkFiles: () -> (lo, dist (c, k), idx (c, k)) per chunk, read from disk one at a time

Each chunk of primary rows is searched against the whole secondary and written to
``cache/<lo>-<hi>.npz`` (atomically) as soon as it is done; a chunk whose file exists is read back,
not searched again, so a job interrupted anywhere resumes from its finished chunks. Nothing holds
more than a chunk's results: the release reads them back chunk by chunk
(linkage_server.release_files). With ``ray`` ("local", or a cluster's address) the unfinished
chunks run as Ray tasks: the secondary's identifiers and their index are put in
the object store once and shared by every task, at most 2 tasks per CPU are in flight, and a task whose
worker dies is retried by Ray. The index, exact (the Euclidean k-d tree: linkage.pipeline.searcher)
or approximate (faiss's, or the q-gram one: linkage.approx), is built once, in this process,
whether its chunks are searched here or on Ray. The chunks' search is the same function either way,
so the results are byte-identical to the local path (tests/test_chunk_search.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from files.atomic import write_atomic
from files.private import private_ray_tmp
from linkage.approx import Approx, approx_searcher
from linkage.contracts import LinkageError
from linkage.pipeline import searcher
from linkage.store import npz_bytes

RETRIES = 3  # a chunk whose Ray worker died is run again this many times


def _chunk_file(cache: Path, lo: int, hi: int) -> Path:
    return cache / f"{lo}-{hi}.npz"


@dataclass(frozen=True)
class ChunkFiles:
    """A finished search on disk, one file per chunk of primary rows; calling it iterates
    (lo, dist (c, k), idx (c, k)) in row order, one chunk in memory at a time (linkage.release.Chunks)."""

    cache: Path
    chunks: tuple[tuple[int, int], ...]

    def __call__(self):
        for lo, hi in self.chunks:
            with np.load(_chunk_file(self.cache, lo, hi)) as z:
                yield lo, z["dist"], z["idx"]

    def distances(self, rows: np.ndarray) -> np.ndarray:
        """dist (s, k) of the records ``rows`` (s,), ascending."""
        rows = np.asarray(rows, np.int64)
        out = None
        for lo, dist, _ in self():
            inside = (rows >= lo) & (rows < lo + len(dist))
            out = np.empty((len(rows), dist.shape[1])) if out is None else out
            out[inside] = dist[rows[inside] - lo]
        return out


def cache_key(primary_sha256: str, party_sha256: str, metric: str, pool: int, search: str = "") -> str:
    """The search cache's name: both uploads' bytes and every parameter the search depends on
    (``search``: an approximate search's tag, linkage.approx.Approx.tag; "" when exact)."""
    fields = {"primary": primary_sha256, "party": party_sha256, "metric": metric, "pool": pool}
    text = json.dumps(fields | ({"search": search} if search else {}))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def fresh_cache(root: Path, key: str) -> Path:
    """root/key; whatever else is under root (chunks of older uploads or parameters) is removed."""
    if root.exists():
        for old in root.iterdir():
            if old.name != key:
                shutil.rmtree(old) if old.is_dir() else old.unlink()
    return root / key


@dataclass(frozen=True)
class PartySearch:
    """One secondary's search: its identifiers ``base``, the metric, the candidates kept per
    record (``k``: the job's pool) and the index (``approx``)."""

    party: str
    base: object
    metric: str
    k: int
    approx: Approx = Approx()

    def build(self):
        """q -> (dist, idx): the exact search, or the approximate index built once over ``base``."""
        if self.approx.method == "exact":
            return searcher(self.base, metric=self.metric, k=self.k, party=self.party)
        return approx_searcher(self.metric, self.base, self.k, self.approx)


def chunked_search(
    cache: Path, query, search: PartySearch, chunks: list[tuple[int, int]], tick, ray: str = ""
) -> ChunkFiles:
    """Every chunk's top-k on disk; ``tick()`` once per chunk done (module docstring)."""
    todo = [(lo, hi) for lo, hi in chunks if not _chunk_file(cache, lo, hi).exists()]
    on_ray = bool(ray)
    if on_ray and todo:
        _on_ray(cache, query, todo, tick, ray, search)
    find = None
    for lo, hi in chunks:
        path = _chunk_file(cache, lo, hi)
        if not path.exists():
            find = find or search.build()
            dist, idx = find(query[lo:hi])
            write_atomic(path, npz_bytes(dist=dist, idx=idx))
            tick()
        elif not on_ray or (lo, hi) not in todo:
            tick()
    return ChunkFiles(cache, tuple(chunks))


def connect(address: str) -> None:
    """Ray in this process: a local one ("local") or a cluster's (its address), once.

    A local Ray's servers listen on every interface (Ray 2.55 binds them so whatever the node
    address, ``_node_ip_address="127.0.0.1"`` included: measured with ``ss -ltnp``), and Ray runs
    whatever code a client sends it: so a local one is started with Ray's token authentication
    (RAY_AUTH_MODE=token; the token, generated by Ray, stays in this user's ~/.ray, made 0600 in
    a 0700 folder here: :func:`private_ray_token`), unless the operator set RAY_AUTH_MODE, or Ray
    was imported before (it reads the mode once: then it runs as configured). A cluster given by
    address is the operator's to secure the same way (docs/threat-model.md)."""
    if address == "local" and "ray" not in sys.modules:  # Ray reads its mode once, when imported
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    import ray

    if not ray.is_initialized():
        ray.init(
            address=None if address == "local" else address,
            _temp_dir=private_ray_tmp() if address == "local" else None,  # its session folders are 0777
            include_dashboard=False,
            ignore_reinit_error=True,
            log_to_driver=False,
            configure_logging=False,
        )
    private_ray_token()


def private_ray_token() -> Path | None:
    """Ray's token file (``$RAY_AUTH_TOKEN_PATH``, else ~/.ray/auth_token), if this user's: made
    0600 and its folder 0700 (Ray writes it under the process's umask: 0644 under 022), so no
    other user of the host can read the token that lets a client run code in this Ray."""
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if not path.is_file() or path.stat().st_uid != os.getuid():
        return None
    os.chmod(path, 0o600)
    if path.parent.stat().st_uid == os.getuid():
        os.chmod(path.parent, 0o700)
    return path


def _search_chunk(query_chunk, find) -> tuple[np.ndarray, np.ndarray]:
    return find(query_chunk)


def _on_ray(cache: Path, query, todo: list[tuple[int, int]], tick, address: str, search: PartySearch) -> None:
    """Run the unfinished chunks as Ray tasks, writing each to ``cache`` as it completes; the
    search is built once Ray is reached (a wrong address fails before an index is built)."""
    connect(address)  # before this module imports Ray: connect chooses its authentication mode
    import ray

    task = ray.remote(max_retries=RETRIES)(_search_chunk)
    find_ref = ray.put(search.build())  # the secondary and its index (the k-d tree, the faiss or q-gram
    # index), built once, here, and shared by every task through the object store
    limit = max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
    pending, running = list(todo), {}
    while pending or running:
        while pending and len(running) < limit:
            lo, hi = pending.pop(0)
            running[task.remote(query[lo:hi], find_ref)] = (lo, hi)
        done, _ = ray.wait(list(running), num_returns=1)
        lo, hi = running.pop(done[0])
        try:
            dist, idx = ray.get(done[0])
        except ray.exceptions.RayError as e:  # the task failed, or its worker died RETRIES + 1 times
            for ref in running:
                ray.cancel(ref)
            cause = getattr(e, "cause", None)
            raise LinkageError(
                f"party {search.party!r}: search chunk {lo}-{hi} failed on Ray: "
                f"{type(cause or e).__name__}: {str(cause or e).splitlines()[0]}"
            ) from None
        write_atomic(_chunk_file(cache, lo, hi), npz_bytes(dist=dist, idx=idx))
        tick()
