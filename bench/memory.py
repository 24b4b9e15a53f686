"""Memory of a benchmark whose work runs in other processes (a local Ray's workers, a service
started as a subprocess), read from Linux's /proc.

    TreePeak()          samples the summed PSS of this process and everything under it; .stop() -> peak GB
    process_tree(pid)   pid and every process under it
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


class TreePeak:
    """The peak summed PSS of this process and every process under it (a local Ray's GCS, raylet
    and workers), sampled from /proc every ``every`` seconds in a thread; PSS counts pages shared
    between processes (Ray's object store) once in all, not once per process."""

    def __init__(self, every: float = 0.5) -> None:
        self.peak, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(every,), daemon=True)
        self._thread.start()

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        self._once()
        return self.peak

    def _sample(self, every: float) -> None:
        self._once()
        while not self._stop.wait(every):
            self._once()

    def _once(self) -> None:
        self.peak = max(self.peak, sum(_pss_gb(pid) for pid in process_tree(os.getpid())))


def process_tree(root: int) -> list[int]:
    """root and every process under it, from /proc's parent links."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        parent[int(stat.parent.name)] = int(text.rsplit(")", 1)[1].split()[1])
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, ppid in parent.items() if ppid in tree} - tree
        tree, grew = tree | more, bool(more)
    return sorted(tree)


def _pss_gb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1e6  # kB
    except OSError:
        pass
    return 0.0
