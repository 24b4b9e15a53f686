"""The names of a run folder's files, on their own: the status reader (app/run_status.py) needs
them without the training stack app/run_record.py brings (torch); and how its JSON is read."""

import json
from pathlib import Path

CONFIG, METRICS, SUMMARY = "config.json", "metrics.jsonl", "summary.json"
LOSSES, MODEL, PROGRESS, SPLIT = "step_losses.npy", "primary_model.pt", "progress.json", "split.csv"
ID_MATCHES = "id_matches.npz"  # Entity Augmentation's guests met by their ids (app/entity_aug/id_exchange.py)
WRITTEN = (SUMMARY, METRICS, LOSSES, MODEL, CONFIG, PROGRESS, SPLIT)  # what every finished run writes
FILES = (*WRITTEN, ID_MATCHES)  # what a fresh run replaces (app/run_status.py): those, and what some runs write
YARDSTICK = "yardstick.json"  # written after the run by `fedsim train` (fedsim/yardstick.py)
SEARCH, SEARCH_RUNS = "search.json", "search"  # `fedsim train`'s recipe search: its record, its candidates'
ENSEMBLE = "ensemble.json"  # `fedsim train`'s ensemble of the run and its members (fedsim/ensemble_step.py)
CURVE, GATE = "learning_curve.png", "weight_gate.png"  # `fedsim report`'s plots (fedsim/report.py)
# files a command derives from a finished run: replaced with the run
DERIVED = (YARDSTICK, SEARCH, ENSEMBLE, CURVE, GATE)


def read_json(path: Path, lines: bool = False) -> object:
    """The JSON in the run's file ``path`` (``lines``: a list, one value per line, as metrics.jsonl);
    one that is not whole JSON is a ValueError naming it."""
    text = Path(path).read_text()
    try:
        return [json.loads(line) for line in text.splitlines()] if lines else json.loads(text)
    except ValueError as e:
        raise ValueError(f"{path} is not whole JSON ({e}): was the run folder edited or copied part-way?") from None


CHECKPOINT = "checkpoint"  # the run's checkpoints (app/vfl/checkpoint.py; a simulation's parties' beside the primary's)
# likewise: the kept federation of the best epoch (app/vfl/kept.py), the search's, the checkpoints
FOLDERS = ("kept", SEARCH_RUNS, CHECKPOINT)
