"""Separate hosts on one machine, for the multi-host harness: the host layer only.

A ``Lab`` gives each named host (``primary``, ``service``, ``party_a``...) its own network
namespace, joined to the others by a bridge in a dedicated "switch" namespace (the root
namespace gets no interface), an address on a private /24 that no route of the machine covers,
its own OS user (``fsl-<tag>-<name>``, no login shell) and home (0700, that user's) under a base
folder the caller gives (0711: each user reaches its own home, lists none). ``run``/``start``
execute an argument list in the host's namespace as its user, in its home, umask 077, with a
clean environment. Nothing is shared through the file system: ``copy_in`` is the operator
placing a file in a home, ``transfer`` one host sending a file to another (read as the sender,
written as the receiver, recorded in ``transfers``).

Isolated: the network stack (interfaces, loopback, ports, routes), the address, the user (uid,
processes), the files (each home 0700). Not isolated: the kernel, CPUs and memory, /tmp (1777,
as on any host), root (reads everything), and the code: the repository and the venv are root's
but world-readable (checked 2026-11-26: /work/main, .venv, site-packages 0755, files 0644; not
runs/, 0700), shared like an installed package; the data is not. iproute2's first ``ip netns
add`` bind-mounts /run/netns once in the root mount namespace; nothing else touches it.

The venv's interpreter is a symlink into /root/.pyenv (/root is 0700: EACCES for other users).
So every command enters through ``lab/enter.py``: in the private mount namespace ``ip netns exec``
makes per command it covers the closed ancestor (/root) with an empty tmpfs, binds the
interpreter's prefix back in (folders 0755 whatever the caller's umask), then becomes the
host's user. The hosts see no /root at all.

    python -m lab.hosts up   --base DIR --hosts primary,service,party_a,party_b,party_c
    python -m lab.hosts down --base DIR      # cleans a lab left by a crashed run (DIR/lab.json)
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from subprocess import CompletedProcess

IP = shutil.which("ip") or "/usr/sbin/ip"
PREFIX = "fsl"
PRIMARY = "primary"  # the primary party's host in every lab
NAME = re.compile(r"^[a-z][a-z0-9_]{0,15}$")
STD_PATH = "/usr/local/bin:/usr/bin:/bin"
NOLOGIN = next((s for s in ("/usr/sbin/nologin", "/sbin/nologin") if Path(s).exists()), "/bin/false")
ENTER = Path(__file__).resolve().with_name("enter.py")  # the root-side step into a host (module docstring)


@dataclass(frozen=True)
class Host:
    name: str  # the party's role: "primary", "service", "party_a"
    netns: str
    user: str
    uid: int
    gid: int
    home: Path
    address: str  # IPv4, on the lab's private /24


@dataclass(frozen=True)
class Transfer:
    sender: str
    receiver: str
    name: str  # the path written, relative to the receiver's home
    size: int  # bytes


@dataclass(frozen=True)
class Running:
    """A long-running process in its own session (its pid is the session's and group's id)."""

    host: Host
    popen: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM to its process group, SIGKILL after ``grace`` seconds; returns its exit code."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            with suppress(ProcessLookupError):
                os.killpg(self.pid, sig)
            try:
                return self.popen.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        return self.popen.poll()


def _sh(*argv: str, check: bool = True) -> CompletedProcess:
    """A root command on the machine (argument list, no shell)."""
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    if check and r.returncode:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def untraversable(path: Path) -> Path | None:
    """The first folder on the way to ``path`` that other users may not enter, or None."""
    path = Path(os.path.realpath(path))
    for folder in [*reversed(path.parents), *([path] if path.is_dir() else [])]:
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.213-10.223.x that no route of the machine (the default one aside) overlaps."""
    routes = []  # "10.0.0.0/8 dev ...", "local 10.0.0.1 dev ..." (table local), "default via ..."
    for words in (line.split() for line in _sh(IP, "-4", "-o", "route", "show", "table", "all").stdout.splitlines()):
        dest = next((w for w in words[:3] if w[0].isdigit()), None)
        if dest and words[0] != "default":
            routes.append(ipaddress.ip_network(dest, strict=False))
    for second in range(213, 224):
        for third in range(256):
            net = ipaddress.ip_network(f"10.{second}.{third}.0/24")
            if not any(net.overlaps(r) for r in routes):
                return net
    raise RuntimeError("no free private /24 in 10.213.0.0-10.223.255.0")


def _shadow() -> list[str]:
    """[blocked ancestor, interpreter prefix] when the interpreter lies behind a closed folder."""
    prefix = Path(os.path.realpath(sys.base_prefix))
    blocked = untraversable(prefix / "bin")
    return [str(blocked), str(prefix)] if blocked and blocked != Path("/") else ["", ""]


