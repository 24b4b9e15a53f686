"""The service's chunked search on a Ray cluster given by its address (issue 20): a head node
started with ``ray start --head``, joined by address, gives the local path's bytes. The test stops
the head it starts. And a local Ray is started with token authentication.

Opt-in (FEDSIM_RAY_CLUSTER_TEST=1): the Ray pinned here binds its head's GCS, raylet and client
servers to every interface whatever ``--node-ip-address`` says, and the suite's servers listen on
127.0.0.1 only. Run it where a listener on every interface for a minute is acceptable:

    FEDSIM_RAY_CLUSTER_TEST=1 .venv/bin/python -m pytest tests/test_ray_cluster.py
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from linkage_server.jobs import JobParams, JobStore
from linkage_server.local import free_port
from linkage_server.uploads import to_npy

RNG = np.random.default_rng(5)
QUERY, BASE = RNG.normal(size=(1200, 12)), RNG.normal(size=(2000, 12))


def job_bytes(root, ray: str) -> bytes:
    store = JobStore(root, chunk_rows=300, ray=ray)
    job, _ = store.create("p", ["s"])
    store.upload(job, "p", to_npy(QUERY))
    store.upload(job, "s", to_npy(BASE))
    store.start(job, JobParams("euclidean", 7, tau=0.9, radius=0.05))
    store.run(job)
    assert store.meta(job)["state"] == "done", store.meta(job)["error"]
    chunks = sorted((root / "jobs" / job / "work" / "s").glob("*/*.npz"), key=lambda p: int(p.stem.split("-")[0]))
    return b"".join(p.read_bytes() for p in chunks)


def ray_port() -> int:
    """A free port outside the range Ray keeps for its workers (10002-19999)."""
    return next(p for p in iter(free_port, None) if not 10_000 <= p < 20_000)


@pytest.fixture
def ray_head(tmp_path):
    """A Ray head node on 127.0.0.1 in its own process group; its address."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    port, log = ray_port(), open(tmp_path / "ray-head.log", "w")
    head = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--head",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--block",
            "--disable-usage-stats",
            f"--ray-client-server-port={ray_port()}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # the head takes a few seconds to listen
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if head.poll() is not None or time.monotonic() > deadline:
                    tail = (tmp_path / "ray-head.log").read_text()[-2000:]
                    raise RuntimeError(f"the Ray head did not start (exit status {head.poll()}):\n{tail}") from None
                time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        ray.shutdown()
        log.close()
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        _forget(port)


def _forget(port: int) -> None:
    """Remove Ray's note of the stopped head (``ray stop`` would, stopping every Ray here): left
    behind, it makes the next ``ray.init()`` (Flower's simulation, tests/test_chunk_search.py)
    try to join a cluster that is gone."""
    import tempfile
    from pathlib import Path

    note = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    if note.exists() and note.read_text().strip().endswith(f":{port}"):
        note.unlink()


@pytest.mark.skipif(
    os.environ.get("FEDSIM_RAY_CLUSTER_TEST") != "1",
    reason="opt-in: a Ray head binds every interface (module docstring)",
)
def test_a_cluster_given_by_address_gives_the_local_bytes(ray_head, tmp_path):
    local = job_bytes(tmp_path / "local", "")
    assert job_bytes(tmp_path / "cluster", ray_head) == local
    import ray

    port = ray_head.rsplit(":", 1)[1]
    assert ray.is_initialized() and ray.get_runtime_context().gcs_address.endswith(f":{port}")  # that cluster


FAKE_RAY = """
import os
def is_initialized():
    return False
def init(address=None, **kw):
    print(os.environ.get("RAY_AUTH_MODE"), address)
"""


@pytest.mark.parametrize(
    "env, address, want",
    [
        ({}, "local", "token None"),
        ({"RAY_AUTH_MODE": "disabled"}, "local", "disabled None"),
        ({}, "10.0.0.5:6379", "None 10.0.0.5:6379"),
    ],
)
def test_a_local_ray_is_started_with_token_authentication(tmp_path, env, address, want):
    """Its servers listen on every interface: only a holder of its token may use them (measured:
    a process without the token is refused, docs/threat-model.md). An operator's own RAY_AUTH_MODE
    is kept; a cluster given by address is the operator's to secure. Ray reads the mode when it is
    imported, so the check runs in a fresh process with a stand-in ``ray`` that reports it."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text(FAKE_RAY)
    clean = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    code = f"from linkage_server.chunk_search import connect; connect({address!r})"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    ).stdout
    assert out.strip() == want


FAKE_RAY_TOKEN = """
import os
def is_initialized():
    return False
def init(address=None, **kw):  # as Ray does: its token written under the process's umask (022: 0644)
    path = os.environ["RAY_AUTH_TOKEN_PATH"]
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"ray-token")
    os.close(fd)
"""


def test_rays_token_is_readable_by_its_owner_only(tmp_path):
    """Issue 28: ~/.ray/auth_token was 0644 while Ray listens on every interface, so any local user
    could read the token and run code in the service's Ray. Failed before: the token stayed 0644."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text(FAKE_RAY_TOKEN)
    token = tmp_path / "home" / ".ray" / "auth_token"
    code = "from linkage_server.chunk_search import connect; connect('local')"
    subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(tmp_path), "RAY_AUTH_TOKEN_PATH": str(token)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        umask=0o022,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert token.read_text() == "ray-token"
    assert oct(token.stat().st_mode & 0o777) == oct(0o600) and oct(token.parent.stat().st_mode & 0o777) == oct(0o700)
