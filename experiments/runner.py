"""Shared bits of the benchmark scripts: run a conf file through `flwr run`, machine info."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
import tomllib
from pathlib import Path

from app.run_status import require_finished
from deploy.localsim import REPO, simulate


def machine() -> str:
    import torch

    cpu = "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.node()}: {os.cpu_count()} cores ({cpu}), {gpu}, Python {platform.python_version()}, torch {torch.__version__}"


def git_rev() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()


def run_flower(values: dict, work: Path, name: str, timeout: float = 3600) -> tuple[dict, Path, float]:
    """One `flwr run` simulation; returns (summary.json, run dir, wall seconds). `flwr run`
    exits 0 even when the ServerApp fails, so the run's status.json decides: RunFailed unless
    this run finished (app/run_status.py)."""
    values = {**values, "out-dir": str(work / "out"), "run-name": name}
    t0, since = time.perf_counter(), time.time()
    proc = simulate(values, work / f"flwr-home-{name}", timeout=timeout)
    wall = time.perf_counter() - t0
    run_dir = work / "out" / name
    summary = require_finished(run_dir, since, f"{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
    return summary, run_dir, wall


def parse_overrides(items: list[str]) -> dict:
    """``--set key=value`` arguments -> run-config values; each value is read as TOML
    (``epochs=3``, ``sigma-cf=0.2``, ``merge='"mlp"'``)."""
    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set expects key=value, got {item!r}")
        out[key] = tomllib.loads(f"v = {text}")["v"]
    return out


def load_conf(name: str) -> dict:
    return tomllib.loads((REPO / "conf" / f"{name}.toml").read_text())


def epochs_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
