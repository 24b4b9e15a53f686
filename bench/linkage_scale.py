"""Linkage beyond the paper's shapes: exact vs approximate top-K at scale cases made
from the shipped data (resampled with jitter, seeded), time, peak memory and tie-aware recall.

    python -m bench.linkage_scale --case hamming --m 1000000 --n 1000000       # one case
    python -m bench.linkage_scale --case euclid --m 10000000 --n 1000000 --k 50
    python -m bench.linkage_scale --case hamming --m 100000 --n 100000 --methods exact hnsw ivf

Cases: euclid = Melbourne sale coordinates (primary) against Airbnb coordinates (secondary),
each resampled with 200 m of jitter; hamming = the same points as 1024-bit FEDERAL filters (512
bits per coordinate, the parties' key); strings = Steam titles against How-Long-To-Beat titles
(bench.game_shape), resampled with one random edit each; gauss16 / gauss64 = synthetic
embedding-like points in 16 / 64 dimensions, 1000 clusters (gauss_case: no shipped dataset has
that many numeric identifiers), where linkage.approx's "auto" picks HNSW; gauss16u / gauss64u the
same without clusters. Each (case, method) runs in a fresh
process (its ru_maxrss is its own peak, inputs included). The exact column is timed on
--exact-rows primary records against the whole base and extrapolated (linear in m) when that is
fewer than m: the table says which. Recall: tie-aware, on 1000 records against their exact top-K.

Every search runs chunk by chunk (--chunk primary rows; the approximate index is built once for
all chunks) and each chunk's output is discarded once the recall sample's rows are kept from it:
the peak is the index and one chunk's output, not the whole (m, K), as a service that writes each
chunk away would hold. --hnsw-m, --ef-search, --ef-construction, --nlist, --nprobe and
--candidates set linkage.approx.Approx's knobs (else its defaults); each row's note names the
settings and the threads it ran on. --metric picks the strings case's scorer (e.g. jaro_winkler,
whose exact search is all pairs; qgram_cosine's exact search is already the q-gram index).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import os
import resource
import time
from functools import partial

import numpy as np

from app.run_record import machine
from bench.linkage import DATA, SECRET
from experiments.runner import git_rev
from linkage.approx import Approx, approx_chunks, tie_aware_recall
from linkage.encode import federal_numbers
from linkage.strings import normalize_strings


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
    q, b = euclid_case(m, n, seed)
    both = np.concatenate([q[:100_000], b[:100_000]])
    lo, hi = both.min(0) - 0.01, both.max(0) + 0.01
    kw = dict(bits_per_dim=512, t=0.05 * (hi - lo), lo=lo, hi=hi)
    return federal_numbers(q, SECRET, **kw), federal_numbers(b, SECRET, **kw)


def strings_case(m: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    from bench.game_shape import game_shape, perturb  # lazy: pandas, for the strings case only

    rng = np.random.default_rng(seed)
    query, base = game_shape(seed=0)
    q = [perturb(query[i], rng) for i in rng.integers(len(query), size=m)]
    b = [perturb(base[i], rng) for i in rng.integers(len(base), size=n)]
    return np.array(normalize_strings(q), dtype=object), np.array(normalize_strings(b), dtype=object)


def gauss_case(m: int, n: int, d: int, clusters: int = 1000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic, not from the shipped data (none has many numeric identifier columns): an
    embedding-like base of n points in d dimensions, ``clusters`` Gaussian clusters (centres
    N(0, 1), spread 0.3 per dimension; 0: no clusters, the base is N(0, 1)), and m queries, each
    a base point moved by N(0, 0.05): the near-copies a linkage looks for, among others."""
    rng = np.random.default_rng(seed)
    if clusters:
        base = rng.normal(size=(clusters, d))[rng.integers(clusters, size=n)] + rng.normal(0, 0.3, (n, d))
    else:
        base = rng.normal(size=(n, d))
    return base[rng.integers(n, size=m)] + rng.normal(0, 0.05, (m, d)), base


KNOBS = ("hnsw_m", "ef_search", "ef_construction", "nlist", "nprobe", "candidates")  # Approx's, settable here
CASES = {
    "euclid": (euclid_case, "euclidean"),
    "hamming": (hamming_case, "hamming"),
    "strings": (strings_case, "qgram_cosine"),
    "gauss16": (partial(gauss_case, d=16), "euclidean"),
    "gauss64": (partial(gauss_case, d=64), "euclidean"),
    "gauss16u": (partial(gauss_case, d=16, clusters=0), "euclidean"),
    "gauss64u": (partial(gauss_case, d=64, clusters=0), "euclidean"),
}


