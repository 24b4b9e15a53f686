"""What a real deployment costs per step and per epoch, against Flower simulation, on hdb.

    python -m bench.deploy_cost [--n-rows 0] [--steps 6] [--epochs 2] [--s 100000] [--sim-s 100000]
                                [--transport flower|direct] [--pipeline] [--insecure]

A. Simulation (`flwr run`, one virtual SuperNode): `--epochs` epochs at S = `--sim-s` (default:
   a whole epoch per exchange, the simulation's fastest); epoch time = training + evaluation
   (+ checkpoint) per epoch.
B. Deployment (deploy.commands: SuperLink + SuperNode + linkage service on 127.0.0.1, TLS and node
   auth unless --insecure), linked through the service:
   B1. S = 1 for `--steps` steps: the per-step latency of exact split learning;
   B2. the same `--epochs` epochs at S = `--s` (with --pipeline, A and B2 pipelined);
   both over `--transport` (flower: a Flower exchange per window; direct: each party worker's
   own encrypted link, app/party_worker.py).
C. In process at S = 1 (no Flower; the twin oracles prove it equal to `flwr run`): the fastest
   exact epoch, and its test metric next to the deployment's.
Prints a markdown table; docs/benchmarks.md records it with the command, machine and date.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from app.run_record import machine, read_metrics
from app.run_status import require_finished
from deploy import commands as deploy
from experiments.runner import git_rev, run_flower


def epoch_seconds(run_dir: Path) -> list[float]:
    return [r["seconds"] + r.get("eval_seconds", 0.0) for r in read_metrics(run_dir)]


def deployed_run(dep: deploy.Deployment, values: dict, name: str) -> tuple[dict, Path, float]:
    """One deployed run; RunFailed unless its status.json says it finished (`flwr run` exits 0
    when the ServerApp fails)."""
    t0, since = time.perf_counter(), time.time()
    r = deploy.flwr_run(dep, {**values, "run-name": name}, timeout=3600)
    wall = time.perf_counter() - t0
    run_dir = dep.root / "runs" / name
    summary = require_finished(run_dir, since, f"{r.stdout[-4000:]}\n{r.stderr[-2000:]}")
    return summary, run_dir, wall


def simulated(base: dict, args, work: Path) -> tuple[tuple, list[float], dict]:
    """A: the simulation's epochs at S = --sim-s (Flower messages in memory)."""
    sim, sim_dir, sim_wall = run_flower({**base, "epochs": args.epochs, "steps-per-exchange": args.sim_s}, work, "sim")
    epochs = epoch_seconds(sim_dir)
    print("simulation done", epochs, flush=True)
    return (
        (
            "simulation",
            f"{args.sim_s}{' pipelined' if args.pipeline else ''}",
            "flower",
            "",
            sim["exchange"]["median_seconds"],
            sim["exchange"]["count"] / args.epochs,
            statistics.fmean(epochs),
            sim_wall,
        ),
        epochs,
        sim,
    )


def in_process(base: dict, args, work: Path) -> tuple[tuple, list[float], dict]:
    """C: exact split learning (S = 1) in one process, the engine the twin oracles prove equal to
    `flwr run`: the fastest an exact epoch can be here."""
    from app.config import RunConfig  # lazy: torch and flwr, for the in-process engine only
    from app.modes import run_experiment  # lazy: torch and flwr, for the in-process engine only

    values = {**base, "epochs": args.epochs, "steps-per-exchange": 1, "pipeline": False}
    summary = run_experiment(RunConfig.of(**{k.replace("-", "_"): v for k, v in values.items()}), work / "in-process")
    epochs = epoch_seconds(work / "in-process")
    print("in process done", epochs, flush=True)
    return ("in process", 1, "none", "", "", "", statistics.fmean(epochs), ""), epochs, summary


