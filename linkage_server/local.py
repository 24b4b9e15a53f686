"""Start and stop a linkage service process on 127.0.0.1 (tests, benchmarks, local runs)."""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from files.atomic import write_atomic


def free_port() -> int:
    """A port free on 127.0.0.1 now, below the OS's ephemeral range: a port the OS hands out
    meanwhile (an outgoing connection, a party worker's or a Flower process's bind to port 0) is
    never this one, so the server it is for can still bind it."""
    low = 32768  # Linux's default lower bound
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(10000, max(low, 10001))
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            return port
    with socket.socket() as s:  # everything below the range is taken: any free one
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(port: int, data_dir: Path, token_file: Path) -> list[str]:
    """The command line of a linkage service on 127.0.0.1:``port`` keeping ``data_dir``."""
    return [
        sys.executable,
        "-m",
        "linkage_server",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--admin-token-file",
        str(token_file),
    ]


@contextlib.contextmanager
def local_service(data_dir: Path, port: int, admin_token: str, *extra: str, timeout: float = 60.0):
    """`python -m linkage_server serve` on 127.0.0.1:port; yields its URL; stops it on exit."""
    token = Path(data_dir).parent / "admin.token"
    write_atomic(token, admin_token.encode())  # 0600
    proc = subprocess.Popen(
        [*serve_command(port, data_dir, token), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).is_success:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"service did not start:\n{proc.stdout.read() if proc.poll() is not None else ''}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
