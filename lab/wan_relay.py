"""A WAN between hosts (or network namespaces) where kernel netem is not available: a user-space
TCP relay adding a one-way delay, jitter and a bandwidth cap to each direction. For
each accepted connection it connects to the target and forwards bytes both ways ("up": client ->
target, "down": back). Each chunk read (at most ``chunk_bytes``) is released to the other side at

    sent    = max(read time, end of the previous chunk's sending) + chunk bits / rate
    release = max(previous release, sent + delay + jitter)

so the cap serialises, the delay comes on top and the jitter (uniform in +-jitter, or normal with
sigma jitter/2 clipped to +-jitter; a ``random.Random`` seeded by the settings, the connection's
number and the direction) never reorders: the stream stays FIFO.

Not emulated: loss, reordering, duplication. The delay is per chunk of the application stream,
not per packet: TCP's handshake, ACKs and window run on the two real (fast) legs, so a long path's
slow start is not reproduced, and the client's connect succeeds before the target is reached. The
cap is on application throughput (payload bytes), not on bits on the wire; the queue of a
direction (``max_queued_bytes``) acts as the bottleneck's buffer: at a low rate, lower it.

Bounded, and it stops by itself: ``max_connections`` at a time (one more is closed at once), at
most ``max_queued_bytes`` (+ a chunk) held per direction (then it stops reading: backpressure
reaches the sender through TCP), a connection idle either way for ``idle_timeout_s`` is closed,
after ``lifetime_s`` it closes everything and exits. An end of stream (half-close) or a reset
reaches the other side after the delayed data; a target that refuses closes the client.

    python -m lab.wan_relay --listen 10.0.0.1:9000 --to 10.0.0.2:9092 \\
        --delay-ms 25 --jitter-ms 2 --rate-mbit 100 --lifetime 3600 [--seed 0]
    with start_relay(RelaySettings(target_port=9092, up=Link(25), down=Link(25))) as relay: ...relay.port
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace

from lab.relay_settings import JITTERS, LINK_FLAGS, Link, RelaySettings, Schedule  # noqa: F401 - Schedule re-exported

OnBound = Callable[[int, Callable[[], None]], None]  # (the bound port, a thread-safe stop)


class _Pipe:
    """One direction of one connection: ``fill`` reads and queues chunks with their release time,
    ``drain`` writes each at its time. ``run`` says how the direction ended: "eof" or "reset"."""

    def __init__(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, schedule: Schedule, s: RelaySettings):
        self.src, self.dst, self.schedule = src, dst, schedule
        self.limit, self.chunk = s.max_queued_bytes, s.chunk_bytes
        self.queue: deque[tuple[float, bytes | None]] = deque()  # b"": end of stream; None: reset
        self.queued = 0  # bytes in the queue or being written
        self.ready, self.room = asyncio.Event(), asyncio.Event()
        self.last = asyncio.get_running_loop().time()  # the last byte read or written

    async def run(self) -> str:
        fill = asyncio.create_task(self.fill())
        try:
            return await self.drain()
        finally:
            fill.cancel()
            await asyncio.gather(fill, return_exceptions=True)

    async def fill(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while self.queued >= self.limit:  # backpressure: TCP's window fills at the sender
                self.room.clear()
                await self.room.wait()
            try:
                data = await self.src.read(self.chunk)
            except OSError:  # reset: what is queued is still delivered, then the other side closes
                data = None
            self.last = loop.time()
            size = len(data or b"")
            self.queue.append((self.schedule.release(self.last, size), data))
            self.queued += size
            self.ready.set()
            if not data:
                return

    async def drain(self) -> str:
        loop = asyncio.get_running_loop()
        while True:
            while not self.queue:
                self.ready.clear()
                await self.ready.wait()
            release, data = self.queue.popleft()
            while (wait := release - loop.time()) > 0:  # never early: the tests' lower bounds rely on it
                await asyncio.sleep(wait)
            if data is None:
                return "reset"
            try:
                if not data:
                    if self.dst.can_write_eof():
                        self.dst.write_eof()  # half-close: the other direction goes on
                    return "eof"
                self.dst.write(data)
                await self.dst.drain()
            except OSError:
                return "reset"
            self.queued -= len(data)
            self.room.set()
            self.last = loop.time()


def _close(writer: asyncio.StreamWriter | None, graceful: bool) -> None:
    """Close ``writer``'s transport: after its buffer is written (graceful) or at once (abort)."""
    if writer is not None:
        writer.close() if graceful else writer.transport.abort()


