"""`flwr run` in the apps' predict mode on a local simulation, for `fedsim predict` of a run
trained through Flower (VFL: fedsim/predict.py; Entity Augmentation: fedsim/predict_ea.py)."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from app.kept import trained_values
from fedsim.watch import tail, watch


def predict_through_flower(
    run_dir: Path, meta: dict, predict: dict[str, object], nodes: int, timeout: float, out: Path
) -> bool:
    """The training's run config plus the ``predict`` keys (predict-input, predict-output, ...)
    through `flwr run` with ``nodes`` SuperNodes, its log in <run>/predict-flower.log; stopped
    after ``timeout`` s. True when it wrote ``out``; otherwise the log's tail on stderr."""
    from deploy.localsim import (  # lazy: looked up per call, where tests stand in for Flower (deploy.localsim)
        start_simulation,
        stop_superlink,
    )

    run_dir = Path(run_dir).resolve()
    values = trained_values(meta)
    values.update(
        {"out-dir": str(run_dir.parent), "run-name": "", "resume": False, "predict-run": run_dir.name, **predict}
    )
    log = run_dir / "predict-flower.log"
    home = run_dir.parent / ".flower" / f"predict-{run_dir.name}"
    with open(log, "w") as sink:
        proc, port = start_simulation(values, home, num_supernodes=nodes, output=sink)
        try:
            deadline = time.monotonic() + timeout
            watch(lambda: proc.poll() is not None or time.monotonic() > deadline, None, label="predict")
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            stop_superlink(port)
            shutil.rmtree(home, ignore_errors=True)
    if not Path(out).exists():
        print(f"fedsim predict: the run wrote no output; its log ({log}) ends:\n{tail(log)}", file=sys.stderr)
        return False
    return True
