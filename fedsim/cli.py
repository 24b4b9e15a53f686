"""`fedsim`: the whole lifecycle in one command line.

    fedsim train    --dataset csv --data-dir my-data [-c k=20] [--engine inprocess] [--deployment DIR]
    fedsim link     ...   (and serve, create-job, make-key, encode, upload, start, status, fetch, query, cancel:
                           the linkage service and its parties; `fedsim link --help`)
    fedsim estimate ...   Definition 1's improvement estimate (Delta) from a primary's linkage result
    fedsim predict  RUN NEW.csv --out predictions.csv [--explain]
    fedsim report   [RUN]  one run's summary and plots; without RUN the sweeps' report
    fedsim sweep    conf/sweeps/<name>.toml [--quick]
    fedsim deploy   up|link|run|predict|down|status DIR ...

Exit status: 0 only when the command did what it says (a finished run, a written output).
"""

from __future__ import annotations

import argparse
import sys

from fedsim import predict, train
from files.private import private_umask

SERVICE = {  # fedsim <name> -> python -m linkage_server <name>
    "serve": "serve",
    "create-job": "create-job",
    "make-key": "make-key",
    "encode": "encode",
    "link": "link",
    "upload": "link",
    "start": "start",
    "status": "status",
    "fetch": "fetch",
    "query": "query",
    "cancel": "cancel",
    "estimate": "estimate",
}
DELEGATED = {
    **{k: f"the linkage service's `{v}`" + (" (an alias)" if k != v else "") for k, v in SERVICE.items()},
    "sweep": "a sweep of runs (experiments.sweep)",
    "deploy": "a local deployment (deploy.cli)",
}


def _service(name: str, rest: list[str]) -> int:
    from linkage_server.cli import main as service_main  # lazy: numpy and scipy, off `fedsim --help`

    return _exit_code(lambda: service_main([SERVICE[name], *rest], prog="fedsim"))


def _with_argv(prog: str, main, rest: list[str]) -> int:
    """A module's main() that reads sys.argv (its own parser, its own --help)."""
    argv, sys.argv = sys.argv, [prog, *rest]
    try:
        return _exit_code(main)
    finally:
        sys.argv = argv


def _exit_code(call) -> int:
    try:
        code = call()
    except SystemExit as e:
        code = e.code
    if isinstance(code, str):
        print(code, file=sys.stderr)
        return 1
    return int(code or 0)


def _delegate(name: str, rest: list[str]) -> int:
    if name in SERVICE:
        return _service(name, rest)
    if name == "sweep":
        from experiments.sweep import main as sweep_main  # lazy: torch, for `fedsim sweep` only

        return _with_argv("fedsim sweep", sweep_main, rest)
    from deploy.cli import main as deploy_main  # lazy: torch, for `fedsim deploy` only

    return _with_argv("fedsim deploy", lambda: deploy_main(rest), rest)  # its usage names the whole command


REPORT_HELP = """usage: fedsim report RUN
       fedsim report [--quick] [--sweeps SWEEPS] [--out OUT] [--existing] [--jobs JOBS]

RUN: a finished run's folder (e.g. runs/housing): prints its summary (best epoch, validation and
test metrics, hyperparameters, warnings, privacy) and writes learning_curve.png and
weight_gate.png into it.

Without RUN: the sweeps' report (experiments.report), with these options:
"""


def _report(rest: list[str]) -> int:
    from fedsim import report  # lazy: torch, for `fedsim report` only

    if rest and rest[0] in ("-h", "--help"):
        print(REPORT_HELP)
    elif rest and not rest[0].startswith("-") and not report.is_run(rest[0]):
        print(f"fedsim report: {rest[0]} is not a run folder (no config.json); `fedsim report --help`", file=sys.stderr)
        return 2
    if rest and report.is_run(rest[0]):
        from pathlib import Path

        if rest[1:]:
            print(f"fedsim report: report takes one RUN; unexpected {rest[1:]}", file=sys.stderr)
            return 2
        return report.one_run(Path(rest[0]))
    from experiments.report import main as sweeps_report  # lazy: torch, for the sweeps' report only

    return _with_argv("fedsim report", sweeps_report, rest)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="fedsim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train.add_parser(sub)
    predict.add_parser(sub)
    sub.add_parser(
        "report", help="`report RUN`: one run's summary and plots; `report` alone: the sweeps' report", add_help=False
    )
    for name, what in DELEGATED.items():
        sub.add_parser(name, help=what, add_help=False)
    return ap


def main(argv: list[str] | None = None) -> int:
    private_umask()  # every file a command writes (runs, models, linkage, secrets) is its owner's alone
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        return _delegate(argv[0], argv[1:])
    if argv and argv[0] == "report":
        return _report(argv[1:])
    args = parser().parse_args(argv)
    return {"train": train.command, "predict": predict.command}[args.command](args)