class _Relay:
    """The connections of one relay: each accepted one is served by ``handle`` (a task of ours)."""

    def __init__(self, settings: RelaySettings):
        self.s = settings
        self.tasks: set[asyncio.Task] = set()
        self.count = 0  # connections accepted so far: seeds each one's jitter
        self.closing = False

    async def handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if self.closing or len(self.tasks) >= self.s.max_connections:
            _close(client_w, graceful=False)  # over the limit (or stopping): closed at once
            return
        self.tasks.add(task)
        number = self.count = self.count + 1
        target_w, graceful = None, False
        try:
            async with asyncio.timeout(self.s.connect_timeout_s):  # not wait_for: 3.11's may lose a cancel
                target_r, target_w = await asyncio.open_connection(
                    self.s.target_host, self.s.target_port, limit=self.s.chunk_bytes
                )
            graceful = not self.closing and await self._forward(client_r, client_w, target_r, target_w, number)
        except (OSError, TimeoutError):  # the target refused or did not answer: close the client
            graceful = True
        except asyncio.CancelledError:  # close_all: asyncio's streams (3.11) log a cancelled callback
            if not self.closing:
                raise
        finally:
            self.tasks.discard(task)
            _close(client_w, graceful and not self.closing)
            _close(target_w, graceful and not self.closing)

    async def _forward(self, client_r, client_w, target_r, target_w, number: int) -> bool:
        """Forward both ways until both ends have ended, one reset, or the connection idles; True
        when the ends may be closed gracefully (not idle)."""
        seed = f"{self.s.seed}:{number}"
        up = _Pipe(client_r, target_w, Schedule(self.s.up, random.Random(f"{seed}:up")), self.s)
        down = _Pipe(target_r, client_w, Schedule(self.s.down, random.Random(f"{seed}:down")), self.s)
        pending = {asyncio.create_task(up.run()), asyncio.create_task(down.run())}
        loop = asyncio.get_running_loop()
        try:
            while pending:
                idle_until = max(up.last, down.last) + self.s.idle_timeout_s
                done, pending = await asyncio.wait(
                    pending, timeout=max(0.0, idle_until - loop.time()), return_when=asyncio.FIRST_COMPLETED
                )
                if any(t.result() == "reset" for t in done):
                    return True
                if not done and loop.time() >= max(up.last, down.last) + self.s.idle_timeout_s:
                    return False
            return True
        finally:
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def close_all(self) -> None:
        self.closing = True
        for t in (tasks := list(self.tasks)):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0)  # the aborted transports' connection_lost callbacks run


