"""A composed job's links per secondary row, counted once per job and kept on disk, so that a
query (linkage_server.queries) never loads the job's whole release (8 concurrent
one-record queries of a composed job held +3 GB, each reading every token of primary.npz).

    links_per_row(folder, party, row_of_token) -> (n,) int64

Counted from ``results/primary.npz``'s tokens of the party, read a block at a time (the archive
is stored uncompressed, linkage.store.zip_members), into ``query-counts/<party>.npy`` (0600,
written atomically); later queries read that file (n integers). One job's first queries wait
for one count, not one each.
"""

from __future__ import annotations

import threading
import zipfile
from pathlib import Path

import numpy as np

from files.atomic import write_atomic
from linkage.store import npy_blocks
from linkage_server.uploads import to_npy

BLOCK = 1 << 20  # tokens read at a time (8 MB)
_lock = threading.Lock()


def _tokens_in_blocks(npz: Path, party: str):
    """The party's released tokens (m, K) of primary.npz, flat, BLOCK at a time."""
    with zipfile.ZipFile(npz) as zf, zf.open(f"tokens__{party}.npy") as f:
        yield from npy_blocks(f, BLOCK)


def links_per_row(folder: Path, party: str, row_of_token: np.ndarray) -> np.ndarray:
    """(n,) the links of the job's release to each of the party's n rows (module docstring)."""
    path = folder / "query-counts" / f"{party}.npy"
    with _lock:
        if not path.exists():
            row_of_token = np.asarray(row_of_token, np.int64)
            counts = np.zeros(len(row_of_token), np.int64)
            for tokens in _tokens_in_blocks(folder / "results" / "primary.npz", party):
                counts += np.bincount(row_of_token[tokens], minlength=len(row_of_token))
            write_atomic(path, to_npy(counts))
    return np.load(path, allow_pickle=False)
