"""End-to-end cost of a job through the linkage service over loopback HTTP, per phase.

    python -m bench.linkage_service [--case house|game] [--scale 1.0]

Starts `python -m linkage_server serve` on 127.0.0.1, creates a job, uploads both parties,
runs it, fetches both results, restarts the service and fetches again; stops what it started.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from app.run_record import machine
from bench.linkage import inputs
from experiments.runner import git_rev
from linkage_server.client import LinkageClient, create_job
from linkage_server.local import free_port, local_service

ADMIN = "bench-admin-token-0123456789"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="house", choices=["house", "game", "hamming"])
    ap.add_argument("--scale", type=float, default=1.0)
    args = ap.parse_args()
    metric = {"house": "euclidean", "game": "edit", "hamming": "hamming"}[args.case]
    query, base = inputs(args.case, args.scale)
    query, base = np.asarray(query), np.asarray(base)
    port = free_port()
    print(f"# bench.linkage_service  {machine()}  git {git_rev()}  {args.case} {len(query):,} x {len(base):,} K=100")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t = {}
        with local_service(tmp / "svc", port, ADMIN) as url:
            made = create_job(url, ADMIN, "p", ["s"])
            p = LinkageClient(url, made["job"], "p", made["secrets"]["p"])
            s = LinkageClient(url, made["job"], "s", made["secrets"]["s"])
            t0 = time.perf_counter()
            p.upload(query)
            s.upload(base)
            t["upload both"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            p.start(metric, 100)
            st = p.wait(timeout=3600, poll=0.1)
            t["job (start -> done)"] = time.perf_counter() - t0
            t["  of which search (service)"] = st["seconds"]["search"]
            t["  of which noise + tokens (service)"] = st["seconds"]["release"]
            t0 = time.perf_counter()
            p.fetch(tmp / "out")
            s.fetch(tmp / "out")
            t["fetch both"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with local_service(tmp / "svc", port, ADMIN) as url:
            t["restart"] = time.perf_counter() - t0
            LinkageClient(url, made["job"], "p", made["secrets"]["p"]).fetch(tmp / "again")
        same = (tmp / "again" / "primary.npz").read_bytes() == (tmp / "out" / "primary.npz").read_bytes()
        size = (tmp / "out" / "primary.npz").stat().st_size / 2**20
    for k, v in t.items():
        print(f"| {k} | {v:.2f} s |")
    print(f"primary result {size:.0f} MiB; identical after restart: {same}")


if __name__ == "__main__":
    main()
