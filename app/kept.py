"""What both training modes share about a kept federation (app/vfl/kept.py, app/entity_aug/kept.py)
and about predicting with it: the best-epoch :class:`Keeper`, the manifest's reading, and the
predictions CSV written whole or not at all (an older one kept on failure: app/predict_files.py).

The Keeper snapshots the states after each epoch's evaluation when the validation metric
improves (ties keep the earlier epoch, as strategies.records.best_epoch does). With ``folder``
(the Flower engine) every improvement is written at once, with ``best.json``, so a resumed run
keeps the best epoch of its first part; without, the states wait in memory for the mode's
``save``, which writes them and the mode's manifest (:meth:`Keeper.write`).
"""

from __future__ import annotations

import io
import json
import re
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from app.config import RunConfig
from app.predict_files import left_note, output_refusal
from app.run_files import read_json
from app.run_status import PREVIOUS
from files.atomic import write_atomic
from files.private import private_dir
from strategies.heads import TaskHead
from strategies.records import EpochRecord
from strategies.wire_checks import ProtocolError

KEPT, MANIFEST, BEST, OUTPUTS = "kept", "federation.json", "best.json", "outputs.npz"
ATTEMPT = "attempt"  # <run>/kept/attempt: the training attempt whose states the run keeps (attempt_id)

if TYPE_CHECKING:
    import pandas as pd  # annotations only: no message pays for importing pandas


class KeptError(ValueError):
    """No kept federation, or one that does not fit what predict was given."""


def _copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


class Keeper:
    """The best-validation epoch's states, as the evaluation saw them."""

    def __init__(self, head: TaskHead, folder: Path | None = None) -> None:
        self.head, self.folder, self.best = head, folder, None
        self.states: dict[str, dict[str, torch.Tensor]] = {}

    def resume(self, records: list[EpochRecord]) -> None:
        """Go on from the best epoch kept before the interruption, among the epochs ``records`` holds."""
        path = None if self.folder is None else self.folder / BEST
        if path is None or not path.exists():
            return
        best = json.loads(path.read_text())
        for rec in records:
            if rec.epoch == best["epoch"]:
                self.best = rec

    def offer(self, rec: EpochRecord, models: dict[str, torch.nn.Module]) -> bool:
        """``models``: the ones this process keeps (state name -> module), right after the
        epoch's evaluation. True when the epoch is the best so far."""
        if self.best is not None and not self.head.selects(rec.val, self.best.val):
            rec.outputs = None  # predictions are held for the best epoch only, not for every record
            return False
        if self.best is not None:
            self.best.outputs = None
        self.best = rec
        self.states = {name: _copy(m) for name, m in models.items()}
        if self.folder is not None:
            self._write_states()
            self._write_outputs()
            write_atomic(self.folder / BEST, json.dumps({"epoch": rec.epoch, "val": rec.val}).encode())
        return True

    def _write_states(self) -> None:
        private_dir(self.folder)
        for name, state in self.states.items():
            buf = io.BytesIO()
            torch.save(state, buf)
            write_atomic(self.folder / f"{name}.pt", buf.getvalue())

    def _write_outputs(self) -> None:
        if self.best.outputs is not None:
            write_outputs(self.folder, self.best.outputs)

    def write(self, run_dir: Path, manifest: Callable[[int], dict]) -> Path:
        """The kept states (those held) and ``manifest(best epoch)`` into <run_dir>/kept."""
        if self.best is None:
            raise KeptError("no epoch was evaluated: nothing to keep")
        on_disk = self.folder is not None  # the Flower engine wrote each improvement already
        self.folder = Path(run_dir) / KEPT
        if self.states and not on_disk:
            self._write_states()
            self._write_outputs()
        write_atomic(self.folder / MANIFEST, json.dumps(manifest(self.best.epoch), indent=2).encode())
        return self.folder


def attempt_id(run_dir: Path) -> str:
    """The id of the run folder's training attempt, made at its first keep: a fresh run starts
    without kept/ (app/run_status.py sets a finished run's aside, with its id), a resumed run goes
    on with its own. Each secondary keeps its states under it (:func:`party_kept_file`), so the
    keeps of a rerun that fails never replace those of the finished run put back in its place."""
    path = Path(run_dir) / KEPT / ATTEMPT
    if not path.exists():
        private_dir(path.parent)
        write_atomic(path, secrets.token_hex(8).encode())
    return kept_attempt(run_dir)


