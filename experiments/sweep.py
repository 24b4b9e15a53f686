"""Run a sweep file's (dataset, variant, seed) runs, resume where it stopped, and tabulate.

    python -m experiments.sweep conf/sweeps/baselines.toml            # the full preset
    python -m experiments.sweep conf/sweeps/baselines.toml --quick    # its [quick] overrides (minutes)
    python -m experiments.sweep conf/sweeps/baselines.toml --engine flower   # every run through `flwr run`
    python -m experiments.sweep conf/sweeps/baselines.toml --jobs 8   # 8 runs at once (a many-core machine)
    python -m experiments.sweep conf/sweeps/baselines.toml --ray local --threads 2   # each run a Ray task

A sweep file names datasets, seeds, run-config values for every run (`[set]`, and
`[set.<dataset>]`), optionally its `engine`, and variants (`[variants]`: name -> run-config
values, e.g. a method or an ablation). Each run writes
runs/sweeps/<sweep>/<dataset>/<variant>/s<seed>/summary.json; a finished run (its
status.json, app/run_status.py) is skipped, so an interrupted sweep resumes. At the end it writes
results.csv (one row per run), results.md (mean ± std over seeds of the test metric at the
best-validation epoch) and plots (learning curves; the weight gate's similarity -> weight curve).
Engine "inprocess" runs the federated protocol with in-process secondaries, which the twin
oracles prove equal to `flwr run` (tests/test_equivalence.py, tests/test_flower_run.py).
A failed run does not stop the others; the command then exits 1, each failure on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from app.run_files import CONFIG, FILES
from app.run_status import STATUS, is_finished
from experiments.runner import REPO, run_flower
from experiments.sweep_tables import key_metric, markdown, param_plot, plots, tabulate
from files.private import private_umask

ENGINES = ("inprocess", "flower")
KEYS = {"datasets", "seeds", "set", "variants", "quick", "x", "engine", "name"}  # what a sweep file may hold
QUICK_KEYS = {"seeds", "set"}


def load_sweep(path: Path, quick: bool) -> dict:
    """The sweep file, refused by name where it lacks a key or holds one the runner would ignore
    (a misspelt section, a run-config key above [set], a [set.<dataset>] for a dataset not run)."""
    sweep = tomllib.loads(path.read_text())
    for key in ("datasets", "seeds", "variants"):
        if key not in sweep:
            raise SystemExit(f"{path}: missing '{key}'")
    stray = sorted(set(sweep) - KEYS) + sorted(f"quick.{k}" for k in set(sweep.get("quick", {})) - QUICK_KEYS)
    if stray:
        raise SystemExit(f"{path}: keys a sweep file does not have: {stray} (it may hold {sorted(KEYS)})")
    per_dataset = {k for k, v in sweep.get("set", {}).items() if isinstance(v, dict)} - set(sweep["datasets"])
    if per_dataset:
        raise SystemExit(f"{path}: [set.<dataset>] for datasets it does not run: {sorted(per_dataset)}")
    if quick:
        q = sweep.get("quick", {})
        sweep["seeds"] = q.get("seeds", sweep["seeds"])
        sweep["quick_set"] = q.get("set", {})
    sweep.setdefault("name", path.stem + ("-quick" if quick else ""))
    return sweep


def applies(sweep: dict, dataset: str, variant: str) -> bool:
    """A variant may name the datasets it applies to (`only = [...]`, e.g. combine: synthetic sets)."""
    only = sweep["variants"][variant].get("only")
    return only is None or dataset in only


def run_values(sweep: dict, dataset: str, variant: str, seed: int) -> dict:
    common = {k: v for k, v in sweep.get("set", {}).items() if not isinstance(v, dict)}
    per_dataset = sweep.get("set", {}).get(dataset, {})
    own = {k: v for k, v in sweep["variants"][variant].items() if k != "only"}
    return {"dataset": dataset, **common, **per_dataset, **own, **sweep.get("quick_set", {}), "seed": seed}


def check_runs(path: Path, sweep: dict) -> None:
    """Every run the sweep file asks for has a run config the runs accept (a misspelt key, a value
    out of range), refused by name before any run starts."""
    from app.config import ConfigError, RunConfig  # lazy: the data stack, for a sweep about to run

    problems = []
    for dataset in sweep["datasets"]:
        for variant in (v for v in sweep["variants"] if applies(sweep, dataset, v)):
            try:
                RunConfig.from_flower(run_values(sweep, dataset, variant, sweep["seeds"][0]))
            except ConfigError as e:
                problems.append(f"variant {variant!r} on {dataset}: {e}")
    if problems:
        raise SystemExit(f"{path}: " + "; ".join(problems) + "; no run started")


def same_settings(out: Path, values: dict) -> bool:
    """Whether the finished run in ``out`` ran with the run config ``values`` gives now (its
    config.json), out-dir and run name aside: a sweep file changed since runs it again rather than
    tabulating a run of other settings as its own."""
    from app.config import RunConfig  # lazy: the data stack, once a finished run is there to compare

    if not (out / CONFIG).exists():  # a run from before config.json: as it was, reused
        return True
    then = json.loads((out / CONFIG).read_text()).get("run", {})
    now = RunConfig.from_flower(values).flat()
    return all(then.get(k) == v for k, v in now.items() if k not in ("out_dir", "run_name"))


def run_one(values: dict, out: Path, engine: str) -> dict:
    """One run into ``out``: its run record (app/run_record.py, which names the machine it ran
    on) and status, as the engine wrote them; the sweep never rewrites them."""
    return _flower_run(values, out) if engine == "flower" else _inprocess_run(values, out)


def _flower_run(values: dict, out: Path) -> dict:
    """Through `flwr run` into a scratch folder, then the run's files copied as they are
    (status.json last: the copy is finished only once it is there)."""
    with tempfile.TemporaryDirectory() as tmp:
        summary, run_dir, _ = run_flower(values, Path(tmp), "run")
        out.mkdir(parents=True, exist_ok=True)
        for name in (*FILES, STATUS):
            if (run_dir / name).exists():
                (out / name).write_bytes((run_dir / name).read_bytes())
        return summary


def _inprocess_run(values: dict, out: Path) -> dict:
    from app.config import RunConfig  # lazy: torch and flwr, in the worker only
    from app.modes import run_experiment  # lazy: in the worker; tests patch it

    return run_experiment(RunConfig.from_flower({**values, "out-dir": str(out.parent / ".linkage")}), out)


def _run_guarded(values: dict, out: Path, engine: str, threads: int) -> dict | str:
    """One run: its summary, or the error with its traceback as text. In a worker process
    (``threads`` > 0) torch and the BLAS/OpenMP pools get ``threads`` threads each."""
    import traceback

    from threadpoolctl import threadpool_limits

    if threads:
        import os

        import torch

        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # the run's own choice (app/threads.py) stays under it
    try:
        with threadpool_limits(limits=threads or None):
            return run_one(values, out, engine)
    except Exception as e:
        return f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}"


@dataclass(frozen=True)
class Workers:
    """Where a sweep's runs execute: one at a time in this process (``jobs`` 1), ``jobs`` spawned
    processes at once, or (``ray``: "local" or a cluster's address) each a Ray task of ``threads`` CPUs."""

    jobs: int = 1
    ray: str = ""
    threads: int = 1


def run_pending(pending: list[tuple[str, dict, Path]], engine: str, workers: Workers = Workers()):
    """Yield (name, summary or error text) for each pending run, ``workers.jobs`` at a time. Each
    worker is a fresh (spawned) process with usable cores // jobs threads, so runs never share state
    and CUDA initialises per process; results come back as runs finish. A worker that dies (out of
    memory, a crash) fails its run, not the sweep; leaving early cancels the queued runs. With
    ``workers.ray`` every run is a Ray task of ``workers.threads`` CPUs instead."""
    if workers.ray:
        yield from run_on_ray(pending, engine, workers.ray, workers.threads)
        return
    jobs = min(workers.jobs, len(pending))
    if jobs <= 1:
        for name, values, out in pending:
            yield name, _run_guarded(values, out, engine, 0)
        return
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor, as_completed

    threads = max(1, len(os.sched_getaffinity(0)) // jobs)
    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {pool.submit(_run_guarded, values, out, engine, threads): name for name, values, out in pending}
        for f in as_completed(futures):
            try:
                yield futures[f], f.result()
            except Exception as e:  # BrokenProcessPool: the worker died
                yield futures[f], f"{type(e).__name__}: {e}"
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def run_on_ray(pending: list[tuple[str, dict, Path]], engine: str, address: str, threads: int):
    """Each run a Ray task reserving ``threads`` CPUs (torch and BLAS get as many threads), as the
    cluster has room; results as they finish; a task that fails or whose worker dies fails its run
    only. Run folders are written by the node that runs them: on a cluster, the sweep's root must
    be a folder every node sees (a shared filesystem)."""
    from linkage_server.chunk_search import connect  # lazy: Ray, for --ray only

    connect(address)  # before this module imports Ray: connect chooses its authentication mode
    import ray

    task = ray.remote(num_cpus=threads, max_retries=0)(_run_guarded)
    refs = {task.remote(values, out, engine, threads): name for name, values, out in pending}
    try:
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            name = refs.pop(done[0])
            try:
                yield name, ray.get(done[0])
            except Exception as e:  # the task's worker died
                yield name, f"{type(e).__name__}: {e}"
    finally:
        for ref in refs:  # leaving early: cancel the runs not finished
            ray.cancel(ref)


def progress_bar(console=None):
    """Runs done / total, elapsed, ETA on stderr (``console``: another rich Console); quiet when it
    is not a terminal (a log file, CI)."""
    from rich import console as rc
    from rich import progress as rp

    console = console or rc.Console(stderr=True)
    return rp.Progress(
        rp.TextColumn("sweep"),
        rp.BarColumn(),
        rp.MofNCompleteColumn(),
        rp.TextColumn("runs"),
        rp.TimeElapsedColumn(),
        rp.TextColumn("ETA"),
        rp.TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,
    )


def run_all(
    pending: list[tuple[str, dict, Path]],
    engine: str,
    log,
    already: int = 0,
    console=None,
    workers: Workers = Workers(),
) -> list[str]:
    """The pending runs under a progress bar (``already``: the sweep's runs finished before); returns
    the failures ("<run>: <error>"), each logged: one bad run does not stop the sweep, nor is it tabulated."""
    failures: list[str] = []
    with progress_bar(console) as bar:
        task = bar.add_task("sweep", total=already + len(pending), completed=already)
        for name, result in run_pending(pending, engine, workers):
            bar.advance(task)
            if isinstance(result, str):
                failures.append(f"{name}: {result}")
                log(f"FAILED {failures[-1]}")
                continue
            metric, _ = key_metric(result)
            log(
                f"{name}: test {metric} {result['test'][metric]:.4f} (best epoch {result['best_epoch']}, "
                f"{result['epochs_run']} epochs run)"
            )
    return failures


class SweepFailed(RuntimeError):
    """Runs of a sweep failed; the table and plots of the others were written all the same."""

    def __init__(self, md: str, pngs: list[Path], failures: list[str]) -> None:
        super().__init__(f"{len(failures)} run(s) failed:\n" + "\n".join(failures))
        self.md, self.pngs, self.failures = md, pngs, failures


def run_sweep(
    path: Path,
    quick: bool = False,
    engine: str | None = None,
    root: Path | None = None,
    log=print,
    existing_only: bool = False,
    workers: Workers = Workers(),
) -> tuple[str, list[Path]]:
    """Run (or resume) a sweep; returns its markdown table and plot files (SweepFailed, which
    carries them, when a run failed). With
    ``existing_only`` nothing runs: the finished runs are tabulated and the missing ones listed.
    ``workers``: where the runs execute (:class:`Workers`); a progress bar on a terminal."""
    sweep = load_sweep(path, quick)
    check_runs(path, sweep)
    engine = engine or sweep.get("engine", "inprocess")  # a sweep file may name its engine
    if engine not in ENGINES:
        raise SystemExit(f"{path}: engine must be one of {ENGINES}, got {engine!r}")
    root = (root or REPO / "runs" / "sweeps") / sweep["name"]
    t0 = time.perf_counter()
    missing, pending, finished = [], [], 0
    for dataset in sweep["datasets"]:
        for variant in sweep["variants"]:
            for seed in sweep["seeds"]:
                out = root / dataset / variant / f"s{seed}"
                values = run_values(sweep, dataset, variant, seed)
                if not applies(sweep, dataset, variant):
                    continue
                if is_finished(out) and same_settings(out, values):
                    finished += 1
                    continue
                if existing_only:
                    missing.append(f"{dataset} {variant} seed {seed}")
                    continue
                pending.append((f"{dataset} {variant} seed {seed}", values, out))
    failures = run_all(pending, engine, log, already=finished, workers=workers)
    rows = tabulate(root, sweep)
    shown = path.relative_to(REPO) if path.is_absolute() and path.is_relative_to(REPO) else path
    command = (
        f"python -m experiments.sweep {shown}"
        + (" --quick" if quick else "")
        + (f" --engine {engine}" if engine != sweep.get("engine", "inprocess") else "")
    )  # as the user must type it
    md = markdown(rows, sweep, command, engine, time.perf_counter() - t0)
    if failures:
        md += "\nFailed runs:\n" + "\n".join(f"- {f}" for f in failures) + "\n"
    if missing:
        md += (
            f"\n**Not run yet** ({len(missing)} of the preset's runs; the table shows the finished ones): "
            + ", ".join(missing)
            + "\n"
        )
    (root / "results.md").write_text(md)
    pngs = plots(root, sweep) + param_plot(root, sweep, rows)
    if failures:
        raise SweepFailed(md, pngs, failures)
    return md, pngs


def main() -> None:
    private_umask()  # runs hold models and linkage: their owner's alone
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--engine", choices=ENGINES, default=None, help="default: the sweep file's `engine`, else inprocess"
    )
    ap.add_argument("--root", type=Path, default=REPO / "runs" / "sweeps")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process (default 1)")
    ap.add_argument(
        "--ray",
        default="",
        metavar="ADDRESS",
        help="run every run as a Ray task: 'local' or a cluster's address (its nodes must see --root)",
    )
    ap.add_argument("--threads", type=int, default=1, help="with --ray: CPUs (and torch threads) per run")
    args = ap.parse_args()
    if args.jobs < 1 or args.threads < 1:
        ap.error("--jobs and --threads must be at least 1")
    failed = None
    try:
        md, pngs = run_sweep(
            args.sweep.resolve(),
            args.quick,
            args.engine,
            args.root,
            log=lambda m: print(m, flush=True),
            workers=Workers(args.jobs, args.ray, args.threads),
        )
    except SweepFailed as e:
        md, pngs, failed = e.md, e.pngs, e
    print(md + "".join(f"\n![{p.stem}]({p})\n" for p in pngs))
    if failed:
        print(failed, file=sys.stderr)  # every failed run and its error
        sys.exit(1)


if __name__ == "__main__":
    main()
