"""Files only their owner can read: 0600 files in 0700 folders, whatever the umask.

Every file the service, the parties' commands, training and the deployment write may hold
identifiers, linkage, secrets or models, so every one is its owner's alone:

    private_umask()                 the process's umask -> 0o077 (called first by every entry point:
                                    `fedsim`, `python -m linkage_server`, `python -m deploy`, the
                                    Flower apps), so files that libraries write (torch.save,
                                    np.save, logs) are 0600 and folders 0700 too
    private_dir(path)               mkdir -p where every folder it creates is 0700
    create_private(path)            an empty 0600 file made now (a writer then fills it)
    create_secret(path, data)       a secret or key: 0600 from its first byte (O_CREAT | O_EXCL),
                                    never over an existing file
    exposed(path)                   why a secret file given to a command is readable by others, or None

A folder given by the user that already exists keeps its mode (it is the user's); every file
written into it is still 0600.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

PRIVATE_UMASK = 0o077


class SecretExists(FileExistsError):
    """A secret or key file that would be overwritten."""


def private_umask() -> int:
    """Set the process's umask to 0o077 (files 0600, folders 0700); returns the previous one."""
    return os.umask(PRIVATE_UMASK)


def private_dir(path: Path) -> Path:
    """``path`` and its missing parents, each created 0700 (mkdir's ``parents`` ignores the mode)."""
    path = Path(path)
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass
        else:
            os.chmod(folder, 0o700)  # mkdir's mode is masked by the umask: 0700 exactly
    return path


def create_private(path: Path) -> Path:
    """An empty file at ``path`` (truncated if there), 0600 before any byte is written into it."""
    path = Path(path)
    private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a file that existed keeps its mode through O_CREAT: made private now
    finally:
        os.close(fd)
    return path


def create_secret(path: Path, data: bytes | str, what: str = "secret") -> Path:
    """Write a secret or key to a new file, 0600 from its first byte; refused (SecretExists,
    naming the file) when the file exists: a secret is never silently replaced."""
    path = Path(path)
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise SecretExists(
            f"{path} exists: refusing to overwrite a {what} (remove it first, or choose another path)"
        ) from None
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    return path


def exposed(path: Path) -> str | None:
    """Why the file at ``path`` is readable (or writable) by users other than its owner, or None."""
    mode = os.stat(path).st_mode
    if not mode & (stat.S_IRWXG | stat.S_IRWXO):
        return None
    return f"{path} is mode {stat.S_IMODE(mode):04o}: other users of this host can read it (chmod 600 {path})"


def warn_if_exposed(path: Path, what: str) -> None:
    """A warning on stderr when a secret or key file given to a command is readable by others."""
    problem = exposed(path)
    if problem:
        print(f"warning: the {what} {problem}", file=sys.stderr, flush=True)


def private_ray_tmp() -> str:
    """A fresh folder inside a 0700 one of this user's, for a Ray this project starts
    (``RAY_TMPDIR`` or ``ray.init(_temp_dir=...)``): Ray makes its session folders (logs, sockets,
    runtime resources) 0777 without a sticky bit under its temporary folder, so under the shared
    /tmp another user could create and delete files in a run's sockets/. Inside this folder no
    other user can reach them. Short (Ray's socket paths must fit 107 bytes):
    /tmp/fedsim-ray-XXXXXXXX/r; removed when the process that asked for it exits (a shell script
    makes and removes its own: scripts/demo.sh)."""
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="fedsim-ray-", dir="/tmp" if os.path.isdir("/tmp") else None)  # 0700
    atexit.register(shutil.rmtree, folder, True)  # gone with the process that started its Ray
    return os.path.join(folder, "r")  # Ray makes the folder it is given 0777 itself: one inside the 0700 one
