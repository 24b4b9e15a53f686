"""`python -m deploy <command>` (also `fedsim deploy <command>`): a local deployment's command line,
over deploy/commands.py (up, link, run, down, status) and deploy/predict.py (predict).

    python -m deploy up     DIR --dataset house3          # SuperLink + SuperNodes + linkage service
    python -m deploy link   DIR --k 50                    # every party links through the service
    python -m deploy run    DIR --run-config 'epochs=2'   # `flwr run . fedsim-deploy` against it
    python -m deploy predict DIR --run RUN --input new.csv --out p.csv
    python -m deploy down   DIR ;  python -m deploy status DIR
"""

from __future__ import annotations

import argparse
import sys
import time
import tomllib
from pathlib import Path

from app import run_status
from deploy.commands import Deployment, _procs, down, flwr_run, link, run_values, up
from deploy.deployment import LinkRequest
from deploy.predict import add_parser as add_predict_parser
from deploy.predict import command as predict_command
from deploy.processes import running
from files.private import private_umask


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("up", help="start SuperLink, one SuperNode per secondary, and the linkage service")
    s.add_argument("folder", type=Path)
    s.add_argument("--dataset", required=True)
    s.add_argument("--data-dir", default="", help="where the parties' data lives ('' = the loaders' default)")
    s.add_argument("--parties", default="", help="comma-separated secondaries ('' = all of the dataset's)")
    s.add_argument("--insecure", action="store_true", help="plain HTTP and no node auth (local experiments only)")
    s.add_argument(
        "--privacy",
        default="",
        help="each secondary's own level: 'strict' for all or 'a=strict,b=off' ('' = standard; docs/privacy.md)",
    )
    s = sub.add_parser("link", help="link every party through the linkage service; each fetches its own result")
    s.add_argument("folder", type=Path)
    s.add_argument("--k", type=int, required=True)
    s.add_argument("--tau", type=float, default=None, help="the primary's attack bound (default: none, the floors')")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--n-rows", type=int, default=0, help="as the run's n-rows")
    s.add_argument("--layout", choices=["independent", "chain"], default="independent")
    s.add_argument("--radius", type=float, default=0.0, help="what tau bounds, identifier units; 0 = half the spacing")
    s.add_argument(
        "--privacy",
        choices=["off", "standard", "strict"],
        default=None,
        help="the floor every secondary states for its records (default: each its own level from `up`)",
    )
    s.add_argument("--compose", action="store_true", help="noise composed over each secondary record's links")
    s.add_argument(
        "--private",
        action="store_true",
        help="every party uploads keyed Bloom / FEDERAL filters of its identifiers (a key the service never sees)",
    )
    s = sub.add_parser("run", help="flwr run against the deployment (prints the run's log)")
    s.add_argument("folder", type=Path)
    s.add_argument("--run-config", default="", help="extra run-config values, 'key=value key2=value2'")
    add_predict_parser(sub)
    for name, what in (
        ("down", "stop everything `up` started"),
        ("status", "which processes of the deployment are running"),
    ):
        sub.add_parser(name, help=what).add_argument("folder", type=Path)
    return ap


def main(argv: list[str] | None = None) -> None:
    private_umask()  # the parties' folders, credentials, logs: 0600 files in 0700 folders
    args = parser().parse_args(argv)
    if args.command == "up":
        parties = [p for p in args.parties.split(",") if p] or None
        dep = up(args.folder, args.dataset, args.data_dir, parties, secure=not args.insecure, privacy=args.privacy)
        print(
            f"SuperLink 127.0.0.1:{dep.superlink.port} ({'TLS + node auth' if dep.secure else 'INSECURE'}), "
            f"SuperNodes {sorted(dep.nodes)} (privacy {dep.privacy}), linkage service {dep.service_url}"
        )
        folder = args.folder
        print(
            f"next: fedsim deploy link {folder} --k K, then fedsim train --deployment {folder} --dataset "
            f"{dep.dataset} (Entity Augmentation: no link, train with --mode entity-aug)"
        )
    elif args.command == "link":
        dep = Deployment.load(args.folder)
        print(
            "linkage job",
            link(
                dep,
                LinkRequest(
                    k=args.k,
                    tau=args.tau,
                    seed=args.seed,
                    layout=args.layout,
                    n_rows=args.n_rows,
                    radius=args.radius,
                    compose=args.compose,
                    privacy=args.privacy,
                    private=args.private,
                ),
            ),
        )
    elif args.command == "run":
        _run(args)
    elif args.command == "predict":
        sys.exit(predict_command(args))
    elif args.command == "down":
        print(f"stopped {down(args.folder)} running process(es) of {args.folder}")
    else:
        dep = Deployment.load(args.folder)
        for p in _procs(dep):
            print(f"{'running' if running(p) else 'stopped'}  pid {p.pid}  port {p.port}  {p.log}")


def _run(args: argparse.Namespace) -> None:
    """`flwr run` against the deployment; `flwr run` exits 0 when the ServerApp fails: the run's
    status decides (exit 1, the reason on stderr)."""
    extra = tomllib.loads(args.run_config.replace(" ", "\n")) if args.run_config else {}
    extra.setdefault("run-name", time.strftime("run-%Y%m%d-%H%M%S"))  # its folder holds its status.json
    dep, since = Deployment.load(args.folder), time.time()
    r = flwr_run(dep, extra)
    print(r.stdout[-20000:], r.stderr[-5000:])
    sys.exit(run_status.problem(Path(run_values(dep, extra)["out-dir"]) / str(extra["run-name"]), since))


if __name__ == "__main__":
    main()
