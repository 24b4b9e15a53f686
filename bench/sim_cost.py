"""What Flower costs this protocol in simulation, on hdb (89,356 flats x 165 schools, K = 50).

Measures in one go, on this machine:
  A. Flower's floor: mean (and median) time of an empty exchange (query.ping), inside a `flwr run`;
     and the federated per-step time at S = 1 in the same run.
  B. The same steps in one process: the protocol with in-process secondaries (no Flower)
     and the one-process twin; per-step overhead = federated - in-process.
  C. One full epoch at the default S (pyproject) through Flower vs the twin's epoch.
  D. Bytes exchanged per epoch vs the naive protocol that ships B*K embeddings and
     B*K gradients per step.
  E. Linkage time (exact top-K + standardise + tokens).

    python -m bench.sim_cost [--steps 150] [--s S]   (S defaults to pyproject's steps-per-exchange)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import tomllib
from pathlib import Path

from app import probes
from app.config import RunConfig, Settings
from app.data import load_data
from app.run_record import machine
from app.vfl.inprocess import run_in_process, run_twin
from app.vfl.linking import run_linkage
from deploy.localsim import REPO
from experiments.runner import git_rev, run_flower


def default_s() -> int:
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    return int(conf["steps-per-exchange"])


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def epoch_cost(base: RunConfig, settings: Settings, work: Path, s: int, n_train: int) -> dict:
    """Parts C and D: one full epoch at S through Flower vs the twin, and its bytes per epoch vs the
    naive protocol; prints them and returns the results."""
    # C. a full epoch at the default S
    sd, _, _ = run_flower({"dataset": "hdb", "epochs": 1, "steps-per-exchange": s}, work, f"s{s}")
    fed_epoch = sd["seconds"]["epochs"][0]
    twin_epoch = run_twin(base.replace(epochs=1, steps_per_exchange=s)).train_seconds
    res = dict(
        fed_epoch_s=fed_epoch,
        twin_epoch_s=twin_epoch,
        s=s,
        steps_per_epoch=sd["steps"],
        exchanges_per_epoch=sd["exchange"]["count"],
    )
    print(
        f"C full epoch at S={s}: federated {fed_epoch:.1f} s ({sd['steps']} steps, "
        f"{sd['exchange']['count']} exchanges incl. evaluation and the final save) vs twin {twin_epoch:.1f} s: ratio {fed_epoch / twin_epoch:.2f}",
        flush=True,
    )

    # D. bytes per epoch vs naive B*K embeddings + gradients
    ours = sd["exchange"]["bytes_down"] + sd["exchange"]["bytes_up"]
    naive = 2 * n_train * settings.k * settings.model.cut_dim * 4  # every pair's embedding up, gradient down
    res.update(bytes_epoch=ours, bytes_naive=naive)
    print(
        f"D bytes per epoch (incl. val/test evaluation): {ours / 1e6:.2f} MB vs naive B*K {naive / 1e6:.1f} MB: "
        f"{naive / ours:.0f}x fewer",
        flush=True,
    )
    return res


def linkage_cost(base: RunConfig, settings: Settings, ds) -> dict:
    """Part E: the linkage's time (exact top-K + standardise + tokens); printed and returned."""
    _, seconds = timed(lambda: run_linkage(ds, base, settings))
    print(
        f"E linkage hdb {ds.primary.n_rows} x {ds.secondaries['school'].n_rows}, K={settings.k}: {seconds:.3f} s",
        flush=True,
    )
    return {"linkage_s": seconds}


def flower_steps(work: Path, steps: int, floor_n: int) -> dict:
    """Part A: Flower's empty-exchange floor (``floor_n`` exchanges) and the federated step at
    S = 1 (``steps`` of them), in one `flwr run`."""
    os.environ[probes.BENCH_FLOOR] = str(floor_n)  # a probe, passed on by the simulation's environment
    s1, _, _ = run_flower({"dataset": "hdb", "epochs": 1, "steps-per-exchange": 1, "max-steps": steps}, work, "s1")
    del os.environ[probes.BENCH_FLOOR]
    ex = s1["exchange"]
    return dict(
        floor_mean_s=ex["floor_mean_seconds"],
        floor_median_s=ex["floor_median_seconds"],
        exchange_mean_s=ex["mean_seconds"],
        exchange_median_s=ex["median_seconds"],
        fed_step_s1=s1["seconds"]["epochs"][0] / s1["steps"],
    )


def in_process_steps(base: RunConfig, steps: int) -> dict:
    """Part B: the same steps in one process, by the protocol with in-process secondaries and by
    the one-process twin (seconds per step)."""
    cfg1 = base.replace(epochs=1, steps_per_exchange=1, max_steps=steps)
    return dict(local_step=run_in_process(cfg1).train_seconds / steps, twin_step=run_twin(cfg1).train_seconds / steps)


def report_steps(res: dict, floor_n: int) -> None:
    """Parts A and B's lines: the floor, the federated step, the same steps in one process, and
    Flower's overhead per step."""
    floor, fed_step = res["floor_mean_s"], res["fed_step_s1"]
    print(
        f"A Flower floor, empty exchange over {floor_n}: mean {floor * 1000:.1f} ms, median "
        f"{res['floor_median_s'] * 1000:.1f} ms (quantised by 0.1 s polls); a training exchange at S=1: mean "
        f"{res['exchange_mean_s'] * 1000:.1f} ms, median {res['exchange_median_s'] * 1000:.1f} ms",
        flush=True,
    )
    print(f"A federated step at S=1: {fed_step * 1000:.1f} ms", flush=True)
    overhead = fed_step - res["local_step"]
    print(
        f"B same steps in one process: protocol with in-process secondaries {res['local_step'] * 1000:.1f} ms, "
        f"twin {res['twin_step'] * 1000:.1f} ms",
        flush=True,
    )
    print(
        f"B per-step overhead of Flower at S=1: {overhead * 1000:.1f} ms = mean empty-exchange floor "
        f"{floor * 1000:.1f} ms + {(overhead - floor) * 1000:.1f} ms",
        flush=True,
    )


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=150, help="training steps timed at S = 1")
    ap.add_argument("--s", type=int, default=default_s(), help="steps per exchange for the full epoch")
    ap.add_argument("--floor", type=int, default=40, help="empty exchanges timed")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--skip-epoch", action="store_true", help="only parts A, B and E")
    return ap


def main() -> None:
    args = _parser().parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} | {machine()} | commit {git_rev()}", flush=True)
    res: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base = RunConfig.of(dataset="hdb", out_dir=str(work / "local"))
        settings = base.resolve()
        ds = load_data(base)
        res.update(linkage_cost(base, settings, ds))
        res.update(flower_steps(work, args.steps, args.floor))
        res.update(in_process_steps(base, args.steps))
        report_steps(res, args.floor)
        if args.skip_epoch:
            return
        res.update(epoch_cost(base, settings, work, args.s, n_train=len(ds.split.train)))
    if args.out:
        args.out.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
