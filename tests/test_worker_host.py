"""A simulation's party workers in one host process (app/worker_host.py): each party on its own
link, key and context; a deployment's node keeps a worker of its own (tests/test_direct_transport.py).
The twins through `flwr run` (tests/test_flower_run.py, tests/test_entity_aug.py) run over it."""

import contextlib
import json
import os
import signal
import socket
import time

import pytest
from flwr.app import Context, RecordDict

from app import party_worker, threads, worker_host, worker_start
from app.secure_link import LinkError, SecureLink, new_key
from app.vfl.channel import FlowerChannel
from app.vfl.direct import DirectChannel
from app.worker_start import spawn
from deploy.localsim import _processes


def _node(partition: int, **extra) -> Context:
    """A simulation's virtual node ``partition`` of two (Flower's node config there)."""
    config = {"partition-id": partition, "num-partitions": 2, **extra}
    return Context(run_id=1, node_id=partition + 1, node_config=config, state=RecordDict(), run_config={})


def _started(module: str) -> list[int]:
    """This test process's children running ``module`` (hosts and workers are started by spawn)."""
    return [pid for pid, ppid, _, args in _processes() if f"-m {module}" in args and ppid == os.getpid()]


def _gone(module: str, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout  # a loaded machine's margin; the host ends ~5 s after its last party
    while _started(module) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _started(module) == []


@pytest.fixture
def one_host(monkeypatch):
    """Two CPUs whatever this machine has (one host for the primary's other CPU), and this test
    process as the node: pytest's xdist workers share a parent, so each gets a host of its own."""
    monkeypatch.setattr(threads, "usable_cpus", lambda: 2)
    node = party_worker.started(os.getpid())
    monkeypatch.setattr(worker_start, "_node", lambda: node)
    assert _gone("app.worker_host")  # an earlier test's host, in its last seconds
    yield worker_host._name(node, 0)
    for pid in _started("app.worker_host"):
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)  # its sockets closed: a host leaving lists no command line before it closes them


def _ping(link: SecureLink, party: str) -> dict:
    channel = DirectChannel(FlowerChannel(None, {party: 1}, 10.0, "job"), {party: link})
    return channel._exchange("query.ping", {party: RecordDict()})[party].config_records


def test_only_a_simulations_virtual_nodes_share_a_host():
    assert worker_host.shared({"partition-id": 0, "num-partitions": 3})
    assert not worker_host.shared({"party": "bank"})  # a deployment's node
    assert not worker_host.shared({"partition-id": 0, "party": "bank"})  # named: its own


def test_a_simulations_parties_are_served_by_one_host_each_on_its_own_link(one_host):
    keys = [new_key(), new_key()]
    addresses = [spawn(_node(i), keys[i], timeout=30) for i in range(2)]
    assert len(_started("app.worker_host")) == 1 and _started("app.party_worker") == []
    assert addresses[0] != addresses[1]
    with pytest.raises(LinkError):  # party 1's key does not open party 0's link
        SecureLink.connect(addresses[0], keys[1], 10)
    links = [SecureLink.connect(a, k, 10) for a, k in zip(addresses, keys)]
    assert _ping(links[0], "a") == {} and _ping(links[1], "b") == {}
    links[0].sock.sendall(b"\x00\x00\x00\x05\x01garbage")  # party 0's link fails: party 1 goes on
    time.sleep(0.5)
    assert _ping(links[1], "b") == {}
    for link in links:
        link.close()
    assert _gone("app.worker_host")


def test_the_host_holds_at_most_a_nodes_max_workers_for_a_party(one_host):
    spawn(_node(0, **{"max-workers": 1}), new_key(), timeout=30)
    with pytest.raises(RuntimeError, match="refused the party: .*already runs 1 party worker.*'max-workers' = 1"):
        spawn(_node(0, **{"max-workers": 1}), new_key(), timeout=30)


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's process needs root to start")
def test_a_host_name_held_by_another_user_gets_no_key(one_host):
    """Another local user binding the host's name first: the party starts a worker of its own
    and no key goes to that user's process."""
    name = one_host
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user
        try:
            os.setuid(65534)
            squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            squatter.bind(name)
            squatter.listen()
            os.write(ready_w, b"!")
            time.sleep(60)
        finally:
            os._exit(0)  # never back into pytest
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"!"  # the name is the other user's
        key = new_key()
        link = SecureLink.connect(spawn(_node(0), key, timeout=30), key, 10)
        assert len(_started("app.party_worker")) == 1 and _started("app.worker_host") == []
        assert _ping(link, "a") == {}
        link.close()
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's process needs root to start")
def test_the_host_drops_another_users_registration(one_host):
    key = new_key()
    link = SecureLink.connect(spawn(_node(0), key, timeout=30), key, 10)  # the host, serving party 0
    name = one_host
    answer_r, answer_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user hands the host a spec of its own
        try:
            os.setuid(65534)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(name)
            sock.sendall(b'{"handlers": "app.vfl.client"}')
            sock.shutdown(socket.SHUT_WR)
            os.write(answer_w, b"[" + sock.recv(100) + b"]")
        except BaseException as e:  # noqa: BLE001 - told to the test
            os.write(answer_w, repr(e).encode())
        finally:
            os._exit(0)  # never back into pytest
    os.close(answer_w)
    os.waitpid(pid, 0)
    answer = os.read(answer_r, 200)
    assert answer in (b"[]", b"ConnectionResetError(104, 'Connection reset by peer')")  # closed without a word
    assert _ping(link, "a") == {}  # the host serves on
    link.close()
    assert _gone("app.worker_host")


def test_a_clientapp_gone_before_its_answer_does_not_end_the_host(one_host):
    """A ClientApp that hands its spec and leaves (killed, or its wait over) made the host's answer
    fail with a broken pipe, and the host exited, taking every party it served with it."""
    key = new_key()
    link = SecureLink.connect(spawn(_node(0), key, timeout=30), key, 10)
    for _ in range(3):
        gone = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        gone.connect(one_host)
        spec = {"handlers": "app.vfl.client", "tag": "x", "listen": "127.0.0.1:0", "node_config": {}}
        gone.sendall(json.dumps(spec).encode())
        gone.close()
    time.sleep(1.0)  # the host answers them meanwhile (an order, not a speed: the ping below queues behind)
    assert _ping(link, "a") == {}
    link.close()


def test_a_host_name_bound_by_a_process_that_does_not_listen_gets_the_party_its_own_worker(one_host):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as holder:
        holder.bind(one_host)  # bound, never listening: every connect is refused
        key = new_key()
        link = SecureLink.connect(spawn(_node(0), key, timeout=30), key, 10)
        assert len(_started("app.party_worker")) == 1
        assert _ping(link, "a") == {}
        link.close()
