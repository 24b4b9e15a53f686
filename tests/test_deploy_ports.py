"""A deployment's servers on ports picked free a moment before they bind (deploy/processes.py):
another process can take the port in between (other tests, other users' servers). The server
then dies on "address already in use"; `up` must see that (not the other process's listener)
and start it again on a fresh port. Tiny Python servers stand in for Flower's: seconds each."""

import socket
import subprocess
import sys
import time

import pytest

from deploy import processes
from deploy.processes import Proc, start_time

SERVER = """
import socket, sys, time
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError as e:
    print(f"error while attempting to bind: {e}", flush=True)  # uvicorn's words: [Errno 98] ... in use
    sys.exit(1)
time.sleep(float(sys.argv[2]))  # the import time of a real server
s.listen()
time.sleep(60)
"""


def _server(tmp_path, port: int, delay: float = 0.3) -> Proc:
    log = tmp_path / f"server-{port}.log"
    with open(log, "ab") as out:
        out.write(f"{processes.MARK} on port {port}\n".encode())
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(port), str(delay)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Proc(proc.pid, port, str(log), start_time(proc.pid))


@pytest.fixture
def taken():
    """A port another process listens on (here: this test's own socket)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_port_answered_by_another_process_is_not_the_servers(tmp_path, taken):
    """The server died on the taken port: its start fails naming the port taken, even though a
    connection to that port succeeds (the other process answers it)."""
    proc = _server(tmp_path, taken)
    try:
        with pytest.raises(processes.PortTaken, match="in use"):
            processes._wait_port(taken, proc, "the test server", 30)
    finally:
        processes.stop(proc)


def test_a_server_that_lost_its_port_starts_again_on_a_fresh_one(tmp_path, taken):
    ports = iter([taken])

    def start(port: int) -> Proc:
        return _server(tmp_path, port)

    proc = processes.listening(start, lambda: next(ports, None) or _free(), "the test server", 30)
    try:
        assert proc.port != taken and processes.running(proc)
        assert processes._listens(proc.pid, proc.port)
    finally:
        processes.stop(proc)


def test_a_server_failing_otherwise_is_not_retried(tmp_path):
    """Only a lost port is worth a second start: any other failure is reported at once, its log
    tail included."""
    starts = []

    def start(port: int) -> Proc:
        starts.append(port)
        log = tmp_path / "broken.log"
        log.write_text("--- started\nValueError: a bad certificate\n")
        proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"], start_new_session=True)
        return Proc(proc.pid, port, str(log), start_time(proc.pid))

    with pytest.raises(RuntimeError, match="a bad certificate") as err:
        processes.listening(start, _free, "the broken server", 30)
    assert not isinstance(err.value, processes.PortTaken) and len(starts) == 1


def test_an_old_start_s_lost_port_in_the_log_is_not_this_one(tmp_path):
    """The log is appended across `up`s: a line from an earlier start does not make this start's
    failure a lost port."""
    log = tmp_path / "s.log"
    log.write_text("--- started\naddress already in use\n--- started\nValueError: no key\n")
    assert not processes.lost_port(str(log))
    log.write_text("--- started\nValueError: no key\n--- started\n[Errno 98] address already in use\n")
    assert processes.lost_port(str(log))
    log.write_text("--- started\nERROR: Public key already in use\n")  # Flower's, for a node's key: not a port
    assert not processes.lost_port(str(log))
    log.write_text("[Errno 98] error while attempting to bind on address: address already in use\n")  # no mark
    assert processes.lost_port(str(log))


def _free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_wait_port_returns_once_the_server_itself_listens(tmp_path):
    proc = _server(tmp_path, _free(), delay=0.5)
    try:
        began = time.monotonic()
        processes._wait_port(proc.port, proc, "the test server", 30)
        assert processes._listens(proc.pid, proc.port)
        assert (
            time.monotonic() - began >= 0.3
        )  # not before its bind: the server sleeps 0.5 s first (a bound, not a speed)
    finally:
        processes.stop(proc)
