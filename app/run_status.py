"""The run-status file: ``<run folder>/status.json`` says whether a run is running, finished or
failed (with the error), so that no script takes a run's success from `flwr run`'s exit code (0
even when the ServerApp fails: "Exit Code: 700") or from an old summary.json.

    {"state": "running" | "finished" | "failed", "error": "LinkageError: K=..." | null,
     "traceback": str | null, "engine": "flower" | "inprocess", "resumed": bool,
     "started": unix s, "ended": unix s | null, "pid": int, "host": str}

Every engine (app/vfl/server.py, app/vfl/inprocess.py, app/entity_aug/server.py and inprocess.py) runs inside
:meth:`RunStatus.recording`. :meth:`RunStatus.start` first removes what an earlier run under the
name left that could look current (a fresh run: summary, metrics, model, config; a resumed run:
its summary), then writes "running"; the block's end writes "finished" (after summary.json) and
an exception writes "failed" with the error, removes this run's summary, and propagates. A run
that fails where a finished run was never destroys it: the finished run's files wait in
``.previous/`` while the new run is under way and are put back if it fails (its failure then in
``last-attempt.json``, which :func:`problem` reports). A run refused before it starts (a resume
with nothing to resume or another config) touches no file.
summary.json exists only for a finished run. Tools check with :func:`require_finished` or

    python -m app.run_status check RUN_DIR [--since UNIX_TIME]  # exit 1 unless finished; the error on stderr
    python -m app.run_status folder 'k=v ...' ['k=v ...']       # check run-config strings as `flwr run
                                                                  # --run-config` takes them; print the run folder
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

from app.run_files import DERIVED, FILES, FOLDERS, SUMMARY, read_json
from files.atomic import write_atomic
from files.private import private_dir

STATUS = "status.json"


class RunFailed(RuntimeError):
    """A run that did not finish; the message says why (its error, or that it never started)."""


class RunPastDeadline(KeyboardInterrupt):
    """The command's --timeout passed (fedsim train): an in-process run stops at its next step."""

    def __init__(self, *args) -> None:
        super().__init__(*(args or ("timed out: the command's --timeout passed; the run stopped",)))


class RunInterrupted(KeyboardInterrupt):
    """The user interrupted the command running the run (Ctrl-C, SIGINT)."""

    def __init__(self, *args) -> None:
        super().__init__(*(args or ("interrupted (Ctrl-C / SIGINT); the run stopped",)))


def read(folder: Path) -> dict | None:
    path = Path(folder) / STATUS
    return read_json(path) if path.exists() else None


class RunStatus:
    """The status file of one run folder; nothing is written before :meth:`start`."""

    def __init__(self, folder: Path, engine: str) -> None:
        self.folder, self.engine = Path(folder), engine
        self.record: dict | None = None

    def start(self, *, resume: bool = False) -> None:
        """The run begins: an earlier run's files go first (a fresh run: a finished run's are set
        aside in PREVIOUS until this one finishes, any other's removed; a resumed run: its summary,
        its metrics and checkpoints go on), then "running"."""
        private_dir(self.folder)
        _recover(self.folder)  # an attempt killed while a finished run was set aside: put it back
        (self.folder / LAST_ATTEMPT).unlink(missing_ok=True)
        if not resume and is_finished(self.folder):
            _move(self.folder, private_dir(self.folder / PREVIOUS))
        for name in ((SUMMARY, *DERIVED) if resume else FILES + DERIVED) + (STATUS,):
            (self.folder / name).unlink(missing_ok=True)
        for name in () if resume else FOLDERS:
            shutil.rmtree(self.folder / name, ignore_errors=True)
        self.record = {
            "state": "running",
            "error": None,
            "traceback": None,
            "engine": self.engine,
            "resumed": resume,
            "started": time.time(),
            "ended": None,
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }
        self._write()

    def _write(self) -> None:
        write_atomic(self.folder / STATUS, json.dumps(self.record, indent=2).encode())

    def _end(self, error: BaseException | None) -> None:
        if error is None:
            self.record.update(state="finished", ended=time.time())
            self._write()
            shutil.rmtree(self.folder / PREVIOUS, ignore_errors=True)  # replaced by a finished run
            return
        (self.folder / SUMMARY).unlink(missing_ok=True)  # no summary for a failed run
        self.record.update(
            state="failed",
            ended=time.time(),
            error=f"{type(error).__name__}: {error}",
            traceback="".join(traceback.format_exception(error))[-8000:],
        )
        if (self.folder / PREVIOUS).is_dir():  # the finished run this one was to replace stays the folder's
            write_atomic(self.folder / LAST_ATTEMPT, json.dumps(self.record, indent=2).encode())
            _recover(self.folder)
        else:
            self._write()

    @contextmanager
    def recording(self):
        """Run the block as the run: its end marks a started run finished, an exception marks it
        failed (and propagates). A run that never started leaves the folder as it was."""
        try:
            yield self
        except BaseException as e:
            if self.record is not None:
                self._end(e)
            raise
        if self.record is not None:
            self._end(None)


def mark_stopped(folder: Path, since: float, error: BaseException | None = None) -> None:
    """A run that its command stopped and left 'running' (a Flower run's ServerApp dies with the
    processes the command stops: Ctrl-C, or the command's timeout) and that started at ``since``
    or later: failed with ``error`` (default: interrupted), as its own :meth:`RunStatus.recording`
    would have written it (a finished run it replaced is put back). A status from before
    ``since`` is another command's and stays as it is."""
    st = read(folder)
    if st is None or st["state"] != "running" or st["started"] < since:
        return
    status = RunStatus(folder, st["engine"])
    status.record = st
    status._end(error or RunInterrupted())


