"""Where an in-process training step's time goes: the first N steps of an epoch of the
federated protocol with in-process secondaries (strategies/vfl/protocol.py:train_epoch behind a
LocalChannel, as app/vfl/inprocess.py builds it), timed, then once more under torch.profiler.

    python -m bench.step_profile --dataset hdb --steps 100 [--set steps-per-exchange=8 ...] [--rows 25]

Runs from whichever tree is the working folder (train_epoch's signature is the same before and
after the step was reworked), so two trees compare on one machine with the same command.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from app.config import RunConfig
from app.run_record import machine
from experiments.runner import parse_overrides


def _pieces(values: dict):
    from app.vfl.inprocess import _local_parties, _setup  # the run's pieces, as run_in_process builds them
    from app.vfl.parties import build_strategy  # the primary's strategy, as the apps build it
    from strategies.schedule import epoch_batches  # the epoch's batches
    from strategies.vfl.channel import LocalChannel  # the in-process secondaries

    cfg, settings, ds, linkage, job, plan = _setup(RunConfig.from_flower(values), None)
    strategy = build_strategy(ds, linkage, cfg, settings)
    channel = LocalChannel(_local_parties(cfg, ds, job, linkage))
    return strategy, channel, epoch_batches(ds.split.train, plan.batch_size, plan.seed, 0), plan


def run_steps(values: dict, steps: int, offset: int = 0) -> float:
    """Seconds for ``steps`` steps (from batch ``offset``) on fresh parties, the last loss read."""
    from strategies.vfl.protocol import Exchange, train_epoch  # the code measured

    strategy, channel, batches, plan = _pieces(values)
    losses: list[float] = []
    t0 = time.perf_counter()
    train_epoch(Exchange(strategy, channel, plan), batches[offset : offset + steps], losses, lambda *a: None)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="hdb")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rows", type=int, default=25, help="rows of the profiler's table")
    ap.add_argument("--no-profile", action="store_true", help="only the timed steps (bench/step_ab.sh)")
    ap.add_argument("--warmup", type=int, default=0, help="steps run first on fresh parties, not timed")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more run-config values (TOML)")
    args = ap.parse_args()
    values = {"dataset": args.dataset, "epochs": 1, **parse_overrides(args.set)}
    print(f"{machine()}, {torch.get_num_threads()} torch threads; run config {values}")
    if args.warmup:
        run_steps(values, args.warmup)
    seconds = run_steps(values, args.steps)
    print(f"{args.steps} steps: {seconds:.2f} s ({1000 * seconds / args.steps:.1f} ms/step)", flush=True)
    if args.no_profile:
        return
    cuda = values.get("device") == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda) as prof:
        steps_s = run_steps(values, args.steps)
    events = prof.key_averages()
    if cuda:  # how busy the GPU was: its kernels' time against the profiled wall time
        kernels = sum(e.self_device_time_total for e in events) / 1e6
        launches = sum(
            e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")
        )
        print(
            f"profiled: {steps_s:.2f} s of steps, GPU kernels {kernels:.3f} s, {launches / args.steps:.0f} launches/step"
        )
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
