"""A model of the simulation's exact step, to test one explanation of its cost on a small host:
that a socket's wake-up is synchronous (the woken guest is placed on the sender's core), so the
primary is held up at each send while a core idles. A primary and N guests (forked processes)
with calibrated CPU work in place of the models: each step the primary computes ``--primary`` ms
(its forward and backward), sends every guest a request, computes ``--update`` ms (its optimiser,
overlapping the guests) and waits for every reply; each guest computes ``--guest`` ms per request.
The requests go over socket pairs in both modes; a guest is woken either by that socket (``sock``:
it blocks in recv, a synchronous wake-up) or by a futex in shared memory (``futex``: it blocks
there, an asynchronous wake-up; the data still goes over the socket). Linux only.

    python -m bench.wake_model [--guests 2] [--steps 3000] [--rounds 3] [--primary 1.1 --guest 0.55]
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import platform
import socket
import time

SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine(), 202)
FUTEX_WAIT, FUTEX_WAKE = 0, 1
REQUEST, REPLY = 4096, 1024  # bytes: about a digits step's request and reply
LIBC = ctypes.CDLL(None, use_errno=True)


def spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def loops_for(ms: float) -> int:
    """Iterations of :func:`spin` that take ``ms`` milliseconds on this core now."""
    n, t = 200_000, time.perf_counter()
    spin(n)
    return int(n * ms / 1000 / (time.perf_counter() - t))


class Futexes:
    """One 32-bit word per guest in an anonymous shared mapping (inherited by fork)."""

    def __init__(self, count: int) -> None:
        self.words = (ctypes.c_int * count).from_buffer(mmap.mmap(-1, 4 * count, mmap.MAP_SHARED))

    def _call(self, i: int, op: int, value: int) -> None:
        LIBC.syscall(SYS_FUTEX, ctypes.c_void_p(ctypes.addressof(self.words) + 4 * i), op, value, None, None, 0)

    def wait_past(self, i: int, seen: int) -> int:
        while self.words[i] == seen:
            self._call(i, FUTEX_WAIT, seen)
        return self.words[i]

    def bump(self, i: int) -> None:
        self.words[i] += 1
        self._call(i, FUTEX_WAKE, 1)


def guest(sock: socket.socket, futexes: Futexes | None, i: int, work: int) -> None:
    seen = 0
    while True:
        if futexes is not None:
            seen = futexes.wait_past(i, seen)
        if sock.recv(REQUEST) in (b"", b"q"):
            os._exit(0)
        spin(work)
        sock.sendall(b"r" * REPLY)


def run(mode: str, args: argparse.Namespace) -> float:
    """Milliseconds per step of ``args.steps`` steps, the guests woken as ``mode`` says."""
    futexes = Futexes(args.guests) if mode == "futex" else None
    primary, update, work = loops_for(args.primary), loops_for(args.update), loops_for(args.guest)
    pairs = [socket.socketpair() for _ in range(args.guests)]
    pids = []
    for i, (_, theirs) in enumerate(pairs):
        pid = os.fork()
        if pid == 0:
            guest(theirs, futexes, i, work)
        pids.append(pid)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        spin(primary)
        for i, (ours, _) in enumerate(pairs):
            ours.sendall(b"x" * REQUEST)
            if futexes is not None:
                futexes.bump(i)
        spin(update)
        for ours, _ in pairs:
            got = 0
            while got < REPLY:
                got += len(ours.recv(REPLY))
    seconds = time.perf_counter() - t0
    for i, (ours, _) in enumerate(pairs):
        ours.sendall(b"q")
        if futexes is not None:
            futexes.bump(i)
    for pid in pids:
        os.waitpid(pid, 0)
    return 1000 * seconds / args.steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--guests", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--primary", type=float, default=1.1, help="ms of the primary's forward and backward")
    ap.add_argument("--update", type=float, default=0.4, help="ms of the primary's update")
    ap.add_argument("--guest", type=float, default=0.55, help="ms of a guest's step")
    args = ap.parse_args()
    serial = args.primary + args.update + args.guests * args.guest
    print(f"{args.guests} guests, {os.cpu_count()} CPUs; the same work in one process: {serial:.2f} ms/step")
    for r in range(args.rounds):
        row = {mode: run(mode, args) for mode in ("sock", "futex")}
        print(f"round {r + 1}: " + ", ".join(f"{m} {ms:.3f} ms/step" for m, ms in row.items()), flush=True)


if __name__ == "__main__":
    main()
