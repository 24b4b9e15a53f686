"""`python -m deploy.certs` under a permissive umask: the CA and server certificates and the
nodes' public keys were written 0666 (another user of the host could replace ca.crt or a node's
.pub: a man in the middle, or a SuperNode of theirs authenticated); the private keys were 0600.
Every file it writes is now its owner's alone from its first byte, whatever the umask."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_credential_file_is_the_owners_alone_under_umask_000(tmp_path):
    folder = tmp_path / "creds"
    folder.mkdir(mode=0o755)  # a folder the user already had: it keeps its mode, what goes in does not
    done = subprocess.run(
        [sys.executable, "-m", "deploy.certs", str(folder), "--parties", "a,b"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(0),
    )
    assert done.returncode == 0, done.stderr
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"ca.crt", "ca.key", "server.crt", "server.key", "a", "a.pub", "b", "b.pub"}
    loose = {str(p.relative_to(folder)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files if p.stat().st_mode & 0o077}
    assert not loose, loose
