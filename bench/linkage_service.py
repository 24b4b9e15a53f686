"""End-to-end cost of a job through the linkage service over loopback HTTP, per phase.

    python -m bench.linkage_service [--case house|game|hamming] [--scale 1.0]
    python -m bench.linkage_service --case euclid --m 10000000 --n 1000000 --k 50 --tau 0.9 --radius 0.001

Starts `python -m linkage_server serve` on 127.0.0.1, creates a job, uploads both parties,
runs it, fetches both results, restarts the service and fetches the primary's again (compared by
SHA-256, the first copy removed first: a 10M-record result is 6 GB); stops what it started.
With --m / --n the case is one of bench.linkage_scale's (shipped data resampled with jitter,
seeded): what a user's job at scale costs through the service's own HTTP, upload and download
included. It reports the service process's peak resident memory (VmHWM) and the peak summed PSS
of this process and everything under it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from app.run_record import machine
from bench.linkage import inputs as paper_shape
from bench.linkage_scale import CASES
from bench.memory import TreePeak, process_tree
from experiments.runner import git_rev
from linkage_server.client import LinkageClient, create_job
from linkage_server.local import free_port, local_service
from linkage_server.params import JobParams

ADMIN = "bench-admin-token-0123456789"
METRICS = {"house": "euclidean", "game": "edit", "hamming": "hamming", "euclid": "euclidean"}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.linkage_service",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--case", default="house", choices=list(METRICS))
    ap.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="house / game / hamming: the paper's shapes, scaled (not with --m / --n)",
    )
    ap.add_argument("--m", type=int, default=0, help="euclid / hamming at scale: primary records")
    ap.add_argument("--n", type=int, default=0, help="euclid / hamming at scale: secondary records")
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument(
        "--tau", type=float, default=None, help="default: none asked (the secondary's privacy floor sets the noise)"
    )
    ap.add_argument("--radius", type=float, default=0.0, help="default: none asked (the floor's)")
    args = ap.parse_args(argv)
    if min(args.m, args.n) < 0:
        ap.error(f"--m and --n count records: got {args.m} and {args.n}")
    at_scale = bool(args.m or args.n)
    if (at_scale and (args.case not in ("euclid", "hamming") or not (args.m and args.n))) or (
        args.case == "euclid" and not at_scale
    ):
        ap.error("--case euclid needs --m and --n; --m and --n go together, with euclid or hamming")
    if at_scale and args.scale != 1.0:
        ap.error("--scale sizes the paper's shapes; at scale, --m and --n do")
    return args


def inputs(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    if args.m:
        return CASES[args.case][0](args.m, args.n)
    query, base = paper_shape(args.case, args.scale)
    return np.asarray(query), np.asarray(base)


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def service_hwm_gb() -> float:
    """The running service's peak resident memory (VmHWM), from /proc: the child of this
    process started as `python -m linkage_server serve`."""
    for pid in process_tree(os.getpid()):
        try:
            if b"linkage_server\x00serve" in Path(f"/proc/{pid}/cmdline").read_bytes():
                status = Path(f"/proc/{pid}/status").read_text()
                return int(status.split("VmHWM:")[1].split()[0]) / 1e6  # kB
        except (OSError, IndexError):
            continue
    return 0.0


def first_run(url: str, args: argparse.Namespace, query, base, out: Path) -> tuple[dict, dict, float]:
    """Upload, link, fetch: (seconds per phase, the job's status, the service's peak GB)."""
    t, made = {}, create_job(url, ADMIN, "p", ["s"])
    p = LinkageClient(url, made["job"], "p", made["secrets"]["p"])
    s = LinkageClient(url, made["job"], "s", made["secrets"]["s"])
    t0 = time.perf_counter()
    p.upload(query)
    s.upload(base)
    t["upload both"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    p.start(JobParams(METRICS[args.case], args.k, tau=args.tau or 0.0, radius=args.radius))
    st = p.wait(timeout=3600, poll=0.1)
    t["job (start -> done)"] = time.perf_counter() - t0
    t["  of which search (service)"] = st["seconds"]["search"]
    t["  of which noise + tokens (service)"] = st["seconds"]["release"]
    t["  of which privacy report (service)"] = st["seconds"]["privacy"]
    t0 = time.perf_counter()
    p.fetch(out)
    s.fetch(out)
    t["fetch both"] = time.perf_counter() - t0
    return t, made, service_hwm_gb()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    query, base = inputs(args)
    port = free_port()
    print(
        f"# bench.linkage_service  {machine()}  git {git_rev()}  {time.strftime('%Y-%m-%d %H:%M')}  "
        f"{args.case} {len(query):,} x {len(base):,} K={args.k} tau={args.tau}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmp, tree = Path(tmp), TreePeak()
        with local_service(tmp / "svc", port, ADMIN) as url:
            t, made, hwm = first_run(url, args, query, base, tmp / "out")
        first = tmp / "out" / "primary.npz"
        size, digest = first.stat().st_size / 2**20, sha256(first)
        first.unlink()  # room on disk for the second copy
        t0 = time.perf_counter()
        with local_service(tmp / "svc", port, ADMIN) as url:
            t["restart"] = time.perf_counter() - t0
            LinkageClient(url, made["job"], "p", made["secrets"]["p"]).fetch(tmp / "again")
        same = sha256(tmp / "again" / "primary.npz") == digest
        peak = tree.stop()
    for k, v in t.items():
        print(f"| {k} | {v:.2f} s |")
    print(
        f"primary result {size:.0f} MiB; identical after restart: {same}; service peak (VmHWM) {hwm:.2f} GB; "
        f"peak summed PSS of the bench and the service {peak:.2f} GB"
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
