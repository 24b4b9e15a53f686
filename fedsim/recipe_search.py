"""The recipe search of `fedsim train` on a user's own parties: which method and input encoding
to train with, chosen on the user's own rows, never on their test rows.

Each candidate (:data:`CANDIDATES`, in order) is trained once in this process (federated == one
process) on a search split (run-config ``search-fold`` 1, datasets/base.py split_primary): the
usual validation tenth A and another tenth B taken from the training rows are both held out,
and the real test rows are in no part of the run at all. The run evaluates A (its validation)
and B (its "test") after every epoch; the candidate's score is :func:`cross_score`: B's metric
at the epoch A prefers and A's at the epoch B prefers, averaged, in the value the run chooses its
epoch on (rmse; a classifier's log loss, as it stops early). No half scores the epoch it
chose itself, so a candidate whose curve wobbles gains nothing from a lucky epoch (a best value
over 100-200 epochs, read on the rows that chose it, is biased exactly that way). The best score
wins (the earlier candidate on ties); the run itself is then trained with its values, through
the engine the user chose.

Every candidate stops early as a run on own data does (patience ``UNTUNED_PATIENCE`` unless the
user set one): on a built-in set, whose run trains a fixed number of epochs, its candidates still
stop when validation does (a classifier's on its log loss, a finer score than 150 rows'
accuracy), and train at most two thirds of the run's epochs (:func:`candidate_epochs`), so the
search stays under 3x a run there too.

The budget is counted in runs (each about a single run's time): the run itself, the candidates,
and beyond the default's three candidates more members of the chosen recipe (an ensemble,
fedsim/ensemble_step.py) before the other candidates (:func:`plan`), stated before the first one
starts; under two candidates no search is made.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from app.config import UNTUNED_PATIENCE
from app.run_files import SEARCH, SEARCH_RUNS
from app.run_record import read_metrics
from files.private import private_dir
from strategies.heads import better

SEARCH_FOLD = 1  # the search split: the usual validation tenth and the one before it held out
DEFAULT_BUDGET = 4  # runs: 3 candidates and the run itself
SEARCHED_FIRST = 3  # candidates before any ensemble member: the default budget's
# more members of the chosen recipe a budget buys before the fourth candidate: an ensemble of at
# most 3 (the size measured). On house the six candidates chose what the first three did in every
# seed ("The attention's start searched too"); three members gained on validation on house (5 of 5
# seeds) and game (3 of 5, level in 1) (docs/fedsim-attn.md "Ensembles of members")
ENSEMBLE_MOST = 2
RECORD = SEARCH  # in the run folder: the plan, every candidate's scores, the choice
SEARCHED = ("method", "input-scale", "attention-start")  # the run-config keys a candidate sets


@dataclass(frozen=True)
class Candidate:
    """One recipe: the run-config values it sets, and why it is on the list."""

    name: str
    values: dict = field(hash=False)
    why: str = ""


# The order: the inputs as the parties declared them (standard unless a party's parties.toml says
# otherwise) under the two methods, fedsim_attn (ahead on validation on five of six built-in
# tables) and the paper's FedSim; then piecewise-linear inputs, which won on validation on all
# four built-in data sets (docs/fedsim-attn.md); then, for a budget beyond the default, the
# attention's silent start (the model starts as the paper's FedSim; the choice made by hand on
# house's and game's validation).
SILENT = {"method": "fedsim_attn", "attention-start": "silent"}
CANDIDATES = (
    Candidate("attn", {"method": "fedsim_attn"}, "fedsim_attn, the inputs as declared"),
    Candidate("fedsim", {"method": "fedsim"}, "the paper's FedSim, the inputs as declared"),
    Candidate("attn-ple", {"method": "fedsim_attn", "input-scale": "ple"}, "fedsim_attn, piecewise-linear inputs"),
    Candidate("fedsim-ple", {"method": "fedsim", "input-scale": "ple"}, "the paper's FedSim, piecewise-linear inputs"),
    Candidate("attn-silent", SILENT, "fedsim_attn started silent, the inputs as declared"),
    Candidate("attn-ple-silent", {**SILENT, "input-scale": "ple"}, "fedsim_attn started silent, piecewise-linear"),
)


@dataclass(frozen=True)
class Plan:
    candidates: tuple[Candidate, ...]
    budget: int
    epochs: int = 0  # > 0: each candidate's most epochs (a fixed-epoch run's, :func:`candidate_epochs`)
    members: int = 0  # runs of the chosen recipe after the run itself: an ensemble of 1 + members

    @property
    def runs(self) -> int:
        return len(self.candidates) + 1 + self.members  # and the run itself

    def text(self, in_process: bool) -> str:
        engine = "in this process" if in_process else "through Flower"
        names = ", ".join(c.name for c in self.candidates)
        search = (
            f"{len(self.candidates)} candidate(s) ({names}), one run each in this process on the run's training "
            f"rows with two tenths held out (its test rows unused), then the run itself {engine}"
            if self.candidates
            else f"no candidates (the keys you set leave one recipe), the run itself {engine}"
        )
        ensemble = (
            f", then {self.members} more member(s) of it alike (an ensemble of up to {self.members + 1}: the size "
            "best on validation)"
            if self.members
            else ""
        )
        more = (
            f"; --budget {self.runs + ENSEMBLE_MOST} adds {ENSEMBLE_MOST} members of the chosen recipe, kept as an "
            "ensemble where validation prefers it"
            if not self.members
            else ""
        )
        return f"recipe search: {search}{ensemble}: {self.runs} runs, {self._each()} (budget {self.budget}{more})"

    def _each(self) -> str:
        if self.epochs and self.candidates:
            return f"each candidate at most {self.epochs} epoch(s), two thirds of the run's"
        return "each about one run's time"


def candidate_epochs(epochs: int, patience: int) -> int:
    """A candidate's most epochs for a run of ``epochs`` with ``patience`` (resolved): a run that
    trains fixed epochs (patience 0) gives each candidate two thirds of them, so three candidates
    on 6/7 of its training rows and the run itself cost at most 3 x 6/7 x 2/3 + 1 = 2.7 runs; a
    run that stops early caps nothing (0), its candidates stop as it does."""
    return 0 if patience > 0 else max(1, 2 * epochs // 3)


def plan(given: dict, budget: int, epochs: int = 0) -> Plan | None:
    """What ``budget`` runs afford beside the run itself: the first :data:`SEARCHED_FIRST`
    candidates, then up to :data:`ENSEMBLE_MOST` more members of the run (an ensemble), then
    the other candidates; with the keys the user set (``given``) held at their value (candidates
    that then coincide are one; when one is left there is nothing to search and the budget goes to
    members), each candidate of at most ``epochs`` (0: no cap). None when it affords neither a
    choice between two candidates nor a member."""
    distinct = _distinct(given)
    searchable = distinct if len(distinct) >= 2 else []
    first = searchable[: min(SEARCHED_FIRST, budget - 1)]
    if len(first) < 2 and searchable:
        return None  # a budget under three runs: no choice, and no ensemble before the search is afforded
    spare = budget - 1 - len(first)
    members = max(0, min(ENSEMBLE_MOST, spare))
    rest = searchable[len(first) : len(first) + spare - members]
    if not first and not members:
        return None
    return Plan(tuple(first + rest), budget, epochs, members)


def _distinct(given: dict) -> list[Candidate]:
    """:data:`CANDIDATES` with the user's keys held (those that then coincide are one)."""
    seen, kept = set(), []
    named = {tuple(sorted(c.values.items())): c for c in CANDIDATES}  # a candidate is named for what it trains
    for c in CANDIDATES:
        values = {**c.values, **{k: given[k] for k in SEARCHED if k in given}}
        if values["method"] != "fedsim_attn":
            values.pop("attention-start", None)
        key = tuple(sorted(values.items()))
        if key not in seen:
            seen.add(key)
            like = named.get(key)
            kept.append(Candidate(like.name, values, like.why) if like else Candidate(c.name, values, _held(c, given)))
    return kept


