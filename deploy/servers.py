"""A local deployment's servers (deploy/commands.py's `up`): the SuperLink, one SuperNode per
party and the linkage service, each in its own session with its own log under DIR/logs, each on
127.0.0.1 at a port picked free and, where another process takes it first, a fresh one
(deploy/processes.py ``listening``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from deploy.deployment import CONNECTION, Deployment, node_config
from deploy.localsim import free_port
from deploy.processes import MARK, Proc, listening, start_time
from files.atomic import write_atomic
from files.private import private_dir
from linkage_server.local import serve_command


def tool(name: str) -> str:
    return shutil.which(name, path=str(Path(sys.executable).parent)) or name


def _spawn(dep: Deployment, name: str, cmd: list[str], port: int) -> Proc:
    """Start ``cmd`` in its own session (so `down` can end it and all it spawned)."""
    log = private_dir(dep.root / "logs") / f"{name}.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # appended: an earlier up's lines stay
    with os.fdopen(fd, "ab") as out:  # umask: what the process writes is private whatever this one's umask
        out.write(f"{MARK} {name} on 127.0.0.1:{port}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=dep.env(), start_new_session=True, cwd=dep.root, umask=0o077
        )
    return Proc(proc.pid, port, str(log), start_time(proc.pid))


def write_connection(dep: Deployment) -> None:
    auth = f'root-certificates = "{dep.creds / "ca.crt"}"' if dep.secure else "insecure = true"
    write_atomic(
        dep.home / "config.toml",
        (
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{dep.superlink.port}"\n{auth}\n'
        ).encode(),
    )


def start_superlink(dep: Deployment, timeout: float) -> None:
    listening(lambda port: _superlink(dep, port), free_port, "the SuperLink", timeout)  # each start recorded in dep
    write_connection(dep)


def _superlink(dep: Deployment, port: int) -> Proc:
    cmd = [
        tool("flower-superlink"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--disable-runtime-dependency-installation",
    ]
    if dep.secure:
        c = dep.creds
        cmd += [
            "--ssl-ca-certfile",
            str(c / "ca.crt"),
            "--ssl-certfile",
            str(c / "server.crt"),
            "--ssl-keyfile",
            str(c / "server.key"),
            "--enable-supernode-auth",
        ]
    else:
        cmd += ["--insecure"]
    dep.superlink = _spawn(dep, "superlink", cmd, port)
    dep.save()  # `down` stops it should `up` fail from here
    return dep.superlink


def register_node(dep: Deployment, party: str) -> None:
    """The SuperLink operator admits a party's SuperNode by its public key."""
    pub = dep.creds / "nodes" / f"{party}.pub"
    r = subprocess.run(
        [tool("flwr"), "supernode", "register", str(pub), CONNECTION, "--name", party],
        env=dep.env(),
        capture_output=True,
        text=True,
        timeout=60,
        umask=0o077,
    )
    if r.returncode != 0:
        raise RuntimeError(f"registering SuperNode {party!r} failed:\n{r.stdout}\n{r.stderr}")


def start_node(dep: Deployment, party: str, key: Path | None = None, port: int = 0) -> Proc:
    """One party's SuperNode, configured by its own node config (node_config), its Runtime API
    on ``port`` (0: a free one)."""
    port = port or free_port()
    cmd = [
        tool("flower-supernode"),
        "--superlink",
        f"127.0.0.1:{dep.superlink.port}",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--node-config",
        node_config(dep, party),
        "--max-retries",
        "3",
        "--max-wait-time",
        "30",
    ]
    if dep.secure:
        cmd += [
            "--root-certificates",
            str(dep.creds / "ca.crt"),
            "--auth-supernode-private-key",
            str(key or dep.creds / "nodes" / party),
        ]
    else:
        cmd += ["--insecure"]
    return _spawn(dep, f"supernode-{party}", cmd, port)


def start_service(dep: Deployment, port: int = 0) -> Proc:
    """The linkage service, not waited for: `up` registers the SuperNodes while it starts."""
    port = port or free_port()
    token = dep.root / "admin.token"
    if not token.exists():
        from deploy.certs import write_private  # lazy: cryptography, for `up` only

        write_private(token, os.urandom(24).hex().encode())
    cmd = serve_command(port, dep.root / "linkage-service", token)
    if dep.secure:
        cmd += ["--certfile", str(dep.creds / "server.crt"), "--keyfile", str(dep.creds / "server.key")]
    dep.service = _spawn(dep, "linkage-service", cmd, port)
    dep.save()
    return dep.service


def linkage_service(
    dep: Deployment, timeout: float, what: str = "the linkage service", started: Proc | None = None
) -> Proc:
    """The linkage service listening: started here (or ``started``'s start waited for), again on
    a fresh port where another process took its port first (deploy/processes.py ``listening``)."""
    return listening(
        lambda port: start_service(dep, port), free_port, what, timeout, started
    )  # each start recorded in dep
