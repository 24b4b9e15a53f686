"""The worker that computes queued jobs, in two lanes, so a small job never waits behind a large one.

    Worker(store).start() / .submit(job) / .stop()

A job of at most ``small_cells`` cells (primary records x K x secondaries; linkage_server.limits,
``serve --small-job-cells``) goes to the small lane, any other to the large lane; each lane is
one thread taking its jobs in order. So at most two jobs run at once, one of them small, and a
small job waits only behind other small ones. A job cancelled while queued is skipped when its
turn comes (JobStore.run claims only a queued job, or a running one a previous process left);
one job is never run by two lanes at once. At start it removes the request bodies a stopped
process left in the jobs' ``incoming/`` folders (linkage_server.service streams bodies there).
"""

from __future__ import annotations

import queue
import threading

from linkage_server.requestlog import event


class Worker:
    """Two background threads (lanes) computing queued jobs (the service's only compute)."""

    def __init__(self, store, small_cells: int | None = None) -> None:
        self.store = store
        self.small_cells = store.limits.small_cells if small_cells is None else small_cells
        self._lanes: dict[str, queue.Queue[str | None]] = {"small": queue.Queue(), "large": queue.Queue()}
        self._threads = [
            threading.Thread(target=self._loop, args=(q,), name=f"linkage-worker-{name}", daemon=True)
            for name, q in self._lanes.items()
        ]
        self._active: set[str] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        for body in self.store.root.glob("*/incoming/*"):  # request bodies a killed process left half-read
            body.unlink(missing_ok=True)
        for job in self.store.pending():  # re-queue what a previous process left queued or running
            self.submit(job)
        for thread in self._threads:
            thread.start()

    def lane(self, job: str) -> str:
        """ "small" for a job of at most small_cells cells, else "large"."""
        try:
            return "small" if self.store.cells(job) <= self.small_cells else "large"
        except Exception:  # noqa: BLE001 - a job whose size cannot be read runs (and fails) in the large lane
            return "large"

    def submit(self, job: str) -> None:
        self._lanes[self.lane(job)].put(job)

    def stop(self) -> None:
        for q in self._lanes.values():
            q.put(None)

    def _loop(self, jobs: queue.Queue) -> None:
        while (job := jobs.get()) is not None:
            with self._lock:
                if job in self._active:  # submitted again (restarted) while its other entry runs
                    continue
                self._active.add(job)
            try:
                self.store.run(job)
                _finished(self.store, job)
            finally:
                with self._lock:
                    self._active.discard(job)


def _finished(store, job: str) -> None:
    """The service log's line for a job that ended (linkage_server.requestlog)."""
    meta = store.meta(job)
    if meta["state"] in ("done", "failed"):
        error = f": {meta.get('error')}" if meta["state"] == "failed" else ""
        event(f"job {job} finished: {meta['state']}{error} ({meta.get('searched_seconds', 0):.1f} s of search)")
