"""What our code costs in each deployed message: Flower 1.41 runs every message in a fresh
ClientApp process, which imports the app and rebuilds its party from context.state.

    python -m bench.message_cost [--repeats 5] [--ea-dataset credit] [--vfl-dataset hdb]

Prints, as medians over --repeats:
- imports in a fresh interpreter: `flwr.clientapp` (Flower's own floor), `torch`, and our
  `app.client_app` (which imports both);
- a FedSim secondary restored from context.state, with and without the node's cache-dir (the
  features parsed once and memory-mapped after);
- an Entity Augmentation secondary restored from context.state as it is now (its feature block and
  batch schedule stored at its hello) against rebuilding it from the dataset (what every message
  did before).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

from flwr.app import Context, RecordDict

from app.config import RunConfig
from app.data import _load, load_data
from app.entity_aug import client as ea_secondary
from app.entity_aug.parties import build_party, ea_data
from app.run_record import machine
from app.vfl.linking import linkage_job
from app.vfl.secondary import SecondaryParty
from experiments.runner import REPO, git_rev


def median_seconds(fn, repeats: int) -> float:
    """Each repeat as in a fresh process: the in-process cache of loaded datasets emptied first."""
    times = []
    for _ in range(repeats):
        _load.cache_clear()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def import_seconds(module: str, repeats: int) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    runs = [
        float(subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True, text=True).stdout)
        for _ in range(repeats)
    ]
    return statistics.median(runs)


def vfl_rows(dataset: str, repeats: int) -> list[tuple[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig.of(dataset=dataset, out_dir=tmp)
        ds = load_data(cfg)
        _, job = linkage_job(ds, cfg, cfg.resolve())
        party = sorted(ds.secondaries)[0]
        rows = []
        for label, cache in (("no cache-dir", ""), ("cache-dir", tmp)):
            ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
            SecondaryParty(cfg, party, str(job), cache).persist(ctx)  # the hello (fills the cache)
            rows.append(
                (
                    f"FedSim secondary {party!r} ({dataset}) restore, {label}",
                    median_seconds(lambda: SecondaryParty.restore(cfg, ctx), repeats),
                )
            )
        return rows


def ea_rows(dataset: str, repeats: int) -> list[tuple[str, float]]:
    cfg = RunConfig.of(dataset=dataset, mode="entity-aug", ea_variant="augment")
    secondary = ea_data(cfg).secondaries[0]
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    ea_secondary.persist(build_party(cfg, secondary), ctx)  # the hello
    return [
        (
            f"EA secondary {secondary!r} ({dataset}) rebuilt from the dataset (before)",
            median_seconds(lambda: build_party(cfg, secondary), repeats),
        ),
        (
            f"EA secondary {secondary!r} ({dataset}) restored from context.state (now)",
            median_seconds(lambda: ea_secondary.restore(cfg, ctx), repeats),
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ea-dataset", default="credit")
    ap.add_argument("--vfl-dataset", default="hdb")
    args = ap.parse_args(argv)
    rows = [
        (f"import {m} (fresh interpreter)", import_seconds(m, args.repeats))
        for m in ("flwr.clientapp", "torch", "app.client_app")
    ]
    rows += vfl_rows(args.vfl_dataset, args.repeats) + ea_rows(args.ea_dataset, args.repeats)
    print(f"{machine()}, git {git_rev()}, median of {args.repeats}\n")
    print("| per message | seconds |\n|---|---|")
    for what, seconds in rows:
        print(f"| {what} | {seconds:.3f} |")


if __name__ == "__main__":
    main()
