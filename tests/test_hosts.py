"""lab/hosts.py (issue 32, the host layer): hosts in their own network namespaces, as their own
users, with their own homes; nothing shared through the file system; a teardown that leaves the
machine as it found it. Needs root and `ip netns` (CI runs as root); skipped otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lab.hosts import Lab, main

PORT = 8765  # inside the lab's namespaces only


def _why_not() -> str | None:
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux (network namespaces, useradd); CI runs as root"
    if not all(shutil.which(t) for t in ("ip", "useradd", "userdel", "pkill")):
        return "needs iproute2 (ip netns), useradd/userdel and pkill"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode:
        return "`ip netns` is not available here"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


# Run as a host's user: the paths (one a line, on stdin) it can open for reading.
READABLE = """
import sys
for path in sys.stdin.read().splitlines():
    try:
        open(path, "rb").close()
        print(path)
    except OSError:
        pass
"""


def read_by_others(lab: Lab, owner, files: list[Path]) -> list[tuple[str, str]]:
    """(reader, path) for each of ``owner``'s ``files`` another host's user can open: one process
    per reader tries them all (the lab tests' homes hold hundreds of files)."""
    seen = []
    for reader in (h for h in lab.hosts.values() if h.name != owner.name):
        r = lab.run(reader, [sys.executable, "-c", READABLE], input="\n".join(map(str, files)), timeout=300)
        assert r.returncode == 0, (reader.name, r.stderr)
        seen += [(reader.name, line) for line in r.stdout.splitlines()]
    return seen


LISTEN = (
    """
import os, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", %d))
s.listen()
while True:
    c, _ = s.accept()
    c.sendall(b"uid %%d" %% os.getuid())
    c.close()
"""
    % PORT
)

CONNECT = (
    """
import socket, sys, time
deadline = time.monotonic() + float(sys.argv[2])
while True:
    try:
        print(socket.create_connection((sys.argv[1], %d), timeout=2).recv(100).decode())
        break
    except OSError as e:
        if time.monotonic() > deadline:
            print(type(e).__name__)
            break
        time.sleep(0.05)
"""
    % PORT
)


# A process that leaves: its own session, its pipes closed (`run` waits for the captured pipes).
ESCAPE = "import subprocess as s; s.Popen(['sleep', '301'], start_new_session=True, stdout=s.DEVNULL, stderr=s.DEVNULL)"


def _links() -> list[str]:
    """The root namespace's interface names."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines())


def _mounts() -> list[str]:
    """The root mount namespace's mounts but /run/netns (iproute2's: the namespaces, and itself once)."""
    return [line for line in Path("/proc/self/mounts").read_text().splitlines() if " /run/netns" not in line]


def _leftovers(lab: Lab) -> list[str]:
    """Whatever of the lab still exists: namespaces, users, groups, homes, processes of its uids."""
    mark = f"fsl-{lab.tag}-"
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = [line.split()[0] for line in netns.splitlines() if line.startswith(mark)]
    for db in ("passwd", "group"):
        out = subprocess.run(["getent", db], capture_output=True, text=True).stdout
        left += [f"{db}:{line.split(':')[0]}" for line in out.splitlines() if line.startswith(mark)]
    left += [str(lab.home(n)) for n in lab.names if lab.home(n).exists()]
    uids = {h.uid for h in lab.hosts.values()}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.stat().st_uid in uids:
                left.append(f"pid {proc.name}")
        except FileNotFoundError:
            continue
    return left


@pytest.fixture
def base():
    path = Path(tempfile.mkdtemp(prefix="fsl-test-", dir="/tmp"))  # pytest's tmp_path is 0700: users can't enter
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def lab():
    path = Path(tempfile.mkdtemp(prefix="fsl-test-", dir="/tmp"))
    with Lab(path, ["primary", "party_a"]) as lab:
        yield lab
    assert not _leftovers(lab)
    shutil.rmtree(path, ignore_errors=True)


def test_two_hosts_talk_over_tcp_and_each_has_its_own_loopback(lab, base):
    a, b = lab.hosts["primary"], lab.hosts["party_a"]
    assert a.address != b.address and a.netns != b.netns
    server = lab.start(a, [sys.executable, "-c", LISTEN], base / "listen.log")
    try:
        local = lab.run(a, [sys.executable, "-c", CONNECT, "127.0.0.1", "10"])
        assert local.stdout.strip() == f"uid {a.uid}", local.stderr  # up, on a's loopback
        across = lab.run(b, [sys.executable, "-c", CONNECT, a.address, "2"])
        assert across.stdout.strip() == f"uid {a.uid}", across.stderr
        loopback = lab.run(b, [sys.executable, "-c", CONNECT, "127.0.0.1", "0"])
        assert loopback.stdout.strip() == "ConnectionRefusedError"  # b's 127.0.0.1 is not a's
    finally:
        server.stop(grace=1)
    assert server.popen.poll() is not None


def test_a_hosts_files_are_readable_by_it_and_not_by_another_host(lab, tmp_path):
    a, b = lab.hosts["primary"], lab.hosts["party_a"]
    (tmp_path / "own.csv").write_text("id,x\n1,2\n")
    path = lab.copy_in(a, tmp_path / "own.csv", "data/own.csv")
    assert (path.stat().st_uid, path.stat().st_mode & 0o777) == (a.uid, 0o600)
    assert (path.parent.stat().st_mode & 0o777, a.home.stat().st_mode & 0o777) == (0o700, 0o700)
    assert lab.readable_by(a, path) and lab.readable_by(a, "data/own.csv")
    assert not lab.readable_by(b, path)
    assert lab.run(b, ["ls", str(a.home)]).returncode != 0
    assert lab.run(b, ["ls", str(lab.base)]).returncode != 0  # 0711: enter, not list


def test_commands_run_as_the_hosts_user_in_its_home_with_umask_077_and_a_clean_environment(lab):
    a = lab.hosts["primary"]
    assert lab.run(a, ["id", "-u"]).stdout.strip() == str(a.uid)
    assert lab.run(a, ["pwd"]).stdout.strip() == str(a.home)
    assert lab.run(a, ["touch", "made"]).returncode == 0
    made = a.home / "made"
    assert (made.stat().st_uid, made.stat().st_mode & 0o777) == (a.uid, 0o600)
    env = lab.run(a, ["env"], env={"EXTRA": "1"}).stdout.splitlines()
    assert sorted(line.split("=")[0] for line in env) == ["EXTRA", "HOME", "LANG", "LOGNAME", "PATH", "USER"]
    version = lab.run(a, [sys.executable, "-c", "import sys; print(sys.version)"])
    assert version.stdout.strip() == sys.version, version.stderr  # the venv's own interpreter


def test_transfer_writes_as_the_receiver_and_is_recorded(lab, tmp_path):
    a, b = lab.hosts["primary"], lab.hosts["party_a"]
    (tmp_path / "keys.csv").write_bytes(b"k\n" * 100)
    lab.copy_in(a, tmp_path / "keys.csv", "out/keys.csv")
    dest = lab.transfer(a, b, "out/keys.csv", "in/keys.csv")
    assert dest == b.home / "in" / "keys.csv" and dest.read_bytes() == b"k\n" * 100
    assert (dest.stat().st_uid, dest.stat().st_mode & 0o777) == (b.uid, 0o600)
    assert lab.readable_by(b, dest) and not lab.readable_by(a, dest)
    last = lab.transfers[-1]
    assert (last.sender, last.receiver, last.name, last.size) == ("primary", "party_a", "in/keys.csv", 200)


def test_teardown_removes_everything_also_after_an_exception(base):
    before, mounts = _links(), _mounts()
    with pytest.raises(RuntimeError, match="inside"):
        with Lab(base, ["primary", "service", "party_a"]) as lab:
            assert _leftovers(lab) and _links() == before  # nothing in the root namespace
            host = lab.hosts["party_a"]
            sleeper = lab.start(host, ["sleep", "300"], base / "sleep.log")
            escaped = lab.run(host, [sys.executable, "-c", ESCAPE])  # its own session, not ours to stop
            assert escaped.returncode == 0 and sleeper.popen.poll() is None
            assert _mounts() == mounts  # /root covered only in the commands' own mount namespaces
            raise RuntimeError("inside the with block")
    assert not _leftovers(lab) and sleeper.popen.poll() is not None
    assert _links() == before and _mounts() == mounts and not (base / "lab.json").exists()
    lab.teardown()  # twice is fine


def test_teardown_after_a_half_done_setup_and_down_after_a_crash(base, monkeypatch):
    half = Lab(base, ["primary", "party_a", "party_b"])
    made = half._make_host

    def fail_at_party_b(i, name):
        if name == "party_b":
            raise OSError("disk full")
        return made(i, name)

    monkeypatch.setattr(half, "_make_host", fail_at_party_b)
    with pytest.raises(OSError, match="disk full"):
        half.setup()
    assert set(half.hosts) == {"primary", "party_a"} and not _leftovers(half)
    crashed = Lab(base, ["primary", "party_a"]).setup()  # as if its process died without teardown
    assert _leftovers(crashed) and (base / "lab.json").stat().st_mode & 0o777 == 0o600
    main(["down", "--base", str(base)])
    assert not _leftovers(crashed)


def test_a_command_runs_whatever_the_callers_umask(lab):
    """The suite's processes may run under umask 077 (private files): the folders the interpreter's
    shadow mount makes must still let the host's user reach the interpreter (failed before: EACCES)."""
    old = os.umask(0o077)
    try:
        r = lab.run(lab.hosts["primary"], [sys.executable, "-c", "print('ok')"])
    finally:
        os.umask(old)
    assert r.stdout.strip() == "ok", r.stderr[-800:]
