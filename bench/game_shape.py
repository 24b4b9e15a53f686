"""The FedSim paper's "game" linkage shape on real titles: 26,987 Steam names x 439,999 base titles.

The base is the HLTB titles plus seeded perturbed copies of them (character insert / delete /
substitute, word drop / swap), so it has near-duplicate clusters like a real catalogue.
"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
import pandas as pd

from linkage.strings import normalize_strings, tie_aware_recall, topk_edit, topk_edit_exact

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "game"
N_QUERY, N_BASE = 26_987, 439_999
ALPHABET = string.ascii_letters + string.digits + " :-'"


def perturb(title: str, rng: np.random.Generator) -> str:
    """One to three random edits: char insert / delete / substitute, word drop / swap."""
    s = title
    for _ in range(rng.integers(1, 4)):
        op = rng.integers(5)
        words = s.split(" ")
        if op == 3 and len(words) > 1:  # drop a word
            del words[rng.integers(len(words))]
            s = " ".join(words)
        elif op == 4 and len(words) > 1:  # swap two adjacent words
            i = rng.integers(len(words) - 1)
            words[i], words[i + 1] = words[i + 1], words[i]
            s = " ".join(words)
        else:
            i = int(rng.integers(len(s) + 1))
            c = ALPHABET[rng.integers(len(ALPHABET))]
            if op == 0 or not s:  # insert
                s = s[:i] + c + s[i:]
            elif op == 1:  # delete
                i = min(i, len(s) - 1)
                s = s[:i] + s[i + 1 :]
            else:  # substitute
                i = min(i, len(s) - 1)
                s = s[:i] + c + s[i + 1 :]
    return s


def game_shape(seed: int = 0, data: Path = DATA) -> tuple[list[str], list[str]]:
    """(query, base): the first 26,987 Steam names, and HLTB titles + perturbed copies to 439,999 rows."""
    rng = np.random.default_rng(seed)
    query = pd.read_csv(data / "steam.csv.gz", usecols=["name"])["name"].astype(str).tolist()[:N_QUERY]
    hltb = pd.read_csv(data / "hltb.csv.gz", usecols=["Name"])["Name"].astype(str).tolist()
    src = rng.integers(len(hltb), size=N_BASE - len(hltb))  # (n_extra,) which title each copy perturbs
    base = hltb + [perturb(hltb[i], rng) for i in src]
    return query, base


def main() -> None:
    """Time topk_edit at game shape (or a query subset) and check it against the exact oracle."""
    import argparse
    import resource
    import time

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--queries", type=int, default=0, help="random query subset (0 = all 26,987)")
    p.add_argument("--exact", type=int, default=500, help="queries checked against the exact top-K")
    p.add_argument("-k", type=int, default=100)
    a = p.parse_args()
    query, base = game_shape()
    rng = np.random.default_rng(1)
    if a.queries:
        query = [query[i] for i in rng.choice(len(query), a.queries, replace=False)]
    t0 = time.perf_counter()
    q, b = normalize_strings(query), normalize_strings(base)
    t1 = time.perf_counter()
    dist, idx = topk_edit(q, b, a.k)
    t2 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"{len(q)} x {len(b)}, K={a.k}: normalise {t1 - t0:.1f} s, topk_edit {t2 - t1:.1f} s, peak RSS {peak:.2f} GB")
    sub = rng.choice(len(q), min(a.exact, len(q)), replace=False)
    t3 = time.perf_counter()
    de, ie = topk_edit_exact([q[i] for i in sub], b, a.k)
    t4 = time.perf_counter()
    setrec = np.mean([len(set(x) & set(y)) / a.k for x, y in zip(idx[sub], ie)])
    print(
        f"exact on {len(sub)} queries {t4 - t3:.1f} s (x{len(q) / len(sub):.0f} = {(t4 - t3) * len(q) / len(sub):.0f} s); "
        f"tie-aware recall {tie_aware_recall(dist[sub], de):.4f}, set recall {setrec:.4f}, "
        f"distance columns equal {bool((dist[sub] == de).all())}"
    )


if __name__ == "__main__":
    main()
