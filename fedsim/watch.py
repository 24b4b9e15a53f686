"""Running `flwr run` (or an in-process run) to its end while showing its progress.

The run writes ``<run>/progress.json`` (app/run_record.py documents the format); on a terminal
it is drawn as a rich progress bar (epoch, step, loss, last validation metric), elsewhere (CI,
logs) nothing is drawn. Flower's own output goes to ``<run>/flower.log``; its tail is shown when
the run fails. The outcome is the run's status file (app/run_status.py), never the mere
existence of an output.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

PROGRESS = "progress.json"


def read_progress(run_dir: Path) -> dict | None:
    try:
        return json.loads((Path(run_dir) / PROGRESS).read_text())
    except (OSError, ValueError):
        return None


def _describe(p: dict) -> str:
    val = p.get("val") or {}
    shown = " ".join(f"{k}={v:.4g}" for k, v in list(val.items())[:2])
    loss = f" loss={p['loss']:.4g}" if p.get("loss") is not None else ""
    epoch = f"epoch {p.get('epoch', 0) + 1}/{p.get('max_epochs', '?')}"
    return f"{p.get('phase', '')} {epoch}{loss}{(' | val ' + shown) if shown else ''}"


def watch(done: Callable[[], bool], run_dir: Path | None, *, label: str, interval: float = 0.5) -> None:
    """Until ``done()``: a progress bar of the run's steps on a terminal (``run_dir`` None: a
    spinner); nothing otherwise."""
    if not sys.stderr.isatty():
        while not done():
            time.sleep(interval)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task(f"{label}: starting Flower", total=None)
        while not done():
            p = read_progress(run_dir) if run_dir is not None else None
            if p:
                bar.update(task, description=f"{label}: {_describe(p)}", completed=p.get("step", 0),
                           total=p.get("steps_per_epoch") or None)
            time.sleep(interval)


def run_thread(target: Callable[[], object]) -> tuple[threading.Thread, dict]:
    """``target`` in a thread; the dict gets "result" or "error"."""
    box: dict = {}

    def body() -> None:
        try:
            box["result"] = target()
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            box["error"] = e

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, box


def tail(path: Path, chars: int = 4000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except OSError:
        return ""
