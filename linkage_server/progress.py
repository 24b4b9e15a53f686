"""Progress bars for the command line's long phases (uploads, a job's chunks), with rich.

Drawn on stderr, and only when stderr is a terminal: in CI, logs and pipes nothing is printed.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def shown() -> bool:
    return sys.stderr.isatty()


class Bar:
    """One task's bar: ``with Bar("upload", total, bytes=True) as bar: bar.update(done, total)``."""

    def __init__(self, description: str, total: float | None = None, *, bytes: bool = False) -> None:
        count = DownloadColumn() if bytes else MofNCompleteColumn()
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            count,
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            disable=not shown(),
            transient=False,
        )
        self._task = self._progress.add_task(description, total=total)

    def __enter__(self) -> "Bar":
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    def update(self, done: float, total: float | None = None, description: str | None = None) -> None:
        extra = {"description": description} if description else {}
        self._progress.update(self._task, completed=done, total=total or None, **extra)

    def job(self, status: dict) -> None:
        """A job status (GET /jobs/{job}) as the bar: its state, and its chunks done of total."""
        p = status.get("progress") or {}
        state = status["state"]
        what = {
            "created": "waiting for the primary to start the job",
            "queued": "job queued: waiting for the service's worker",
        }.get(state, f"job {state}")
        done, total = p.get("done", 0), p.get("total") or None
        if state == "done" and not total:  # a secondary sees no counts (linkage_server.views): done is all
            done, total = 1, 1
        self.update(done, total, what)