def _kept(chunks, sample: np.ndarray, k: int) -> np.ndarray:
    """(s, k) the distances of the sample rows (sorted), from (lo, dist, ...) chunks consumed one
    at a time: every other row's output is discarded as soon as its chunk is done."""
    kept = np.empty((len(sample), k))
    for lo, dist, *_ in chunks:
        a, b = np.searchsorted(sample, [lo, lo + len(dist)])
        kept[a:b] = dist[sample[a:b] - lo]
    return kept


def _exact_chunks(metric: str, query, base, k: int, rows: int):
    """The exact search (linkage.pipeline.topk) chunk by chunk, as the service's chunked search does."""
    from linkage.pipeline import topk  # lazy: scipy, for the exact method only

    for lo in range(0, len(query), rows):
        yield lo, *topk(metric, query[lo : lo + rows], base, k)


def settings(method: str, approx) -> str:
    """The knobs a method's row was measured with (the table's note)."""
    if method == "hnsw":
        return f"M={approx.hnsw_m}, efSearch={approx.ef_search}, efConstruction={approx.ef_construction}"
    if method == "ivf":
        return f"nlist={approx.nlist or 'auto'}, nprobe={approx.nprobe}"
    return f"candidates={approx.candidates or 'max(4K, 100)'}" if method == "qgram" else ""


def one(spec: dict) -> dict:
    """In its own process: build the case, search it in chunks of spec["chunk"] primary rows
    (each chunk's output discarded but for the recall sample's rows), time, peak memory, recall."""
    import faiss

    from linkage.hamming import num_threads  # lazy: numba, loaded with the case's search, not at import

    make, metric = CASES[spec["case"]]
    metric, m, n, k, method = spec["metric"] or metric, spec["m"], spec["n"], spec["k"], spec["method"]
    query, base = make(m, n)
    sample = np.sort(np.random.default_rng(1).choice(m, size=min(spec["check"], m), replace=False))
    approx = Approx(method, **spec["knobs"])
    t0 = time.perf_counter()
    if method == "exact":
        rows = min(m, spec["exact_rows"])
        _kept(_exact_chunks(metric, query[:rows], base, k, spec["chunk"]), sample[sample < rows], k)
        seconds, recall = (time.perf_counter() - t0) * m / rows, 1.0
        note = "" if rows == m else f"extrapolated from {rows:,}"
    else:
        kept = _kept(approx_chunks(metric, query, base, k, approx, spec["chunk"]), sample, k)
        seconds, note = time.perf_counter() - t0, settings(method, approx)
        recall = tie_aware_recall(metric, query[sample], base, k, kept, np.arange(len(sample)))
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    threads = f"faiss {faiss.omp_get_max_threads()}, numba {num_threads()} threads"
    return {
        **spec,
        "metric": metric,
        "seconds": seconds,
        "peak_gb": peak_gb,
        "recall": recall,
        "note": "; ".join(x for x in (note, threads) if x),
    }


def run_isolated(spec: dict) -> dict:
    with cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(one, spec).result()


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.linkage_scale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--case", choices=sorted(CASES), required=True)
    ap.add_argument("--metric", default="", help="strings case: the scorer (default qgram_cosine)")
    ap.add_argument("--m", type=int, required=True, help="primary records")
    ap.add_argument("--n", type=int, required=True, help="secondary records")
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--methods", nargs="+", default=["exact", "hnsw"], choices=["exact", "hnsw", "ivf", "qgram"])
    ap.add_argument("--exact-rows", type=int, default=20_000, help="primary records the exact search is timed on")
    ap.add_argument("--check", type=int, default=1000, help="records the recall is measured on")
    ap.add_argument("--chunk", type=int, default=1_000_000, help="primary rows searched (and discarded) at once")
    for knob in KNOBS:
        ap.add_argument(
            f"--{knob.replace('_', '-')}",
            type=int,
            default=None,
            help="linkage.approx.Approx's knob (default: its own)",
        )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    knobs = {key: getattr(args, key) for key in KNOBS if getattr(args, key) is not None}
    import torch

    print(
        f"# {machine()} ({torch.get_num_threads()} torch threads), git {git_rev()}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}, loadavg {os.getloadavg()[0]:.2f}"
    )
    print("| case | m | n | K | method | seconds | peak GB | tie-aware recall | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    for method in args.methods:
        r = run_isolated(
            {
                "case": args.case,
                "metric": args.metric,
                "method": method,
                "m": args.m,
                "n": args.n,
                "k": args.k,
                "exact_rows": args.exact_rows,
                "check": args.check,
                "chunk": args.chunk,
                "knobs": knobs,
            }
        )
        load = os.getloadavg()[0]
        print(
            f"| {r['case']} | {r['m']:,} | {r['n']:,} | {r['k']} | {r['method']} | {r['seconds']:.1f} | "
            f"{r['peak_gb']:.2f} | {r['recall']:.4f} | {r['note']} |",
            flush=True,
        )
        print(f"# loadavg after: {load:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
