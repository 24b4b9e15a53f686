"""The simulation's epoch against the in-process engine's, per tree and data set, interleaved:

    python -m bench.engine_table --trees /work/wt-before,/work/wt-after [--sets digits,credit,hdb]
        [--rounds 2] [--ea-epochs 20]

Each round runs, for every tree in turn, every set through ``fedsim train --engine simulation``
then ``--engine inprocess`` (the tree's code on PYTHONPATH, this checkout's .venv), so a load that
comes and goes falls on each alike. hdb: one epoch of the default recipe (``--recipe given``: no
search first); Entity Augmentation (digits = examples/digits, credit): ``--ea-epochs`` epochs.
Per run the median epoch seconds from its summary.json; per round the ratio of the two engines'
medians; at the end a table of each tree's medians and ratios. A tree is a checkout (``git
worktree add``), with this checkout's .venv linked into it (a demo's test would build one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ENGINES = ("simulation", "inprocess")


def set_args(name: str, tree: Path, ea_epochs: int) -> list[str]:
    if name == "hdb":
        return ["--dataset", "hdb", "--epochs", "1", "--recipe", "given"]
    data = (
        ["--dataset", "csv", "--data-dir", str(tree / "examples" / "digits")]
        if name == "digits"
        else ["--dataset", name]
    )
    return [*data, "--mode", "entity-aug", "--epochs", str(ea_epochs)]


def one_run(tree: Path, name: str, engine: str, out: Path, ea_epochs: int) -> float | None:
    """The median epoch seconds of one run (None: it failed, its log's tail printed); its threads printed."""
    run = f"{tree.name}-{name}-{engine}"
    argv = [sys.executable, "-m", "fedsim", "train", *set_args(name, tree, ea_epochs), "--no-yardstick"]
    argv += ["--engine", engine, "--out-dir", str(out), "--run-name", run]
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(argv, cwd=out, env=env, capture_output=True, text=True, timeout=1800)
    summary = out / run / "summary.json"
    if done.returncode or not summary.exists():
        print(f"{run}: exit {done.returncode}\n{done.stdout[-800:]}{done.stderr[-800:]}", flush=True)
        return None
    got = json.loads(summary.read_text())
    print(f"{run}: epochs {[round(s, 3) for s in got['seconds']['epochs']]}, threads {got.get('threads')}", flush=True)
    return statistics.median(got["seconds"]["epochs"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", required=True, help="comma-separated checkouts")
    ap.add_argument("--sets", default="digits,credit,hdb")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ea-epochs", type=int, default=20)
    args = ap.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    sets = args.sets.split(",")
    got: dict[tuple, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for tree in trees:
                for name in sets:
                    out = Path(tmp) / f"round{r}"
                    out.mkdir(exist_ok=True)
                    medians = {e: one_run(tree, name, e, out, args.ea_epochs) for e in ENGINES}
                    for e, m in medians.items():
                        got.setdefault((tree.name, name, e), []).append(m)
                    ratio = medians["simulation"] / medians["inprocess"] if None not in medians.values() else None
                    got.setdefault((tree.name, name, "ratio"), []).append(ratio)
                    print(f"round {r + 1} {tree.name} {name}: {medians} ratio {ratio}", flush=True)
    print("| tree | set | simulation s/epoch | in process s/epoch | simulation / in process |")
    print("| --- | --- | --- | --- | --- |")
    for tree in trees:
        for name in sets:
            cells = [
                "; ".join("failed" if v is None else f"{v:.3f}" for v in got[(tree.name, name, e)]) for e in ENGINES
            ]
            ratios = "; ".join("-" if v is None else f"{v:.2f}x" for v in got[(tree.name, name, "ratio")])
            print(f"| {tree.name} ({_commit(tree)}) | {name} | {cells[0]} | {cells[1]} | {ratios} |")


def _commit(tree: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


if __name__ == "__main__":
    main()