def kept_attempt(run_dir: Path) -> str:
    """The attempt whose states the run keeps; "" for a run kept before attempts were recorded."""
    path = Path(run_dir) / KEPT / ATTEMPT
    return path.read_text().strip() if path.exists() else ""


ATTEMPT_ID = re.compile(r"[0-9a-f]{16}")  # attempt_id's: 8 secret bytes in hex
_STATE_FILE = re.compile(r"(kept|model)-[0-9a-f]{16}\.pt")  # an attempt's state in a secondary's folder


def _checked(attempt: str) -> str:
    """``attempt`` when it is "" (none) or an attempt's id; anything else (a primary's other name)
    is refused, so that only an attempt's files are made and dropped in a party's folder."""
    if attempt and not ATTEMPT_ID.fullmatch(attempt):
        raise ProtocolError(f"attempt {attempt!r} is not a training attempt's id (16 hex digits)")
    return attempt


def party_kept_file(attempt: str) -> str:
    """A secondary's kept state of ``attempt`` in its model folder of the run."""
    return f"kept-{attempt}.pt" if _checked(attempt) else "kept.pt"


def party_model_file(attempt: str) -> str:
    """A secondary's final state at the finish of ``attempt``, in its model folder of the run:
    a rerun that fails after its finish leaves the finished run's beside it."""
    return f"model-{attempt}.pt" if _checked(attempt) else "model.pt"


ATTEMPT_KEYS = ("attempt", "previous")  # the fields of a keep and a finish naming the kept states that stay


def kept_attempts(run_dir: Path, make: bool = False) -> dict[str, str]:
    """The attempts whose kept states each secondary holds for the run, sent with every keep and
    finish: this ``attempt``'s (``make``: made at the run's first keep, :func:`attempt_id`) and the
    ``previous`` one's, the finished run this one would replace (set aside until this run is marked
    finished, after the secondaries' finish: app/run_status.py), which a failure puts back; ""
    where there is none. The party drops every other (:func:`drop_other_attempts`), so no name a
    primary sends piles states up on its disk."""
    attempt = attempt_id(run_dir) if make else kept_attempt(run_dir)
    return {"attempt": attempt, "previous": kept_attempt(Path(run_dir) / PREVIOUS)}


def attempt_fields(attempts: dict[str, str]) -> dict[str, str]:
    """``attempts`` as a message's fields: the ones there are ("" is none, sent as no field)."""
    return {k: v for k, v in attempts.items() if v}


def drop_other_attempts(folder: Path, keep: dict[str, str]) -> None:
    """A secondary's kept and final states of the run's attempts other than those ``keep`` names
    (:func:`kept_attempts`: an attempt that failed, an older finished run) leave its model
    folder of the run: ``kept-<id>.pt``, ``model-<id>.pt`` and a run's ``kept.pt`` from before
    attempts. Nothing else in it is touched: not a ``model.pt`` (the final state of a run finished
    before final states were named for their attempt, which a rerun's failure puts back), nor a
    file of another name."""
    wanted = {name(a) for a in keep.values() for name in (party_kept_file, party_model_file)}
    for path in Path(folder).glob("*.pt"):
        ours = path.name == "kept.pt" or _STATE_FILE.fullmatch(path.name)
        if ours and path.name not in wanted:
            path.unlink(missing_ok=True)


def read_manifest(run_dir: Path) -> dict:
    """federation.json; refused by name when the run kept none."""
    folder = Path(run_dir) / KEPT
    if not (folder / MANIFEST).exists():
        raise KeptError(
            f"run {Path(run_dir)} has no kept federation ({folder / MANIFEST} is missing): it did not "
            "finish, or it was trained before runs kept their best epoch; train it again"
        )
    return read_json(folder / MANIFEST)


def write_outputs(folder: Path, outputs: dict[str, dict[str, np.ndarray]]) -> None:
    """The best epoch's predictions on validation and test (strategies/records.py eval_part), as
    ``folder``/outputs.npz: what an ensemble of runs is scored from (app/vfl/ensemble.py)."""
    buf = io.BytesIO()
    np.savez(buf, **{f"{part}_{k}": v for part, kept in outputs.items() for k, v in kept.items()})
    write_atomic(Path(folder) / OUTPUTS, buf.getvalue())


