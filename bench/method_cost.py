"""Training cost per step of methods side by side, in one process, interleaved (so both see the
same machine load): the in-process engine (the protocol with in-process secondaries), float32.

    python -m bench.method_cost game --methods fedsim fedsim_attn --steps 200 [--repeats 2]
    python -m bench.method_cost synthetic -c n-rows=60000 -c sigma-cf=0.2

Prints per method the median seconds per training step over the repeats and the implied epoch
time (steps per epoch from the dataset's batch size), and the ratio to the first method.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile

import torch

from app.config import RunConfig, parse_pairs
from app.data import load_data
from app.run_record import machine
from app.vfl.inprocess import run_in_process


def per_step(cfg: RunConfig, steps: int) -> float:
    """Seconds per training step (the training loop's own clock: linkage and set-up excluded)."""
    with tempfile.TemporaryDirectory() as tmp:
        run = run_in_process(RunConfig.of(**{**cfg.__dict__, "max_steps": steps, "epochs": 1, "out_dir": tmp}))
        return run.train_seconds / steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.method_cost", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("dataset")
    ap.add_argument("--methods", nargs="+", default=["fedsim", "fedsim_attn"])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("-c", dest="values", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    base = RunConfig.from_flower({"dataset": args.dataset, **parse_pairs(args.values)})
    ds = load_data(base)
    print(f"{machine()}; torch threads {torch.get_num_threads()}; {args.dataset} {' '.join(args.values)}")
    times: dict[str, list[float]] = {m: [] for m in args.methods}
    for _ in range(args.repeats):
        for m in args.methods:  # interleaved
            times[m].append(per_step(RunConfig.of(**{**base.__dict__, "method": m}), args.steps))
    first = statistics.median(times[args.methods[0]])
    for m in args.methods:
        cfg = RunConfig.of(**{**base.__dict__, "method": m})
        epoch_steps = math.ceil(len(ds.split.train) / cfg.resolve().batch_size)
        t = statistics.median(times[m])
        print(
            f"{m}: {t * 1000:.1f} ms/step, {t * epoch_steps:.1f} s per epoch of {epoch_steps} steps "
            f"(x{t / first:.2f} of {args.methods[0]}; runs {', '.join(f'{x * 1000:.1f}' for x in times[m])} ms)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
