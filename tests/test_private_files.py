"""Issue 28, items 1, 2 and 4: on a host other people share, nothing the service, the parties'
commands or the deployment write can be read by another user, secrets are private from their
first byte, and private mode never uploads a plaintext identifier.

The parties and the service run as real processes under the usual umask 022, in a folder any
user may enter (0755), so only the files' own modes protect them; each file is then read as
the user ``nobody`` (setpriv), as a local attacker would.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from files.atomic import write_atomic
from files.private import SecretExists, create_private, create_secret, exposed, private_dir
from linkage_server.local import free_port
from tests.test_service_cli import TITLES

NOBODY = 65534
SETPRIV = shutil.which("setpriv")


@pytest.fixture
def shared_host():
    """A folder every user may enter and list (0755), outside pytest's private tmp folder."""
    root = Path(tempfile.mkdtemp(prefix="fedsim-shared-"))
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """A command as a user runs it, under the usual umask 022."""
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=180, umask=0o022)
    if check and out.returncode != 0:
        raise AssertionError(f"{args} failed:\n{out.stdout}\n{out.stderr}")
    return out


def _readable_by_others(root: Path, skip: tuple[Path, ...] = ()) -> list[str]:
    """Every file or folder under root whose mode lets another user read, write or enter it."""
    found = []
    for path in sorted(root.rglob("*")):
        if any(path == s or s in path.parents for s in skip):
            continue
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & 0o077:
            found.append(f"{path.relative_to(root)} {mode:04o}")
    return found


def _read_as_nobody(paths: list[Path]) -> list[str]:
    """The files that the user nobody can read (should be none)."""
    if os.geteuid() != 0 or SETPRIV is None:
        return []
    read = []
    for path in paths:
        r = subprocess.run(
            [SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "cat", str(path)],
            capture_output=True,
            timeout=30,
        )
        if r.returncode == 0:
            read.append(str(path))
    return read


def _plaintext_in(folder: Path, words: list[str]) -> list[str]:
    """Files under folder holding any of these strings as bytes (UTF-8, or numpy's UTF-32)."""
    needles = [w.encode() for w in words] + [w.encode("utf-32-le") for w in words]
    return sorted(str(p) for p in folder.rglob("*") if p.is_file() and any(n in p.read_bytes() for n in needles))


def _inputs(root: Path) -> tuple[Path, list[str]]:
    """The parties' own inputs (left 0644 on purpose: they are not ours to protect): raw string
    identifiers as .npy files and a CSV."""
    inputs = root / "inputs"
    inputs.mkdir(mode=0o755)
    primary = [t for t in TITLES]
    np.save(inputs / "p.npy", np.array(primary))
    np.save(inputs / "s.npy", np.array([t.upper() + "!" for t in TITLES[::-1]]))
    np.save(inputs / "q.npy", np.array(["portal 3", "hades ii"]))
    return inputs, primary


def _service(root: Path):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "linkage_server",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--data-dir",
            str(root / "svc"),
            "--privacy-floor",  # the files' modes are the subject here: the secondary states its own floor
            "off",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        umask=0o022,
    )
    import time

    import httpx

    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=1).is_success:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"the service did not start: {proc.stdout.read()}")


def _private_mode_job(root: Path, url: str, inputs: Path) -> None:
    """Every private-mode path a party has: make-key, encode (--npy), link --npy of raw and of
    encoded identifiers, start --fetch, fetch, query --npy; each with the key."""
    made = json.loads(
        _run(
            "-m",
            "linkage_server",
            "create-job",
            "--url",
            url,
            "--admin-token-file",
            str(root / "svc" / "admin-token"),
            "--primary",
            "p",
            "--secondary",
            "s",
            "--secrets-dir",
            str(root / "secrets"),
        ).stdout
    )
    job, key = made["job"], root / "keys" / "parties.key"
    _run("-m", "linkage_server", "make-key", "--out", str(key))

    def party(name: str, *args: str, check: bool = True):
        return _run(
            "-m",
            "linkage_server",
            *args,
            "--url",
            url,
            "--job",
            job,
            "--party",
            name,
            "--secret-file",
            str(root / "secrets" / f"{job}-{name}.secret"),
            check=check,
        )

    _run(
        "-m",
        "linkage_server",
        "encode",
        "--npy",
        str(inputs / "s.npy"),
        "--key-file",
        str(key),
        "--out",
        str(root / "s-enc" / "s.npy"),
    )
    # off: the two queries' draws against a record with few links in a noisy release would
    # otherwise pass its allowance (429) in some draws of the job's secret
    party("s", "link", "--npy", str(root / "s-enc" / "s.npy"), "--key-file", str(key), "--privacy", "off")
    party(
        "p",
        "link",
        "--npy",
        str(inputs / "p.npy"),
        "--key-file",
        str(key),
        "--start",
        "--k",
        "3",
        "--fetch",
        str(root / "p-linkage"),
    )
    party("s", "fetch", "--out", str(root / "s-linkage"))
    party(
        "p", "query", "--npy", str(inputs / "q.npy"), "--key-file", str(key), "--out", str(root / "p-queries" / "q.npz")
    )
    # an encoded file offered with another key is refused by name, never uploaded as this key's
    other = root / "keys" / "other.key"
    _run("-m", "linkage_server", "make-key", "--out", str(other))
    refused = party("s", "link", "--npy", str(root / "s-enc" / "s.npy"), "--key-file", str(other), check=False)
    assert refused.returncode == 2 and "encoded with another key" in refused.stderr, refused.stderr


