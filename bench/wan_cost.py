"""Training across hosts over an emulated WAN: exact split learning (S = 1) over the
direct transport between the primary's host and the school's (lab/training.py on a
lab.hosts.Lab), with a lab/wan_relay.py relay in the primary's namespace between it and the
school's worker (one-way delay = RTT / 2 each way, optional rate cap). Only the direct transport's
link crosses the relay: Flower's own messages (one exchange an epoch) go straight to the SuperLink.

    python -m bench.wan_cost --rtt 0,20,50,100 [--rate-mbit 0] [--n-rows 2000] [--epochs 2]

Prints, per RTT, the train seconds of each epoch (summary.json) and the test metric.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from lab.hosts import Lab
from lab.training import PRIMARY, REPO, WORKER_PORT, train_across_hosts

RELAY_PORT = 9400  # in the primary's namespace


def one(rtt_ms: float, rate_mbit: float, n_rows: int, epochs: int, data_dir: Path, set_values: dict) -> dict:
    base, logs = Path(tempfile.mkdtemp(dir="/tmp")), Path(tempfile.mkdtemp())
    try:
        with Lab(base, [PRIMARY, "school"]) as lab:
            school = lab.hosts["school"]
            relay = [sys.executable, "-m", "lab.wan_relay", "--listen", f"127.0.0.1:{RELAY_PORT}"]
            relay += ["--to", f"{school.address}:{WORKER_PORT}", "--delay-ms", str(rtt_ms / 2)]
            relay += ["--rate-mbit", str(rate_mbit), "--lifetime", "3000"]
            proc = lab.start(lab.hosts[PRIMARY], relay, logs / "relay.log", env={"PYTHONPATH": str(REPO)})
            try:
                run = train_across_hosts(
                    lab,
                    "hdb",
                    data_dir,
                    {"school": "school"},
                    epochs=epochs,
                    n_rows=n_rows,
                    logs=logs,
                    run_config=set_values,
                    advertise={"school": f"127.0.0.1:{RELAY_PORT}"},
                )
            finally:
                proc.stop()
            return {
                "epochs": run.summary["seconds"]["epochs"],
                "test": run.summary["test"],
                "steps": run.summary["steps"],
            }
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)


def main() -> None:
    from experiments.runner import git_rev, parse_overrides  # lazy: the run-config parser

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rtt", default="0,20,50,100", help="round-trip times in ms, comma-separated")
    ap.add_argument("--rate-mbit", type=float, default=0.0, help="rate cap each way (0 = none)")
    ap.add_argument("--n-rows", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more run-config values")
    args = ap.parse_args()
    extra = parse_overrides(args.set)
    print(
        f"git {git_rev()}; hdb n-rows {args.n_rows}, direct transport, rate cap {args.rate_mbit} Mbit/s; {extra or 'S = 1'}"
    )
    print("| RTT ms | steps | train s per epoch | test |")
    print("|---|---|---|---|")
    for rtt in [float(r) for r in args.rtt.split(",")]:
        r = one(rtt, args.rate_mbit, args.n_rows, args.epochs, args.data_dir, extra)
        metric = ", ".join(f"{k} {v:.4f}" for k, v in r["test"].items() if isinstance(v, float))
        print(f"| {rtt:g} | {r['steps']} | {' / '.join(f'{s:.2f}' for s in r['epochs'])} | {metric} |", flush=True)


if __name__ == "__main__":
    main()
