"""One process for a simulation's party workers (the direct transport, app/party_worker.py).

A deployment's node starts a party worker of its own. A Flower simulation runs every party's
ClientApp on one machine, as one user; there each ClientApp's :func:`join` hands its worker's
spec to the simulation's host process, which serves every party on its own link, key and
context, one party's message at a time. Measured on 2 cores (docs/benchmarks.md): four party
processes each waking for a step of a few hundred microseconds ran that step 2-3x slower than
one process running all four in turn, their caches cold from the others.

The host listens on an abstract Unix socket named for the user and the simulation's process
(Linux only; elsewhere each party keeps its own worker); both ends check that the other runs as
the same user before a key crosses. The host ends once no party is left, or with the simulation
(the node process that started it).

    python -m app.worker_host NODE   (started by join only)
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import queue
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from app import party_worker as worker
from app.secure_link import SecureLink

LINE = 1 << 16  # bytes a spec or a reply may take
MESSAGE_TIME = 30.0  # seconds a party's message has, once begun, to arrive whole (the others wait meanwhile)


def shared(node_config: dict) -> bool:
    """Whether this node's worker joins the host: a simulation's virtual node (a partition id,
    no party of its own in the node config), on Linux."""
    return sys.platform.startswith("linux") and "partition-id" in node_config and "party" not in node_config


def slot(node_config: dict) -> int:
    """Which of the simulation's hosts serves this virtual node: one host per usable CPU but the
    primary's (at least one, at most one per node), the nodes dealt round."""
    from app.threads import usable_cpus  # lazy: a deployed node's handshake never asks

    hosts = max(1, min(usable_cpus() - 1, int(node_config.get("num-partitions", 1))))
    return int(node_config["partition-id"]) % hosts


def _name(node: list, slot: int) -> bytes:
    """A host's abstract socket: this user's, this simulation's (its pid and start time), its slot."""
    return f"\0fedsim-workers-{os.getuid()}-{node[0]}-{node[1]}-{slot}".encode()


def _same_user(sock: socket.socket) -> bool:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1] == os.getuid()


class Squatted(RuntimeError):
    """Another user's process listens at the host's name: the party gets a worker of its own."""


def join(spec: dict, env: dict) -> str:
    """spawn's way in a simulation: the simulation's host (started here if none runs) serves the
    party of ``spec``; returns the address its link listens at. :class:`Squatted` where the
    host's name is held by a process that is not a host of this user's."""
    deadline, refused = time.monotonic() + worker.START_TIMEOUT, 0
    while time.monotonic() < deadline:
        sock = _connect(spec["node"], spec["slot"])
        if sock is None:
            if _start(spec["node"], spec["slot"], env, deadline) == "taken":
                refused += 1  # the name bound, yet nobody accepts at it: once is a host between bind and listen
                if refused > 2:
                    raise Squatted("a process holds this simulation's worker-host name and does not listen at it")
            continue
        try:
            reply = _ask(sock, spec, deadline)
        except ConnectionError:
            continue  # the host was ending as it was reached, the spec unread: the next try starts a new one
        except OSError as e:
            raise RuntimeError(f"the simulation's worker host did not answer: {e}") from e
        finally:
            sock.close()
        if reply.startswith("ready "):
            return reply.split()[1]
        raise RuntimeError(f"the simulation's worker host refused the party: {reply or 'no answer'}")
    raise RuntimeError(f"no worker host answered within {worker.START_TIMEOUT} s; see this node's log")


def _connect(node: list, slot: int) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(worker.HANDSHAKE)  # a name held by a process that never accepts holds no one up
    try:
        sock.connect(_name(node, slot))
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        return None
    except OSError as e:
        sock.close()
        raise Squatted(f"this simulation's worker-host name does not accept ({e})") from e
    if not _same_user(sock):
        sock.close()
        raise Squatted("another user's process holds this simulation's worker-host name: no key goes to it")
    return sock


def _ask(sock: socket.socket, spec: dict, deadline: float) -> str:
    sock.settimeout(max(0.1, deadline - time.monotonic()))
    sock.sendall(json.dumps(spec).encode())
    sock.shutdown(socket.SHUT_WR)
    return _read_all(sock).decode(errors="replace").strip()


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while len(data) <= LINE:
        piece = sock.recv(LINE)
        if not piece:
            return data
        data += piece
    raise ValueError(f"a worker-host message over {LINE} bytes")