def deployed(dep: deploy.Deployment, base: dict, args) -> tuple[list[tuple], list[float], dict]:
    """B1: S = 1 for --steps steps; B2: --epochs epochs at S = --s; both over --transport."""
    base = {**base, "transport": args.transport}
    one, one_dir, one_wall = deployed_run(
        dep, {**base, "pipeline": False, "epochs": 1, "steps-per-exchange": 1, "max-steps": args.steps}, "s1"
    )
    step_s = read_metrics(one_dir)[0]["seconds"] / args.steps
    rows = [("deployment", 1, args.transport, step_s, one["exchange"]["median_seconds"], "", "", one_wall)]
    print("deployment S=1 done", step_s, flush=True)
    run, run_dir, wall = deployed_run(dep, {**base, "epochs": args.epochs, "steps-per-exchange": args.s}, "sdef")
    epochs = epoch_seconds(run_dir)
    rows.append(
        (
            "deployment",
            f"{args.s}{' pipelined' if args.pipeline else ''}",
            args.transport,
            "",
            run["exchange"]["median_seconds"],
            run["exchange"]["count"] / args.epochs,
            statistics.fmean(epochs),
            wall,
        )
    )
    return rows, epochs, run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="hdb")
    ap.add_argument("--n-rows", type=int, default=0)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--steps", type=int, default=6, help="S = 1 steps timed in deployment")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--s", type=int, default=100000, help="steps per exchange for the epoch runs (>= an epoch: one)")
    ap.add_argument(
        "--sim-s",
        type=int,
        default=100000,
        help="the simulation's steps per exchange (default: one exchange per epoch, its fastest)",
    )
    ap.add_argument("--transport", choices=["flower", "direct"], default="flower", help="the deployed runs' transport")
    ap.add_argument("--pipeline", action="store_true", help="the epoch runs pipelined (run-config pipeline = true)")
    ap.add_argument("--insecure", action="store_true")
    args = ap.parse_args()
    base = {"dataset": args.dataset, "n-rows": args.n_rows, "k": args.k, "seed": 0, "pipeline": args.pipeline}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(f"# {machine()}, git {git_rev()}, {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
        sim_row, sim_epochs, sim = simulated(base, args, work)
        own_row, own_epochs, own = in_process(base, args, work)
        t0 = time.perf_counter()
        dep = deploy.up(work / "dep", args.dataset, secure=not args.insecure)
        up_s = time.perf_counter() - t0
        try:
            t0 = time.perf_counter()
            deploy.link(dep, deploy.LinkRequest(k=args.k, n_rows=args.n_rows))
            link_s = time.perf_counter() - t0
            dep_rows, dep_epochs, dep_run = deployed(dep, base, args)
        finally:
            deploy.down(dep.root)
    security = "insecure" if args.insecure else "TLS + SuperNode auth"
    print(
        f"\ndataset {args.dataset} (n-rows {args.n_rows or 'all'}, K={args.k}), {security}; "
        f"deployment up {up_s:.1f} s, linkage through the service {link_s:.1f} s\n"
    )
    print(
        "| runtime | S | transport | per step s (S=1) | median exchange s | exchanges / epoch | epoch s (train+eval) "
        "| wall s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in [sim_row, own_row, *dep_rows]:
        print("| " + " | ".join(f"{c:.2f}" if isinstance(c, float) else str(c) for c in r) + " |")
    print(
        f"\ndeployment epoch (S={args.s}, {args.transport}) / simulation epoch (S={args.sim_s}): "
        f"{statistics.fmean(dep_epochs) / statistics.fmean(sim_epochs):.2f}x (epochs: simulation "
        f"{[round(x, 1) for x in sim_epochs]}, deployment {[round(x, 1) for x in dep_epochs]})"
    )
    print(
        f"deployment epoch / in-process S=1 epoch: {statistics.fmean(dep_epochs) / statistics.fmean(own_epochs):.2f}x "
        f"(in process {[round(x, 1) for x in own_epochs]})"
    )
    print(
        f"test after {args.epochs} epochs: simulation {sim['test']}, in process S=1 {own['test']}, "
        f"deployment {dep_run['test']}"
    )


if __name__ == "__main__":
    main()
