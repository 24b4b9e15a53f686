"""Running `flwr run` (or an in-process run) to its end while showing its progress.

The run writes ``<run>/progress.json`` (app/run_record.py documents the format); on a terminal
it is drawn as a rich progress bar (epoch, step, loss, last validation metric); elsewhere (CI,
logs) a plain line is printed each time the phase or the epoch changes. Flower's own output goes
to ``<run>/flower.log``; its tail is shown when the run fails. The outcome is the run's status file (app/run_status.py), never the mere
existence of an output.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

PROGRESS = "progress.json"


def read_progress(run_dir: Path, since: float = 0.0) -> dict | None:
    """The run's progress; None before it wrote any, or while the file is one written before
    ``since`` (time.time(): an earlier run's under this name, until this run writes its own)."""
    path = Path(run_dir) / PROGRESS
    try:
        if path.stat().st_mtime < since:
            return None
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _describe(p: dict) -> str:
    """The progress line: epochs numbered from 0 as in summary.json (best_epoch) and metrics.jsonl."""
    val = p.get("val") or {}
    shown = " ".join(f"{k}={v:.4g}" for k, v in list(val.items())[:2])
    loss = f" loss={p['loss']:.4g}" if p.get("loss") is not None else ""
    if p.get("phase") == "linkage":
        return "linking (each record's K most similar records)"
    epoch = f"epoch {p.get('epoch', 0)}/{p.get('max_epochs', '?')}"
    return f"{p.get('phase', '')} {epoch}{loss}{(' | val ' + shown) if shown else ''}"


def clock_text(seconds: float) -> str:
    """Elapsed time as H:MM:SS."""
    s = max(0, int(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def watch(
    done: Callable[[], bool],
    run_dir: Path | None,
    *,
    label: str,
    starting: str = "starting",
    since: float = 0.0,
    interval: float = 0.5,
    stream: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Until ``done()``: on a terminal (``stream``, default stderr) a progress bar of the run's
    steps (``run_dir`` None: a spinner) and a clock, both redrawn every ``interval`` seconds
    whether or not the run's progress changed; ``starting``: what happens before the run writes
    its progress; ``since`` (time.time()): the run's start (older progress: an earlier run's).
    Elsewhere a plain line per phase or epoch (:func:`_lines`). (Rich's own elapsed column stops
    for good once a bar is full, i.e. at the end of the first epoch: hence a clock of our own.)"""
    stream = sys.stderr if stream is None else stream
    progress = lambda: read_progress(run_dir, since) if run_dir is not None else None  # noqa: E731 - both views'
    if not stream.isatty():
        _lines(done, progress, label, stream, clock, sleep, interval)
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[count]}"),
        TextColumn("{task.fields[clock]}"),
    )
    t0 = clock()
    with Progress(
        *columns, console=Console(file=stream, force_terminal=True), transient=True, auto_refresh=False
    ) as bar:
        task = bar.add_task(f"{label}: {starting}", total=None, clock=clock_text(0), count="")
        while not done():
            p = progress()
            total = (p or {}).get("steps_per_epoch") or None  # steps of this epoch; unknown: no count shown
            news = (
                {
                    "description": f"{label}: {_describe(p)}",
                    "completed": p.get("step", 0),
                    "total": total,
                    "count": f"step {p.get('step', 0)}/{total}" if total else "",
                }
                if p
                else {}
            )
            bar.update(task, clock=clock_text(clock() - t0), **news)
            bar.refresh()
            sleep(interval)


def _lines(
    done: Callable[[], bool],
    progress: Callable[[], dict | None],
    label: str,
    stream: TextIO,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    interval: float,
) -> None:
    """Off a terminal (a log, CI): one plain line each time the run's phase or epoch changes, with
    the time so far, so that a long run is never silent for an epoch; nothing before its progress."""
    t0, last = clock(), None
    while not done():
        p = progress()
        key = (p.get("phase"), p.get("epoch")) if p else None
        if key is not None and key != last:
            print(f"{label}: {_describe(p)} [{clock_text(clock() - t0)}]", file=stream, flush=True)
            last = key
        sleep(interval)


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


def interrupt(thread: threading.Thread, exc: type[BaseException]) -> None:
    """Raise ``exc`` in ``thread`` at its next Python instruction (CPython's
    PyThreadState_SetAsyncExc): a run in a thread stops as Ctrl-C stops the main thread, through
    its own handlers, instead of training on or being cut off mid-write when the process exits."""
    import ctypes  # lazy: only an interrupted run needs it

    if thread.ident is not None and thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc))


def tail(path: Path, chars: int = 4000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except OSError:
        return ""
