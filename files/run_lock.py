"""One command trains a run folder at a time.

    hold_run(run_dir)    a context holding ``<run_dir>/.lock`` (an exclusive flock, 0600; the folder
                         made 0700 where missing); RunInUse names the holder's pid where another
                         process holds it

A run's start sets a finished run's files aside by their names (app/run_files.py), never the lock.
The kernel lets go of it when the holder's process ends, however it ends, so a killed command
never leaves a run locked.
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
def hold_run(run_dir: Path):
    path = private_dir(Path(run_dir)) / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise RunInUse(
                f"run {Path(run_dir).name} in {Path(run_dir).parent} is being trained by another command (pid {holder}); "
                "wait for it to end, or give this run another --run-name"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # the lock goes with the descriptor
