"""The recipe search of `fedsim train` on a user's own parties: which input encoding, method and
attention start to train with, chosen on the user's validation rows alone.

Each candidate (:data:`CANDIDATES`, in the order of the evidence from the built-in data sets)
is trained in this process (federated == one process) on ``folds`` splits that share the run's
test rows and differ only in which tenth of the other rows validates (run-config ``val-fold``,
datasets/base.py split_primary); its score is the mean over the folds of its best validation
value, so two tenths of the rows choose instead of one. The test metrics the runs record are
never read here (:func:`choose` takes validation values only). The chosen candidate's fold-0 run
is the usual split's run: in process it becomes the run itself (:func:`promote`), so the search
costs ``candidates x folds - 1`` runs beyond the run; otherwise the run is trained again through
Flower with the chosen values.

The budget is counted in runs (each about a single run's time: the same rows train), stated
before the first one starts; ``budget // folds`` candidates fit, and under two no search is made.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from linkage.private import private_dir
from linkage.store import write_atomic

FOLDS = 2  # validation folds per candidate: the usual tenth and the one before it
DEFAULT_BUDGET = 4  # runs: 2 candidates x 2 folds; in process one of them is the run itself
RECORD = "search.json"  # in the run folder: the plan, every candidate's scores, the choice
SEARCHED = ("method", "input-scale", "attention-start")  # the run-config keys a candidate sets


@dataclass(frozen=True)
class Candidate:
    """One recipe: the run-config values it sets, and why it is on the list."""

    name: str
    values: dict = field(hash=False)
    why: str = ""


# In the order the built-in data sets' validation evidence puts them (docs/fedsim-attn.md): ple
# inputs won on both seeds of all four, fedsim_attn led every federated baseline, and the silent
# start (the paper's FedSim at its first step) was chosen on two of the four. The paper's FedSim
# itself and the earlier standard inputs follow.
CANDIDATES = (
    Candidate("attn-ple", {"method": "fedsim_attn", "input-scale": "ple"}, "fedsim_attn, ple inputs, Top1Sim start"),
    Candidate(
        "attn-silent-ple",
        {"method": "fedsim_attn", "input-scale": "ple", "attention-start": "silent"},
        "fedsim_attn, ple inputs, starting at the paper's FedSim",
    ),
    Candidate("fedsim-ple", {"method": "fedsim", "input-scale": "ple"}, "the paper's FedSim, ple inputs"),
    Candidate(
        "attn-standard", {"method": "fedsim_attn", "input-scale": "standard"}, "fedsim_attn, standardised inputs"
    ),
)


@dataclass(frozen=True)
class Plan:
    candidates: tuple[Candidate, ...]
    folds: int
    budget: int

    @property
    def runs(self) -> int:
        return len(self.candidates) * self.folds

    def text(self, in_process: bool) -> str:
        names = ", ".join(c.name for c in self.candidates)
        then = (
            "the chosen one's first run is the run itself"
            if in_process
            else "then the run itself is trained through Flower with the chosen one"
        )
        return (
            f"recipe search: {len(self.candidates)} candidate(s) ({names}) x {self.folds} validation folds = "
            f"{self.runs} runs in this process, each about one run's time (budget {self.budget}); {then}"
        )


def plan(given: dict, budget: int, folds: int = FOLDS) -> Plan | None:
    """The candidates the budget affords, with the keys the user set (``given``) held at their
    value (candidates that then coincide are one); None when fewer than two remain."""
    seen, kept = set(), []
    for c in CANDIDATES:
        values = {**c.values, **{k: given[k] for k in SEARCHED if k in given}}
        if values["method"] != "fedsim_attn":
            values.pop("attention-start", None)
        key = tuple(sorted(values.items()))
        if key not in seen:
            seen.add(key)
            kept.append(Candidate(c.name, values, c.why))
    kept = kept[: budget // folds]
    return Plan(tuple(kept), folds, budget) if len(kept) >= 2 else None


@dataclass
class Outcome:
    """One candidate's runs: each fold's best validation value, or why the run failed."""

    candidate: Candidate
    metric: str = ""  # the runs' key metric: rmse (lower is better) or accuracy
    val: dict[int, float] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0

    def score(self) -> float:
        return sum(self.val.values()) / len(self.val) if self.val and not self.failed else math.nan


def better(a: float, b: float, lower: bool) -> bool:
    if math.isnan(a) or math.isnan(b):
        return not math.isnan(a)
    return a < b if lower else a > b


def choose(outcomes: list[Outcome]) -> Outcome | None:
    """The candidate with the best mean validation value over its folds (the first on ties);
    None when every candidate failed. Reads validation values only."""
    lower = any(o.metric == "rmse" for o in outcomes)
    best = None
    for o in outcomes:
        if not math.isnan(o.score()) and (best is None or better(o.score(), best.score(), lower)):
            best = o
    return best


Trainer = Callable[[dict, Path], dict]  # (run-config values, run folder) -> its summary.json


def search(p: Plan, values: dict, out: Path, prefix: str, train: Trainer, say=print) -> list[Outcome]:
    """Every candidate on every fold, fold by fold, each run ``out``/<prefix>-<candidate>-f<fold>
    (beside the run, sharing its linkage and the in-process service's secrets)."""
    outcomes = [Outcome(c) for c in p.candidates]
    n = 0
    for fold in range(p.folds):
        for o in outcomes:
            n += 1
            name = run_name(prefix, o.candidate, fold)
            say(f"search [{n}/{p.runs}] {o.candidate.name} ({o.candidate.why}), validation fold {fold}")
            t0 = time.monotonic()
            run = {**values, **o.candidate.values, "val-fold": fold, "run-name": name, "out-dir": str(out)}
            try:
                summary = train(run, out / name)
                o.metric = key_metric(summary)
                o.val[fold] = float(summary["val"][o.metric])
                say(f"  {o.metric} {o.val[fold]:.4f} on validation fold {fold}")
            except Exception as e:  # noqa: BLE001 - a failed candidate is recorded, the others go on
                o.failed[fold] = f"{type(e).__name__}: {e}"
                say(f"  failed: {o.failed[fold]}")
            o.seconds += time.monotonic() - t0
    return outcomes


def run_name(prefix: str, candidate: Candidate, fold: int) -> str:
    return f"{prefix}-{candidate.name}-f{fold}"


def key_metric(summary: dict) -> str:
    """The metric the run chose its epoch by: rmse (regression) or accuracy."""
    return "rmse" if "rmse" in summary["val"] else "accuracy"


def record(p: Plan, outcomes: list[Outcome], chosen: Outcome | None) -> dict:
    """What search.json keeps: the plan, each candidate's values and scores, the choice."""
    metric = next((o.metric for o in outcomes if o.metric), "key metric")
    return {
        "rule": f"the best mean validation {metric} over {p.folds} folds sharing the run's test rows "
        "(test metrics are not read); ties keep the earlier candidate",
        "budget_runs": p.budget,
        "runs": p.runs,
        "candidates": [
            {
                "name": o.candidate.name,
                "why": o.candidate.why,
                "values": o.candidate.values,
                "val_by_fold": {str(k): v for k, v in sorted(o.val.items())},
                "failed": {str(k): v for k, v in sorted(o.failed.items())},
                "score": None if math.isnan(o.score()) else o.score(),
                "seconds": round(o.seconds, 1),
            }
            for o in outcomes
        ],
        "chosen": None if chosen is None else chosen.candidate.name,
        "chosen_values": None if chosen is None else chosen.candidate.values,
    }


def promote(run: Path, run_dir: Path) -> None:
    """The chosen candidate's fold-0 run becomes ``run_dir``: moved, and the run name and folder
    it records made the run's own (its config and its kept federation's manifest). A finished
    run already under that name is replaced only now, once the new one has finished."""
    aside = run_dir.parent / f".replaced-{run_dir.name}"
    if run_dir.exists():
        run_dir.rename(aside)
    run.rename(run_dir)
    shutil.rmtree(aside, ignore_errors=True)
    for path in (run_dir / "config.json", run_dir / "kept" / "federation.json"):
        if path.exists():
            data = _renamed(json.loads(path.read_text()), run_dir)
            write_atomic(path, (json.dumps(data, indent=2) + "\n").encode())


def _renamed(data, run_dir: Path):
    if isinstance(data, dict):
        return {
            k: run_dir.name if k == "run_name" else str(run_dir.parent) if k == "out_dir" else _renamed(v, run_dir)
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [_renamed(v, run_dir) for v in data]
    return data


def keep_evidence(runs: list[Path], run_dir: Path) -> None:
    """The other candidates' records (config, metrics, summary, status) under ``run_dir``/search,
    their run folders removed: only the chosen one predicts."""
    kept = private_dir(run_dir / "search")
    for run in runs:
        if not run.is_dir():
            continue
        private_dir(kept / run.name)
        for name in ("config.json", "metrics.jsonl", "summary.json", "status.json"):
            if (run / name).exists():
                shutil.copy2(run / name, kept / run.name / name)
        shutil.rmtree(run)
