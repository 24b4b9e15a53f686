"""The service's resumable chunked top-K search, in this process or on Ray (issue 20).

    chunked_search(cache, query (m, ..), base (n, ..), metric, k, party, chunks, tick, ray="")
        -> dist (m, k), idx (m, k)

Each chunk of primary rows is searched against the whole secondary and written to
``cache/<lo>-<hi>.npz`` (atomically) as soon as it is done; a chunk whose file exists is read back,
not searched again, so a job interrupted anywhere resumes from its finished chunks. With
``ray`` ("local", or a cluster's address) the unfinished chunks run as Ray tasks: the secondary's
identifiers are put in the object store once and shared by every task, at most 2 tasks per CPU
are in flight (bounded memory: finished chunks go to disk), and a task whose worker dies is
retried by Ray. The chunks' search is the same function either way, so the results are
byte-identical to the local path (tests/test_chunk_search.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from linkage.contracts import LinkageError
from linkage.pipeline import search
from linkage.store import npz_bytes, write_atomic

RETRIES = 3  # a chunk whose Ray worker died is run again this many times


def _chunk_file(cache: Path, lo: int, hi: int) -> Path:
    return cache / f"{lo}-{hi}.npz"


def chunked_search(cache: Path, query, base, metric: str, k: int, party: str, chunks: list[tuple[int, int]],
                   tick, ray: str = "") -> tuple[np.ndarray, np.ndarray]:
    """(dist, idx) of every primary row; ``tick()`` once per chunk done (module docstring)."""
    todo = [(lo, hi) for lo, hi in chunks if not _chunk_file(cache, lo, hi).exists()]
    if ray and todo:
        _on_ray(cache, query, base, metric, k, party, todo, tick, ray)
    parts = []
    for lo, hi in chunks:
        path = _chunk_file(cache, lo, hi)
        if not path.exists():
            dist, idx = search(query[lo:hi], base, metric=metric, k=k, party=party)
            write_atomic(path, npz_bytes(dist=dist, idx=idx))
            tick()
        elif not ray or (lo, hi) not in todo:
            tick()
        with np.load(path) as z:
            parts.append((z["dist"], z["idx"]))
    return np.concatenate([d for d, _ in parts]), np.concatenate([i for _, i in parts])


def connect(address: str) -> None:
    """Ray in this process: a local one ("local") or a cluster's (its address), once."""
    import ray

    if not ray.is_initialized():
        ray.init(address=None if address == "local" else address, include_dashboard=False,
                 ignore_reinit_error=True, log_to_driver=False, configure_logging=False)


def _search_chunk(query_chunk, base, metric: str, k: int, party: str) -> tuple[np.ndarray, np.ndarray]:
    return search(query_chunk, base, metric=metric, k=k, party=party)


def _on_ray(cache: Path, query, base, metric: str, k: int, party: str, todo: list[tuple[int, int]], tick,
            address: str) -> None:
    """Run the unfinished chunks as Ray tasks, writing each to ``cache`` as it completes."""
    import ray

    connect(address)
    task = ray.remote(max_retries=RETRIES)(_search_chunk)
    base_ref = ray.put(base)  # shared by every task: the secondary crosses the object store once
    limit = max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
    pending, running = list(todo), {}
    while pending or running:
        while pending and len(running) < limit:
            lo, hi = pending.pop(0)
            running[task.remote(query[lo:hi], base_ref, metric, k, party)] = (lo, hi)
        done, _ = ray.wait(list(running), num_returns=1)
        lo, hi = running.pop(done[0])
        try:
            dist, idx = ray.get(done[0])
        except ray.exceptions.RayError as e:  # the task failed, or its worker died RETRIES + 1 times
            for ref in running:
                ray.cancel(ref)
            cause = getattr(e, "cause", None)
            raise LinkageError(f"party {party!r}: search chunk {lo}-{hi} failed on Ray: "
                               f"{type(cause or e).__name__}: {str(cause or e).splitlines()[0]}") from None
        write_atomic(_chunk_file(cache, lo, hi), npz_bytes(dist=dist, idx=idx))
        tick()
