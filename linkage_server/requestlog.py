"""The linkage service's own log, for its operator: where `serve` listens (printed at start,
with its data folder and where the admin token is, never the token) and one line per event on
stderr, with the time: a job created, an upload, a start, a cancel, a result fetched, a query
answered, a job finished, and every refusal (status code and reason).

A line never holds a secret, a token or an identifier value: it names jobs, parties, row
counts, kinds, states and the service's own refusal messages (which quote no identifier).
Off until :func:`enable` (`serve` turns it on; tests and benchmarks of the app stay quiet).
"""

from __future__ import annotations

import sys
import time

_enabled = False


def enable() -> None:
    global _enabled
    _enabled = True


def event(text: str) -> None:
    if _enabled:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}", file=sys.stderr, flush=True)


def refused(method: str, path: str, status: int, reason: str) -> None:
    event(f"refused {status} {method} {path}: {reason[:300]}")


def banner(url: str, data_dir, token_file, created: bool) -> None:
    """What `serve` prints once it is listening."""
    how = "created now" if created else "existing"
    print(
        f"linkage service listening on {url}\n  data dir: {data_dir}\n  admin token: in {token_file} ({how}; "
        f"give it to the admin only)\n  log: one line per request on stderr (no secret, token or identifier)",
        flush=True,
    )
