"""Rate limiting of failed authentication: per client address and per party.

A client address, or a party (or the admin), with ``max_failures`` failed authentications inside
``window_s`` seconds answers further failures 429 (Retry-After), each still counting. The limits
are checked only after a failure (linkage_server.service.Gate), so a request holding a right
secret is always accepted: nobody can lock a party out, neither from a clean address nor from
an address it shares with the attacker (loopback, a NAT, a proxy: an attack review found one wrong
secret per 6 s from the same address refusing a third of the right party's requests). So the
limits do not slow guessing: the 256-bit party secrets are what make guessing hopeless; the
limits make an attack visible (429s) and tell a misconfigured client to stop. The address is the
TCP peer's (the service does not trust X-Forwarded-For). State is in memory: a restart forgets it.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Callable, Iterable

MAX_KEYS = 10_000  # failure counters kept before expired ones are swept


class RateLimited(Exception):
    """Too many failed authentications; retry_after: whole seconds until the next attempt counts."""

    def __init__(self, retry_after: int, what: str) -> None:
        super().__init__(f"too many failed authentications for {what}: retry after {retry_after} s")
        self.retry_after = retry_after


class AuthLimiter:
    """Thread-safe failure counters over a sliding window; keys are strings."""

    def __init__(
        self, max_failures: int = 10, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_failures < 1 or window_s <= 0:
            raise ValueError(f"need max_failures >= 1 and window_s > 0; got {max_failures}, {window_s}")
        self.max_failures, self.window_s, self._clock = max_failures, window_s, clock
        self._failures: dict[str, deque[float]] = {}
        self._swept = float("-inf")
        self._lock = threading.Lock()

    def _recent(self, key: str, now: float) -> deque[float]:
        times = self._failures.get(key)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[key]
        return times

    def _wait(self, key: str, now: float) -> int | None:
        """Seconds until `key` is under the limit again, or None when it is under it now."""
        times = self._recent(key, now)
        if len(times) < self.max_failures:
            return None
        return max(1, math.ceil(times[-self.max_failures] + self.window_s - now))

    def check(self, address: str, parties: Iterable[str]) -> None:
        """Raise :class:`RateLimited` if this address, or one of these parties, is over the limit."""
        with self._lock:
            now = self._clock()
            wait = self._wait(f"address:{address}", now)
            if wait is not None:
                raise RateLimited(wait, f"client address {address}")
            for party in parties:
                wait = self._wait(f"party:{party}", now)
                if wait is not None:
                    raise RateLimited(wait, "this party (its right secret is still accepted)")

    def failed(self, address: str, parties: Iterable[str]) -> None:
        with self._lock:
            now = self._clock()
            if len(self._failures) > MAX_KEYS and now - self._swept > 1.0:  # forget expired, at most 1/s
                self._swept = now
                for key in list(self._failures):
                    self._recent(key, now)
            for key in (f"address:{address}", *(f"party:{p}" for p in parties)):
                self._recent(key, now)
                self._failures.setdefault(key, deque()).append(now)
