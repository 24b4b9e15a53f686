"""`fedsim train`'s engines: the run in this process (a thread this terminal watches) or through
`flwr run` (a local simulation or a deployment), and what Ctrl-C leaves. Each returns the run's
output tail; the outcome is read from the run's status file (fedsim/train.py report_outcome)."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import time
from pathlib import Path

from fedsim.watch import interrupt, run_thread, tail, watch
from files.private import private_dir


class RunTimedOut(TimeoutError):
    """The command stopped a Flower run at its deadline (`fedsim train --timeout`)."""


class Signalled(KeyboardInterrupt):
    """SIGTERM (`kill`, a CI's cancel) or SIGHUP (a closed terminal): the run stops as at Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP stop the command's run as Ctrl-C does (:func:`stopped`), where they would
    kill it outright; a signal this command was started ignoring (`nohup`'s SIGHUP) stays ignored."""

    def stop(signum, frame) -> None:
        raise Signalled(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, stop)


def in_process_run(cfg, run_dir: Path, timeout: float) -> str:
    """The run in a thread this terminal watches; stopped at its next step by Ctrl-C (re-raised)
    or past ``timeout`` seconds (RunTimedOut)."""
    from app.modes import run_experiment  # lazy: the training stack (torch, flwr, pandas), off `fedsim --help`
    from app.run_status import RunInterrupted, RunPastDeadline  # lazy: as above

    since, deadline = time.time(), time.monotonic() + timeout  # progress from before `since` is an earlier run's
    thread, box = run_thread(lambda: run_experiment(cfg, run_dir))
    try:
        watch(
            lambda: not thread.is_alive() or time.monotonic() > deadline,
            run_dir,
            label=cfg.runtime.run_name,
            starting="loading the data and linking, in this process",
            since=since,
        )
    except KeyboardInterrupt:
        interrupt(thread, RunInterrupted)  # the run ends through its own status handling
        thread.join(timeout=STOP_WAIT)
        raise
    if thread.is_alive():  # past the deadline
        interrupt(thread, RunPastDeadline)
        thread.join(timeout=STOP_WAIT)
        raise RunTimedOut(f"timed out: the run had not ended when the command's --timeout of {timeout:g} s passed")
    thread.join()
    return f"{type(box['error']).__name__}: {box['error']}" if "error" in box else ""


def flower_run(values: dict, run_dir: Path, nodes: int, args: argparse.Namespace) -> str:
    """`flwr run` to its end, its output in <run>/flower.log; returns that log's tail."""
    private_dir(run_dir)
    log, since = run_dir / "flower.log", time.time()  # progress from before it is an earlier run's
    with open(log, "w") as out:
        if args.deployment:
            from deploy.commands import Deployment, start_run  # lazy: httpx, for a run through Flower only

            proc, stop = start_run(Deployment.load(args.deployment), values, output=out), None
        else:
            from deploy.localsim import (  # lazy: httpx; looked up per call, where tests stand in for Flower (deploy.localsim)
                start_simulation,
                stop_superlink,
            )

            home = Path(str(values["out-dir"])) / ".flower" / str(values["run-name"])
            proc, port = start_simulation(values, home, num_supernodes=nodes, output=out)
            stop = lambda: stop_superlink(port)  # noqa: E731 - flwr leaves its local SuperLink running
        timed_out = False
        try:
            deadline = time.monotonic() + args.timeout
            starting = (
                "submitting the run to the deployment"
                if args.deployment
                else f"starting Flower (a local SuperLink, {nodes} simulated SuperNode(s))"
            )
            watch(
                lambda: proc.poll() is not None or time.monotonic() > deadline,
                run_dir,
                label=str(values["run-name"]),
                starting=starting,
                since=since,
            )
        finally:
            if proc.poll() is None:
                timed_out = time.monotonic() > deadline
                proc.kill()
            proc.wait()
            if stop:
                stop()
                shutil.rmtree(home, ignore_errors=True)  # the simulation's own FLWR_HOME (installed app, state)
    if timed_out:
        raise RunTimedOut(f"timed out: the run had not ended when the command's --timeout of {args.timeout:g} s passed")
    return tail(log)


STOP_WAIT = 60.0  # seconds an interrupted in-process run gets to stop at its next step and record it


def stopped(run_dir: Path, since: float, error: BaseException) -> int:
    """Ctrl-C, SIGTERM or SIGHUP (``error`` a KeyboardInterrupt: exit 128 + the signal, as a shell
    reports it; 130 for Ctrl-C) or the command's timeout (exit 1): the run stopped; a status it
    left 'running' (Flower's processes stopped with the command) says it failed and why. The line
    says what the folder now holds (the run's failure and a finished run it kept, or a run that
    had finished)."""
    from app.run_status import RunInterrupted, mark_stopped, problem  # lazy: numpy and torch, off `fedsim --help`

    interrupted = isinstance(error, KeyboardInterrupt)
    signum = error.signum if isinstance(error, Signalled) else signal.SIGINT
    name = signal.Signals(signum).name
    mark_stopped(run_dir, since, RunInterrupted(f"interrupted ({name}); the run stopped") if interrupted else error)
    why = f"interrupted ({name})" if interrupted else str(error)
    print(f"fedsim train: {why}; {problem(run_dir, since) or f'run {run_dir} had finished'}", file=sys.stderr)
    return 128 + signum if interrupted else 1  # as a shell reports the signal (Ctrl-C: 130)
