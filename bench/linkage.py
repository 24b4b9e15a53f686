"""Linkage speed, recall and memory at the FedSim paper's shapes, next to a naive method.

    python -m bench.linkage                    # all cases at full shape (about 10 minutes here)
    python -m bench.linkage --cases house,game # some of them
    python -m bench.linkage --scale 0.05       # every shape scaled down (a smoke run)

Each (case, method) runs in a fresh process, so the peak memory it reports (ru_maxrss, data
included) is its own. Recall is measured on a seeded subset of primary records against an exact
top-K computed on that subset: tie-aware (a returned neighbour counts when its distance is no
larger than the exact K-th distance), and plain set overlap.
Shapes (m primary x n secondary): house 141,050 x 27,827 (d=2; Melbourne sale and Airbnb
coordinates resampled with jitter), hdb 89,356 x 165 (our real data; the paper had 92,095),
game 26,987 x 439,999 titles (bench.game_shape), company 77,225 x 220,583 names (a stand-in built
the same way from titles), hamming: 1024-bit FEDERAL filters of the house coordinates.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import resource
import time
from pathlib import Path

import numpy as np

from app.run_record import machine
from experiments.runner import git_rev
from linkage.encode import federal_numbers
from linkage.strings import normalize_strings, topk_edit, topk_edit_exact

K = 100
PAPER_MIN = {"hdb": 0.98, "house": 3.48, "game": 3.62, "company": 13.20, "hamming": 145.2}
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SECRET = b"bench-shared-secret"


# ----------------------------------------------------------------------------- inputs


def house_shape(scale: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    import pandas as pd

    rng = np.random.default_rng(seed)
    sales = pd.read_csv(DATA / "house_melbourne" / "sales.csv.gz", usecols=["Lattitude", "Longtitude"]).dropna()
    bnb = pd.read_csv(DATA / "house_melbourne" / "airbnb_listings.csv.gz", usecols=["latitude", "longitude"]).dropna()
    m, n = int(141_050 * scale), int(27_827 * scale)
    q = sales.to_numpy()[rng.integers(len(sales), size=m)] + rng.normal(0, 0.002, (m, 2))
    b = bnb.to_numpy()[rng.integers(len(bnb), size=n)] + rng.normal(0, 0.002, (n, 2))
    return q, b


def hdb_shape(scale: float) -> tuple[np.ndarray, np.ndarray]:
    from datasets import load_dataset  # lazy: pandas, for the hdb case only

    ds = load_dataset("hdb")
    m = int(ds.primary.n_rows * scale)
    return ds.primary.identifiers[:m], ds.secondaries["school"].identifiers


def string_shape(case: str, scale: float) -> tuple[list[str], list[str]]:
    from bench.game_shape import game_shape, perturb  # lazy: pandas, for the string cases only

    query, base = game_shape(seed=0)
    if case == "company":  # a stand-in of the paper's company shape, from the same titles
        rng = np.random.default_rng(1)
        pool = query + base
        base = [pool[i] for i in rng.permutation(len(pool))[:220_583]]
        query = [perturb(base[i], rng) for i in rng.integers(len(base), size=77_225)]
    m, n = max(1, int(len(query) * scale)), max(K, int(len(base) * scale))
    return normalize_strings(query[:m]), normalize_strings(base[:n])


def hamming_shape(scale: float) -> tuple[np.ndarray, np.ndarray]:
    q, b = house_shape(scale)
    both = np.concatenate([q, b])
    lo, hi = both.min(0), both.max(0)
    kw = dict(bits_per_dim=512, t=0.05 * (hi - lo), lo=lo, hi=hi)
    return federal_numbers(q, SECRET, **kw), federal_numbers(b, SECRET, **kw)


def inputs(case: str, scale: float):
    if case == "house":
        return house_shape(scale)
    if case == "hdb":
        return hdb_shape(scale)
    if case in ("game", "company"):
        return string_shape(case, scale)
    if case == "hamming":
        return hamming_shape(scale)
    raise SystemExit(f"unknown case {case!r}")


# ----------------------------------------------------------------------------- methods


def method_fn(case: str, method: str):
    """(callable(query, base, k) -> (dist, idx), exact callable for the recall subset)."""
    from linkage.pipeline import topk_bruteforce, topk_euclidean  # lazy: scipy, for the Euclidean methods only

    if case in ("house", "hdb"):
        if method == "ours":  # scipy cKDTree, both cores
            return topk_euclidean, topk_bruteforce
        if method == "naive":  # the reference: sklearn KDTree, one thread
            from sklearn.neighbors import KDTree

            def naive(q, b, k):
                return KDTree(b).query(q, k=k)

            return naive, topk_bruteforce
    if case in ("game", "company"):
        if method == "ours":
            return topk_edit, topk_edit_exact
        if method == "naive":  # the reference's prefix blocking, then exact distances inside blocks
            return prefix_blocking, topk_edit_exact
    if case == "hamming":
        from linkage.hamming import topk_hamming  # lazy: numba, for the hamming case only

        if method == "ours":
            return topk_hamming, hamming_exact
        if method == "naive":  # the reference: faiss IndexBinaryFlat (heap top-K)
            return faiss_binary_flat, hamming_exact
    raise SystemExit(f"no method {method!r} for case {case!r}")


def prefix_blocking(query: list[str], base: list[str], k: int, prefix: int = 7):
    """The reference's edit-distance linkage: only base strings sharing the first 7 characters."""
    from collections import defaultdict

    from rapidfuzz.distance import Levenshtein

    blocks = defaultdict(list)
    for j, s in enumerate(base):
        blocks[s[:prefix]].append(j)
    dist = np.full((len(query), k), np.inf)
    idx = np.full((len(query), k), -1, dtype=np.int64)
    for i, s in enumerate(query):
        cand = blocks.get(s[:prefix], [])
        if cand:
            d = np.array([Levenshtein.distance(s, base[j]) for j in cand], dtype=np.float64)
            order = np.argsort(d, kind="stable")[:k]
            dist[i, : len(order)], idx[i, : len(order)] = d[order], np.asarray(cand)[order]
    return dist, idx


