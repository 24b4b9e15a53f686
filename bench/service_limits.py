"""What one party can make the shared linkage service hold, per case.

    python -m bench.service_limits [--case uploads|queries|queue|bigk|all] [--upload-mib 400]

Starts `python -m linkage_server serve` on 127.0.0.1 and samples the service process's resident
memory (VmRSS, every 50 ms) while the case runs; reports the peak above the level before it:
  uploads  three parties upload --upload-mib MiB each at once (float64 coordinates); also the
           worst /health latency meanwhile
  queries  a composed job (--qm primary records x K=50), then 8 concurrent one-record queries
  queue    a large job (--big-m records x K=50), then a 10 x 10 job: when the small job ends,
           and whether the large one was still running then
  bigk     a --bk-m x --bk-n job with K = --bk-k (chunk memory at large K)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

from app.run_record import machine
from bench.memory import process_tree
from experiments.runner import git_rev
from linkage_server.client import LinkageClient, create_job
from linkage_server.local import free_port, local_service
from linkage_server.params import JobParams

ADMIN = "bench-admin-token-0123456789"


def service_pid() -> int:
    for pid in process_tree(os.getpid()):
        try:
            if b"linkage_server\x00serve" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    raise RuntimeError("no service process")


class RssPeak:
    """The peak VmRSS (GB) of one process, sampled in a thread, above its level at the start."""

    def __init__(self, pid: int, every: float = 0.05) -> None:
        self.pid, self.every, self._stop = pid, every, threading.Event()
        self.base = self.peak = self._rss()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _rss(self) -> float:
        status = Path(f"/proc/{self.pid}/status").read_text()
        return int(status.split("VmRSS:")[1].split()[0]) / 1e6

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, self._rss())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak - self.base


def _job(url: str, secondaries=("s",)) -> tuple[str, dict]:
    made = create_job(url, ADMIN, "p", list(secondaries))
    return made["job"], {p: LinkageClient(url, made["job"], p, s, timeout=3600) for p, s in made["secrets"].items()}


def case_uploads(url: str, args) -> str:
    job, c = _job(url, ("s", "t"))
    rows = int(args.upload_mib * 2**20 / 16)
    arrays = {p: np.random.default_rng(i).uniform(0, 10, (rows, 2)) for i, p in enumerate(c)}
    worst, done = 0.0, threading.Event()
    peak = RssPeak(service_pid())

    def health() -> None:
        nonlocal worst
        with httpx.Client(base_url=url, timeout=60) as h:
            while not done.is_set():
                t0 = time.perf_counter()
                h.get("/health")
                worst = max(worst, time.perf_counter() - t0)
                time.sleep(0.05)

    watcher = threading.Thread(target=health, daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda p: c[p].upload(arrays[p]), c))
    seconds = time.perf_counter() - t0
    done.set()
    watcher.join()
    return (
        f"uploads: 3 x {args.upload_mib} MiB at once in {seconds:.1f} s: service peak +{peak.stop():.2f} GB "
        f"above its level before, worst /health {worst:.2f} s"
    )


def case_queries(url: str, args) -> str:
    job, c = _job(url)
    rng = np.random.default_rng(0)
    c["p"].upload(rng.uniform(0, 10, (args.qm, 2)))
    c["s"].upload(rng.uniform(0, 10, (20_000, 2)))
    c["p"].start(JobParams("euclidean", 50, tau=0.9, radius=0.001, compose=True))
    c["p"].wait(timeout=3600)
    one = rng.uniform(0, 10, (1, 2))
    c["p"].query(one)  # the first query (it may compute what later ones reuse)
    peak = RssPeak(service_pid())
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda _: LinkageClient(url, job, "p", c["p"]._http.headers["authorization"][7:]).query(one), range(8)
            )
        )
    return (
        f"queries: composed job {args.qm:,} x 20,000 K=50; 8 concurrent one-record queries in "
        f"{time.perf_counter() - t0:.2f} s: service peak +{peak.stop():.2f} GB"
    )


def case_queue(url: str, args) -> str:
    rng = np.random.default_rng(1)
    big, cb = _job(url)
    cb["p"].upload(rng.uniform(0, 10, (args.big_m, 2)))
    cb["s"].upload(rng.uniform(0, 10, (200_000, 2)))
    small, cs = _job(url)
    cs["p"].upload(rng.uniform(0, 10, (10, 2)))
    cs["s"].upload(rng.uniform(0, 10, (10, 2)))
    t0 = time.perf_counter()
    cb["p"].start(JobParams("euclidean", 50))
    while cb["p"].status()["state"] != "running":
        time.sleep(0.05)
    cs["p"].start(JobParams("euclidean", 10))
    cs["p"].wait(timeout=3600, poll=0.05)
    small_s, big_state = time.perf_counter() - t0, cb["p"].status()["state"]
    cb["p"].wait(timeout=3600, poll=0.2)
    return (
        f"queue: a {args.big_m:,} x 200,000 K=50 job started first ({time.perf_counter() - t0:.1f} s); "
        f"the 10 x 10 job done after {small_s:.1f} s, the large one then {big_state}"
    )


def case_bigk(url: str, args) -> str:
    job, c = _job(url)
    rng = np.random.default_rng(2)
    c["p"].upload(rng.uniform(0, 10, (args.bk_m, 2)))
    c["s"].upload(rng.uniform(0, 10, (args.bk_n, 2)))
    peak = RssPeak(service_pid())
    t0 = time.perf_counter()
    c["p"].start(JobParams("euclidean", args.bk_k))
    c["p"].wait(timeout=3600, poll=0.2)
    return (
        f"bigk: {args.bk_m:,} x {args.bk_n:,} K={args.bk_k} in {time.perf_counter() - t0:.1f} s: "
        f"service peak +{peak.stop():.2f} GB"
    )


CASES = {"uploads": case_uploads, "queries": case_queries, "queue": case_queue, "bigk": case_bigk}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.service_limits", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--case", default="all", choices=[*CASES, "all"])
    ap.add_argument("--upload-mib", type=int, default=400)
    ap.add_argument("--qm", type=int, default=1_000_000, help="queries: the composed job's primary records")
    ap.add_argument("--big-m", type=int, default=2_000_000, help="queue: the large job's primary records")
    ap.add_argument("--bk-m", type=int, default=20_000)
    ap.add_argument("--bk-n", type=int, default=5_000)
    ap.add_argument("--bk-k", type=int, default=1000)
    ap.add_argument("--serve", default="", help="extra `serve` options, space-separated")
    args = ap.parse_args(argv)
    print(f"# bench.service_limits  {machine()}  git {git_rev()}  {time.strftime('%Y-%m-%d %H:%M')}")
    for name in CASES if args.case == "all" else [args.case]:
        with tempfile.TemporaryDirectory() as tmp:
            extra = ["--max-upload-mb", "4096", *args.serve.split()]
            with local_service(Path(tmp) / "svc", free_port(), ADMIN, *extra) as url:
                print(CASES[name](url, args), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
