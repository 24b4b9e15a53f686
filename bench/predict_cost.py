"""What predicting new records costs on hdb (89,356 flats x 165 schools, K = 50), in process
and through `flwr run` (Flower simulation).

Trains a short FedSim run (its kept federation is the best epoch), then predicts N new flats
resampled from the data (features of random flats, identifiers moved by up to ~100 m), timing
each phase: prepare (kept state, data, models), linkage query, embeddings, the primary's
forward pass; and one record alone. In process, peak memory is the process's max RSS. With
--flower the run trains and predicts through `flwr run` (predict mode of the same apps; the
input an .npz of prepared arrays): the command's wall time, the phases the ServerApp logs, and
Flower's start-up as the difference.

    python -m bench.predict_cost [--new 100000] [--epochs 1] [--max-steps 200] [--flower]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from app.config import RunConfig
from app.data import load_data
from app.modes import run_experiment
from app.run_record import machine
from app.vfl.predict import predict_in_process
from deploy.localsim import simulate
from experiments.runner import git_rev


def new_flats(ds, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n flats resampled from the data: (features (n, d), identifiers (n, 2) lat/lon moved)."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, ds.primary.n_rows, n)
    ids = ds.primary.identifiers[rows] + rng.uniform(-1e-3, 1e-3, (n, 2))  # ~100 m in degrees
    return ds.primary.features[rows], ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new", type=int, default=100_000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument(
        "--max-steps",
        type=int,
        default=200,
        help="training steps (the cost of predict does not depend on how long it trained)",
    )
    ap.add_argument("--flower", action="store_true", help="train and predict through `flwr run` (simulation)")
    args = ap.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} | {machine()} | commit {git_rev()}")
    if args.flower:
        return flower(args)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig.of(dataset="hdb", epochs=args.epochs, max_steps=args.max_steps, out_dir=str(Path(tmp) / "out"))
        t0 = time.perf_counter()
        run_experiment(cfg, Path(tmp) / "run")
        print(f"training (not part of predict): {time.perf_counter() - t0:.1f} s")
        x, ids = new_flats(load_data(cfg), args.new)
        predict_in_process(Path(tmp) / "run", x[:1], ids[:1])  # warm: data cache, torch
        t0 = time.perf_counter()
        one = predict_in_process(Path(tmp) / "run", x[:1], ids[:1])
        print(f"one record: {time.perf_counter() - t0:.3f} s wall; phases {fmt(one.seconds)}")
        t0 = time.perf_counter()
        many = predict_in_process(Path(tmp) / "run", x, ids)
        wall = time.perf_counter() - t0
        print(f"{args.new} records: {wall:.2f} s wall; phases {fmt(many.seconds)}; {args.new / wall:,.0f} records/s")
        print(
            f"peak memory (max RSS of this process): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
        )


def flower(args) -> None:
    """Train, then predict one record and N records, each a `flwr run` of its own."""
    import re

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = {"dataset": "hdb", "epochs": args.epochs, "max-steps": args.max_steps, "out-dir": str(tmp / "out")}
        t0 = time.perf_counter()
        r = simulate({**base, "run-name": "trained"}, tmp / "home-train", timeout=3000)
        if not (tmp / "out" / "trained" / "kept" / "federation.json").exists():
            raise SystemExit(f"training failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        print(f"training through flwr run (not part of predict): {time.perf_counter() - t0:.1f} s")
        x, ids = new_flats(load_data(RunConfig.of(dataset="hdb")), args.new)
        for n in (1, args.new):
            np.savez(tmp / "new.npz", features=x[:n], identifiers=ids[:n])
            keys = {
                **base,
                "predict-run": "trained",
                "predict-input": str(tmp / "new.npz"),
                "predict-output": str(tmp / "pred.csv"),
            }
            t0 = time.perf_counter()
            r = simulate(keys, tmp / f"home-{n}", timeout=3000)
            wall = time.perf_counter() - t0
            line = re.search(r"\[primary\] predict: .*? in ([0-9.]+) s: (.*?) ->", r.stdout + r.stderr)
            if line is None or not (tmp / "pred.csv").exists():
                raise SystemExit(f"predict failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
            inside = float(line.group(1))
            print(
                f"{n} record(s) through flwr run: {wall:.1f} s command wall; ServerApp predict {inside:.2f} s "
                f"({line.group(2)}); Flower start-up and teardown {wall - inside:.1f} s"
            )


def fmt(seconds: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3f} s" for k, v in seconds.items())


if __name__ == "__main__":
    main()
