"""`fedsim train`'s recipe-search step (fedsim/recipe_search.py): whether a run searches, the
in-process trainer it searches with, and what it leaves: the chosen values for the run, and in
the finished run's folder search.json and the candidates' records."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from fedsim import recipe_search as rs
from files.atomic import write_atomic
from files.private import private_dir


@dataclass
class Searched:
    """What the search decided: the run-config values to train the run with, the candidates'
    runs (kept as records once the run has finished), search.json's record, and how many more
    members of the run the budget trains after it (fedsim/ensemble_step.py)."""

    values: dict
    runs: list[Path]
    record: dict
    members: int = 0


def step(cfg, values: dict, run_dir: Path, args, in_process: bool) -> Searched | int | None:
    """`fedsim train`'s search: None when this run does not search (why said), an exit status when
    it failed, else what it decided."""
    why = why_not(cfg, args)
    if why:
        print(f"recipe search: none ({why})")
        return None
    try:
        return run(values, run_dir, args.budget or rs.DEFAULT_BUDGET, in_process)
    except RuntimeError as e:
        print(f"fedsim train: {e}", file=sys.stderr)
        return 1


def why_not(cfg, args) -> str:
    """Why this run does not search ("" = it does)."""
    if args.recipe != "search":
        return "--recipe given: the run config's values (or their defaults) as they are"
    if cfg.train.mode != "vfl":
        return "Entity Augmentation has no recipe search yet"
    if cfg.train.hparams == "dataset":
        return 'hparams "dataset": the recipe chosen by hand on this data set\'s validation (docs/fedsim-attn.md)'
    if args.deployment:
        return "the search trains every party in this process, and here the secondaries' data is on their hosts"
    if cfg.link.linkage_dir:
        return (
            "with linkage-dir the primary reads only its own file (the secondaries train from theirs), and the "
            "search trains every party in this process"
        )
    if cfg.train.resume:
        return "a resumed run keeps its recipe"
    if cfg.data.dataset != "csv":
        return ""
    from datasets.csv_parties import read_spec  # lazy: pandas, for own data only

    if "entity_id" in read_spec(Path(cfg.data.data_dir))["primary"]:
        return "parties with entity ids validate on entities every party holds, which has one split"
    return ""


@contextlib.contextmanager
def _quiet():
    """Flower's logger at errors only while a candidate trains: each would log every epoch, and its
    warnings are the run's own (the same data), which the run prints at its end. A candidate that
    fails is said by the search with its error."""
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def train_in_process(values: dict, run_dir: Path) -> None:
    """One candidate run in this process (raises when it fails)."""
    from app.config import RunConfig  # lazy: torch and flwr, after the CLI's checks
    from app.modes import run_experiment  # lazy: the training stack

    with _quiet():
        run_experiment(RunConfig.from_flower(values), run_dir)


def _candidate_epochs(values: dict) -> int:
    from app.config import RunConfig  # lazy: torch and flwr, after the CLI's checks

    s = RunConfig.from_flower(values).resolve()
    return rs.candidate_epochs(s.epochs, s.patience)


def given(values: dict) -> dict:
    """The searched keys the user set (held at their value)."""
    return {k: values[k] for k in rs.SEARCHED if k in values}


def run(values: dict, run_dir: Path, budget: int, in_process: bool, train: rs.Trainer = train_in_process) -> Searched:
    """The search for the run at ``run_dir``; raises RuntimeError when every candidate failed.
    No plan: the values as given; a plan without candidates: the values as given, and members."""
    p = rs.plan(given(values), budget, _candidate_epochs(values))
    if p is None:
        why = f"budget {budget} runs affords neither two candidates beside the run nor a member"
        print(f"recipe search: none ({why}, or the keys you set leave one recipe)", flush=True)
        return Searched(values, [], {"plan": why})
    print(p.text(in_process), flush=True)
    if not p.candidates:
        return Searched(values, [], {"plan": "the keys you set leave one recipe"}, p.members)
    out, prefix = private_dir(run_dir.parent), f"{run_dir.name}.search"
    outcomes = rs.search(p, values, out, prefix, train)
    runs = [out / rs.run_name(prefix, c) for c in p.candidates]
    chosen = rs.choose(outcomes)
    if chosen is None:  # the candidates' run folders (their status.json) stay, for their reasons
        failures = "; ".join(f"{o.candidate.name}: {o.failed}" for o in outcomes)
        raise RuntimeError(f"every candidate of the recipe search failed (runs {out}/{prefix}-*): {failures}")
    print(
        f"recipe search chose {chosen.candidate.name}: {chosen.candidate.why} ({chosen.metric} {chosen.score:.4f})",
        flush=True,
    )
    rec = rs.record(p, outcomes, chosen)
    return Searched({**values, **chosen.candidate.values}, runs, rec, p.members)


SOURCES = {"input-scale": "input_scale", "attention-start": "attention_start"}  # key -> hyperparameter row


def write(run_dir: Path, searched: Searched, given: dict) -> None:
    """search.json and the candidates' records in the finished run, and the rows of its
    config.json the search chose (not the user: ``given``) said to come from it."""
    write_atomic(run_dir / rs.RECORD, (json.dumps(searched.record, indent=2) + "\n").encode())
    rs.keep_evidence(searched.runs, run_dir)
    chosen = searched.record.get("chosen_values") or {}
    path = run_dir / "config.json"
    config = json.loads(path.read_text())
    for key, row in SOURCES.items():
        if key in chosen and key not in given and row in config.get("hyperparameters", {}):
            config["hyperparameters"][row]["source"] = f"recipe search ({rs.RECORD})"
    write_atomic(path, (json.dumps(config, indent=2) + "\n").encode())
