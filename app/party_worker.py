"""A secondary's party worker for the direct transport (run config ``transport = "direct"``):
one long-lived process per run that holds the party in memory and answers the primary's steps
over an encrypted, authenticated link (app/secure_link.py), with the ClientApp's own handlers
(``DIRECT`` of app/vfl/client.py for FedSim, of app/entity_aug/client.py for Entity Augmentation). A deployed Flower exchange costs seconds (a fresh ClientApp process
per message, the SuperNode's 3 s idle poll); this link costs milliseconds, so exact split
learning (S = 1) runs at the simulation's speed (docs/deployment.md "Direct transport").

The ClientApp starts it on ``query.direct_open`` (:func:`spawn`), handing it the node's own
config, the run config and the run key through a pipe. It listens where the node config says
(``direct-listen``, default 127.0.0.1 on a free port) and tells the primary the address of
``direct-address`` (default: the listening one). It serves one authenticated connection and
exits when the primary closes it, or when nobody authenticates within ``node-timeout``.

    python -m app.party_worker   (config as JSON on standard input; started by spawn only)
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import select
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from flwr.app import Context, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

from app.secure_link import LinkClosed, LinkError, SecureLink, host_port
from strategies.wire_bytes import pack, unpack

APP_ROOT = Path(__file__).resolve().parents[1]  # the folder holding the app's packages (the FAB's root)
START_TIMEOUT = 60.0  # seconds for a worker to listen (its imports, on a loaded machine)
MAX_WAIT = 600.0  # a worker waits at most this long for the primary, whatever node-timeout says
HANDSHAKE = 5.0  # seconds a connection has to prove the run key
HANDLERS = ("app.vfl.client", "app.entity_aug.client")  # the modules whose DIRECT table a worker may serve
MAX_WORKERS = 8  # live workers a node starts for one party (node config max-workers): a run needs one
WORKER_IDLE = 3600.0  # seconds a linked worker waits for the primary's next message (node config worker-idle)


class LiveContext(Context):
    """The worker's context: the party stays in memory between messages (SecondaryParty.restore
    and persist use ``live_party``), where a ClientApp process rebuilds it from ``state``."""

    live_party: object = None
    live_config: object = None  # the node's run config, resolved once (app/node.py): neither config changes


def encode(content: RecordDict) -> bytes:
    return recorddict_to_proto(content).SerializeToString()


BodyHandler = Callable[[bytes, Context], bytes]  # what a DIRECT table maps a message type to


def records(handler: Callable[[RecordDict, Context], RecordDict]) -> BodyHandler:
    """A content handler answering over a link, each body a RecordDict's protobuf (as Flower's)."""
    return lambda body, context: encode(handler(decode(body), context))


def packed(handler: Callable[[tuple, Context], tuple], message_type: str) -> BodyHandler:
    """A handler of a core type's codec, (arrays, fields) in and out, each body packed without
    Flower's records (strategies/wire_bytes.py): the per-step messages, where those cost most."""
    return lambda body, context: pack(handler(unpack(body, message_type), context))


def decode(body: bytes) -> RecordDict:
    proto = ProtoRecordDict()
    proto.ParseFromString(body)
    return recorddict_from_proto(proto)


def spawn(context: Context, key: str, timeout: float, handlers: str = HANDLERS[0]) -> str:
    """Start this node's party worker for the run; returns the address the primary connects to.
    The worker exits unless the primary authenticates within ``timeout`` seconds. ``handlers``:
    the ClientApp module (one of :data:`HANDLERS`) whose ``DIRECT`` table the worker answers."""
    if handlers not in HANDLERS:
        raise ValueError(f"a party worker serves one of {HANDLERS}, not {handlers!r}")
    listen = str(context.node_config.get("direct-listen", "127.0.0.1:0"))
    host, _ = host_port(listen, "node config 'direct-listen'")
    advertise = str(context.node_config.get("direct-address", ""))
    if advertise:  # refused here, naming the setting, rather than as an address the primary cannot reach
        host_port(advertise, "node config 'direct-address'")
    if not advertise and host in ("0.0.0.0", "::", ""):
        raise ValueError(
            f"node config 'direct-listen' = {listen!r} listens on every interface: set "
            "'direct-address' to the HOST:PORT the primary reaches this worker at"
        )
    node = _started(os.getppid())
    tag = _refuse_past_cap(context, node)
    spec = {
        "node_config": dict(context.node_config),
        "run_config": dict(context.run_config),
        "key": key,
        "listen": listen,
        "timeout": min(timeout, MAX_WAIT),
        "node": node,
        "handlers": handlers,
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(APP_ROOT), os.environ.get("PYTHONPATH", "")])}
    # the ClientApp's working folder: default and relative node-config folders resolve alike
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.party_worker", "--node", tag],  # the tag: how the next spawn counts it
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=os.getcwd(),
        env=env,
        start_new_session=True,
    )  # outlives this ClientApp process
    try:
        proc.stdin.write(json.dumps(spec).encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it exited at once: told below
    ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT)
    line = proc.stdout.readline().decode().strip() if ready else ""
    proc.stdout.close()
    if not line.startswith("ready "):
        if proc.poll() is None:
            proc.kill()
            raise RuntimeError(f"the party worker did not listen within {START_TIMEOUT} s; see this node's log")
        raise RuntimeError(
            f"the party worker exited with status {proc.wait()} before listening at {listen} (a port "
            "in use by an earlier run's worker?); its error is in this node's log"
        )
    return advertise or line.split()[1]


