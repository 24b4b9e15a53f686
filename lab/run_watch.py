"""Watching a run from outside, for the fault tests (lab/faults.py): its progress.json and
status.json as the ServerApp writes them, until it is mid-epoch after a checkpoint, failed, or
settled; and a resumed run compared with the uninterrupted one (step losses bit for bit, every
epoch's metrics, the summary)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from lab.hosts import Running


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not there yet, or (never, written atomically) half-written
        return None


def wait_mid_epoch(run_dir: Path, proc: Running, timeout: float = 600.0) -> dict:
    """Waits until the run has committed a checkpoint and is inside a later epoch (progress.json:
    training, 0 < step < steps_per_epoch); returns that progress."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = read_json(run_dir / "progress.json")
        committed = (run_dir / "checkpoint" / "checkpoint.json").exists()
        if committed and p and p["phase"] == "training" and 0 < p["step"] < p["steps_per_epoch"]:
            return p
        if proc.popen.poll() is not None:
            raise RuntimeError(f"the run ended before it was mid-epoch; progress {p}")
        time.sleep(0.1)
    raise RuntimeError(f"the run was not mid-epoch within {timeout} s")


def wait_failed(run_dir: Path, proc: Running, since: float, timeout: float) -> float:
    """Seconds from ``since`` (monotonic) until `flwr run` returned or status.json left "running"."""
    deadline = since + timeout
    while time.monotonic() < deadline:
        status = read_json(run_dir / "status.json") or {}
        if proc.popen.poll() is not None or status.get("state", "running") != "running":
            return time.monotonic() - since
        time.sleep(0.2)
    raise RuntimeError(f"no failure seen within {timeout} s of the fault")


def compare(uninterrupted: Path, resumed: Path) -> dict:
    """The resumed run against the uninterrupted one: step losses (bit for bit, and the largest
    difference), each epoch's val/test metrics, the summary's best epoch and test metrics."""
    a, b = np.load(uninterrupted / "step_losses.npy"), np.load(resumed / "step_losses.npy")
    rows = [[json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()] for d in (uninterrupted, resumed)]
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (uninterrupted, resumed))
    epochs = [[(r["epoch"], r["val"], r["test"]) for r in rs] for rs in rows]
    return {
        "steps": [int(a.size), int(b.size)],
        "losses_equal": a.shape == b.shape and bool(np.array_equal(a, b)),
        "max_loss_diff": float(np.abs(a - b).max()) if a.shape == b.shape else float("inf"),
        "epochs_equal": epochs[0] == epochs[1],
        "summary_equal": (sa["best_epoch"], sa["test"], sa["val"]) == (sb["best_epoch"], sb["test"], sb["val"]),
        "test": [sa["test"], sb["test"]],
    }


def settled(run_dir: Path, timeout: float) -> dict:
    """status.json once the ServerApp that wrote it is done: not "running", or its process gone
    (a killed ServerApp leaves "running"); a ServerApp may outlive `flwr run` (its own session)."""
    deadline = time.monotonic() + timeout
    while True:
        status = read_json(run_dir / "status.json") or {}
        if status.get("state") != "running" or not Path(f"/proc/{status.get('pid')}").exists():
            return status
        if time.monotonic() > deadline:
            raise RuntimeError(f"the ServerApp (pid {status.get('pid')}) was still running {timeout} s after the fault")
        time.sleep(0.5)
