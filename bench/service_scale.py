"""The linkage service's whole job at scale: upload, chunked search, the release written
chunk by chunk, the privacy report; wall time per stage, peak memory, disk.

    python -m bench.service_scale --case euclid --m 10000000 --n 1000000 --k 50
    python -m bench.service_scale --case hamming --m 1000000 --n 1000000 --k 50 --search ivf --width 4

It drives linkage_server.jobs.JobStore directly (the service's own code, without HTTP) on a data
folder under --dir (default: a temporary folder, removed afterwards). The cases are
bench.linkage_scale's (shipped data resampled with jitter, seeded). The job's secret is the
service's own (drawn per job). Peak memory is this process's ru_maxrss: the inputs (generated and
uploaded first, and reported separately) included. With Ray the workers are other processes: the
job's peak summed PSS over this process and every process under it is reported too (sampled).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path

from app.run_record import machine
from bench.linkage_scale import CASES
from bench.memory import TreePeak
from experiments.runner import git_rev
from linkage_server.jobs import JobParams, JobStore
from linkage_server.uploads import to_npy


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux


def _size_gb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e9


def run(args: argparse.Namespace, root: Path) -> dict:
    t0 = time.perf_counter()
    make, metric = CASES[args.case]
    query, base = make(args.m, args.n)
    store = JobStore(root, chunk_rows=args.chunk_rows, ray=args.ray)
    job, _ = store.create("primary", ["secondary"])
    store.upload(job, "primary", to_npy(query))
    store.upload(job, "secondary", to_npy(base))
    del query, base
    inputs_s, inputs_gb = time.perf_counter() - t0, _peak_gb()
    params = JobParams(
        metric=metric,
        k=args.k,
        tau=args.tau,
        radius=args.radius,
        search=args.search,
        recall_floor=args.recall_floor,
        width=args.width,
    )
    store.start(job, params)
    t1, tree = time.perf_counter(), TreePeak()
    store.run(job)
    tree_gb = tree.stop()
    meta = store.meta(job)
    folder = root / "jobs" / job
    return {
        "state": meta["state"],
        "error": meta["error"],
        "inputs_s": inputs_s,
        "inputs_peak_gb": inputs_gb,
        "job_s": time.perf_counter() - t1,
        "seconds": meta["seconds"],
        "peak_gb": _peak_gb(),
        "tree_peak_pss_gb": tree_gb,
        "primary_npz_gb": (folder / "results" / "primary.npz").stat().st_size / 1e9 if meta["state"] == "done" else 0,
        "work_gb": _size_gb(folder / "work"),
        "recall": _recalls(folder / "results" / "primary.npz"),
        "strongest": {p: e.get("strongest") for p, e in (meta.get("privacy") or {}).get("parties", {}).items()},
    }


def _recalls(path: Path) -> dict:
    """Each party's search recall, from primary.npz's meta (its rows are not read)."""
    import json

    import numpy as np

    if not path.exists():
        return {}
    with np.load(path) as z:
        return {p: s["recall"] for p, s in json.loads(str(z["meta"]))["stats"].items()}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.service_scale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--case", choices=["euclid", "hamming"], required=True)
    ap.add_argument("--m", type=int, required=True, help="primary records")
    ap.add_argument("--n", type=int, required=True, help="secondary records")
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--tau", type=float, default=1.0)
    ap.add_argument("--radius", type=float, default=0.5)
    ap.add_argument("--search", default="exact", choices=["exact", "hnsw", "ivf", "auto"])
    ap.add_argument("--width", type=int, default=0, help="the job's search width (IVF nprobe, HNSW ef_search)")
    ap.add_argument("--recall-floor", type=float, default=0.0)
    ap.add_argument("--chunk-rows", type=int, default=20_000)
    ap.add_argument("--ray", default="", help="'local' or a cluster's address: search the chunks on Ray")
    ap.add_argument("--dir", default="", help="the service's data folder (default: a temporary one, removed)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="service-scale-"))
    try:
        out = run(args, root)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    print(f"# {machine()} git {git_rev()} {time.strftime('%Y-%m-%d %H:%M')}")
    print(
        f"case={args.case} m={args.m} n={args.n} K={args.k} tau={args.tau} search={args.search} "
        f"chunk-rows={args.chunk_rows} ray={args.ray or 'no'}"
    )
    for key, value in out.items():
        print(f"  {key}: {value}")
    return 0 if out["state"] == "done" else 1


if __name__ == "__main__":
    raise SystemExit(main())
