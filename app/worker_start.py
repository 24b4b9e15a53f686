"""How a node's ClientApp starts its party worker for the direct transport (``query.direct_open``,
``query.ea_direct_open``): a deployment's node starts one of its own (app/party_worker.py), a
simulation's virtual node hands it to the simulation's worker host (app/worker_host.py).

    spawn(context, key, timeout, handlers) -> the address the primary connects to
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

from flwr.app import Context

from app import party_worker as worker
from app import worker_host
from app.secure_link import host_port


def spawn(context: Context, key: str, timeout: float, handlers: str = worker.HANDLERS[0]) -> str:
    """Start this node's party worker for the run; returns the address the primary connects to.
    The worker exits unless the primary authenticates within ``timeout`` seconds. ``handlers``:
    the ClientApp module (one of app/party_worker.py's ``HANDLERS``) whose ``DIRECT`` table the worker answers."""
    if handlers not in worker.HANDLERS:
        raise ValueError(f"a party worker serves one of {worker.HANDLERS}, not {handlers!r}")
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
    node = _node()
    tag = _refuse_past_cap(context, node)
    spec = {
        "node_config": dict(context.node_config),
        "run_config": dict(context.run_config),
        "key": key,
        "listen": listen,
        "timeout": min(timeout, worker.MAX_WAIT),
        "node": node,
        "handlers": handlers,
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(worker.APP_ROOT), os.environ.get("PYTHONPATH", "")])}
    if worker_host.shared(spec["node_config"]):
        try:
            address = worker_host.join({**spec, "tag": tag, "slot": worker_host.slot(spec["node_config"])}, env)
            return advertise or address
        except worker_host.Squatted as e:
            print(f"[party worker] {e}: starting this party's own", file=sys.stderr, flush=True)
    address = _own_worker(spec, tag, env)
    return advertise or address


def _own_worker(spec: dict, tag: str, env: dict) -> str:
    """Start a party worker of the node's own with ``spec``; the address it listens at."""
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
    ready, _, _ = select.select([proc.stdout], [], [], worker.START_TIMEOUT)
    line = proc.stdout.readline().decode().strip() if ready else ""
    proc.stdout.close()
    if not line.startswith("ready "):
        if proc.poll() is None:
            proc.kill()
            raise RuntimeError(f"the party worker did not listen within {worker.START_TIMEOUT} s; see this node's log")
        raise RuntimeError(
            f"the party worker exited with status {proc.wait()} before listening at {spec['listen']} (a port "
            "in use by an earlier run's worker?); its error is in this node's log"
        )
    return line.split()[1]


def _node() -> list:
    """(pid, start time) of the process that ran this ClientApp: the SuperNode, or the
    simulation's process; its workers end with it."""
    return worker.started(os.getppid())


def _refuse_past_cap(context: Context, node: list) -> str:
    """This node's tag for its party's workers (the node process and the party), refused when
    that many are alive already: each direct_open starts one, so a primary could otherwise hold
    any number (~280 MiB each, waiting up to MAX_WAIT to be authenticated, then for the link)."""
    party = context.node_config.get("party", context.node_config.get("partition-id", ""))
    tag = f"{node[0]}:{node[1]}:{party}"
    cap = int(context.node_config.get("max-workers", worker.MAX_WORKERS))
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
