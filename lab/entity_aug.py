"""Entity Augmentation across separate hosts: the primary (labels; the EA paper's host) on its
own host running the SuperLink and the ServerApp, each guest's SuperNode on its own host as its own
user with every folder in its own home (lab/training.py's federation: TLS, SuperNode
authentication, each guest's party worker on its own address for the direct transport). Entity
Augmentation links nothing: records are matched by entity id, so no linkage job runs and no
linkage file crosses; a built-in data set that reads a data folder gets a copy in each home. With
the parties' own CSVs (``--data-dir`` holding parties.toml with entity ids) each home gets
parties.toml and its own file only, and the guests' ids meet the primary's in a private set
intersection (app/entity_aug/id_exchange.py).

    python -m lab.entity_aug --base /tmp/lab-ea --epochs 2 --n-rows 300
    python -m lab.entity_aug --base /tmp/lab-ea --data-dir examples/digits
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from lab.hosts import Lab
from lab.placement import place_data, place_own_files
from lab.training import PRIMARY, RUN_NAME, LabRun, credentials, federation, train

GUESTS = ("left", "right")  # the digits set's two guests (datasets/overlap.py)


def train_ea_across_hosts(
    lab: Lab, dataset: str, data_dir: Path, guests: tuple[str, ...], run_config: dict, logs: Path
) -> LabRun:
    """Credentials, data, SuperLink, registered SuperNodes (each guest on the lab host of its own
    name), `flwr run` in mode entity-aug over the direct transport; the finished run's summary
    (RunFailed otherwise). Stops what it started."""
    t0, primary = time.monotonic(), lab.hosts[PRIMARY]
    hosts = {g: lab.hosts[g] for g in guests}
    commands: dict[str, list[list[str]]] = {primary.name: []}
    credentials(lab, primary, hosts)
    if dataset == "csv":
        place_own_files(lab, {PRIMARY: primary, **hosts}, data_dir)
    else:
        place_data(lab, [primary, *hosts.values()], dataset, data_dir)
    values = {
        "mode": "entity-aug",
        "dataset": dataset,
        "data-dir": str(primary.home / "data"),
        "out-dir": str(primary.home / "runs"),
        "run-name": RUN_NAME,
        "transport": "direct",
        "node-timeout": 120.0,
        **run_config,
    }
    with federation(lab, hosts, logs, commands):
        summary, run_dir, output = train(lab, values, commands, timeout=900.0)
    return LabRun(summary, run_dir, output, commands, time.monotonic() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="folder for the hosts' homes")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--n-rows", type=int, default=300)
    ap.add_argument(
        "--data-dir", type=Path, help="the parties' own CSVs (parties.toml with entity ids; guests left, right)"
    )
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="lab-ea-logs-"))
    dataset, data_dir = ("csv", args.data_dir.resolve()) if args.data_dir else ("digits", Path("."))
    with Lab(args.base, [PRIMARY, *GUESTS]) as lab:
        run = train_ea_across_hosts(
            lab, dataset, data_dir, GUESTS, {"epochs": args.epochs, "n-rows": args.n_rows}, logs
        )
    print(json.dumps({"seconds": run.seconds, "test": run.summary["test"], "logs": str(logs)}, indent=1))


if __name__ == "__main__":
    main()