def _refuse_past_cap(context: Context, node: list) -> str:
    """This node's tag for its party's workers (the node process and the party), refused when
    that many are alive already: each direct_open starts one, so a primary could otherwise hold
    any number (~280 MiB each, waiting up to MAX_WAIT to be authenticated, then for the link)."""
    party = context.node_config.get("party", context.node_config.get("partition-id", ""))
    tag = f"{node[0]}:{node[1]}:{party}"
    cap = int(context.node_config.get("max-workers", MAX_WORKERS))
    live = _live(tag)
    if live >= cap:
        raise RuntimeError(
            f"this node already runs {live} party worker(s) for party {party!r} (node config 'max-workers' = {cap}): "
            "refusing to start another; a run needs one, and each ends with its run"
        )
    return tag


def _live(tag: str) -> int:
    """This host's running party workers started with ``tag`` (their command line; Linux's /proc)."""
    want = f"app.party_worker\0--node\0{tag}\0".encode()
    count = 0
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        try:
            count += pid.isdigit() and want in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # gone, or another user's
    return count


def _started(pid: int) -> list:
    """(pid, start time) of a live process, the SuperNode (or simulation) that ran this ClientApp;
    (pid, "") once it is gone or a zombie. Without /proc (not Linux): (pid, "?") while it exists."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return [pid, "" if fields[0] in "ZX" else fields[19]]
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return [pid, ""]
        try:
            os.kill(pid, 0)
            return [pid, "?"]
        except OSError:
            return [pid, ""]


def _watch(node: list) -> None:
    """Exit with the node that started this worker: a stopped SuperNode takes its party out of
    the run (the primary's next step fails naming it), as through Flower."""
    while True:
        time.sleep(0.5)
        if _started(node[0]) != node:
            print(
                f"[party worker] the process that started it ({node[0]}) is gone: exiting", file=sys.stderr, flush=True
            )
            os._exit(3)


def _listen(address: str) -> socket.socket:
    host, port = host_port(address, "node config 'direct-listen'")
    server = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    server.listen(64)
    return server


def _try(conn: socket.socket, peer, key: str, won: queue.Queue) -> None:
    """One connection's handshake, on its own thread, whole within HANDSHAKE seconds: a silent or
    trickling peer holds no one else up."""
    conn.settimeout(HANDSHAKE)
    try:
        won.put(SecureLink.accept(conn, key, time.monotonic() + HANDSHAKE))
    except (LinkError, OSError) as e:
        print(f"[party worker] refused a connection from {peer}: {e}", file=sys.stderr, flush=True)
        conn.close()


def _authenticated(server: socket.socket, key: str, timeout: float) -> SecureLink:
    """The first connection that proves it holds the run key; others are dropped."""
    deadline, won = time.monotonic() + timeout, queue.Queue()
    server.settimeout(0.05)
    while time.monotonic() < deadline:
        try:
            link = won.get_nowait()
            link.settimeout(None)
            return link
        except queue.Empty:
            pass
        try:
            conn, peer = server.accept()
        except socket.timeout:
            continue
        threading.Thread(target=_try, args=(conn, peer, key, won), daemon=True).start()
    raise TimeoutError(f"no primary authenticated within {timeout} s")


def serve(link: SecureLink, context: Context, handlers: dict) -> None:
    """Answer requests in order until the primary closes the link, or sends nothing for the node
    config's ``worker-idle`` seconds (a silent primary holds no party's memory for ever). A
    handler's error goes back as the reply (the primary fails the run naming it), as a
    ClientApp's does through Flower."""
    idle = float(context.node_config.get("worker-idle", WORKER_IDLE))
    while True:
        try:
            kind, seq, message_type, body = link.recv(time.monotonic() + idle)
        except LinkClosed:
            return  # the primary is done (or gone)
        except TimeoutError:
            print(f"[party worker] the primary sent nothing for {idle:.0f} s: ending", file=sys.stderr, flush=True)
            return
        handler = handlers.get(message_type) if kind == b"Q" else None
        try:
            if handler is None:
                raise ValueError(f"unexpected message {kind!r} {message_type!r} on the direct link")
            link.send(b"R", seq, message_type, handler(body, context))
        except Exception as e:  # noqa: BLE001 - every failure goes back to the primary by name
            traceback.print_exc(file=sys.stderr)
            link.send(b"E", seq, message_type, f"{type(e).__name__}: {e}".encode())


def main() -> int:
    spec = json.loads(sys.stdin.read())
    server = _listen(spec["listen"])
    host, port = server.getsockname()[:2]
    print(f"ready {host}:{port}", flush=True)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # the pipe's reader is gone: stdout goes to the log
    threading.Thread(target=_watch, args=(spec["node"],), daemon=True).start()
    print(
        f"[party worker] pid {os.getpid()} at {host}:{port}, for node process {spec['node'][0]}",
        file=sys.stderr,
        flush=True,
    )
    # torch and the party's code load while the primary connects and proves the key: the accept
    # loop does not wait on the import (seconds on a busy host), so neither does the primary
    with ThreadPoolExecutor(1) as loader:
        module = spec.get("handlers", HANDLERS[0])
        if module not in HANDLERS:
            raise SystemExit(f"[party worker] refusing to serve {module!r}: not one of {HANDLERS}")
        client = loader.submit(importlib.import_module, module)
        try:
            link = _authenticated(server, spec["key"], float(spec["timeout"]))
        finally:
            server.close()
        handlers = client.result().DIRECT
    context = LiveContext(
        run_id=0, node_id=0, node_config=spec["node_config"], state=RecordDict(), run_config=spec["run_config"]
    )
    try:
        serve(link, context, handlers)
    finally:
        link.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