def _held(c: Candidate, given: dict) -> str:
    """A candidate's description when the user's keys changed it into none of :data:`CANDIDATES`."""
    held = ", ".join(f"{k} = {given[k]}" for k in SEARCHED if k in given)
    return f"{c.why}, with {held} as set"


@dataclass
class Outcome:
    """One candidate's run: its cross-fitted score and the epochs each half chose, or why it failed."""

    candidate: Candidate
    metric: str = ""  # what the run selected on: rmse, log_loss (lower is better) or accuracy
    score: float = math.nan
    epochs: dict = field(default_factory=dict)  # {"A": epoch A chose, "B": epoch B chose}
    failed: str = ""
    seconds: float = 0.0


def cross_score(rows: list[dict], key: str) -> tuple[str, float, dict]:
    """(key, score, epochs) from a search run's metrics.jsonl rows and the validation value its
    run selected on (``key``: its summary's stopping.selected_on): B's ("test") value at the epoch
    A ("val") prefers and A's at the epoch B prefers, averaged (first epoch on ties)."""

    def best(part: str) -> dict:
        top = rows[0]
        for r in rows[1:]:
            if better(r[part][key], top[part][key], key):
                top = r
        return top

    by_a, by_b = best("val"), best("test")
    score = (by_a["test"][key] + by_b["val"][key]) / 2
    return key, score, {"A": by_a["epoch"], "B": by_b["epoch"]}


