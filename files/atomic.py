"""Writes that never leave half a file: a temporary 0600 name beside the target, renamed into
place when the write succeeds and removed when it fails (files.private makes the folders 0700)."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

from files.private import create_private


@contextlib.contextmanager
def atomic_path(path: Path):
    """A temporary name beside ``path`` to write, renamed to ``path`` when the block ends without
    an error and removed when it raises: a crash or failure never leaves half a file. The
    temporary file is created 0600 (in folders created 0700) before the block writes into it,
    so the file is its owner's alone whatever the umask (linkage.private)."""
    tmp = path.with_name(f"{path.name}.tmp{threading.get_ident()}")
    try:
        create_private(tmp)
        yield tmp
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary name, then rename (:func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
