"""What the exchange-privacy observer adds to a training step: in-process runs with
`exchange-report` on and off, interleaved per round, and the observer's own time per step.

    python -m bench.exchange_cost --dataset hdb --steps 150 --rounds 3 [--toggle exchange-privacy]
                                  [--set key=value ...]

Prints per round the train seconds of ``--steps`` steps with the toggled key off and on, and
the medians; for the report, then the observer's ``observe`` time per step (cProfile of one run
with it on). ``--toggle exchange-privacy``: the exchange's defences ("off" against the level's).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import tempfile
from pathlib import Path

from app.config import RunConfig
from app.run_record import machine, read_metrics
from app.vfl.inprocess import run_experiment
from experiments.runner import git_rev, parse_overrides

TOGGLES = {"exchange-report": (False, True), "exchange-privacy": ("off", "")}  # key: (off, on)


def train_seconds(values: dict, profile: cProfile.Profile | None = None) -> float:
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        cfg = RunConfig.from_flower({**values, "out-dir": tmp})
        if profile is not None:
            profile.enable()
        run_experiment(cfg, Path(tmp) / "run")
        if profile is not None:
            profile.disable()
        return sum(r["seconds"] for r in read_metrics(Path(tmp) / "run"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="hdb")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--toggle", choices=sorted(TOGGLES), default="exchange-report")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    values = {"dataset": args.dataset, "epochs": 1, "max-steps": args.steps, "privacy-report": False}
    values |= parse_overrides(args.set)
    print(f"# {machine()}, git {git_rev()}, {args.dataset}, {args.steps} steps, {args.toggle} off / on")
    on, off = [], []
    low, high = ({**values, args.toggle: v} for v in TOGGLES[args.toggle])
    for r in range(args.rounds):
        off.append(train_seconds(low))
        on.append(train_seconds(high))
        print(f"round {r}: {args.toggle} off {off[-1]:.2f} s, on {on[-1]:.2f} s", flush=True)
    print(f"median: off {statistics.median(off):.2f} s, on {statistics.median(on):.2f} s")
    if args.toggle != "exchange-report":
        return
    prof = cProfile.Profile()
    train_seconds(high, prof)
    stats = pstats.Stats(prof)
    observe = sum(v[3] for k, v in stats.stats.items() if k[2] == "observe" and "exchange_observer" in k[0])
    step = sum(v[3] for k, v in stats.stats.items() if k[2] == "train_step" and k[0].endswith("primary.py"))
    print(
        f"profiled: observe {1000 * observe / args.steps:.2f} ms/step of train_step {1000 * step / args.steps:.2f} ms/step"
    )


if __name__ == "__main__":
    main()
