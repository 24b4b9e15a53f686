"""`fedsim train`: the Flower app through `flwr run` on a local simulation (default), on a
deployment (--deployment DIR), or every party in this process (--engine inprocess).

The run config is assembled from the options and `-c key=value` pairs, paths made absolute
against the user's working folder, and checked (every key and value, then the data itself)
before Flower sees it: an error names the key or the file and exits 2. The exit status is the
run's outcome (its status file): 0 only for a finished run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fedsim.helpfmt import HelpFormatter
from fedsim.train_engines import RunTimedOut, flower_run, in_process_run, stop_on_signals, stopped
from files.run_lock import hold_run
from files.source_tree import refuse_source
from strategies.vfl.methods import REGISTRY

FLAGS = ("dataset", "data_dir", "out_dir", "run_name", "mode", "method", "epochs", "seed")


def add_parser(sub) -> None:
    s = sub.add_parser(
        "train", help="train a federation (Flower simulation, deployment, or in process)", formatter_class=HelpFormatter
    )
    s.add_argument(
        "--dataset",
        default=None,
        help="a built-in dataset, or csv (your parties.toml in --data-dir); unset = hdb, or the deployment's",
    )
    s.add_argument("--data-dir", default="", help="folder of the data ('' = the loaders' default)")
    s.add_argument("--out-dir", default=None, help="where run folders go; unset = ./runs, or the deployment's runs/")
    s.add_argument("--run-name", default="", help="the run's folder name ('' = <dataset>-<method>-<time>)")
    s.add_argument(
        "--mode",
        default="vfl",
        choices=("vfl", "entity-aug"),
        help="vfl: FedSim and its baselines; entity-aug: Entity Augmentation",
    )
    s.add_argument(
        "--method",
        default=None,
        help="mode vfl's method (strategies/vfl/methods.py): "
        + "; ".join(f"{m.name}: {m.summary}" for m in REGISTRY.values())
        + " (default: fedsim_attn; on your own parties the recipe search's choice)",
    )
    s.add_argument("--seed", type=int, default=0, help="the run's seed (data split, initial weights, batches)")
    s.add_argument(
        "-c",
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other run-config key (pyproject.toml [tool.flwr.app.config]), repeatable",
    )
    s.add_argument(
        "--engine",
        choices=("simulation", "inprocess"),
        default="simulation",
        help="simulation: `flwr run` on a local simulation; inprocess: every party in this process",
    )
    _search_arguments(s)
    s.add_argument("--deployment", type=Path, default=None, help="a `fedsim deploy up` folder to train on")
    s.add_argument("--resume", action="store_true", help="go on from the run's last checkpoint (needs --run-name)")
    s.add_argument(
        "--timeout",
        type=float,
        default=24 * 3600,
        help="seconds before the run is stopped (marked failed, exit 1), in process or through Flower",
    )
    s.add_argument(
        "--no-yardstick",
        action="store_true",
        help="skip the primary-alone and pooled-data references printed beside the run (their boosting time)",
    )


def _search_arguments(s) -> None:
    s.add_argument(
        "--recipe",
        choices=("search", "given"),
        default="search",
        help="mode vfl, every party's data here (own or built-in): search = choose the method and input "
        "encoding on validation folds of the run's training rows (docs/own-data.md); given = train with "
        "the values set (or their defaults) as they are",
    )
    s.add_argument(
        "--budget",
        type=int,
        default=None,
        help="the recipe search's size in runs, each about one run's time: the run itself, BUDGET - 1 "
        "candidates and members (default 4: fedsim_attn, the paper's FedSim, fedsim_attn on ple inputs; "
        "5 and 6: then 1 or 2 more members of the run, the ensemble's size chosen on validation; "
        "7-9: then the other candidates: the paper's FedSim on ple inputs, fedsim_attn started silent)",
    )
    s.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="epochs (the maximum with early stopping); unset = the run config's default",
    )


def run_values(args: argparse.Namespace) -> dict[str, object]:
    """The run config: flags, then -c pairs (which win), paths absolute, a run name always."""
    values: dict[str, object] = {"mode": args.mode, "seed": args.seed}
    if args.method:
        values["method"] = args.method
    if args.dataset or not args.deployment:
        values["dataset"] = args.dataset or "hdb"
    if args.epochs is not None:
        values["epochs"] = args.epochs
    if args.data_dir:
        values["data-dir"] = str(Path(args.data_dir).expanduser().resolve())
    if args.out_dir or not args.deployment:
        values["out-dir"] = str(Path(args.out_dir or "runs").expanduser().resolve())
    if args.resume:
        values["resume"] = True
    from app.config import parse_pairs  # lazy: `fedsim --help` stays fast

    values.update(parse_pairs(args.config))
    _own_parties(values, bool(args.dataset) or any(p.partition("=")[0].strip() == "dataset" for p in args.config))
    if args.deployment:  # the deployment's dataset, data, linkage job and runs folder, unless said here
        from deploy.commands import Deployment  # lazy: httpx and numpy, for --deployment only
        from deploy.commands import run_values as deployment_values  # lazy: httpx and numpy, for --deployment only

        values = deployment_values(Deployment.load(args.deployment), values)
    _built_in_data(values)
    for key in ("data-dir", "out-dir", "linkage-dir"):
        if values.get(key):
            values[key] = str(Path(str(values[key])).expanduser().resolve())
    if not values.get("run-name"):
        values["run-name"] = args.run_name or auto_run_name(values, time.strftime("%Y%m%d-%H%M%S"))
    return values


def auto_run_name(values: dict[str, object], stamp: str) -> str:
    """A run nobody named: ``<dataset>-<method, or the mode>-<stamp>``."""
    what = values["mode"] if values["mode"] != "vfl" else values.get("method", "fedsim_attn")
    return f"{values['dataset']}-{what}-{stamp}"


def renamed_for(values: dict[str, object], chosen: dict[str, object]) -> dict[str, object]:
    """``chosen`` (the searched run's values); a run that carries its automatic name is named for
    the method the search chose (its stamp kept), one the user named keeps its name."""
    stamp = "-".join(str(values["run-name"]).rsplit("-", 2)[-2:])  # the time, as %Y%m%d-%H%M%S
    if str(values["run-name"]) != auto_run_name(values, stamp):
        return chosen
    return {**chosen, "run-name": auto_run_name(chosen, stamp)}


def _built_in_data(values: dict[str, object]) -> None:
    """A built-in dataset without a data-dir: the folder its loader finds from here, made explicit,
    since Flower runs the app from its own install folder where the defaults do not resolve
    (one not found here is left for the check to name)."""
    from datasets.errors import DatasetError  # lazy: off `fedsim --help`
    from datasets.options import find_data_dir  # lazy: off `fedsim --help`
    from datasets.registry import data_folder, dataset_names  # lazy: off `fedsim --help`

    folder = data_folder(str(values.get("dataset", "")))
    if values.get("data-dir") or not folder or values.get("dataset") not in dataset_names():
        return
    try:
        values["data-dir"] = str(find_data_dir(folder, None).parent)
    except DatasetError:
        return


def _own_parties(values: dict[str, object], dataset_given: bool) -> None:
    """A data-dir holding parties.toml is the user's own parties (dataset csv): said and used when
    no dataset was given, refused with the hint when another one was."""
    from datasets.options import SPEC  # lazy: off `fedsim --help`

    folder = Path(str(values.get("data-dir") or ".")).expanduser()
    if not values.get("data-dir") or values.get("dataset") == "csv" or not (folder / SPEC).is_file():
        return
    if dataset_given:
        raise ValueError(
            f"--data-dir {folder} holds {SPEC} (your own parties): add --dataset csv (not {values.get('dataset')!r})"
        )
    values["dataset"] = "csv"
    print(f"--data-dir {folder} holds {SPEC}: training on your own parties (--dataset csv)")


def check(values: dict[str, object]):
    """The typed config and the number of SuperNodes (secondaries, in either mode), loading the
    data: a bad key, value or file is named before Flower starts."""
    from app.config import RunConfig  # lazy: torch and flwr, off `fedsim --help`

    cfg = RunConfig.from_flower(values)
    if cfg.train.mode == "entity-aug":
        # also what the ServerApp would refuse about the data
        from app.entity_aug.id_exchange import check as ea_check  # lazy: torch and flwr, off `fedsim --help`

        return cfg, len(ea_check(cfg))
    # require_linkable: what the ServerApp's linkage would refuse
    from app.data import primary_data  # lazy: torch, off `fedsim --help`
    from app.vfl.exchange import require_defences  # lazy: torch and flwr, off `fedsim --help`
    from app.vfl.linking import require_linkable  # lazy: torch and flwr, off `fedsim --help`

    ds = primary_data(cfg)  # what the primary's ServerApp reads: with linkage-dir, csv reads its own file only
    require_linkable(ds, cfg)
    require_defences(ds, cfg)
    return cfg, len(ds.party_names)


def refuse_file_on(folder: Path, what: str) -> None:
    """Refuse a ``folder`` that is a file or lies under one (its nearest existing path)."""
    for path in (folder, *folder.parents):
        if path.exists():
            if not path.is_dir():
                raise ValueError(f"{what} {folder}: {path} is a file, not a folder")
            return


def command(args: argparse.Namespace) -> int:
    stop_on_signals()  # kill / a closed terminal stop the run as Ctrl-C does, its status said
    with contextlib.ExitStack() as held:
        try:
            if args.budget is not None and args.budget < 1:
                raise ValueError(f"--budget must be a whole number of runs >= 1, got {args.budget}")
            if not args.timeout > 0:  # NaN too
                raise ValueError(f"--timeout must be a number of seconds > 0, got {args.timeout:g}")
            values = run_values(args)
            out = Path(str(values.get("out-dir") or "runs"))
            refuse_source(out, "--out-dir")  # runs never land in the source
            refuse_file_on(out, "--out-dir")  # before the data is read, not as the run starts
            cfg, nodes = check(values)
            held.enter_context(hold_run(cfg.out_path() / cfg.runtime.run_name))  # one command per run, until it ends
        except Exception as e:  # noqa: BLE001 - a configuration or data error, named
            print(f"fedsim train: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        return train_checked(args, values, cfg, nodes)


def train_checked(args: argparse.Namespace, values: dict, cfg, nodes: int) -> int:
    """The checked run (its recipe searched first unless given), then its members and yardstick."""
    run_dir = cfg.out_path() / cfg.runtime.run_name
    in_process = args.engine == "inprocess" and not args.deployment
    from fedsim.search_step import given, step  # lazy: the search's modules

    searched, user = step(cfg, values, run_dir, args, in_process), given(values)
    if isinstance(searched, int):
        return searched
    if searched is not None:
        values = renamed_for(values, searched.values)
        cfg = check(values)[0]
        run_dir = cfg.out_path() / cfg.runtime.run_name
    print(
        f"run {cfg.runtime.run_name}: {cfg.train.mode} {cfg.train.method if cfg.train.mode == 'vfl' else cfg.ea.variant} on {cfg.data.dataset} "
        f"({nodes} secondary node(s)), engine {'deployment' if args.deployment else args.engine} -> {run_dir}"
    )
    print(
        "\n".join(hyperparameter_text(cfg, listed=not in_process)), flush=True
    )  # in process: the run's log lists them
    train = engine(args, nodes, in_process)
    code = train(values, run_dir)
    if code == 0 and searched is not None:
        from fedsim import ensemble_step  # lazy: the search's modules
        from fedsim.search_step import write  # lazy: the search's modules

        write(run_dir, searched, user)
        if searched.members:
            code = ensemble_step.run(values, run_dir, searched.members, train)
    return yardstick(cfg, run_dir, args, values) if code == 0 and not args.no_yardstick else code


def engine(args: argparse.Namespace, nodes: int, in_process: bool) -> Callable[[dict, Path], int]:
    """``train(values, run folder) -> exit status``: the run, then any member of it, by the engine
    the command chose, its outcome read from the run's status (:func:`report_outcome`)."""

    def train(run_values: dict, folder: Path) -> int:
        from app.config import RunConfig  # lazy: torch and flwr, off `fedsim --help`

        started = time.time()
        try:
            if in_process:
                outcome = in_process_run(RunConfig.from_flower(run_values), folder, args.timeout)
            else:
                outcome = flower_run(run_values, folder, nodes, args)
        except (KeyboardInterrupt, RunTimedOut) as e:  # Ctrl-C, or the command's --timeout
            return stopped(folder, started, e)
        return report_outcome(folder, started, outcome)

    return train


def yardstick(cfg, run_dir: Path, args: argparse.Namespace, values: dict) -> int:
    """The finished run's yardstick (fedsim/yardstick.py), printed and kept in its folder. One that
    cannot be computed (e.g. a deployment's primary host without the data the EA tables need) is a
    warning with its reason, and no yardstick.json: the exit status stays the run's (finished)."""
    from fedsim import yardstick as ys  # lazy: scikit-learn and the loaders, after training only

    why = ""
    if args.deployment:
        why = "a deployment's secondaries keep their data on their own hosts"
    elif cfg.link.linkage_dir:
        why = "this primary reads only its own file (linkage-dir)"
    solo = cfg.train.mode == "vfl" and cfg.data.dataset == "csv" and not why  # own data: the neural model alone too
    print(
        "yardstick: boosting the primary alone"
        + (", its neural model alone" if solo else "")
        + ("" if why else " and the pooled data")
        + " on the run's split",
        flush=True,
    )
    try:
        result = ys.measure(cfg, run_dir, why, ys.neural_alone(values, run_dir) if solo else None)
    except Exception as e:  # noqa: BLE001 - named, the run kept
        print(f"warning: the run finished; its yardstick was not computed: {type(e).__name__}: {e}", file=sys.stderr)
        return 0
    ys.write(run_dir, result)
    print("\n".join(ys.lines(result)) + f"  ({result['seconds']} s)")
    return 0


def hyperparameter_text(cfg, listed: bool = True) -> list[str]:
    """The hyperparameters the run will use and where each came from (as its log and summary.json
    say; ``listed`` False: only where they are), and how epochs are numbered."""
    from app.run_record import hyperparameter_lines  # lazy: numpy and torch, off `fedsim --help`

    numbering = "epochs are numbered from 0 (as best_epoch in summary.json and metrics.jsonl)"
    if not listed:  # an in-process run logs them to this terminal itself, as it starts
        return [numbering]

    if cfg.train.mode == "entity-aug":
        from app.entity_aug.parties import hyperparameters  # lazy: the EA stack only for its mode

        hyper = hyperparameters(cfg)[2]
    else:
        hyper = cfg.hyperparameters()
    return ["hyperparameters (by where each value came from):", *hyperparameter_lines(hyper), numbering]


def report_outcome(run_dir: Path, since: float, output: str) -> int:
    """Exit status from the run's status file; the summary's headline on success."""
    from app.run_status import problem  # lazy: numpy and torch, off `fedsim --help`

    why = problem(run_dir, since)
    if why:
        print(f"fedsim train: {why}", file=sys.stderr)
        if output.strip():
            print(f"--- the run's output (last lines) ---\n{output}", file=sys.stderr)
        return 1
    summary = json.loads((run_dir / "summary.json").read_text())
    print(
        f"finished: best epoch {summary['best_epoch']}/{summary.get('epochs_run', '?')} | val {_fmt(summary['val'])} "
        f"| test {_fmt(summary['test'])}"
    )
    for warning in summary.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    print(f"run folder: {run_dir}")
    return 0


def _fmt(metrics: dict) -> str:
    return " ".join(f"{k}={v:.4f}" for k, v in metrics.items())
