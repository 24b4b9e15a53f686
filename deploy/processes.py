"""The deployment's processes: a started process's pid, port and log; waiting for it to listen;
stopping its whole session."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Proc:
    pid: int
    port: int
    log: str
    started: int = 0  # the process's start time (/proc/<pid>/stat, clock ticks since boot): who it is


def start_time(pid: int) -> int:
    """The start time of process ``pid`` (clock ticks since boot), 0 when there is none: with the
    pid it names one process for good (a pid is reused, a (pid, start time) pair is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22; the name (field 2) may hold spaces


def ours(proc: Proc) -> bool:
    """Whether ``proc.pid`` is still the process that was started (not another one given its pid
    after it ended): a deploy.json without a start time names no process for certain."""
    return proc.started != 0 and start_time(proc.pid) == proc.started


def _wait_port(port: int, proc: Proc, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if not _alive(proc.pid):
            raise RuntimeError(f"{what} exited during start-up; its log {proc.log}:\n{_tail(proc.log)}")
        time.sleep(0.2)
    raise RuntimeError(
        f"{what} did not listen on 127.0.0.1:{port} within {timeout} s; log {proc.log}:\n{_tail(proc.log)}"
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def running(proc: Proc) -> bool:
    """Alive and still the process that was started (its pid not reused since: :func:`ours`)."""
    return ours(proc) and _alive(proc.pid)


def _tail(path: str, n: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def stop(proc: Proc | None, timeout: float = 10.0) -> bool:
    """SIGTERM the process's session (the process and everything it spawned), then SIGKILL; a
    process that is not ours any more (its pid reused: :func:`ours`) is never signalled."""
    if proc is None or not ours(proc):
        return False
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _session_alive(proc.pid):
        time.sleep(0.1)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def _session_alive(sid: int) -> bool:
    out = subprocess.run(["ps", "-eo", "sid=,stat="], capture_output=True, text=True).stdout
    return any(int(s) == sid and not st.startswith("Z") for s, st in (line.split() for line in out.splitlines()))
