"""The direct transport (run config transport = "direct"): the encrypted, mutually authenticated
link (app/secure_link.py) and the party worker behind it (app/party_worker.py). The run through
`flwr run` equals the one-process twin: tests/test_flower_run.py "hdb-S1-direct"; through a TLS
deployment: tests/test_deploy.py."""

import os
import signal
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from flwr.app import ConfigRecord, Context, RecordDict

from app import secure_link
from app.party_worker import decode, encode, spawn
from app.secure_link import LinkClosed, LinkError, SecureLink, new_key
from app.transport import PartyError
from app.vfl.channel import FlowerChannel
from app.vfl.direct import DirectChannel
from deploy.localsim import _processes


def _workers() -> list[int]:
    """The party workers this test process started (their parent until they exit)."""
    return [pid for pid, ppid, _, args in _processes() if "app.party_worker" in args and ppid == os.getpid()]


def _ended(timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while _workers() and time.monotonic() < deadline:
        time.sleep(0.2)
    return _workers() == []


def _pair(primary_key: str, worker_key: str) -> tuple[SecureLink, SecureLink]:
    """Both ends of a link over a loopback socket; raises what either end raised."""
    server = socket.create_server(("127.0.0.1", 0))
    out: dict = {}

    def accept() -> None:
        conn, _ = server.accept()
        try:
            out["worker"] = SecureLink.accept(conn, worker_key)
        except Exception as e:  # noqa: BLE001
            out["error"] = e
            conn.close()

    t = threading.Thread(target=accept)
    t.start()
    try:
        primary = SecureLink.connect(f"127.0.0.1:{server.getsockname()[1]}", primary_key, 10)
    except LinkError:
        primary = None  # the worker refused first: its reason is the one to see
    t.join(10)
    server.close()
    if "error" in out:
        raise out["error"]
    return primary, out["worker"]


def test_a_message_crosses_the_link_in_frames_both_ways(monkeypatch):
    monkeypatch.setattr(secure_link, "CHUNK", 1000)  # a message of many frames
    primary, worker = _pair(key := new_key(), key)
    body = bytes(range(256)) * 40
    primary.send(b"Q", 7, "train.step", body)
    assert worker.recv() == (b"Q", 7, "train.step", body)
    worker.send(b"R", 7, "train.step", b"")
    assert primary.recv() == (b"R", 7, "train.step", b"")
    primary.close()
    with pytest.raises(LinkClosed):  # between two messages: the primary is done
        worker.recv()


def test_a_peer_without_the_run_key_is_refused_both_ways():
    with pytest.raises(LinkError, match="did not prove it holds this run's key"):
        _pair(new_key(), new_key())  # the worker refuses a primary with another key
    server = socket.create_server(("127.0.0.1", 0))

    def impostor() -> None:  # a worker that cannot prove the key: the primary refuses it
        conn, _ = server.accept()
        conn.sendall(b"\0" * 32)
        conn.recv(64)
        conn.sendall(b"\1" * 32)
        time.sleep(0.5)
        conn.close()

    t = threading.Thread(target=impostor)
    t.start()
    with pytest.raises(LinkError, match="the worker did not prove"):
        SecureLink.connect(f"127.0.0.1:{server.getsockname()[1]}", new_key(), 10)
    t.join(10)
    server.close()


def _raw_frame(link: SecureLink, body: bytes) -> bytes:
    """What ``link`` puts on the wire for one message, captured."""
    sent = []
    real = link.sock
    link.sock = type("Capture", (), {"sendall": lambda self, b: sent.append(b)})()
    link.send(b"Q", 1, "query.ping", body)
    link.sock = real
    return b"".join(sent)


def test_an_altered_or_replayed_frame_does_not_decrypt():
    primary, worker = _pair(key := new_key(), key)
    frame = bytearray(_raw_frame(primary, b"gradients"))
    frame[-1] ^= 1  # one bit flipped on the wire
    primary.sock.sendall(bytes(frame))
    with pytest.raises(LinkError, match="does not decrypt"):
        worker.recv()
    primary, worker = _pair(key, key)
    frame = _raw_frame(primary, b"gradients")
    primary.sock.sendall(frame)
    assert worker.recv()[3] == b"gradients"
    primary.sock.sendall(frame)  # the same frame again: its nonce is spent
    with pytest.raises(LinkError, match="does not decrypt"):
        worker.recv()


def _context(**node_config) -> Context:
    return Context(run_id=1, node_id=1, node_config=node_config, state=RecordDict(), run_config={})


def test_the_party_worker_answers_only_the_primary_with_its_key_and_ends_with_the_link():
    key = new_key()
    address = spawn(_context(), key, timeout=30)
    with pytest.raises(LinkError):  # someone without the key: dropped, the worker waits on
        SecureLink.connect(address, new_key(), 10)
    link = SecureLink.connect(address, key, 10)
    channel = DirectChannel(FlowerChannel(None, {"bank": 1}, 10.0, "job"), {"bank": link})
    assert channel._exchange("query.ping", {"bank": RecordDict()})["bank"].config_records == {}
    with pytest.raises(PartyError, match="party 'bank' failed on query.keep: .*lacks"):
        channel._exchange("query.keep", {"bank": RecordDict({"keep": ConfigRecord({"run": "r"})})})
    assert channel.traffic.exchanges == 1
    channel.close()
    assert _ended()


def test_a_worker_that_dies_fails_the_run_naming_its_party():
    key = new_key()
    link = SecureLink.connect(spawn(_context(), key, timeout=30), key, 10)
    channel = DirectChannel(FlowerChannel(None, {"bank": 1}, 10.0, "job"), {"bank": link})
    (pid,) = _workers()
    os.kill(pid, signal.SIGKILL)
    assert _ended()
    with pytest.raises(PartyError, match="party 'bank': the direct link failed on query.ping"):
        channel._exchange("query.ping", {"bank": RecordDict()})
    channel.close()


def test_the_worker_listens_where_its_own_node_config_says():
    with pytest.raises(ValueError, match="'direct-address'"):  # every interface, no address to give the primary
        spawn(_context(**{"direct-listen": "0.0.0.0:0"}), new_key(), timeout=30)
    with pytest.raises(ValueError, match="HOST:PORT"):
        spawn(_context(**{"direct-listen": "nowhere"}), new_key(), timeout=30)
    with pytest.raises(ValueError, match="node config 'direct-address' must be HOST:PORT"):
        spawn(_context(**{"direct-address": "bank.example.org"}), new_key(), timeout=30)
    assert spawn(_context(**{"direct-address": "bank.example.org:9301"}), new_key(), 2) == "bank.example.org:9301"
    assert _ended()  # nobody authenticated within its timeout: it exited


def test_a_worker_told_the_address_to_give_is_started_and_reached_there():
    """A node config with `direct-address` (a host behind its own name, as the lab's hosts): the
    worker is started, listening where `direct-listen` says, and the primary reaches it at the
    address given (a refactor once returned the address with no worker started)."""
    port = _free_port()
    key = new_key()
    node = {"direct-listen": f"127.0.0.1:{port}", "direct-address": f"127.0.0.1:{port}"}
    assert spawn(_context(**node), key, timeout=30) == f"127.0.0.1:{port}"
    link = SecureLink.connect(f"127.0.0.1:{port}", key, 10)
    channel = DirectChannel(FlowerChannel(None, {"bank": 1}, 10.0, "job"), {"bank": link})
    assert channel._exchange("query.ping", {"bank": RecordDict()})["bank"].config_records == {}
    channel.close()
    assert _ended()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_worker_runs_the_code_of_the_app_that_started_it():
    """The worker's PYTHONPATH leads with the folder holding the app's packages (a FAB's root on
    a SuperNode, where nothing of ours is installed), so it imports that copy, not another."""
    from app import party_worker

    assert Path(party_worker.__file__).resolve() == party_worker.APP_ROOT / "app" / "party_worker.py"


def test_content_survives_the_wire_format():
    content = RecordDict({"hello": ConfigRecord({"job_id": "abc", "n": 3})})
    assert decode(encode(content)).config_records["hello"]["job_id"] == "abc"


NODE = """
import subprocess, sys, time
subprocess.run([sys.executable, "-c", '''
import os, sys
from flwr.app import Context, RecordDict
from app.party_worker import spawn
from deploy.localsim import _processes
print(spawn(Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={}), sys.argv[1], 60), flush=True)
print(*[p for p, ppid, _, args in _processes() if ppid == os.getpid() and "app.party_worker" in args], flush=True)
''', sys.argv[1]])
time.sleep(120)
"""


def test_the_worker_ends_with_the_supernode_that_started_it(tmp_path):
    """A ClientApp process (here the inner python) starts the worker and exits; the worker lives on
    while its SuperNode (the outer one) does, and exits when that is stopped."""
    import subprocess
    import sys

    key = new_key()
    node = subprocess.Popen(
        [sys.executable, "-c", NODE, key],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(tmp_path),
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        link = SecureLink.connect(node.stdout.readline().strip(), key, 30)
        worker = int(node.stdout.readline())  # this test's worker (others may run beside it)
        channel = DirectChannel(FlowerChannel(None, {"bank": 1}, 10.0, "job"), {"bank": link})
        channel._exchange("query.ping", {"bank": RecordDict()})  # alive after its ClientApp exited
        node.kill()
        node.wait()
        with pytest.raises(PartyError, match="party 'bank': the direct link failed"):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                channel._exchange("query.ping", {"bank": RecordDict()})
                time.sleep(0.2)
        assert worker not in [pid for pid, _, _, args in _processes() if "app.party_worker" in args]
    finally:
        node.kill()


def test_the_workers_folders_are_its_clientapps(tmp_path, monkeypatch):
    """A deployed party's default folders resolve under the ClientApp's working folder, not the
    app's: the worker reads the linkage the ClientApp would."""
    monkeypatch.chdir(tmp_path)
    key = new_key()
    context = Context(
        run_id=1, node_id=1, node_config={"party": "bank"}, state=RecordDict(), run_config={"dataset": "hdb"}
    )
    channel = DirectChannel(
        FlowerChannel(None, {"bank": 1}, 30.0, "job"), {"bank": SecureLink.connect(spawn(context, key, 30), key, 10)}
    )
    with pytest.raises(PartyError, match=f"no linkage for party 'bank' at {tmp_path / 'linkage'}"):
        channel._exchange("query.hello", {"bank": RecordDict({"hello": ConfigRecord({"job_id": "j"})})})
    channel.close()
    assert _ended()


def test_silent_connections_do_not_hold_the_primary_up():
    """Connections that never prove the key (each has 5 s) do not delay the primary's."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    key = new_key()
    address = spawn(_context(**{"direct-listen": f"127.0.0.1:{port}"}), key, 30)
    assert address == f"127.0.0.1:{port}"  # where its node config says
    squatters = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
    t0 = time.monotonic()
    link = SecureLink.connect(address, key, 10)
    assert time.monotonic() - t0 < 3.0
    link.close()
    for s in squatters:
        s.close()
    assert _ended()


def test_a_frame_too_large_a_cut_message_and_a_reflected_proof_are_refused(monkeypatch):
    primary, worker = _pair(key := new_key(), key)
    primary.sock.sendall(secure_link._FRAME.pack(secure_link.CHUNK + secure_link.TAG + 1, True))
    with pytest.raises(LinkError, match="refusing it"):  # before allocating anything
        worker.recv()
    monkeypatch.setattr(secure_link, "CHUNK", 100)
    primary, worker = _pair(key, key)
    frames = _raw_frame(primary, b"x" * 1000)
    primary.sock.sendall(frames[: len(frames) // 2])  # the message's last frames never come
    primary.close()
    with pytest.raises(LinkError) as cut:
        worker.recv()
    assert not isinstance(cut.value, LinkClosed)  # a cut message is an error, not the run's end

    server = socket.create_server(("127.0.0.1", 0))

    def mirror() -> None:  # a "worker" that sends the primary's own proof back
        conn, _ = server.accept()
        conn.sendall(b"\0" * 32)
        got = conn.recv(64)
        conn.sendall(got[32:])
        time.sleep(0.5)
        conn.close()

    t = threading.Thread(target=mirror)
    t.start()
    with pytest.raises(LinkError, match="the worker did not prove"):
        SecureLink.connect(f"127.0.0.1:{server.getsockname()[1]}", key, 10)
    t.join(10)
    server.close()


class OpeningGrid:
    """Nodes answering the direct transport's handshake (`query.direct_open`) as a ClientApp
    does: each starts a real party worker with the key it was sent and names its party."""

    def __init__(self, parties_by_node: dict[int, str]) -> None:
        self.parties_by_node, self.replies = parties_by_node, {}

    def get_node_ids(self):
        return list(self.parties_by_node)

    def push_messages(self, msgs):
        for m in msgs:
            node = m.metadata.dst_node_id
            key = m.content.config_records["direct_open"]["key"]
            record = {"party": self.parties_by_node[node], "address": spawn(_context(), key, timeout=60)}
            self.replies[f"m{node}"] = SimpleNamespace(
                has_error=lambda: False,
                content=SimpleNamespace(config_records={"direct_open": record}),
                metadata=SimpleNamespace(src_node_id=node, reply_to_message_id=f"m{node}"),
            )
        return list(self.replies)

    def pull_messages(self, ids):
        return [self.replies[i] for i in ids]


def test_a_refused_party_set_releases_the_workers_its_handshake_started(run_identity):
    """A party played by two nodes is refused in the handshake that starts the workers; the
    primary releases them at once rather than leaving them to wait out node-timeout (60 s)."""
    with pytest.raises(PartyError, match="party 'bank' is played by two nodes"):
        DirectChannel.connect(OpeningGrid({1: "bank", 2: "bank"}), ["bank"], "job", timeout=60)
    # released, not left to node-timeout (60 s): 30 s leaves a loaded machine (a suite with network-
    # namespace labs beside it failed at 10 s, 2026-11-26) room and still halves the timeout
    assert len(_workers()) <= 2 and _ended(30)


def test_a_node_starts_at_most_its_max_workers_for_a_party():
    """Each direct_open started a worker, with no cap: a primary opening again and again held any
    number (6 opens: 6 workers, 1.7 GiB, each waiting up to 600 s). A node starts at most its node
    config's max-workers live ones per party; one that ended frees its place. A party of its own:
    the suite's other workers run under the same node process (pytest's) as this test's."""
    node, earlier = {"max-workers": 2, "party": f"cap{os.getpid()}"}, set(_workers())
    mine = lambda: set(_workers()) - earlier  # noqa: E731 - this test's workers, whatever an earlier test left
    spawn(_context(**node), new_key(), timeout=30)
    spawn(_context(**node), new_key(), timeout=30)
    with pytest.raises(RuntimeError, match="already runs 2 party worker.*'max-workers' = 2"):
        spawn(_context(**node), new_key(), timeout=30)
    assert len(mine()) == 2
    os.kill(min(mine()), signal.SIGKILL)
    deadline = time.monotonic() + 20  # a loaded machine's margin for the kill to land
    while len(mine()) > 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    spawn(_context(**node), new_key(), timeout=30)  # a place again
    assert len(mine()) == 2
    for pid in mine():
        os.kill(pid, signal.SIGKILL)
