"""The deployment's processes: a started process's pid, port and log; waiting for it to listen;
stopping its whole session."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
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


PORT_TRIES = 3  # starts of a server whose port another process took between its pick and its bind
MARK = "--- started"  # how each start's lines begin in a server's log (appended across `up`s)
LOST_PORT = re.compile(  # a server's words for a port another process bound first
    r"address already in use|errno 98|port in server address .* already in use", re.IGNORECASE
)


class PortTaken(RuntimeError):
    """The server died because another process had bound its port first."""


def listening(
    start: Callable[[int], Proc], port: Callable[[], int], what: str, timeout: float, started: Proc | None = None
) -> Proc:
    """``start(port())`` (or ``started``, begun already), waited for until it listens itself;
    started again on a fresh port when another process took the port first (a port is picked
    free, then bound seconds later, after the server's imports): PORT_TRIES starts in all. Any
    other failure is raised at once, the server stopped."""
    proc = started or start(port())
    for attempt in range(1, PORT_TRIES + 1):
        try:
            _wait_port(proc.port, proc, what, timeout)
            return proc
        except PortTaken:
            if attempt == PORT_TRIES:
                raise
        except RuntimeError:
            stop(proc)  # alive but not listening in time: not left behind
            raise
        proc = start(port())
    raise AssertionError("unreachable")


def _wait_port(port: int, proc: Proc, what: str, timeout: float) -> None:
    """Until ``proc`` itself listens on 127.0.0.1:``port`` (another process answering that port
    is not it); :class:`PortTaken` if it died on a port in use, RuntimeError on any other exit
    or after ``timeout`` seconds, each with the log's tail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(proc.pid):
            error = PortTaken if lost_port(proc.log) else RuntimeError
            raise error(f"{what} exited during start-up; its log {proc.log}:\n{_tail(proc.log)}")
        if _listens(proc.pid, port):
            return
        time.sleep(0.2)
    raise RuntimeError(
        f"{what} did not listen on 127.0.0.1:{port} within {timeout} s; log {proc.log}:\n{_tail(proc.log)}"
    )


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a socket listening on TCP ``port`` (its network namespace's
    tables and its open files in /proc). Where /proc does not tell (not Linux, another user's
    process): whether anything answers on 127.0.0.1:``port``."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
        tables = [Path(f"/proc/{pid}/net/{t}").read_text() for t in ("tcp", "tcp6")]
    except PermissionError:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0
    except OSError:
        return False  # gone, or a zombie: its files closed
    inodes = set()
    for line in (row for table in tables for row in table.splitlines()[1:]):
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # state 0A: LISTEN
            inodes.add(f"socket:[{fields[9]}]")
    for fd in fds if inodes else []:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
    return False


def lost_port(log: str) -> bool:
    """Whether the last start in ``log`` (the lines after its last :data:`MARK`) failed on a port in use."""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return False
    start = text.rfind(MARK)
    return LOST_PORT.search(text[max(start, 0) :]) is not None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
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
