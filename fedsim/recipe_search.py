"""The recipe search of `fedsim train` on a user's own parties: which method and input encoding
to train with, chosen on the user's validation rows alone.

Candidates (:data:`CANDIDATES`, in order) are trained in this process (federated == one process)
on splits that share the run's test rows and differ only in which tenth of the other rows
validates (run-config ``val-fold``, datasets/base.py split_primary): every candidate on fold 0,
the better half of them (at least two) on fold 1 as well. The choice is the finalist with the
best mean validation value over both folds: two tenths of the rows choose instead of one. The
test metrics the runs record are never read here (:func:`choose` and :func:`finalists` take
validation values only). The chosen candidate's fold-0 run is the usual split's run: in process
it becomes the run itself (:func:`promote`); otherwise the run is trained again through Flower
with the chosen values.

The budget is counted in runs (each about a single run's time: the same number of rows train),
stated before the first one starts: the most candidates whose runs fit (:meth:`Plan.runs`); under
two no search is made.
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


# The order: the inputs as the parties declared them (standard unless a party's parties.toml says
# otherwise) under the two methods, fedsim_attn and the paper's FedSim (ahead of fedsim_attn in 4 of
# 5 seeds on a housing set nobody tuned for); then piecewise-linear inputs, which won on validation
# on all four built-in data sets but lost on both own-data sets it was tried on (docs/own-data.md).
CANDIDATES = (
    Candidate("attn", {"method": "fedsim_attn"}, "fedsim_attn, the inputs as declared"),
    Candidate("fedsim", {"method": "fedsim"}, "the paper's FedSim, the inputs as declared"),
    Candidate("attn-ple", {"method": "fedsim_attn", "input-scale": "ple"}, "fedsim_attn, piecewise-linear inputs"),
    Candidate("fedsim-ple", {"method": "fedsim", "input-scale": "ple"}, "the paper's FedSim, piecewise-linear inputs"),
)


@dataclass(frozen=True)
class Plan:
    candidates: tuple[Candidate, ...]
    folds: int
    budget: int

    @property
    def finalists(self) -> int:
        """How many candidates go on to the later folds: the better half of the first, at least two."""
        return min(len(self.candidates), max(2, math.ceil(len(self.candidates) / 2)))

    @property
    def runs(self) -> int:
        return len(self.candidates) + (self.folds - 1) * self.finalists

    def text(self, in_process: bool) -> str:
        names = ", ".join(c.name for c in self.candidates)
        then = (
            "the chosen one's first run is the run itself"
            if in_process
            else "then the run itself is trained through Flower with the chosen one"
        )
        halving = (
            "" if self.finalists == len(self.candidates) else f", the best {self.finalists} of the first on the rest"
        )
        return (
            f"recipe search: {len(self.candidates)} candidate(s) ({names}) on {self.folds} validation folds{halving}: "
            f"{self.runs} runs in this process, each about one run's time (budget {self.budget}); {then}"
        )


def plan(given: dict, budget: int, folds: int = FOLDS) -> Plan | None:
    """The most candidates whose runs the budget affords, with the keys the user set (``given``)
    held at their value (candidates that then coincide are one); None when fewer than two."""
    seen, kept = set(), []
    for c in CANDIDATES:
        values = {**c.values, **{k: given[k] for k in SEARCHED if k in given}}
        if values["method"] != "fedsim_attn":
            values.pop("attention-start", None)
        key = tuple(sorted(values.items()))
        if key not in seen:
            seen.add(key)
            kept.append(Candidate(c.name, values, c.why))
    fits = [n for n in range(2, len(kept) + 1) if Plan(tuple(kept[:n]), folds, budget).runs <= budget]
    return Plan(tuple(kept[: max(fits)]), folds, budget) if fits else None


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


def choose(outcomes: list[Outcome], folds: int = FOLDS) -> Outcome | None:
    """Among the candidates run on every fold, the best mean validation value (the first on
    ties); None when none was. Reads validation values only."""
    lower = any(o.metric == "rmse" for o in outcomes)
    best = None
    for o in outcomes:
        if len(o.val) < folds:
            continue
        if not math.isnan(o.score()) and (best is None or better(o.score(), best.score(), lower)):
            best = o
    return best


Trainer = Callable[[dict, Path], dict]  # (run-config values, run folder) -> its summary.json


def search(p: Plan, values: dict, out: Path, prefix: str, train: Trainer, say=print) -> list[Outcome]:
    """Every candidate on fold 0, then the best :attr:`Plan.finalists` of them on each later fold;
    each run ``out``/<prefix>-<candidate>-f<fold> (beside the run, sharing its linkage and the
    in-process service's secrets)."""
    outcomes = [Outcome(c) for c in p.candidates]
    n = 0
    for fold in range(p.folds):
        for o in outcomes if fold == 0 else finalists(outcomes, p.finalists):
            n += 1
            say(f"search [{n}/{p.runs}] {o.candidate.name} ({o.candidate.why}), validation fold {fold}")
            _train_one(o, fold, {**values, "out-dir": str(out)}, run_name(prefix, o.candidate, fold), train, say)
    return outcomes


def finalists(outcomes: list[Outcome], n: int) -> list[Outcome]:
    """The ``n`` best on fold 0 (validation values only; failed ones last), in the list's order."""
    lower = any(o.metric == "rmse" for o in outcomes)
    ranked = sorted(outcomes, key=lambda o: _rank(o.val.get(0, math.nan), lower))  # stable: ties keep the order
    best = {id(o) for o in ranked[:n]}
    return [o for o in outcomes if id(o) in best]


def _rank(value: float, lower: bool) -> float:
    return math.inf if math.isnan(value) else value if lower else -value


def _train_one(o: Outcome, fold: int, values: dict, name: str, train: Trainer, say) -> None:
    t0 = time.monotonic()
    run = {**values, **o.candidate.values, "val-fold": fold, "run-name": name}
    try:
        summary = train(run, Path(values["out-dir"]) / name)
        o.metric = key_metric(summary)
        o.val[fold] = float(summary["val"][o.metric])
        say(f"  {o.metric} {o.val[fold]:.4f} on validation fold {fold}")
    except Exception as e:  # noqa: BLE001 - a failed candidate is recorded, the others go on
        o.failed[fold] = f"{type(e).__name__}: {e}"
        say(f"  failed: {o.failed[fold]}")
    o.seconds += time.monotonic() - t0


def run_name(prefix: str, candidate: Candidate, fold: int) -> str:
    return f"{prefix}-{candidate.name}-f{fold}"


def key_metric(summary: dict) -> str:
    """The metric the run chose its epoch by: rmse (regression) or accuracy."""
    return "rmse" if "rmse" in summary["val"] else "accuracy"


def record(p: Plan, outcomes: list[Outcome], chosen: Outcome | None) -> dict:
    """What search.json keeps: the plan, each candidate's values and scores, the choice."""
    metric = next((o.metric for o in outcomes if o.metric), "key metric")
    return {
        "rule": f"the best mean validation {metric} over {p.folds} folds sharing the run's test rows, among the "
        f"{p.finalists} best on fold 0 (test metrics are not read); ties keep the earlier candidate",
        "budget_runs": p.budget,
        "runs": p.runs,
        "folds": p.folds,
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


def lines(rec: dict) -> list[str]:
    """search.json in words: each candidate's validation value per fold and its mean, the choice."""
    if "candidates" not in rec:
        return [f"recipe search: {rec.get('plan', 'none')}"]
    out = [f"recipe search ({rec['runs']} runs; {rec['rule']}):"]
    for c in rec["candidates"]:
        folds = ", ".join(f"{v:.4f}" for v in c["val_by_fold"].values())
        score = (
            "failed: " + "; ".join(c["failed"].values())
            if c["failed"]
            else f"mean {c['score']:.4f} ({folds})"
            if len(c["val_by_fold"]) == rec["folds"]
            else f"fold 0 only: {folds}"
        )
        mark = "  <- chosen" if c["name"] == rec["chosen"] else ""
        out.append(f"  {c['name']:16s} {score}  {c['why']}{mark}")
    return out


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
