"""One command trains a run folder at a time.

    hold_run(out_dir, run_name)    a context holding ``<out_dir>/.<run_name>.lock`` (an exclusive
                                   flock, 0600); RunInUse names the holder's pid where another
                                   process holds it

The lock lives beside the run folder, not in it: a run's start sets a finished run's files aside
inside the folder, which the lock must not depend on. The kernel lets go of it when the holder's
process ends, however it ends, so a killed command never leaves a run locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from files.private import private_dir


class RunInUse(RuntimeError):
    """Another command is training the run."""


@contextlib.contextmanager
def hold_run(out_dir: Path, run_name: str):
    path = private_dir(Path(out_dir)) / f".{run_name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise RunInUse(
                f"run {run_name} in {out_dir} is being trained by another command (pid {holder}); "
                "wait for it to end, or give this run another --run-name"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # the lock goes with the descriptor
