"""`fedsim predict` of an Entity Augmentation run trained through `flwr run` (each guest kept its
own state): the apps' predict mode (app/entity_aug/predict_server.py) on a local simulation,
with the training's run config plus the predict-* keys, one SuperNode per guest."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from pathlib import Path

from fedsim.watch import tail, watch


def fedsim_predict(meta: dict, args) -> int:
    """`fedsim predict RUN IDS --out P` of a run trained through `flwr run` (its options ``args``):
    the ids screened here first (exit 2 naming them, or with --skip-invalid left out and listed),
    then :func:`simulate`; a deployment is refused by name (`fedsim deploy` runs FedSim's parties)."""
    from app.entity_aug.predict_ids import read_screened
    from app.predict_files import kept_rows_input, left_note, write_skipped

    if args.deployment:
        print("fedsim predict: Entity Augmentation on a deployment is not supported (`fedsim deploy` runs "
              "FedSim's parties); predict a run trained in simulation, without --deployment", file=sys.stderr)
        return 2
    column = args.id_column or "entity"
    try:
        _, skipped = read_screened(args.run_dir, args.new, column, args.skip_invalid)
    except Exception as e:  # noqa: BLE001 - bad ids, named before Flower starts
        print(f"fedsim predict: refused: {type(e).__name__}: {e}{left_note(args.out)}", file=sys.stderr)
        return 2
    copy = kept_rows_input(args.new, skipped, column, args.out)[0] if skipped else None
    try:
        code = simulate(args.run_dir, copy or args.new, args.out, args.id_column, meta, args.timeout)
    finally:
        if copy is not None:
            copy.unlink(missing_ok=True)
    told = write_skipped(args.out, skipped, column) if code == 0 and args.skip_invalid else ""
    if told:
        print(told, file=sys.stderr)
    return code


def simulate(run_dir: Path, new: Path, out: Path, id_column: str, meta: dict, timeout: float) -> int:
    """Predict mode on a local simulation (deploy.localsim) with the training's run config, its
    log in <run>/predict-flower.log; exit 0 only with ``out`` written. The run writes beside
    ``out`` and the file replaces ``out`` only when whole: a failed predict leaves an older one
    as it was (and says so)."""
    from app.config import RunConfig
    from deploy.localsim import start_simulation, stop_superlink

    run_dir, out, new = Path(run_dir).resolve(), Path(out).resolve(), Path(new).resolve()
    partial = out.with_name(f".{out.name}.partial")
    values = {k.replace("_", "-"): v for k, v in dataclasses.asdict(RunConfig(**meta["run"])).items()}
    values.update({"out-dir": str(run_dir.parent), "run-name": "", "resume": False, "predict-run": run_dir.name,
                   "predict-input": str(new), "predict-output": str(partial), "predict-id-column": id_column})
    log_file = run_dir / "predict-flower.log"
    home = run_dir.parent / ".flower" / f"predict-{run_dir.name}"
    with open(log_file, "w") as sink:
        proc, port = start_simulation(values, home, num_supernodes=len(meta["guests"]), output=sink)
        try:
            deadline = time.monotonic() + timeout
            watch(lambda: proc.poll() is not None or time.monotonic() > deadline, None, label="predict")
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            stop_superlink(port)
            shutil.rmtree(home, ignore_errors=True)
    if not partial.exists():
        left = f"; {out} is left as it was" if out.exists() else ""
        print(f"fedsim predict: the run wrote no output{left}; its log ({log_file}) ends:\n{tail(log_file)}",
              file=sys.stderr)
        return 1
    os.replace(partial, out)
    print(f"predictions (best epoch {meta['best_epoch']}) -> {out}")
    return 0
