"""Persisting a linkage job as separate files per party: primary.npz, secondary-<party>.npz.

These files are the service's download format too: the primary fetches ``primary.npz``, each
secondary its own ``secondary-<party>.npz``, and training reads them from one folder
(``linkage-dir`` in the run config) or from each party's own copy.
"""

from __future__ import annotations

import io
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np

from files.atomic import atomic_path, write_atomic
from files.private import create_private, private_dir
from linkage.contracts import (
    LinkageError,
    LinkageResult,
    PartyLink,
    PrimaryLinkage,
    SecondaryLinkage,
)


def npz_bytes(**arrays) -> bytes:
    """An uncompressed .npz archive in memory (:func:`zip_members`)."""
    buf = io.BytesIO()
    zip_members(buf, arrays)
    return buf.getvalue()


ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # every member's timestamp: the same content gives the same bytes


def zip_members(target, members: dict) -> None:
    """An uncompressed .npz (what np.savez writes, with a fixed timestamp) into ``target`` (a path
    or a binary file), member by member: each an array, or the Path of a .npy file copied in 1 MiB
    pieces, so a release bigger than memory is written in bounded memory."""
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in members.items():
            with zf.open(zipfile.ZipInfo(f"{name}.npy", ZIP_TIME), "w", force_zip64=True) as out:
                if isinstance(value, Path):
                    with open(value, "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 20)
                else:
                    np.lib.format.write_array(out, np.asanyarray(value), allow_pickle=False)


def link_stats(link: PartyLink) -> dict:
    """A PartyLink's figures as primary.npz's meta records them (everything but its rows)."""
    return {
        "sigma": link.sigma,
        "sim_mean": link.sim_mean,
        "sim_std": link.sim_std,
        "dp_sigma": link.dp_sigma,
        "radius": link.radius,
        "composed": link.composed,
        "recall": link.recall,
    }


def primary_meta(p: PrimaryLinkage) -> str:
    """primary.npz's ``meta`` member: the job, its parameters and every party's figures."""
    return json.dumps(
        {
            "job_id": p.job_id,
            "k": p.k,
            "tau": p.tau,
            "metric": p.metric,
            "layout": p.layout,
            "ids_sha256": p.ids_sha256,
            "parties": sorted(p.links),
            "stats": {q: link_stats(lk) for q, lk in p.links.items()},
        }
    )


def primary_bytes(p: PrimaryLinkage) -> bytes:
    arrays = {}
    for q, lk in p.links.items():
        arrays[f"tokens__{q}"], arrays[f"sims__{q}"] = lk.tokens, lk.sims
    return npz_bytes(meta=primary_meta(p), **arrays)


def secondary_bytes(s: SecondaryLinkage) -> bytes:
    return npz_bytes(row_of_token=s.row_of_token, job_id=s.job_id, party=s.party)


def save_job(result: LinkageResult, folder: Path) -> Path:
    private_dir(folder)
    write_atomic(folder / "primary.npz", primary_bytes(result.primary))
    for party, s in result.secondaries.items():
        write_atomic(folder / f"secondary-{party}.npz", secondary_bytes(s))
    return folder


def write_npz(path: Path, members: dict) -> None:
    """:func:`zip_members` into a temporary file renamed into place: the same bytes as
    :func:`npz_bytes` of the same arrays (linkage_server.release_files)."""
    with atomic_path(path) as tmp:
        zip_members(tmp, members)


class NpyWriter:
    """A .npy file of a known shape written by rows, a chunk at a time: ``with NpyWriter(path,
    (m, K), np.int64) as w: w.write(rows)``; refused unless exactly m rows were written."""

    def __init__(self, path: Path, shape: tuple[int, ...], dtype) -> None:
        self.path, self.shape, self.dtype, self.rows = Path(path), tuple(shape), np.dtype(dtype), 0
        self._f = open(create_private(self.path), "wb")
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": self.shape}
        try:
            np.lib.format.write_array_header_1_0(self._f, header)  # as write_array: the same bytes
        except BaseException:
            self._f.close()
            raise

    def write(self, rows: np.ndarray) -> None:
        if rows.shape[1:] != self.shape[1:] or rows.dtype != self.dtype:
            raise LinkageError(f"{self.path.name}: rows {rows.dtype} {rows.shape} do not fit {self.dtype} {self.shape}")
        self._f.write(np.ascontiguousarray(rows).tobytes())
        self.rows += len(rows)

    def __enter__(self) -> "NpyWriter":
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()
        if exc[0] is None and self.rows != self.shape[0]:
            raise LinkageError(f"{self.path.name}: {self.rows} rows written of {self.shape[0]}")


def npy_header(f) -> tuple[tuple, bool, np.dtype]:
    """(shape, Fortran order, dtype) of the .npy stream ``f`` (either format version), ``f`` left
    at its first value."""
    version = np.lib.format.read_magic(f)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return read_header(f)


def npy_blocks(f, block: int):
    """The values of the .npy stream ``f`` (a file, or an npz member), flat, ``block`` at a time."""
    shape, _, dtype = npy_header(f)
    left = int(np.prod(shape, dtype=np.int64))
    while left:
        count = min(block, left)
        yield np.frombuffer(f.read(count * dtype.itemsize), dtype=dtype)
        left -= count


def npy_chunks(path: Path, step: int):
    """Yield (lo, rows (c, ..)) of a .npy file, ``step`` rows at a time, read (not memory-mapped)."""
    with open(path, "rb") as f:
        shape, fortran, dtype = npy_header(f)
        if fortran:
            raise LinkageError(f"{path}: a Fortran-ordered array cannot be read by rows")
        per_row = int(np.prod(shape[1:], dtype=np.int64))
        for lo in range(0, shape[0], step):
            c = min(step, shape[0] - lo)
            yield lo, np.fromfile(f, dtype=dtype, count=c * per_row).reshape((c, *shape[1:]))


def read_primary(source, rows: bool = True) -> PrimaryLinkage:
    """The primary's linkage; rows=False: its figures only, every party's (m, K) arrays left on
    disk (empty (0, K) arrays in their place: a query of new records needs no more)."""
    with np.load(source, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        empty = np.empty((0, meta["k"]))
        links = {
            q: PartyLink(
                z[f"tokens__{q}"] if rows else empty.astype(np.int64),
                z[f"sims__{q}"] if rows else empty.astype(np.float32),
                **meta["stats"][q],
            )
            for q in meta["parties"]
        }
    return PrimaryLinkage(
        meta["job_id"],
        meta["k"],
        meta["tau"],
        links,
        meta.get("metric", "euclidean"),
        meta.get("layout", "independent"),
        meta.get("ids_sha256", ""),
    )


def read_secondary(source, party: str) -> SecondaryLinkage:
    with np.load(source, allow_pickle=False) as z:
        if "party" in z and str(z["party"]) != party:
            raise LinkageError(f"this linkage file is for party {str(z['party'])!r}, not {party!r}")
        return SecondaryLinkage(str(z["job_id"]), party, z["row_of_token"])


PRIVACY = "privacy.json"  # the job's privacy report (linkage.privacy), beside primary.npz


def save_privacy(report: dict | None, folder: Path) -> None:
    """Write the job's privacy report into its folder; None removes a stale one (a report never
    outlives the job it measured)."""
    path = Path(folder) / PRIVACY
    if report is None:
        path.unlink(missing_ok=True)
        return
    write_atomic(path, json.dumps(report, indent=2).encode())


def load_privacy(folder: Path, job_id: str) -> dict | None:
    """The job's privacy report from its folder, or None when there is none; a report of another
    job is refused by name."""
    path = Path(folder) / PRIVACY
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    if report.get("job_id") != job_id:
        raise LinkageError(
            f"{path} is the privacy report of job {report.get('job_id')!r}, not of this linkage's job {job_id!r}"
        )
    return report


def load_primary(folder: Path, rows: bool = True) -> PrimaryLinkage:
    """``folder``'s primary.npz (:func:`read_primary`; ``rows=False``: its figures only)."""
    path = Path(folder) / "primary.npz"
    if not path.exists():
        raise LinkageError(f"no primary linkage at {path}")
    return read_primary(path, rows)


def load_secondary(folder: Path, party: str) -> SecondaryLinkage:
    path = Path(folder) / f"secondary-{party}.npz"
    if not path.exists():
        raise LinkageError(f"no linkage for party {party!r} at {path}")
    return read_secondary(path, party)
