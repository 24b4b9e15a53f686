"""`fedsim train`'s ensemble: more members of the run (run-config `member` 1, 2, ...: the run's
split, data and recipe, each member its own model draws), trained as the run was, after it, when
the budget affords them (fedsim/recipe_search.py :func:`plan`). Kept: the run and its first
members whose mean predicts the run's validation rows best (the run alone when no mean beats it).
Test rows are reported, never read by the choice.

    <out-dir>/NAME               the run (member 0), and in it ensemble.json (this step's record)
    <out-dir>/NAME.member1, ...  the other members: whole runs, beside the run (one linkage job)

The members are scored from their kept evaluation outputs (app/vfl/ensemble.py score_kept), the
predictions each made at its best epoch, so a run trained through Flower scores as one trained in
process; `fedsim predict NAME ...` then predicts with every member of a kept ensemble
(:func:`kept_members`), each by the path it was trained on.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from app.run_files import CONFIG, ENSEMBLE, read_json
from files.atomic import write_atomic

RECORD = ENSEMBLE  # in the run folder
RULE = (
    "the size (the run and its first members) whose mean is best on validation, in the value each member "
    "chose its epoch on, the smaller on ties; kept when more than the run (the test rows are reported, not read)"
)

Trainer = Callable[[dict, Path], int]  # (run-config values, run folder) -> exit status, as the run's engine trains


def member_name(run_name: str, member: int) -> str:
    return f"{run_name}.member{member}"


def member_values(values: dict, member: int) -> dict:
    """The run's values for its ``member``-th member: the same recipe, split and out-dir."""
    return {**values, "member": member, "run-name": member_name(str(values["run-name"]), member)}


def run(values: dict, run_dir: Path, members: int, train: Trainer) -> int:
    """Train ``members`` more members of the finished run at ``run_dir``, score the ensemble and
    record the choice in ``run_dir``/ensemble.json. Exit status: 0, or a failed member's (the
    run itself stays finished and usable alone, which the record says)."""
    dirs = [run_dir]
    for m in range(1, members + 1):
        print(f"ensemble: member {m} of {members} more (run-config member={m})", flush=True)
        member = member_values(values, m)
        dirs.append(run_dir.parent / member["run-name"])
        if not _ours(dirs[-1], m):
            return _failed(run_dir, dirs[:-1], f"{dirs[-1]} is a run of its own, not member {m}: not trained over", 1)
        code = train(member, dirs[-1])
        if code != 0:
            return _failed(run_dir, dirs, f"member {m} failed (exit {code})", code)
    try:
        rec = score(dirs)
    except Exception as e:  # noqa: BLE001 - members that cannot be scored together: named, the run kept
        return _failed(run_dir, dirs, f"not scored ({type(e).__name__}: {e})", 1)
    write_record(run_dir, rec)
    print("\n".join(lines(rec)), flush=True)
    return 0


def _ours(folder: Path, member: int) -> bool:
    """Whether ``folder`` may take member ``member``: absent, or a run recorded as that member (an
    earlier ensemble's), never a run of its own that a user named like a member."""
    config = folder / CONFIG
    return not config.exists() or json.loads(config.read_text()).get("run", {}).get("member") == member


def _failed(run_dir: Path, dirs: list[Path], what: str, code: int) -> int:
    """No ensemble: ``what`` went wrong, recorded and said; the run stays finished and predicts alone."""
    why = f"{what}: the run {run_dir.name} is finished and predicts alone"
    write_record(run_dir, {"rule": RULE, "members": [d.name for d in dirs], "kept": False, "failed": why})
    print(f"fedsim train: ensemble {why}", file=sys.stderr)
    return code


def score(dirs: list[Path]) -> dict:
    """The record of the ensemble of the runs ``dirs`` (the run first): each size's validation and
    test metrics, and whether the whole ensemble is kept (:data:`RULE`)."""
    from app.kept import read_manifest  # lazy: torch, after training only
    from app.vfl.ensemble import check_members, score_kept  # lazy: as above
    from strategies.heads import TaskHead  # lazy: as above

    check_members(dirs, in_process=False)  # one data set, split and linkage release, different members
    head = TaskHead(**read_manifest(dirs[0])["head"])
    scores = score_kept(dirs, head)
    key = head.selection_key if head.selection_key in scores["val"][0] else head.key_metric
    size = 1
    for n, val in enumerate(scores["val"][1:], 2):
        if head.selects(val, scores["val"][size - 1]):
            size = n
    return {
        "rule": RULE,
        "members": [d.name for d in dirs],
        "selected_on": key,
        "metric": head.key_metric,
        "val": scores["val"],  # [metrics of the first 1, 2, ... members' mean]
        "test": scores["test"],
        "size": size,  # the members kept: the first ``size``
        "kept": size > 1,
    }


def write_record(run_dir: Path, rec: dict) -> None:
    write_atomic(run_dir / RECORD, (json.dumps(rec, indent=2) + "\n").encode())


def lines(rec: dict) -> list[str]:
    """ensemble.json in words."""
    if "val" not in rec:
        return [f"ensemble: not kept: {rec.get('failed', '')}"]
    key, metric, n = rec["selected_on"], rec["metric"], len(rec["members"])
    out = [f"ensemble of up to {n} ({RULE}):"]
    for k, (v, t) in enumerate(zip(rec["val"], rec["test"], strict=True), 1):
        out.append(f"  {k} member(s): val {key} {v[key]:.4f} | test {metric} {t[metric]:.4f}")
    size = rec["size"]
    verdict = f"kept: predictions are the mean of {size} members" if rec["kept"] else "not kept: the run predicts alone"
    return [*out, f"  {verdict}"]


def _kept(run_dir: Path) -> dict | None:
    """The run's ensemble record when it kept an ensemble, else None."""
    path = Path(run_dir) / RECORD
    rec = read_json(path) if path.exists() else {}
    return rec if rec.get("kept") else None


def kept_members(run_dir: Path) -> list[Path]:
    """The other members of the run's kept ensemble, beside it ([] when it kept none)."""
    rec = _kept(run_dir)
    return [Path(run_dir).parent / name for name in rec["members"][1 : rec["size"]]] if rec else []


def federated(run_dir: Path, metric: str) -> tuple[float, str] | None:
    """(the kept ensemble's test ``metric``, what it is) for the yardstick; None without one."""
    rec = _kept(run_dir)
    return (rec["test"][rec["size"] - 1][metric], f"the ensemble of {rec['size']}") if rec else None