class Lab:
    """Hosts on one machine, each in its own network namespace, as its own user (module docstring).
    ``with Lab(base, ["primary", "party_a"]) as lab: lab.run(lab.hosts["party_a"], ["id", "-u"])``
    """

    def __init__(self, base: Path, names: list[str], tag: str | None = None, subnet: str | None = None):
        bad = [n for n in names if not NAME.match(n) or n == "switch"]
        if bad or len(set(names)) != len(names) or not 0 < len(names) <= 200:
            raise ValueError(f"host names must be unique, [a-z][a-z0-9_]{{0,15}}, not 'switch': {names}")
        self.base, self.names = Path(base).resolve(), list(names)
        self.tag = tag or secrets.token_hex(3)
        self.switch, self.bridge = f"{PREFIX}-{self.tag}-switch", f"br{self.tag}"
        self.subnet = ipaddress.ip_network(subnet) if subnet else None
        self.hosts: dict[str, Host] = {}
        self.transfers: list[Transfer] = []
        self._shadow = _shadow()
        self._started: list[Running] = []
        self._closed = False

    # --- names ---
    def user(self, name: str) -> str:
        return f"{PREFIX}-{self.tag}-{name}"

    netns = user  # a host's namespace is named as its user

    def home(self, name: str) -> Path:
        return self.base / self.user(name)

    # --- set-up ---
    def __enter__(self) -> Lab:
        return self.setup()

    def __exit__(self, *exc) -> None:
        self.teardown()

    def setup(self) -> Lab:
        """Creates the switch, then each host; on any failure cleans what exists and re-raises."""
        try:
            self._prepare_base()
            self.subnet = self.subnet or free_subnet()
            self._record()
            self._make_switch()
            for i, name in enumerate(self.names):
                self.hosts[name] = self._make_host(i, name)
            self._record()
        except BaseException:
            self.teardown()
            raise
        return self

    def _prepare_base(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o711)
        blocked = untraversable(self.base)
        if blocked:
            raise ValueError(f"{self.base}: other users cannot enter {blocked}; choose a base under /tmp or /srv")

    def _record(self) -> None:
        """BASE/lab.json (0600): the names to clean, written before anything is created."""
        hosts = {n: {**asdict(h), "home": str(h.home)} for n, h in self.hosts.items()}
        record = {"tag": self.tag, "names": self.names, "subnet": str(self.subnet), "hosts": hosts}
        fd = os.open(self.base / "lab.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)
            json.dump(record, f, indent=1)

    def _make_switch(self) -> None:
        _sh(IP, "netns", "add", self.switch)
        _sh(IP, "-n", self.switch, "link", "set", "lo", "up")
        _sh(IP, "-n", self.switch, "link", "add", self.bridge, "type", "bridge")
        _sh(IP, "-n", self.switch, "link", "set", self.bridge, "up")

    def _make_host(self, i: int, name: str) -> Host:
        ns, port, address = self.netns(name), f"v{self.tag}{i}", str(self.subnet[10 + i])
        _sh(IP, "netns", "add", ns)
        _sh(IP, "-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _sh(IP, "-n", self.switch, "link", "set", port, "master", self.bridge, "up")
        _sh(IP, "-n", ns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        _sh(IP, "-n", ns, "link", "set", "eth0", "up")
        _sh(IP, "-n", ns, "link", "set", "lo", "up")
        return self._make_user(name, ns, address)

    def _make_user(self, name: str, ns: str, address: str) -> Host:
        user, home = self.user(name), self.home(name)
        _sh("useradd", "--system", "--user-group", "--no-create-home", "-d", str(home), "-s", NOLOGIN, user)
        entry = pwd.getpwnam(user)
        home.mkdir(mode=0o700)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        os.chmod(home, 0o700)
        return Host(name, ns, user, entry.pw_uid, entry.pw_gid, home, address)

    # --- running things on a host ---
    def command(self, host: Host, argv: list[str]) -> list[str]:
        """The root-side argument list that runs ``argv`` in the host's namespace as its user."""
        enter = [sys.executable, "-I", "-S", str(ENTER)]  # stdlib only: no site, no path of ours
        who = [str(host.uid), str(host.gid), str(host.home), *self._shadow]
        return [IP, "netns", "exec", host.netns, *enter, *who, "--", *argv]

    def environment(self, host: Host, env: dict[str, str] | None = None) -> dict[str, str]:
        """Only PATH (the venv's bin first), HOME, LANG, USER, LOGNAME, and what the caller gives."""
        path = f"{Path(sys.executable).parent}:{STD_PATH}"
        own = {"PATH": path, "HOME": str(host.home), "LANG": "C.UTF-8", "USER": host.user, "LOGNAME": host.user}
        return {**own, **(env or {})}

    def run(self, host: Host, argv: list[str], env=None, timeout=60.0, input=None, text=True) -> CompletedProcess:
        """Runs ``argv`` to completion on ``host`` (its namespace, user, home, umask 077), captured."""
        cmd, environment = self.command(host, argv), self.environment(host, env)
        return subprocess.run(cmd, env=environment, input=input, capture_output=True, text=text, timeout=timeout)

    def start(self, host: Host, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> Running:
        """Starts ``argv`` on ``host`` in a session of its own, stdout and stderr to ``log_path``."""
        with open(log_path, "ab") as log:
            cmd, environment = self.command(host, argv), self.environment(host, env)
            out = {"stdin": subprocess.DEVNULL, "stdout": log, "stderr": subprocess.STDOUT}
            popen = subprocess.Popen(cmd, env=environment, start_new_session=True, **out)
        running = Running(host, popen)
        self._started.append(running)
        return running

    # --- files: what crosses between hosts ---
    def copy_in(self, host: Host, src: Path, dest_rel: str | Path | None = None, mode: int = 0o600) -> Path:
        """The operator places ``src`` (read by root) in the host's home, owned by its user."""
        return self._write_as(host, dest_rel or Path(src).name, Path(src).read_bytes(), mode)

    def transfer(self, sender: Host, receiver: Host, path: str | Path, dest_rel=None, mode: int = 0o600) -> Path:
        """Sends a file: read as the sender (``path`` relative to its home), written as the receiver."""
        read = self.run(sender, ["cat", "--", str(path)], text=False)
        _check(read, f"{sender.name} reading {path}")
        name = str(_relative(dest_rel or Path(path).name))
        dest = self._write_as(receiver, name, read.stdout, mode)
        self.transfers.append(Transfer(sender.name, receiver.name, name, len(read.stdout)))
        return dest

    def readable_by(self, host: Host, path: str | Path) -> bool:
        """Whether the host's user can open and read the file ``path``."""
        return self.run(host, ["head", "-c", "1", "--", str(path)], text=False).returncode == 0

    def _write_as(self, host: Host, dest_rel: str | Path, data: bytes, mode: int) -> Path:
        rel = _relative(dest_rel)
        if len(rel.parts) > 1:
            _check(self.run(host, ["mkdir", "-p", "-m", "700", "--", str(rel.parent)]), f"mkdir on {host.name}")
        _check(self.run(host, ["dd", f"of={rel}", "status=none"], input=data, text=False), f"write on {host.name}")
        _check(self.run(host, ["chmod", f"{mode:o}", "--", str(rel)]), f"chmod on {host.name}")
        return host.home / rel

    # --- teardown ---
    def teardown(self, grace: float = 3.0) -> None:
        """Stops every process of the lab's users, deletes the namespaces (and so the veths), the
        switch, the users and their homes. Safe after a partial set-up, and to call twice."""
        if self._closed:
            return
        for running in self._started:
            running.stop(grace=0.5)
        existing = {entry.pw_name for entry in pwd.getpwall()}
        users = [self.user(n) for n in self.names if self.user(n) in existing]
        _kill_users(users, grace)
        for name in self.names:
            _drop_netns(self.netns(name))
        _drop_netns(self.switch)
        for user in users:
            _sh("userdel", "--force", user, check=False)
            _sh("groupdel", user, check=False)  # left when it was not the user's private group
        for name in self.names:
            shutil.rmtree(self.home(name), ignore_errors=True)
        (self.base / "lab.json").unlink(missing_ok=True)
        self._closed = True

    @classmethod
    def load(cls, base: Path) -> Lab:
        """The lab recorded in BASE/lab.json (to tear down what a crashed run left)."""
        record = json.loads((Path(base) / "lab.json").read_text())
        return cls(base, record["names"], tag=record["tag"])


def _relative(path: str | Path) -> Path:
    rel = Path(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise ValueError(f"{path}: a path inside the home, relative, without '..'")
    return rel


def _check(r: CompletedProcess, what: str) -> None:
    if r.returncode:
        err = r.stderr.decode(errors="replace") if isinstance(r.stderr, bytes) else r.stderr
        raise RuntimeError(f"{what}: exit {r.returncode}: {err.strip()}")


def _alive(users: list[str]) -> bool:
    return any(_sh("pgrep", "-u", u, check=False).returncode == 0 for u in users)


def _kill_users(users: list[str], grace: float) -> None:
    """SIGTERM to every process of ``users``, SIGKILL to what is left after ``grace`` seconds."""
    for sig, wait in (("-TERM", grace), ("-KILL", 5.0)):
        for user in users:
            _sh("pkill", sig, "-u", user, check=False)
        deadline = time.monotonic() + wait
        while _alive(users) and time.monotonic() < deadline:
            time.sleep(0.05)


def _drop_netns(ns: str) -> None:
    if not Path("/run/netns", ns).exists():
        return
    for pid in _sh(IP, "netns", "pids", ns, check=False).stdout.split():
        with suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    _sh(IP, "netns", "delete", ns, check=False)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m lab.hosts", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--base", type=Path, required=True, help="folder for the homes and lab.json")
    parser.add_argument("--hosts", default="primary,service,party_a,party_b,party_c")
    args = parser.parse_args(argv)
    if args.action == "down":
        if not (args.base / "lab.json").exists():
            raise SystemExit(f"{args.base}/lab.json: no lab recorded there")
        return Lab.load(args.base).teardown()
    lab = Lab(args.base, args.hosts.split(",")).setup()
    print(json.dumps({n: {**asdict(h), "home": str(h.home)} for n, h in lab.hosts.items()}, indent=1))


if __name__ == "__main__":
    main()