def _start(node: list, slot: int, env: dict, deadline: float) -> str:
    """Start a host: ``ready``, or ``taken`` where another process holds the name (another
    ClientApp's host won the race, or not a host at all) and the one started here just exits."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.worker_host", json.dumps(node), str(slot)],
        stdout=subprocess.PIPE,
        cwd=os.getcwd(),
        env=env,
        start_new_session=True,
    )  # outlives this ClientApp process
    ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
    line = proc.stdout.readline().decode().strip() if ready else ""
    proc.stdout.close()
    if line not in ("ready", "taken"):
        if proc.poll() is None:
            proc.kill()
        raise RuntimeError(f"the simulation's worker host did not start (status {proc.wait()}); see this node's log")
    return line


@dataclass
class Party:
    """One party the host serves: its link, its context (the party in memory) and its handlers."""

    link: SecureLink
    context: worker.LiveContext
    handlers: dict
    tag: str
    idle: float
    last: float = field(default_factory=time.monotonic)  # its last message


class Host:
    """The parties this host serves. Each registration's handshake runs on a thread of its own
    (a silent peer holds no one up); every linked party's messages are answered on the main
    thread, one at a time, in the order they arrive."""

    def __init__(self, registry: socket.socket) -> None:
        self.registry, self.registered = registry, time.monotonic()  # its listening socket, its last registration
        self.parties: dict[socket.socket, Party] = {}
        self.linked: queue.Queue = queue.Queue()  # parties whose primary has proved the key
        self.waking = socket.socketpair()  # a handshake's thread wakes the main loop
        self.tags: Counter = Counter()  # party tag -> its parties here (node config max-workers)
        self.counting = threading.Lock()
        self.waiting = 0  # registrations still waiting for their primary

    def register(self, conn: socket.socket) -> None:
        """One ClientApp's spec in, ``ready HOST:PORT`` or the reason it is refused out; a
        ClientApp gone before the answer costs the host nothing."""
        with conn:
            if not _same_user(conn):
                print("[worker host] refused a connection from another user", file=sys.stderr, flush=True)
                return
            conn.settimeout(worker.HANDSHAKE)
            try:
                spec = json.loads(_read_all(conn))
                server = self._listen(spec)
            except Exception as e:  # noqa: BLE001 - told to the ClientApp, which fails naming it
                with contextlib.suppress(OSError):
                    conn.sendall(f"error {type(e).__name__}: {e}".encode())
                return
            host, port = server.getsockname()[:2]
            try:
                conn.sendall(f"ready {host}:{port}".encode())
            except OSError:
                server.close()
                self._count(spec["tag"], -1)
                return
            with self.counting:
                self.waiting += 1
            threading.Thread(target=self._handshake, args=(server, spec), daemon=True).start()

    def _count(self, tag: str, change: int) -> None:
        with self.counting:
            self.tags[tag] += change

    def _listen(self, spec: dict) -> socket.socket:
        if spec.get("handlers") not in worker.HANDLERS:
            raise ValueError(f"a party worker serves one of {worker.HANDLERS}, not {spec.get('handlers')!r}")
        tag, cap = spec["tag"], int(spec["node_config"].get("max-workers", worker.MAX_WORKERS))
        with self.counting:
            if self.tags[tag] >= cap:
                raise RuntimeError(
                    f"this node already runs {self.tags[tag]} party worker(s) for party {tag!r} "
                    f"(node config 'max-workers' = {cap}): refusing to start another"
                )
            server = worker.listen(spec["listen"])
            self.tags[tag] += 1
        return server

    def _handshake(self, server: socket.socket, spec: dict) -> None:
        """The party's handlers loaded and its primary authenticated (app/party_worker.py), then
        handed to the main loop."""
        party = None
        try:
            handlers = importlib.import_module(spec["handlers"]).DIRECT
            link = worker.authenticated(server, spec["key"], float(spec["timeout"]))
            context = worker.live_context(spec)
            party = Party(link, context, handlers, spec["tag"], worker.idle_limit(context))
            self.linked.put(party)
        except Exception as e:  # noqa: BLE001 - this party is not served; the others go on
            print(f"[worker host] {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        finally:
            server.close()
            with self.counting:
                self.waiting -= 1
            self._count(spec["tag"], -(party is None))
        self.waking[1].send(b"!")

    def busy(self) -> bool:
        """Serving a party, or one is on its way: registered within the last HANDSHAKE seconds,
        waiting for its primary, or just linked."""
        recent = time.monotonic() - self.registered < worker.HANDSHAKE
        return bool(self.parties) or self.waiting > 0 or not self.linked.empty() or recent

    def serve(self, wait: float) -> None:
        """Answer what arrives within ``wait`` seconds; take in newly linked parties; end the
        ones closed, failed or idle past their limit."""
        socks = [self.waking[0], self.registry, *self.parties]
        ready, _, _ = select.select(socks, [], [], wait)
        for sock in ready:
            if sock is self.registry:
                self.register(self.registry.accept()[0])
                self.registered = time.monotonic()
            elif sock is self.waking[0]:
                sock.recv(4096)
                while not self.linked.empty():
                    party = self.linked.get()
                    self.parties[party.link.sock] = party
            else:
                self._answer(self.parties[sock])
        now = time.monotonic()
        for party in [p for p in self.parties.values() if now - p.last > p.idle]:
            print(f"[worker host] the primary sent nothing for {party.idle:.0f} s: ending", file=sys.stderr, flush=True)
            self._end(party)

    def _answer(self, party: Party) -> None:
        """The party's next message, whole within MESSAGE_TIME once it has begun (a link that
        stalls mid-message holds the other parties up no longer), answered."""
        party.last = time.monotonic()
        try:
            if worker.answer(party.link, party.context, party.handlers, party.last + MESSAGE_TIME):
                return
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - this party's link or handler failed: the others go on
            print(f"[worker host] a party's link ended: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        self._end(party)

    def _end(self, party: Party) -> None:
        del self.parties[party.link.sock]
        party.link.close()
        self._count(party.tag, -1)


def main() -> int:
    node = json.loads(sys.argv[1])
    registry = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        registry.bind(_name(node, int(sys.argv[2])))
    except OSError:
        print("taken", flush=True)  # another host serves this simulation
        return 0
    registry.listen(64)
    print("ready", flush=True)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # the pipe's reader is gone: stdout goes to the log
    threading.Thread(target=worker.watch, args=(node,), daemon=True).start()
    print(f"[worker host] pid {os.getpid()}, for node process {node[0]}", file=sys.stderr, flush=True)
    host = Host(registry)
    while host.busy():
        host.serve(1.0)
    registry.close()  # a ClientApp reaching it now is turned away and starts a new host
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