def test_nothing_the_service_and_the_parties_write_is_readable_by_another_user(shared_host):
    """Failed before the fix: uploads, search chunks, results, job.json, secrets, fetched linkage
    were 0644 in 0755 folders, and `link --npy raw.npy --key-file` uploaded the raw strings."""
    inputs, words = _inputs(shared_host)
    proc, url = _service(shared_host)
    try:
        _private_mode_job(shared_host, url, inputs)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    svc = shared_host / "svc"
    assert (svc / "admin-token").exists() and list((svc / "jobs").glob("*/work/s/*/*.npz"))  # what item 1 names
    assert _readable_by_others(shared_host, skip=(inputs,)) == []
    assert _read_as_nobody([p for p in shared_host.rglob("*") if p.is_file() and inputs not in p.parents]) == []
    assert _plaintext_in(svc, words + ["portal 3"]) == []  # item 4: the service never saw a raw identifier
    assert _plaintext_in(shared_host / "p-queries", ["portal 3"]) == []


def test_files_are_private_whatever_the_umask_even_in_library_use(tmp_path):
    """The writers themselves, not only the commands' umask: 0600 files in 0700 folders under 022."""
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "a" / "b" / "result.npz", b"linkage")
        create_private(tmp_path / "c" / "chunk.npy")
        private_dir(tmp_path / "d" / "e")
    finally:
        os.umask(old)
    assert _readable_by_others(tmp_path) == []


def test_a_secret_is_private_from_its_first_byte_and_never_overwritten(tmp_path, monkeypatch):
    """Failed before the fix: the admin token, party secrets and the parties' key were written
    0644 and chmod'ed afterwards; a process killed in between (here: chmod never comes) leaves
    a secret any user can read, and a watcher could read it in the window."""
    from linkage_server.cli import main

    monkeypatch.setattr(os, "chmod", lambda *a, **k: None)  # as if killed before any chmod
    monkeypatch.setattr(Path, "chmod", lambda *a, **k: None)
    old = os.umask(0o022)
    try:
        main(["make-key", "--out", str(tmp_path / "keys" / "parties.key")])
        with pytest.raises(SystemExit, match="refusing to overwrite a key"):
            main(["make-key", "--out", str(tmp_path / "keys" / "parties.key")])
        create_secret(tmp_path / "secrets" / "job-p.secret", "s3cret", "party secret")
        with pytest.raises(SecretExists, match="job-p.secret exists"):
            create_secret(tmp_path / "secrets" / "job-p.secret", "other", "party secret")
    finally:
        os.umask(old)
    for path in (tmp_path / "keys" / "parties.key", tmp_path / "secrets" / "job-p.secret"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert (tmp_path / "secrets" / "job-p.secret").read_text() == "s3cret"


def test_a_secret_file_readable_by_others_is_named_in_a_warning(tmp_path, capsys):
    from linkage_server.cli_party import read_secret

    path = tmp_path / "p.secret"
    path.write_text("s3cret")
    path.chmod(0o644)
    assert read_secret(str(path), "UNUSED") == "s3cret"
    assert f"warning: the secret file {path} is mode 0644" in capsys.readouterr().err
    path.chmod(0o600)
    assert exposed(path) is None