PREVIOUS = ".previous"  # a finished run's files while a new run under its name is under way
LAST_ATTEMPT = "last-attempt.json"  # the status of a run that failed over a finished one, which was kept


def _move(src: Path, dst: Path) -> None:
    """A run's files (FILES, FOLDERS, its status) from ``src`` into ``dst``, each renamed."""
    for name in (*FILES, *DERIVED, *FOLDERS, STATUS):
        if (src / name).exists():
            os.replace(src / name, dst / name)


def _recover(folder: Path) -> None:
    """Put a finished run set aside in PREVIOUS back in place of whatever an attempt left."""
    previous = folder / PREVIOUS
    if not previous.is_dir():
        return
    if is_finished(folder):  # a run finished over it and stopped before removing it: the newer run stays
        shutil.rmtree(previous, ignore_errors=True)
        return
    for name in (*FILES, STATUS):
        (folder / name).unlink(missing_ok=True)
    for name in FOLDERS:
        shutil.rmtree(folder / name, ignore_errors=True)
    _move(previous, folder)
    shutil.rmtree(previous, ignore_errors=True)


@contextmanager
def tracked(folder: Path, engine: str):
    """A fresh run in ``folder``, started at once."""
    status = RunStatus(folder, engine)
    with status.recording():
        status.start()
        yield status


# ---------------------------------------------------------------------------- what tools read


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def problem(folder: Path, since: float | None = None, kept: bool = False) -> str | None:
    """Why the run in ``folder`` is not a finished run (None when it is); with ``since`` (unix s),
    a status written by a run that started earlier is another run's. ``kept``: the finished run the
    folder keeps is asked for (predict, a report, an ensemble's member), so a later attempt that
    failed over it (its last-attempt.json) is no problem; without, that attempt's failure is the
    folder's outcome (did the run just started finish?)."""
    folder = Path(folder)
    st, attempt = read(folder), _read_attempt(folder)
    if (
        not kept
        and attempt is not None
        and (since is None or attempt["started"] >= since)
        and attempt["started"] > (st or {}).get("started", 0)
    ):
        return (
            f"run {folder} failed: {attempt['error']} (the earlier finished run in the folder, started "
            f"{_when(st['started'])}, is kept as it was)"
            if st
            else f"run {folder} failed: {attempt['error']}"
        )
    if st is None:
        return f"run {folder} did not start: no {STATUS}"
    if since is not None and st["started"] < since:
        return (
            f"run {folder} did not start: its {STATUS} is from an earlier run (started {_when(st['started'])}, "
            f"{st['state']})"
        )
    if st["state"] == "failed":
        return f"run {folder} failed: {st['error']}"
    if st["state"] != "finished":
        return (
            f"run {folder} did not finish: its status is {st['state']!r} (started {_when(st['started'])} by pid "
            f"{st.get('pid')} on {st.get('host')}; a run killed then says so too)"
        )
    if not (folder / SUMMARY).exists():
        return f"run {folder} finished but its {SUMMARY} is gone"
    return None


def _read_attempt(folder: Path) -> dict | None:
    path = Path(folder) / LAST_ATTEMPT
    return read_json(path) if path.exists() else None


def require_finished(folder: Path, since: float | None = None, output: str = "", kept: bool = False) -> dict:
    """The finished run's summary; :class:`RunFailed` otherwise, with the tail of ``output``
    (e.g. what `flwr run` printed); ``kept``: as :func:`problem`'s."""
    why = problem(folder, since, kept)
    if why:
        raise RunFailed(why + (f"\n--- output (last lines) ---\n{output[-4000:]}" if output.strip() else ""))
    return read_json(Path(folder) / SUMMARY)


def is_finished(folder: Path) -> bool:
    """A finished run: status "finished" and a summary. A folder with a summary and no status
    file is a run from before status files (those wrote summary.json last, too)."""
    folder = Path(folder)
    st = read(folder)
    return (folder / SUMMARY).exists() and (st is None or st["state"] == "finished")


def run_folder(run_config: list[str]) -> Path:
    """The run folder of `flwr run --run-config` strings (later ones override earlier ones, as
    in Flower), after the checks the ServerApp makes: an unknown key or a bad value is named here,
    where Flower 1.41 would refuse an unknown key unnamed ("Invalid run configuration")."""
    from flwr.common.config import parse_config_args

    from app.config import ConfigError, RunConfig  # lazy: torch and flwr; status readers stay light

    cfg = RunConfig.from_flower(parse_config_args(run_config))
    if not cfg.runtime.run_name:
        raise ConfigError("run-config 'run-name' is needed to know the run's folder")
    return cfg.out_path() / cfg.runtime.run_name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("check", help="exit 0 if the run finished; else 1, the reason on stderr")
    s.add_argument("folder", type=Path)
    s.add_argument("--since", type=float, default=None, help="unix time the run was launched at")
    s = sub.add_parser("folder", help="check run-config strings; print the run folder")
    s.add_argument("run_config", nargs="+")
    args = ap.parse_args(argv)
    if args.command == "check":
        why = problem(args.folder, args.since)
        print(why or f"run {args.folder} finished", file=sys.stderr if why else sys.stdout)
        return 1 if why else 0
    import click

    try:
        print(run_folder(args.run_config))
    except (ValueError, click.ClickException) as e:  # ConfigError, or text Flower cannot parse
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
