"""Training across separate hosts: a deployment on a :class:`lab.hosts.Lab`.

The primary's host runs the SuperLink (TLS, SuperNode authentication) and the ServerApp as its
own user; each secondary's host runs its SuperNode as its own user, with every folder it reads or
writes in its own home and its direct-transport worker on its own address. What crosses between
hosts goes through ``lab.transfer`` (recorded): the CA certificate to each party, each party's
public node key to the primary. Each party makes its own key pair; no private key travels.

    primary:  flower-superlink --host <primary>:9092 --ssl-* creds/... --enable-supernode-auth
              flwr supernode register nodekeys/<party>.pub lab --name <party>
              flwr run <repo> lab --stream --run-config '...'
    <party>:  flower-supernode --superlink <primary>:9092 --root-certificates ca.crt
              --auth-supernode-private-key keys/<party> --node-config 'party=... direct-listen=...'

Limitation: the linkage is computed by the operator (root) through the linkage service on the
machine's loopback, as ``python -m deploy link`` does; each party's own result files are then
placed in its home (``lab.copy_in``). The shipped datasets' loaders need all of the public
dataset's files, so each home gets a copy of the dataset folder (docs/deployment.md).

    python -m lab.training --base /tmp/lab --dataset hdb --epochs 2 --n-rows 2000
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from deploy.app_source import app_folder
from deploy.localsim import QUIET_ENV, REPO, run_config_arg
from lab.hosts import PRIMARY, Host, Lab, Running
from lab.placement import link_as_operator, place_data
from strategies.shields import seed_environment

CONNECTION = "lab"
LINK_PORT, NODE_PORT, WORKER_PORT = 9092, 9094, 9301  # each in its own host's namespace
RUN_NAME = "lab"

WAIT = """
import socket, sys, time
host, port, deadline = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
while time.monotonic() < deadline:
    with socket.socket() as s:
        s.settimeout(2)
        if s.connect_ex((host, port)) == 0:
            sys.exit(0)
    time.sleep(0.2)
sys.exit(1)
"""

CREDENTIALS = """
import sys
from pathlib import Path
from deploy.certs import make_ca, make_server_cert
folder = Path("creds")
folder.mkdir(mode=0o700)
ca, key = make_ca(folder)
make_server_cert(folder, ca, key, [sys.argv[1]])
"""

NODE_KEY = "import sys; from pathlib import Path; from deploy.certs import make_node_key; make_node_key(Path(sys.argv[1]), sys.argv[2])"
WRITE = "import sys; from pathlib import Path; p = Path(sys.argv[1]); p.parent.mkdir(mode=0o700, parents=True, exist_ok=True); p.write_text(sys.argv[2])"


@dataclass
class LabRun:
    """What :func:`train_across_hosts` did: the summary, the run folder, each host's commands."""

    summary: dict
    run_dir: Path
    output: str
    commands: dict[str, list[list[str]]] = field(default_factory=dict)
    seconds: float = 0.0


def tool(name: str) -> str:
    return shutil.which(name, path=str(Path(sys.executable).parent)) or name


def flwr_env(host: Host) -> dict[str, str]:
    """Flower's quiet settings, FLWR_HOME in the host's own home, the repository importable, and
    the host's own party seed where the operator's environment sets one (strategies/shields.py)."""
    return {**QUIET_ENV, "FLWR_HOME": str(host.home / "flwr"), "PYTHONPATH": str(REPO), **seed_environment(host.name)}


def checked(r, what: str):
    if r.returncode:
        out = r.stdout + r.stderr if isinstance(r.stdout, str) else ""
        raise RuntimeError(f"{what}: exit {r.returncode}:\n{out[-4000:]}")
    return r


def python(lab: Lab, host: Host, code: str, *args: str, what: str, timeout: float = 120.0):
    """A short Python program run on ``host`` as its user (the repository importable)."""
    r = lab.run(host, [sys.executable, "-c", code, *args], env=flwr_env(host), timeout=timeout)
    return checked(r, f"{what} on {host.name}")