def choose(outcomes: list[Outcome]) -> Outcome | None:
    """The best cross-fitted score (the first on ties); None when every candidate failed."""
    best = None
    for o in outcomes:
        if not math.isnan(o.score) and (best is None or better(o.score, best.score, o.metric)):
            best = o
    return best


Trainer = Callable[[dict, Path], None]  # (run-config values, run folder): trains it, raises on failure


def search(p: Plan, values: dict, out: Path, prefix: str, train: Trainer, say=print) -> list[Outcome]:
    """Each candidate's search run, ``out``/<prefix>-<candidate> (beside the run, sharing its
    linkage and the in-process service's secrets), scored from its metrics.jsonl."""
    outcomes = []
    for n, c in enumerate(p.candidates, 1):
        say(f"search [{n}/{len(p.candidates)}] {c.name} ({c.why})")
        o, t0, name = Outcome(c), time.monotonic(), run_name(prefix, c)
        run = {**values, **c.values, "search-fold": SEARCH_FOLD, "run-name": name, "out-dir": str(out)}
        run.setdefault("patience", UNTUNED_PATIENCE)  # as on own data, on a fixed-epoch built-in set too
        if p.epochs:
            run["epochs"] = p.epochs
        try:
            train(run, out / name)
            selected_on = json.loads((out / name / "summary.json").read_text())["stopping"]["selected_on"]
            o.metric, o.score, o.epochs = cross_score(read_metrics(out / name), selected_on)
            say(f"  {o.metric} {o.score:.4f} (each held-out tenth at the epoch the other chose)")
        except Exception as e:  # noqa: BLE001 - a failed candidate is recorded, the others go on
            o.failed = f"{type(e).__name__}: {e}"
            say(f"  failed: {o.failed}")
        o.seconds = time.monotonic() - t0
        outcomes.append(o)
    return outcomes


def run_name(prefix: str, candidate: Candidate) -> str:
    return f"{prefix}-{candidate.name}"


def record(p: Plan, outcomes: list[Outcome], chosen: Outcome | None) -> dict:
    """What search.json keeps: the rule, each candidate's values and score, the choice."""
    metric = next((o.metric for o in outcomes if o.metric), "key metric")
    return {
        "rule": f"the best validation {metric} over two held-out tenths of the training rows, each read at "
        "the epoch the other chose (the test rows in no search run); ties keep the earlier candidate",
        "budget_runs": p.budget,
        "candidate_epochs": p.epochs or None,
        "runs": p.runs,
        "ensemble_members": p.members + 1 if p.members else None,  # then the run's ensemble (ensemble.json)
        "candidates": [
            {
                "name": o.candidate.name,
                "why": o.candidate.why,
                "values": o.candidate.values,
                "score": None if math.isnan(o.score) else o.score,
                "epochs": o.epochs,
                "failed": o.failed,
                "seconds": round(o.seconds, 1),
            }
            for o in outcomes
        ],
        "chosen": None if chosen is None else chosen.candidate.name,
        "chosen_values": None if chosen is None else chosen.candidate.values,
    }


def lines(rec: dict) -> list[str]:
    """search.json in words: each candidate's score, the choice."""
    if "candidates" not in rec:
        return [f"recipe search: {rec.get('plan', 'none')}"]
    n = len(rec["candidates"])
    out = [f"recipe search ({n} candidates, then the run itself: {rec['runs']} runs; {rec['rule']}):"]
    for c in rec["candidates"]:
        score = f"failed: {c['failed']}" if c["failed"] else f"{c['score']:.4f}"
        mark = "  <- chosen" if c["name"] == rec["chosen"] else ""
        out.append(f"  {c['name']:12s} {score}  {c['why']}{mark}")
    return out


def keep_evidence(runs: list[Path], run_dir: Path) -> None:
    """The candidates' records (config, metrics, summary, status, split) under ``run_dir``/search, their
    run folders removed: they trained without the test rows and predict nothing."""
    kept = private_dir(run_dir / SEARCH_RUNS)
    for run in runs:
        if not run.is_dir():
            continue
        private_dir(kept / run.name)
        for name in ("config.json", "metrics.jsonl", "summary.json", "status.json", "split.csv"):
            if (run / name).exists():
                os.replace(run / name, kept / run.name / name)
        shutil.rmtree(run)  # what is left: the candidate's models