def read_outputs(run_dir: Path) -> dict[str, dict[str, np.ndarray]]:
    """A finished run's kept predictions (:func:`write_outputs`): {"val": {"rows", "values", "y"[,
    "proba"]}, "test": {...}}; refused by name when it kept none."""
    path = Path(run_dir) / KEPT / OUTPUTS
    if not path.exists():
        raise KeptError(f"run {run_dir} kept no evaluation outputs ({path}): it was trained by an older version")
    out: dict[str, dict[str, np.ndarray]] = {}
    with np.load(path) as z:
        for key in z.files:
            part, name = key.split("_", 1)
            out.setdefault(part, {})[name] = z[key]
    return out


def trained_values(meta: dict) -> dict[str, object]:
    """A kept run's run config (its manifest ``meta``) as Flower's run-config table holds it
    (dashed keys): what a predict run of it starts from."""
    return {k.replace("_", "-"): v for k, v in RunConfig.of(**meta["run"]).flat().items()}


def load_states(folder: Path, names: list[str]) -> dict[str, dict[str, torch.Tensor]]:
    """{name: state dict} of the kept states ``names``; refused by name when one is missing."""
    missing = [n for n in names if not (folder / f"{n}.pt").exists()]
    if missing:
        raise KeptError(f"kept federation {folder} lacks the state of {missing}")
    return {n: _state(folder / f"{n}.pt") for n in names}


def _state(path: Path) -> dict[str, torch.Tensor]:
    """One kept state; a file cut short or not a saved state is refused naming it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch's reader, pickle's end of file or refusal, a KeyError: all named
        raise KeptError(f"{path} is not a whole saved state ({type(e).__name__}: {str(e)[:200]})") from None


# ---------------------------------------------------------------------------- predictions out


def predict_mode_files(cfg) -> tuple[Path, Path]:
    """The predict mode's (input, output) from its run config (the ServerApp of either training
    mode): resolved, refused when they are one file, and any older output removed, so that
    whatever happens it cannot pass for this run's (`fedsim predict` writes a fresh name and
    renames it only when whole: app/predict_files.py)."""
    src, out = Path(cfg.predict.input).expanduser().resolve(), Path(cfg.predict.output).expanduser().resolve()
    if src == out:
        raise KeptError(f"run-config 'predict-output' names the input {src}")
    out.unlink(missing_ok=True)
    return src, out


def write_csv(frame: "pd.DataFrame", out: Path) -> None:
    """All of it or nothing at ``out`` (atomic rename), with the usual permissions."""
    buf = io.StringIO()
    frame.to_csv(buf, index=False)
    write_atomic(Path(out), buf.getvalue().encode())


def predict_command(
    out: Path,
    source: Path,
    body: Callable,
    read: Callable | None = None,
    check: Callable[[], object] | None = None,
) -> int:
    """A predict command's outcome as its exit status (app/predict_files.py states the rule):
    ``out`` may not be the input ``source`` (exit 2); ``check()``, the run (exit 1 on an error);
    ``read()``, the input, read and checked before anything runs (exit 2 on an error);
    ``body(read())`` (or ``body()`` without ``read``) predicts, writes ``out`` atomically and
    returns the closing line (stdout); an error: exit 1. A failed predict leaves an older file at
    ``out`` byte-identical, and its message says so."""
    refused = output_refusal(out, source)
    if refused:
        print(f"predict refused: {refused}", file=sys.stderr)
        return 2
    try:
        if check is not None:
            check()
    except Exception as exc:  # no usable run: named
        print(f"predict failed: {type(exc).__name__}: {exc}{left_note(out)}", file=sys.stderr)
        return 1
    try:
        data = read() if read is not None else None
    except Exception as exc:  # bad input: named, before anything ran
        print(f"predict refused: {type(exc).__name__}: {exc}{left_note(out)}", file=sys.stderr)
        return 2
    try:
        line = body(data) if read is not None else body()
    except Exception as exc:  # the outcome is the exit status, with the reason
        print(f"predict failed: {type(exc).__name__}: {exc}{left_note(out)}", file=sys.stderr)
        return 1
    print(line)
    return 0