def wait_listening(lab: Lab, frm: Host, address: str, port: int, proc: Running, log: Path, timeout: float) -> None:
    """Waits until ``address:port`` accepts a connection from ``frm``'s namespace."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lab.run(frm, [sys.executable, "-c", WAIT, address, str(port), "5"], timeout=30).returncode == 0:
            return
        if proc.popen.poll() is not None:
            raise RuntimeError(f"exited ({proc.popen.returncode}) during start-up:\n{tail(log)}")
    raise RuntimeError(f"{address}:{port} not listening within {timeout} s:\n{tail(log)}")


def tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


def credentials(lab: Lab, primary: Host, parties: dict[str, Host]) -> None:
    """The primary's operator makes the CA and the SuperLink's certificate (for its address);
    each party makes its own node key pair; only ca.crt and the public keys cross."""
    python(lab, primary, CREDENTIALS, primary.address, what="CA and server certificate")
    for party, host in parties.items():
        python(lab, host, NODE_KEY, "keys", party, what="node key pair")
        lab.transfer(host, primary, f"keys/{party}.pub", f"nodekeys/{party}.pub")
        lab.transfer(primary, host, "creds/ca.crt", "ca.crt")


def superlink_command(primary: Host) -> list[str]:
    creds = primary.home / "creds"
    return [
        tool("flower-superlink"),
        *("--host", primary.address, "--port", str(LINK_PORT)),
        *("--ssl-ca-certfile", str(creds / "ca.crt")),
        *("--ssl-certfile", str(creds / "server.crt"), "--ssl-keyfile", str(creds / "server.key")),
        "--enable-supernode-auth",
        "--disable-runtime-dependency-installation",
    ]


def connection_config(primary: Host) -> str:
    return (
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
        f'address = "{primary.address}:{LINK_PORT}"\nroot-certificates = "{primary.home / "creds" / "ca.crt"}"\n'
    )


def supernode_command(party: str, host: Host, primary: Host, key: str | None = None, advertise: str = "") -> list[str]:
    """The party's SuperNode: every folder in its own home, its worker on its own address
    (``advertise``: the address the primary reaches it at, e.g. a WAN relay's; default that one)."""
    home, worker = host.home, f"{host.address}:{WORKER_PORT}"
    node_config = (
        f'party="{party}" data-dir="{home / "data"}" linkage-dir="{home / "linkage"}" '
        f'cache-dir="{home / "cache"}" checkpoint-dir="{home / "checkpoints"}" model-dir="{home / "models"}" '
        f'direct-listen="{worker}" direct-address="{advertise or worker}"'
    )
    return [
        tool("flower-supernode"),
        *("--superlink", f"{primary.address}:{LINK_PORT}"),
        *("--host", "127.0.0.1", "--port", str(NODE_PORT)),
        *("--node-config", node_config, "--max-retries", "3", "--max-wait-time", "30"),
        *("--root-certificates", str(home / "ca.crt")),
        *("--auth-supernode-private-key", str(home / (key or f"keys/{party}"))),
    ]


def run_values(primary: Host, dataset: str, link_values: dict, run_config: dict) -> dict[str, object]:
    """The primary's run config: its own data, linkage files and run folder; S = 1, direct."""
    return {
        "dataset": dataset,
        "data-dir": str(primary.home / "data"),
        "out-dir": str(primary.home / "runs"),
        "linkage-dir": str(primary.home / "linkage"),
        "steps-per-exchange": 1,
        "transport": "direct",
        "run-name": RUN_NAME,
        **link_values,
        **run_config,
    }


def start_superlink(lab: Lab, primary: Host, logs: Path, commands: dict) -> Running:
    """The SuperLink on the primary's address; the primary's Flower config points at it."""
    cmd = superlink_command(primary)
    commands[primary.name].append(cmd)
    proc = lab.start(primary, cmd, logs / "superlink.log", env=flwr_env(primary))
    wait_listening(lab, primary, primary.address, LINK_PORT, proc, logs / "superlink.log", 120)
    python(lab, primary, WRITE, str(primary.home / "flwr" / "config.toml"), connection_config(primary), what="config")
    return proc


def register(lab: Lab, primary: Host, party: str, commands: dict) -> None:
    cmd = [tool("flwr"), "supernode", "register", f"nodekeys/{party}.pub", CONNECTION, "--name", party]
    commands[primary.name].append(cmd)
    checked(lab.run(primary, cmd, env=flwr_env(primary), timeout=120), f"registering {party}")


ACTIVATED = b"SuperNode ID"  # Flower 1.42 logs it once the SuperLink accepted the node (start_client_internal)


def activated(log: Path, since: int) -> bool:
    """Whether the SuperNode logging to ``log`` from byte ``since`` on was activated by the SuperLink."""
    with open(log, "rb") as f:
        f.seek(since)
        return ACTIVATED in f.read()


def supervised(lab: Lab, party: str, host: Host, primary: Host, logs: Path, commands: dict) -> Running:
    """The party's SuperNode started, and started again whenever it exits, until the SuperLink
    has activated it (180 s at most), as a supervisor (systemd's Restart=on-failure) would: a
    SuperNode started while the SuperLink still holds its predecessor's session is refused (exit
    305) before it logs its ID; once activated it is not refused (it used to be watched for a
    fixed 30 s instead)."""
    log, end, node = logs / f"supernode-{party}.log", time.monotonic() + 180.0, None
    while time.monotonic() < end:
        if node is None or node.popen.poll() is not None:
            time.sleep(0 if node is None else 5)
            since = log.stat().st_size if log.exists() else 0
            node = start_supernode(lab, party, host, primary, logs, commands)
        elif activated(log, since):
            break
        time.sleep(0.2)
    return node


def start_supernode(
    lab: Lab, party: str, host: Host, primary: Host, logs: Path, commands: dict, key=None, advertise: str = ""
) -> Running:
    cmd = supernode_command(party, host, primary, key, advertise)
    commands.setdefault(host.name, []).append(cmd)
    log = logs / (f"supernode-{party}.log" if key is None else f"supernode-{party}-unregistered.log")
    return lab.start(host, cmd, log, env=flwr_env(host))


def flwr_run(lab: Lab, primary: Host, values: dict, commands: dict, timeout: float) -> str:
    """`flwr run <repo> lab --stream` as the primary's user; returns what it printed."""
    from app.config import RunConfig  # lazy: torch and flwr, for the run only

    RunConfig.from_flower(values)  # names an unknown key, which Flower 1.41 refuses unnamed
    cmd = [tool("flwr"), "run", str(app_folder(REPO)), CONNECTION, "--stream", "--run-config", run_config_arg(values)]
    commands[primary.name].append(cmd)
    r = lab.run(primary, cmd, env=flwr_env(primary), timeout=timeout)
    return r.stdout + r.stderr


@contextmanager
def federation(lab: Lab, hosts: dict[str, Host], logs: Path, commands: dict, advertise: dict[str, str] | None = None):
    """The SuperLink on the primary's host and each party's registered SuperNode on its own, up
    for the ``with`` block (the credentials made before); stops them after, the SuperNodes first
    (they would retry the SuperLink)."""
    primary, started = lab.hosts[PRIMARY], []
    try:
        started.append(start_superlink(lab, primary, logs, commands))
        for party, host in hosts.items():
            register(lab, primary, party, commands)
            via = (advertise or {}).get(party, "")
            started.append(start_supernode(lab, party, host, primary, logs, commands, advertise=via))
        yield started
    finally:
        for proc in reversed(started):
            proc.stop(grace=5)


def train(lab: Lab, values: dict, commands: dict, timeout: float) -> tuple[dict, Path, str]:
    """`flwr run` as the primary's user against the federation up; (summary, run folder, output),
    RunFailed unless the run finished."""
    from app.run_status import require_finished  # lazy: the run-status reader, for the run only

    since = time.time()
    output = flwr_run(lab, lab.hosts[PRIMARY], values, commands, timeout)
    run_dir = lab.hosts[PRIMARY].home / "runs" / RUN_NAME
    return require_finished(run_dir, since, output), run_dir, output


def train_across_hosts(
    lab: Lab,
    dataset: str,
    data_dir: Path,
    parties: dict[str, str],
    *,
    epochs: int = 2,
    n_rows: int = 2000,
    k: int = 8,
    run_config: dict | None = None,
    logs: Path,
    timeout: float = 900.0,
    advertise: dict[str, str] | None = None,
) -> LabRun:
    """Credentials, data, linkage, SuperLink, registered SuperNodes, `flwr run`; the finished
    run's summary (RunFailed otherwise). ``parties``: secondary party -> its host's name in the
    lab (the primary's host is "primary"); ``advertise``: party -> the address the primary reaches
    its worker at, where not its own (a WAN relay's, bench/wan_cost.py). Stops what it started."""
    t0, primary = time.monotonic(), lab.hosts[PRIMARY]
    hosts = {p: lab.hosts[h] for p, h in parties.items()}
    commands: dict[str, list[list[str]]] = {primary.name: []}
    credentials(lab, primary, hosts)
    place_data(lab, [primary, *hosts.values()], dataset, data_dir)
    link_values = link_as_operator(lab, {PRIMARY: primary, **hosts}, dataset, data_dir, k, n_rows)
    extra = {"epochs": epochs, "node-timeout": 120.0, **(run_config or {})}
    with federation(lab, hosts, logs, commands, advertise):
        summary, run_dir, output = train(lab, run_values(primary, dataset, link_values, extra), commands, timeout)
    return LabRun(summary, run_dir, output, commands, time.monotonic() - t0)


def refused_supernode(lab: Lab, party: str, host: Host, logs: Path, timeout: float = 180.0) -> tuple[int | None, str]:
    """A SuperNode whose key the SuperLink never registered (a fresh pair made on ``host``):
    its exit code and log (the SuperLink must be up, with the primary's ca.crt at ``host``)."""
    python(lab, host, NODE_KEY, "rogue", party, what="unregistered key pair")
    proc = start_supernode(lab, party, host, lab.hosts[PRIMARY], logs, {}, key=f"rogue/{party}")
    try:
        code = proc.popen.wait(timeout)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        proc.stop(grace=2)
    return code, tail(logs / f"supernode-{party}-unregistered.log", 8000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="folder for the homes (not under a 0700 folder)")
    ap.add_argument("--dataset", default="hdb")
    ap.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--n-rows", type=int, default=2000)
    args = ap.parse_args()
    from datasets import load_dataset  # lazy: pandas, for the party names

    secondaries = sorted(load_dataset(args.dataset, args.data_dir).secondaries)
    logs = Path(tempfile.mkdtemp(prefix="lab-logs-"))
    with Lab(args.base, [PRIMARY, *secondaries]) as lab:
        run = train_across_hosts(
            lab,
            args.dataset,
            args.data_dir,
            {p: p for p in secondaries},
            epochs=args.epochs,
            n_rows=args.n_rows,
            logs=logs,
        )
        print(json.dumps({"summary": run.summary, "seconds": run.seconds, "logs": str(logs)}, indent=1, default=str))
        print(json.dumps([t.__dict__ for t in lab.transfers], indent=1))


if __name__ == "__main__":
    main()
