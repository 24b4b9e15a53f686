"""Seconds per epoch of one FedSim run on each device (CPU vs GPU), same run config otherwise.

The in-process engine (the federated protocol with in-process secondaries, the code path every
party runs under `flwr run`): train seconds per epoch, evaluation seconds, and the test metric,
so a faster device is also seen to compute the same model.

    python -m bench.device_cost --dataset hdb --epochs 2 --devices cpu,cuda [--set key=value ...] [--twin]

``--twin`` adds, per device, the one-process twin's train seconds per epoch (app/vfl/inprocess.py
run_twin: the same modules in one autograd graph, no protocol) for the same run config.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from app.config import RunConfig
from app.modes import run_experiment
from app.run_record import machine, read_metrics
from app.vfl.inprocess import run_twin
from experiments.runner import git_rev, parse_overrides


def measure(values: dict, device: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig.from_flower({**values, "device": device, "out-dir": tmp})
        summary = run_experiment(cfg, Path(tmp) / "run")
        recs = read_metrics(Path(tmp) / "run")
    metric = "accuracy" if "accuracy" in summary["test"] else "rmse"
    return {
        "device": summary["device"],
        "train_s": [r["seconds"] for r in recs],
        "eval_s": [r["eval_seconds"] for r in recs],
        "steps": summary["steps"],
        "test": summary["test"][metric],
        "metric": metric,
        "total_s": summary["seconds"]["total"],
    }


def measure_twin(values: dict, device: str, epochs: int) -> float:
    """The one-process twin's training seconds per epoch on ``device``."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig.from_flower({**values, "device": device, "out-dir": tmp})
        return run_twin(cfg).train_seconds / epochs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="hdb")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--devices", default="cpu,cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more run-config values (TOML)")
    ap.add_argument("--twin", action="store_true", help="also time the one-process twin per device")
    args = ap.parse_args()
    values = {"dataset": args.dataset, "epochs": args.epochs, **parse_overrides(args.set)}
    print(f"{machine()}, {torch.get_num_threads()} torch threads, git {git_rev()}")
    print(f"run config: {values}")
    print("| device | train s/epoch (median) | eval s/epoch | steps/epoch | test | total s |")
    print("|---|---|---|---|---|---|")
    for device in args.devices.split(","):
        r = measure(values, device)
        print(
            f"| {r['device']} | {statistics.median(r['train_s']):.2f} | {statistics.median(r['eval_s']):.2f} | "
            f"{r['steps'] // args.epochs} | {r['metric']} {r['test']:.4f} | {r['total_s']:.1f} |",
            flush=True,
        )
        if args.twin:
            print(f"| {r['device']} twin | {measure_twin(values, device, args.epochs):.2f} | | | | |", flush=True)


if __name__ == "__main__":
    main()
