"""The root-side step between ``ip netns exec`` and a lab host's command (lab/hosts.py): in
the private mount namespace ``ip netns exec`` makes per command, cover the closed ancestor of the
interpreter (/root) with an empty tmpfs, bind the interpreter's prefix back in (folders 0755
whatever the caller's umask), then become the host's user (its groups, umask 077, its home) and
exec the command. Run as a script with ``python -I -S``: the standard library only.

    python -I -S lab/enter.py UID GID HOME BLOCKED PREFIX -- COMMAND...
"""

from __future__ import annotations

import ctypes
import os
import pwd
import sys

MS_NOSUID, MS_NODEV, MS_BIND, MS_REC = 2, 4, 4096, 16384


def _cover(blocked: str, prefix: str) -> None:
    """In this (private) mount namespace: an empty tmpfs over ``blocked``, ``prefix`` bound back in."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(prefix, os.O_PATH | os.O_DIRECTORY)
    mounts = (
        (b"tmpfs", blocked, b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755"),
        (f"/proc/self/fd/{fd}".encode(), prefix, None, MS_BIND | MS_REC, None),
    )
    for source, target, fstype, flags, data in mounts:
        os.makedirs(target, mode=0o755, exist_ok=True)
        if libc.mount(source, os.fsencode(target), fstype, ctypes.c_ulong(flags), data) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), target)
    os.close(fd)


def enter(argv: list[str]) -> None:
    """uid gid home blocked prefix -- command...: becomes the host's user and execs the command."""
    uid, gid, home, blocked, prefix, sep, *command = argv
    if sep != "--" or not command:
        raise SystemExit("usage: enter.py UID GID HOME BLOCKED PREFIX -- COMMAND...")
    if blocked:
        os.umask(0o022)  # the mounts' folders 0755, whatever the caller's umask
        _cover(blocked, prefix)
    os.initgroups(pwd.getpwuid(int(uid)).pw_name, int(gid))
    os.setgid(int(gid))
    os.setuid(int(uid))
    os.umask(0o077)
    os.chdir(home)
    os.execvp(command[0], command)


if __name__ == "__main__":
    enter(sys.argv[1:])
