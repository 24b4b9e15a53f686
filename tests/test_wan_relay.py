"""Issue 32: the user-space WAN relay (lab/wan_relay.py), on loopback only. Time is asserted as
lower bounds (the relay never releases a chunk early), never as an upper bound on the wall time;
every server a test starts is stopped by it, and every socket has a timeout (no hang)."""

import random
import socket
import socketserver
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from lab.wan_relay import Link, RelaySettings, Schedule, start_relay

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 30.0  # a socket's timeout: only to fail instead of hanging, never a measure


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(1 << 16):
            self.request.sendall(data)
        self.request.shutdown(socket.SHUT_WR)  # half-close back: the client reads to the end


class _Sink(socketserver.BaseRequestHandler):
    def handle(self):
        n = 0
        while data := self.request.recv(1 << 16):
            n += len(data)
        self.request.sendall(str(n).encode())


@contextmanager
def _server(handler):
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT)


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while data := sock.recv(1 << 16):
        chunks.append(data)
    return b"".join(chunks)


def _round_trip(port: int, payload: bytes) -> bytes:
    """Send ``payload``, half-close, read the reply to its end (the sender is a thread so that a
    large payload and its echo flow at once)."""
    with _connect(port) as sock:

        def send():
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        reply = _read_all(sock)
        sender.join(TIMEOUT)
    return reply


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_bytes_arrive_unchanged_and_in_order_both_ways_with_jitter():
    rng = random.Random(7)
    payload = rng.randbytes(4 << 20)
    link = Link(delay_ms=5, jitter_ms=4, rate_mbit=0)  # jitter near the delay: reordering would show
    with _server(_Echo) as target, start_relay(RelaySettings(target_port=target, up=link, down=link)) as relay:
        assert _round_trip(relay.port, payload) == payload
        small = rng.randbytes(1000)
        assert _round_trip(relay.port, small) == small  # the relay serves the next connection too
    assert relay.wait(0)  # stopped by the context manager


def test_the_schedule_is_fifo_adds_the_delay_and_serialises_at_the_rate():
    """The lower bounds below could fail: with no delay a chunk is released when it is read, and
    with one it is released ``delay`` later; jitter never puts a chunk before the previous one."""
    assert Schedule(Link(), random.Random(0)).release(10.0, 1000) == 10.0
    assert Schedule(Link(delay_ms=150), random.Random(0)).release(10.0, 1000) == pytest.approx(10.15)
    jittery = Schedule(Link(delay_ms=10, jitter_ms=10, jitter="normal"), random.Random(0))
    times = [jittery.release(t * 1e-4, 100) for t in range(1000)]
    assert times == sorted(times) and all(r >= t * 1e-4 for t, r in enumerate(times))
    capped = Schedule(Link(rate_mbit=8), random.Random(0))  # 1 byte per microsecond
    assert [capped.release(0.0, 10**6) for _ in range(3)] == pytest.approx([1.0, 2.0, 3.0])


def test_a_round_trip_takes_at_least_twice_the_one_way_delay():
    # 150 ms each way: a loopback round trip without the relay takes well under a millisecond, so
    # the bound is the relay's doing; the relay never releases early, so no slack beyond 1 ms
    # for the float arithmetic of the two clocks' reads (both are time.monotonic).
    link = Link(delay_ms=150)
    with _server(_Echo) as target, start_relay(RelaySettings(target_port=target, up=link, down=link)) as relay:
        with _connect(relay.port) as sock:
            for _ in range(2):  # the second on an open connection: no connect in the measure
                start = time.monotonic()
                sock.sendall(b"ping")
                assert sock.recv(4) == b"ping"
                assert time.monotonic() - start >= 2 * 0.150 - 0.001


def test_a_rate_cap_makes_n_bytes_take_at_least_n_bits_over_the_rate():
    # 1 MB at 8 Mbit/s: >= 1 s. The relay's sending clock starts at the first read (after
    # `start`) and each chunk adds its bits / rate, so the last byte is released >= start + 1 s;
    # 10 ms of slack for the clocks' reads and float rounding. Without the cap it takes ~10 ms.
    n, link = 10**6, Link(rate_mbit=8)
    with _server(_Sink) as target, start_relay(RelaySettings(target_port=target, up=link, down=link)) as relay:
        start = time.monotonic()
        assert _round_trip(relay.port, bytes(n)) == str(n).encode()
        assert time.monotonic() - start >= n * 8 / 8e6 - 0.010


def test_the_relay_stops_at_its_lifetime_then_refuses_connections():
    lifetime = 1.0
    with _server(_Echo) as target:
        started = time.monotonic()
        relay = start_relay(RelaySettings(target_port=target, lifetime_s=lifetime))
        try:
            with _connect(relay.port) as sock:
                sock.sendall(b"hello")
                assert sock.recv(5) == b"hello"
                assert relay.wait(TIMEOUT), "the relay did not stop by itself"
                assert time.monotonic() - started >= lifetime - 0.001  # not before its lifetime
                assert _closed_by_peer(sock)  # the open connection was closed at the end
            with pytest.raises(ConnectionRefusedError):
                _connect(relay.port).close()
        finally:
            relay.stop()


def test_connections_beyond_the_maximum_are_closed():
    settings = dict(max_connections=2)
    with _server(_Echo) as target, start_relay(RelaySettings(target_port=target, **settings)) as relay:
        first, second = _connect(relay.port), _connect(relay.port)
        with first, second:
            for sock in (first, second):  # both served: the relay counts them
                sock.sendall(b"x")
                assert sock.recv(1) == b"x"
            with _connect(relay.port) as third:
                assert _closed_by_peer(third)
            first.close()
            deadline = time.monotonic() + TIMEOUT  # the relay sees the close after the flush
            while time.monotonic() < deadline:
                with _connect(relay.port) as again:
                    again.sendall(b"y")
                    if not _closed_by_peer_or_echo(again):
                        break
                time.sleep(0.05)
            else:
                pytest.fail("a closed connection's place was not given back")
            second.sendall(b"z")
            assert second.recv(1) == b"z"


def _closed_by_peer_or_echo(sock: socket.socket) -> bool:
    """True when the relay closed the connection, False when it echoed."""
    try:
        return sock.recv(1) != b"y"
    except ConnectionResetError:
        return True


def test_a_target_that_refuses_closes_the_client():
    with socket.socket() as reserved:  # bound, not listening: a connection to it is refused
        reserved.bind(("127.0.0.1", 0))
        settings = RelaySettings(target_port=reserved.getsockname()[1])
        with start_relay(settings) as relay, _connect(relay.port) as sock:
            assert _closed_by_peer(sock)


def test_the_command_line_names_a_bad_listen_address():
    r = subprocess.run(
        [sys.executable, "-m", "lab.wan_relay", "--listen", "nowhere", "--to", "127.0.0.1:9"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "--listen" in r.stderr and "nowhere" in r.stderr, r.stderr


def test_the_command_line_says_what_it_does_and_stops_at_its_lifetime():
    with _server(_Echo) as target:
        r = subprocess.run(
            [sys.executable, "-m", "lab.wan_relay", "--listen", "127.0.0.1:0", "--to", f"127.0.0.1:{target}"]
            + ["--delay-ms", "25", "--jitter-ms", "2", "--rate-mbit", "100", "--lifetime", "0.5"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert line.startswith("wan_relay: 127.0.0.1:") and f"-> 127.0.0.1:{target}" in line
    assert "25 ms one-way +- 2 ms uniform jitter, 100 Mbit/s" in line and "stops after 0.5 s" in line
