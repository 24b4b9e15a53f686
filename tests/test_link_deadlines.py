"""The direct link's handshake ends by its deadline however a peer trickles its bytes (app/secure_link.py):
the socket's timeout bounds each read, so a peer sending a byte just inside it held a handshake of 64
bytes for 64 timeouts. Asserted by order, not by wall time: the handshake gives up while the
trickling peer still has bytes to send."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from app.secure_link import LinkError, SecureLink, new_key

TRICKLE = 0.3  # seconds between the peer's bytes: under the 1 s timeout, so each read returns in time


def _trickler(conn: socket.socket, sent: list[int], stop: threading.Event) -> None:
    """Send 64 bytes, one every TRICKLE seconds, counting them; stops when the other end gives up."""
    try:
        for _ in range(64):
            if stop.is_set():
                return
            conn.sendall(b"x")
            sent.append(1)
            time.sleep(TRICKLE)
    except OSError:
        return
    finally:
        conn.close()


def test_a_worker_trickling_its_handshake_is_given_up_at_the_primarys_timeout():
    server = socket.create_server(("127.0.0.1", 0))
    sent, stop = [], threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        _trickler(conn, sent, stop)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with pytest.raises((LinkError, OSError)):
        SecureLink.connect(f"127.0.0.1:{server.getsockname()[1]}", new_key(), 1.0)
    given_up_after = len(sent)
    stop.set()
    t.join(30)
    server.close()
    # the worker's nonce is 32 bytes: one timeout (1 s) lets at most ~1 / TRICKLE of them through;
    # a handshake bounded per read only would have waited for all 32 (about 10 s)
    assert given_up_after < 32, given_up_after


def test_a_stranger_trickling_its_handshake_is_given_up_at_the_workers_deadline():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    sent, stop = [], threading.Event()
    t = threading.Thread(target=_trickler, args=(client, sent, stop), daemon=True)
    t.start()
    conn.settimeout(1.0)
    with pytest.raises((LinkError, OSError)):
        SecureLink.accept(conn, new_key(), time.monotonic() + 1.0)
    given_up_after = len(sent)
    stop.set()
    t.join(30)
    conn.close()
    server.close()
    assert given_up_after < 64, given_up_after  # the nonce and the proof: 64 bytes


def test_a_linked_worker_ends_when_its_primary_goes_silent_past_the_idle_limit():
    """A primary that linked and then sent nothing held its worker (a party's model and data in
    memory) for ever; the worker now ends after the node config's 'worker-idle' seconds."""
    from flwr.app import RecordDict

    from app import party_worker
    from tests.test_direct_transport import _pair

    key = new_key()
    primary, worker = _pair(key, key)
    context = party_worker.LiveContext(
        run_id=0, node_id=0, node_config={"worker-idle": 0.5}, state=RecordDict(), run_config={}
    )
    t = threading.Thread(target=party_worker.serve, args=(worker, context, {}), daemon=True)
    t.start()
    t.join(30)  # 0.5 s of silence ends it; 30 s is a margin for a loaded machine, not a speed claim
    alive = t.is_alive()
    primary.close()
    worker.close()
    assert not alive, "the worker still waits on a silent primary"
