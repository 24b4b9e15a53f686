"""Running experiments: a run-config through `flwr run` (judged by its status, read from its run
record), run-config overrides and conf files, and where the code came from (git, machine)."""

from __future__ import annotations

import subprocess
import time
import tomllib
from pathlib import Path

from app.run_record import read_summary
from app.run_status import require_finished
from deploy.localsim import REPO, simulate


def git_rev() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()


def run_flower(values: dict, work: Path, name: str, timeout: float = 3600) -> tuple[dict, Path, float]:
    """One `flwr run` simulation; returns (summary.json, run dir, wall seconds). `flwr run`
    exits 0 even when the ServerApp fails, so the run's status.json decides: RunFailed unless
    this run finished (app/run_status.py)."""
    values = {**values, "out-dir": str(work / "out"), "run-name": name}
    t0, since = time.perf_counter(), time.time()
    proc = simulate(values, work / f"flwr-home-{name}", timeout=timeout)
    wall = time.perf_counter() - t0
    run_dir = work / "out" / name
    require_finished(run_dir, since, f"{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
    return read_summary(run_dir), run_dir, wall


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