def faiss_binary_flat(query: np.ndarray, base: np.ndarray, k: int):
    import faiss

    index = faiss.IndexBinaryFlat(base.shape[1] * 8)
    index.add(base)
    d, i = index.search(query, k)
    return d.astype(np.float64), i.astype(np.int64)


def hamming_exact(query: np.ndarray, base: np.ndarray, k: int):
    bq, bb = np.unpackbits(query, axis=1).astype(np.float32), np.unpackbits(base, axis=1).astype(np.float32)
    d = bq.sum(1)[:, None] + bb.sum(1)[None, :] - 2 * bq @ bb.T  # (m, n) Hamming
    idx = np.argsort(d, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d, idx, 1).astype(np.float64), idx


# ----------------------------------------------------------------------------- one run


def one(case: str, method: str, scale: float, n_check: int) -> dict:
    """Runs in its own process: build inputs, time the method, measure recall on a subset."""
    query, base = inputs(case, scale)
    fn, exact = method_fn(case, method)
    floor = None
    if case == "hamming" and method == "ours":
        from linkage.hamming import popcount_floor_seconds  # lazy: numba, for the hamming case only

        floor = popcount_floor_seconds(query, base)
    k = min(K, len(base))
    t0 = time.perf_counter()
    dist, idx = fn(query, base, k)
    seconds = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows = np.random.default_rng(0).choice(len(query), size=min(n_check, len(query)), replace=False)
    sub = [query[i] for i in rows] if isinstance(query, list) else query[rows]
    ed, ei = exact(sub, base, k)
    got_d, got_i = np.asarray(dist)[rows], np.asarray(idx)[rows]
    tol = 1e-6 * np.abs(ed[:, -1:]) + 1e-9  # float distances from two algorithms differ in the last bits
    tie = float((got_d <= ed[:, -1:] + tol).mean())
    overlap = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(got_i, ei)]))
    top1 = float((got_d[:, 0] <= ed[:, 0] + tol[:, 0]).mean())
    return {
        "case": case,
        "method": method,
        "m": len(query),
        "n": len(base),
        "k": k,
        "seconds": seconds,
        "peak_mb": peak_mb,
        "tie_recall": tie,
        "set_recall": overlap,
        "top1": top1,
        "floor_s": floor,
    }


def run_isolated(case: str, method: str, scale: float, n_check: int) -> dict:
    with cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(one, case, method, scale, n_check).result()


METHODS = {
    "house": ("ours", "naive"),
    "hdb": ("ours", "naive"),
    "game": ("ours", "naive"),
    "company": ("ours",),
    "hamming": ("ours", "naive"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="hdb,house,game,hamming,company")
    ap.add_argument("--methods", default="ours,naive")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--check", type=int, default=300, help="primary records whose exact top-K checks recall")
    args = ap.parse_args()
    print(f"# bench.linkage  {machine()}  git {git_rev()}  scale {args.scale}  K={K}", flush=True)
    print(
        "| case | m x n | method | seconds | tie-aware recall | set recall | top-1 exact | peak MB | "
        "floor s | paper min |",
        flush=True,
    )
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for case in args.cases.split(","):
        for method in METHODS[case]:
            if method not in args.methods.split(","):
                continue
            r = run_isolated(case, method, args.scale, args.check)
            floor = f"{r['floor_s']:.2f}" if r["floor_s"] else ""
            print(
                f"| {case} | {r['m']:,} x {r['n']:,} | {method} | {r['seconds']:.2f} | {r['tie_recall']:.4f} | "
                f"{r['set_recall']:.4f} | {r['top1']:.4f} | {r['peak_mb']:.0f} | {floor} | "
                f"{PAPER_MIN[case]} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
