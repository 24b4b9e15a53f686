"""Linkage beyond the paper's shapes (issue 20): exact vs approximate top-K at scale cases made
from the shipped data (resampled with jitter, seeded), time, peak memory and tie-aware recall.

    python -m bench.linkage_scale --case hamming --m 1000000 --n 1000000       # one case
    python -m bench.linkage_scale --case euclid --m 10000000 --n 1000000 --k 50
    python -m bench.linkage_scale --case hamming --m 100000 --n 100000 --methods exact hnsw ivf

Cases: euclid = Melbourne sale coordinates (primary) against Airbnb coordinates (secondary),
each resampled with 200 m of jitter; hamming = the same points as 1024-bit FEDERAL filters (512
bits per coordinate, the parties' key); strings = Steam titles against How-Long-To-Beat titles
(bench.game_shape), resampled with one random edit each. Each (case, method) runs in a fresh
process (its ru_maxrss is its own peak, inputs included). The exact column is timed on
--exact-rows primary records against the whole base and extrapolated (linear in m) when that is
fewer than m: the table says which. Recall: tie-aware, on 1000 records against their exact top-K.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import resource
import time

import numpy as np

from app.run_record import machine
from bench.linkage import DATA, SECRET
from experiments.runner import git_rev


def _resample(points: np.ndarray, size: int, rng: np.random.Generator, jitter: float) -> np.ndarray:
    return points[rng.integers(len(points), size=size)] + rng.normal(0, jitter, (size, points.shape[1]))


def euclid_case(m: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(m, 2) sale and (n, 2) listing coordinates, degrees, 0.002 degree (~200 m) of jitter."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    sales = pd.read_csv(DATA / "house_melbourne" / "sales.csv.gz", usecols=["Lattitude", "Longtitude"]).dropna()
    bnb = pd.read_csv(DATA / "house_melbourne" / "airbnb_listings.csv.gz", usecols=["latitude", "longitude"]).dropna()
    return _resample(sales.to_numpy(), m, rng, 0.002), _resample(bnb.to_numpy(), n, rng, 0.002)


def hamming_case(m: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The euclid case's points as (m, 128) and (n, 128) uint8: 1024-bit FEDERAL filters."""
    from linkage.encode import federal_numbers

    q, b = euclid_case(m, n, seed)
    both = np.concatenate([q[:100_000], b[:100_000]])
    lo, hi = both.min(0) - 0.01, both.max(0) + 0.01
    kw = dict(bits_per_dim=512, t=0.05 * (hi - lo), lo=lo, hi=hi)
    return federal_numbers(q, SECRET, **kw), federal_numbers(b, SECRET, **kw)


def strings_case(m: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    from bench.game_shape import game_shape, perturb
    from linkage.strings import normalize_strings

    rng = np.random.default_rng(seed)
    query, base = game_shape(seed=0)
    q = [perturb(query[i], rng) for i in rng.integers(len(query), size=m)]
    b = [perturb(base[i], rng) for i in rng.integers(len(base), size=n)]
    return np.array(normalize_strings(q), dtype=object), np.array(normalize_strings(b), dtype=object)


CASES = {"euclid": (euclid_case, "euclidean"), "hamming": (hamming_case, "hamming"),
         "strings": (strings_case, "qgram_cosine")}


def one(case: str, method: str, m: int, n: int, k: int, exact_rows: int, check: int) -> dict:
    """In its own process: build the case, search it, time, peak memory, recall."""
    from linkage.approx import Approx, approx_topk, tie_aware_recall
    from linkage.pipeline import topk

    make, metric = CASES[case]
    query, base = make(m, n)
    t0 = time.perf_counter()
    if method == "exact":
        rows = min(m, exact_rows)
        topk(metric, query[:rows], base, k)
        seconds, note = (time.perf_counter() - t0) * m / rows, ("" if rows == m else f"extrapolated from {rows:,}")
        recall = 1.0
    else:
        dist, _ = approx_topk(metric, query, base, k, Approx(method))
        seconds, note = time.perf_counter() - t0, ""
        sample = np.random.default_rng(1).choice(m, size=min(check, m), replace=False)
        recall = tie_aware_recall(metric, query, base, k, dist, sample)
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {"case": case, "method": method, "m": m, "n": n, "k": k, "seconds": seconds, "note": note,
            "peak_gb": peak_gb, "recall": recall}


def run_isolated(*args) -> dict:
    with cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(one, *args).result()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.linkage_scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=sorted(CASES), required=True)
    ap.add_argument("--m", type=int, required=True, help="primary records")
    ap.add_argument("--n", type=int, required=True, help="secondary records")
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--methods", nargs="+", default=["exact", "hnsw"], choices=["exact", "hnsw", "ivf"])
    ap.add_argument("--exact-rows", type=int, default=20_000, help="primary records the exact search is timed on")
    ap.add_argument("--check", type=int, default=1000, help="records the recall is measured on")
    args = ap.parse_args(argv)
    print(f"# {machine()}, git {git_rev()}, {time.strftime('%Y-%m-%d %H:%M')}")
    print("| case | m | n | K | method | seconds | peak GB | tie-aware recall | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    for method in args.methods:
        r = run_isolated(args.case, method, args.m, args.n, args.k, args.exact_rows, args.check)
        print(f"| {r['case']} | {r['m']:,} | {r['n']:,} | {r['k']} | {r['method']} | {r['seconds']:.1f} | "
              f"{r['peak_gb']:.2f} | {r['recall']:.4f} | {r['note']} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
