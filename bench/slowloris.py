"""The slow-headers attack on the linkage service: connections that never finish their request head.

A stranger (no credential) opens N connections from its own address (127.0.0.2: every
127.0.0.0/8 address is this machine's loopback) to a real ``fedsim serve`` on 127.0.0.1, sends
a partial request head on each and then one more header line every second, and keeps reopening
what the service closes. While it holds, a party on 127.0.0.1 creates a job, uploads, links
and fetches. Printed per regime: the attacker's connections still open after ``--hold`` seconds,
the service's open file descriptors, /health's answer time, and whether the party's job went
through.

    python -m bench.slowloris [--connections 3000 --hold 15]

"before": the service without limits on request heads (``--header-timeout`` and the connection
caps set out of reach, as uvicorn alone behaves); "after": ``serve``'s defaults.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from linkage_server.client import LinkageClient, create_job
from linkage_server.local import free_port, local_service
from linkage_server.params import JobParams

ADMIN = "slowloris-bench-admin-token-0123456789"
UNLIMITED = ("--header-timeout", "100000", "--max-connections-per-address", "1000000", "--max-connections", "1000000")


class Attacker:
    """N half-sent requests from 127.0.0.2, kept topped up until :meth:`stop`."""

    def __init__(self, port: int, n: int) -> None:
        self.port, self.n, self.socks, self._stop = port, n, [], threading.Event()
        self.thread = threading.Thread(target=self._hold, daemon=True)

    def _open(self) -> socket.socket | None:
        s = socket.socket()
        try:
            s.bind(("127.0.0.2", 0))
            s.settimeout(2)
            s.connect(("127.0.0.1", self.port))
            s.sendall(b"POST /jobs HTTP/1.1\r\nHost: x\r\n")
            s.setblocking(False)
            return s
        except OSError:
            s.close()
            return None

    def alive(self) -> int:
        """Connections the service has not closed (a read that would block: still open)."""
        n = 0
        for s in list(self.socks):
            try:
                n += s.recv(1) != b""
            except BlockingIOError:
                n += 1
            except OSError:
                pass
        return n

    def _hold(self) -> None:
        while not self._stop.is_set():
            self.socks = [s for s in self.socks if s.fileno() >= 0]
            while len(self.socks) < self.n and not self._stop.is_set():
                s = self._open()
                if s is None:
                    break
                self.socks.append(s)
            for s in list(self.socks):
                try:
                    s.send(b"X-Slow: 1\r\n")
                except OSError:
                    s.close()
            time.sleep(1.0)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)
        for s in self.socks:
            s.close()


def party_round_trip(url: str, root: Path) -> str:
    """A job created, linked and fetched by its parties while the attack holds; "ok" or why not."""
    rng = np.random.default_rng(0)
    try:
        made = create_job(url, ADMIN, "p", ["s"])
        with (
            LinkageClient(url, made["job"], "p", made["secrets"]["p"]) as p,
            LinkageClient(url, made["job"], "s", made["secrets"]["s"]) as s,
        ):
            s.upload(rng.uniform(0, 10, (50, 2)))
            p.upload(rng.uniform(0, 10, (200, 2)))
            p.start(JobParams("euclidean", 3))
            p.wait(timeout=60)
            p.fetch(root / "linkage")
        return "ok"
    except Exception as e:  # noqa: BLE001 - the outcome is what this measures
        return f"failed: {type(e).__name__}: {str(e)[:120]}"


def health_seconds(url: str) -> str:
    import httpx

    t0 = time.perf_counter()
    try:
        httpx.get(f"{url}/health", timeout=20).raise_for_status()
        return f"{time.perf_counter() - t0:.3f} s"
    except Exception as e:  # noqa: BLE001
        return f"no answer ({type(e).__name__})"


def service_fds(data: Path) -> int:
    """Open file descriptors of the `serve` process whose data folder is ``data``."""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if b"serve" in cmd and str(data).encode() in cmd:
                    return len(os.listdir(f"/proc/{pid}/fd"))
            except OSError:
                continue
    return -1


def regime(name: str, extra: tuple, n: int, hold: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root, port = Path(tmp), free_port()
        with local_service(root / "svc", port, ADMIN, "--privacy-floor", "off", *extra) as url:
            attacker = Attacker(port, n)
            attacker.start()
            time.sleep(hold)
            alive, fds, health = attacker.alive(), service_fds(root / "svc"), health_seconds(url)
            outcome = party_round_trip(url, root)
            attacker.stop()
    print(f"| {name} | {n} | {alive} | {fds} | {health} | {outcome} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=3000)
    ap.add_argument("--hold", type=float, default=15.0, help="seconds the attack holds before it is measured")
    args = ap.parse_args()
    print("| regime | attacker's connections | still open | service fds | /health | a party's job meanwhile |")
    print("|---|---|---|---|---|---|")
    regime("before (no head deadline, no caps)", UNLIMITED, args.connections, args.hold)
    regime("after (serve's defaults)", (), args.connections, args.hold)


if __name__ == "__main__":
    main()
