"""What an ensemble's predict costs against one member's (app/vfl/ensemble.py): the first 1, 2,
... k of the given kept members predict a split of their seed as new records, each phase timed
(prepare, linkage query, embeddings, forward; summed over the members).

    python -m bench.ensemble_predict RUN_0 RUN_1 RUN_2 [--part test|val]

The runs are members of one seed's split (run-config member), kept in their folders: a sweep's
<root>/<sweep>/<dataset>/<variant>/s<seed> runs (docs/benchmarks.md "Ensembles").
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from app.config import RunConfig
from app.data import load_data
from app.kept import read_manifest
from app.run_record import machine
from app.vfl.ensemble import predict_ensemble


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+", help="kept members, member 0 first")
    ap.add_argument("--part", choices=("test", "val"), default="test")
    args = ap.parse_args(argv)
    ds = load_data(RunConfig.of(**read_manifest(args.runs[0])["run"]))
    rows = getattr(ds.split, args.part)
    print(f"{machine()}; {len(rows)} {args.part} records of {ds.name}")
    for k in range(1, len(args.runs) + 1):
        t0 = time.perf_counter()
        pred, _ = predict_ensemble(args.runs[:k], ds.primary.features[rows], ds.primary.identifiers[rows])
        phases = ", ".join(f"{name} {sec:.1f}" for name, sec in pred.seconds.items())
        print(f"{k} member(s): {time.perf_counter() - t0:.1f} s ({phases})")


if __name__ == "__main__":
    main()
