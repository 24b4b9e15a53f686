"""`fedsim predict` of an Entity Augmentation run trained through `flwr run` (each secondary kept
its own state): the apps' predict mode (app/entity_aug/predict_server.py) on a local simulation,
with the training's run config plus the predict-* keys, one SuperNode per secondary."""

from __future__ import annotations

import sys
from pathlib import Path

from app.config import RunConfig
from app.entity_aug.predict_ids import id_column, read_screened
from app.predict_files import kept_rows_input, left_note, list_skipped, run_to_output
from fedsim.predict_flower import predict_through_flower


def fedsim_predict(meta: dict, args) -> int:
    """`fedsim predict RUN IDS --out P` of a run trained through `flwr run` (its options ``args``):
    the ids screened here first (exit 2 naming them, or with --skip-invalid left out and listed),
    then :func:`simulate`, or on the deployment it was trained on (``--deployment``)."""
    column = id_column(args.id_column, RunConfig.of(**meta["run"]))
    try:
        skipped = read_screened(args.run_dir, args.new, column, args.skip_invalid)[1]
    except Exception as e:  # noqa: BLE001 - bad ids, named before Flower starts
        print(f"fedsim predict: refused: {type(e).__name__}: {e}{left_note(args.out)}", file=sys.stderr)
        return 2
    copy = kept_rows_input(args.new, skipped, column, args.out)[0] if skipped else None
    try:
        code = simulate(
            args.run_dir, copy or args.new, args.out, args.id_column, meta, args.timeout, deployment=args.deployment
        )
    finally:
        if copy is not None:
            copy.unlink(missing_ok=True)
    told = list_skipped(args.out, skipped, column, args.skip_invalid) if code == 0 else ""
    if told:
        print(told, file=sys.stderr)
    return code


def simulate(
    run_dir: Path, new: Path, out: Path, id_column: str, meta: dict, timeout: float, deployment: Path | None = None
) -> int:
    """Predict mode with the training's run config, on a local simulation (fedsim/predict_flower.py,
    one SuperNode per secondary) or on ``deployment`` (each SuperNode embeds with the state it kept
    in its own folder); exit 0 only with ``out`` written. The run writes beside ``out`` and the
    file replaces ``out`` only when whole (app/predict_files.py run_to_output): a failed predict
    leaves an older one as it was (and says so)."""

    def start(partial: Path) -> bool:
        keys = {
            "predict-input": str(Path(new).resolve()),
            "predict-output": str(partial),
            "predict-id-column": id_column,
        }
        if deployment is None:
            return predict_through_flower(run_dir, meta, keys, len(meta["secondaries"]), timeout, partial)
        return _on_deployment(Path(deployment), Path(run_dir), keys, timeout, partial)

    code = run_to_output(out, start)
    if code == 0:
        print(f"predictions (best epoch {meta['best_epoch']}) -> {out}")
    return code


def _on_deployment(deployment: Path, run_dir: Path, keys: dict, timeout: float, out: Path) -> bool:
    """`flwr run` in predict mode against the deployment the run was trained on, with the training's
    run config less the deployment's own folders and data; True when it wrote ``out``, otherwise
    its output's tail on stderr."""
    from deploy.commands import Deployment, flwr_run  # lazy: httpx, for --deployment only
    from deploy.predict import trained_values  # lazy: httpx, for --deployment only

    dep = Deployment.load(deployment)
    values = {**trained_values(dep, Path(run_dir).name), "run-name": "", "predict-run": Path(run_dir).name, **keys}
    r = flwr_run(dep, values, timeout)
    if not out.exists():
        print(
            f"fedsim predict: the run wrote no output; `flwr run` said:\n{(r.stdout + r.stderr)[-4000:]}",
            file=sys.stderr,
        )
        return False
    return True