async def serve(settings: RelaySettings, stop: asyncio.Event | None = None, on_bound: OnBound | None = None) -> None:
    """Relay until ``stop`` is set or the lifetime ends, then close every connection and return.
    ``on_bound(port, stop_now)`` is called once listening: the bound port and a thread-safe stop."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    relay = _Relay(settings)
    s = settings
    server = await asyncio.start_server(relay.handle, s.listen_host, s.listen_port, limit=s.chunk_bytes)
    try:
        if on_bound is not None:
            on_bound(server.sockets[0].getsockname()[1], lambda: loop.call_soon_threadsafe(stop.set))
        async with asyncio.timeout(settings.lifetime_s):
            await stop.wait()
    except TimeoutError:
        pass
    finally:
        server.close()  # new connections are refused from here
        await relay.close_all()
        await server.wait_closed()


class RelayHandle:
    """A relay running in a background thread (its own event loop): ``port``, ``stop()``, ``wait()``
    (``wait(0)``: whether it has ended); a context manager that stops it on exit."""

    def __init__(self, settings: RelaySettings):
        self.settings = settings
        self.port = 0
        self.error: BaseException | None = None
        self._stop_now: Callable[[], None] | None = None
        self._bound = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wan-relay", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(serve(self.settings, on_bound=self._on_bound))
        except BaseException as e:  # kept for the caller of start_relay
            self.error = e
        finally:
            self._bound.set()

    def _on_bound(self, port: int, stop_now: Callable[[], None]) -> None:
        self.port, self._stop_now = port, stop_now
        self._bound.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the relay to end (its lifetime, or stop()); True when it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        if self._stop_now is not None and self._thread.is_alive():
            with suppress(RuntimeError):  # the loop closed meanwhile: it has stopped by itself
                self._stop_now()
        self.wait(timeout)

    def __enter__(self) -> RelayHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_relay(settings: RelaySettings, timeout: float = 10.0) -> RelayHandle:
    """Start a relay in a background thread; return once it listens (``.port``), or raise why not."""
    handle = RelayHandle(settings)
    handle._thread.start()
    if not handle._bound.wait(timeout):
        handle.stop()
        raise TimeoutError(f"the WAN relay did not start listening in {timeout} s")
    if handle.error is not None:
        raise RuntimeError(f"the WAN relay could not start: {handle.error}") from handle.error
    return handle


def describe(s: RelaySettings, port: int | None = None) -> str:
    """One line: what the relay does."""

    def link(x: Link) -> str:
        rate = f"{x.rate_mbit:g} Mbit/s" if x.rate_mbit > 0 else "unlimited rate"
        return f"{x.delay_ms:g} ms one-way +- {x.jitter_ms:g} ms {x.jitter} jitter, {rate}"

    down = "the same" if s.down == s.up else link(s.down)
    return (
        f"wan_relay: {s.listen_host}:{s.listen_port if port is None else port} -> {s.target_host}:{s.target_port};"
        f" up {link(s.up)}; down {down}; at most {s.max_connections} connections, idle timeout"
        f" {s.idle_timeout_s:g} s; stops after {s.lifetime_s:g} s (seed {s.seed})"
    )


def _address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT (a port 0-65535)")
    return host, int(port)


def number(value: str) -> float:
    x = float(value)  # a ValueError: argparse says "invalid number value: '...'"
    if not 0 <= x < float("inf"):  # > 0 where it must be: RelaySettings says so, naming the field
        raise argparse.ArgumentTypeError(f"{value!r} is not a finite number >= 0")
    return x


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab.wan_relay", description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", type=_address, required=True, metavar="HOST:PORT", help="where to listen")
    p.add_argument("--to", type=_address, required=True, metavar="HOST:PORT", help="the target")
    for flag, what in LINK_FLAGS.items():
        p.add_argument(f"--{flag}", type=number, default=0.0, help=f"{what}, each direction")
        p.add_argument(f"--down-{flag}", type=number, help=f"{what}, target -> client if not the same")
    p.add_argument("--jitter", choices=JITTERS, default="uniform", help="the jitter's distribution")
    p.add_argument("--lifetime", dest="lifetime_s", type=number, default=3600.0, metavar="S", help="seconds, then exit")
    p.add_argument("--idle-timeout", dest="idle_timeout_s", type=number, default=600.0, metavar="S", help="seconds")
    p.add_argument("--max-connections", type=int, default=64, help="at a time; one more is closed at once")
    p.add_argument("--max-queued-bytes", type=int, default=4 << 20, help="per direction of a connection")
    p.add_argument("--seed", type=int, default=0, help="seeds the jitter")
    return p


def _settings(a: argparse.Namespace) -> RelaySettings:
    up = Link(a.delay_ms, a.jitter_ms, a.rate_mbit, a.jitter)
    own = {k: getattr(a, f"down_{k}") for k in ("delay_ms", "jitter_ms", "rate_mbit")}
    down = replace(up, **{k: v for k, v in own.items() if v is not None})
    ends = dict(target_host=a.to[0], target_port=a.to[1], listen_host=a.listen[0], listen_port=a.listen[1])
    rest = {k: getattr(a, k) for k in ("lifetime_s", "idle_timeout_s", "max_connections", "max_queued_bytes", "seed")}
    return RelaySettings(**ends, up=up, down=down, **rest)


async def _serve_until_signal(settings: RelaySettings) -> None:
    stop, loop = asyncio.Event(), asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(settings, stop, on_bound=lambda port, _: print(describe(settings, port), flush=True))


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        settings = _settings(args)
    except ValueError as e:
        parser.error(str(e))
    try:
        asyncio.run(_serve_until_signal(settings))
    except OSError as e:  # e.g. the address is in use or not on this host
        print(f"wan_relay: cannot listen on {settings.listen_host}:{settings.listen_port}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
