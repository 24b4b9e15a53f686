"""What a client can hold of the service before it has authenticated: its connections and their time.

uvicorn never closes a connection whose request headers stay incomplete, so anyone who can
reach the port could hold every file descriptor the service has (3,000 half-sent requests were
all still open after 75 s; two clients of 10,100 connections took it to 20,000 of 20,000 file
descriptors, and /health stopped answering). :func:`guarded_h11` is uvicorn's h11 protocol with:

- a header deadline: a connection that has not sent a whole request head within
  ``header_timeout`` seconds of connecting, or of the first byte of its next request on a kept-alive
  connection, is closed (uvicorn's keep-alive timeout already closes an idle connection);
- at most ``per_address`` connections open from one client address, and ``total`` from all; one
  more is closed at once, before any byte is read.

A request whose head has arrived is the application's (its routes authenticate before reading
a body, so a body can only be held open by a party with a secret).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float = 10.0  # seconds to send a request's head
    per_address: int = 64  # connections open at once from one client address
    total: int = 4096  # connections open at once from every address together

    def __post_init__(self) -> None:
        if not (self.header_timeout > 0 and self.per_address >= 1 and self.total >= self.per_address):
            raise ValueError(f"connection limits must be positive (total >= per_address); got {self}")


def guarded_h11(limits: ConnectionLimits) -> type:
    """uvicorn's h11 protocol class under ``limits`` (module docstring); one class per server,
    whose connections share its counts."""
    from uvicorn.protocols.http.h11_impl import H11Protocol  # lazy: uvicorn, for `serve` only

    held: Counter = Counter()

    class Guarded(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._address, self._deadline = (self.client[0] if self.client else "unknown"), None
            if held[self._address] >= limits.per_address or sum(held.values()) >= limits.total:
                self._address = None  # not counted: refused before any byte is read
                transport.abort()
                return
            held[self._address] += 1
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._address is None:
                return
            if self._waiting() and self._deadline is None:  # the first byte of the next request
                self._arm()
            super().data_received(data)
            if not self._waiting():  # its head has arrived: the application's now
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._disarm()  # idle until the next byte: uvicorn's keep-alive timeout

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._address is not None:
                held[self._address] -= 1
                if not held[self._address]:
                    del held[self._address]
                self._address = None
            super().connection_lost(exc)

        def _waiting(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(limits.header_timeout, self._too_slow)

        def _disarm(self) -> None:
            if getattr(self, "_deadline", None) is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            self._deadline = None
            if self._waiting() and not self.transport.is_closing():
                self.transport.abort()

    return Guarded
