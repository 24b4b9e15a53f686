"""Running this app as a local Flower simulation from Python (tests, benchmarks, scripts).

``flwr run`` starts a detached local SuperLink and leaves it running; :func:`simulate`
gives each caller its own FLWR_HOME and ports and :func:`stop_superlink` ends exactly the
processes that SuperLink started (its session and its SuperExec's session: the
simulation process and Ray).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from deploy.app_source import app_folder
from files.private import private_ray_tmp
from linkage_server.local import free_port  # noqa: F401 - deploy.commands and the tests take it from here

REPO = Path(__file__).resolve().parents[1]
QUIET_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return "'" + v.replace("'", "") + "'"
    return repr(v)


def run_config_arg(values: dict[str, object]) -> str:
    return " ".join(f"{k}={toml_value(v)}" for k, v in values.items())


def write_federation(home: Path, num_supernodes: int, cpus_per_client: int = 1) -> str:
    """FLWR_HOME's config.toml (the local SuperLink) and the `--federation-config` value that
    sizes the simulation (Flower 1.41 deprecates `options.` entries in config.toml). Ray gets
    the CPUs the simulated nodes take, not the machine's: it starts a worker process per CPU it
    is given, and each idle one cost 1.6 s of CPU on a 2-core machine (2026-12-06; 16 on a GPU box)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text('[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n')
    cpus = num_supernodes * cpus_per_client
    return f"num-supernodes={num_supernodes} client-resources-num-cpus={cpus_per_client} init-args-num-cpus={cpus}"


def _processes() -> list[tuple[int, int, int, str]]:
    out = subprocess.run(
        ["ps", "-ww", "-u", str(os.getuid()), "-o", "pid=,ppid=,sid=,args="], capture_output=True, text=True
    ).stdout
    rows = []
    for line in out.splitlines():
        pid, ppid, sid, args = line.split(None, 3) if len(line.split(None, 3)) == 4 else (*line.split(), "")
        rows.append((int(pid), int(ppid), int(sid), args))
    return rows


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (e.g. a FLWR_HOME path)."""
    return [pid for pid, _, _, args in _processes() if text in args and pid != os.getpid()]


def stop_superlink(port: int, timeout: float = 10.0) -> int:
    """Kill the local SuperLink listening on ``port`` and everything it started; returns
    the number of processes signalled."""
    procs = _processes()  # this user's only: another user's SuperLink on that port is theirs
    links = [p for p in procs if "flower-superlink" in p[3] and f"--port {port}" in p[3]]
    sessions = {p[2] for p in links}
    sessions |= {p[2] for p in procs if p[1] in {link[0] for link in links}}
    victims = [p[0] for p in procs if p[2] in sessions and p[0] != os.getpid()]
    for sid in sessions:
        try:
            os.killpg(sid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    _wait_gone(victims, timeout)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # a killed process is listed until the kernel has torn it down, which on a loaded machine took
    # seconds (a test found the SuperLink still listed once this returned): the caller is told
    # "stopped" only once nothing it started is left (or ``timeout`` more seconds have passed)
    _wait_gone(victims, timeout)
    return len(victims)


def _wait_gone(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(p[0] in pids and "<defunct>" not in p[3] for p in _processes()):
        time.sleep(0.2)


STARTUP_S = 300.0  # Flower waits 15 s for the local SuperLink it starts: a loaded 2-core machine took longer
PRESTART = (
    "import sys, flwr.cli.local_superlink as s; s.LOCAL_SUPERLINK_STARTUP_TIMEOUT = float(sys.argv[1]); "
    "s._is_local_superlink_started() or s._start_local_superlink(False)"
)


def start_superlink(env: dict[str, str], timeout: float = STARTUP_S) -> None:
    """The local SuperLink that `flwr run` would start (Flower's own launcher, so the same command
    and files), started now and waited for up to ``timeout`` s instead of Flower's fixed 15 s
    (under load `flwr run` failed "Failed to start local SuperLink within 15s");
    `flwr run` then finds it running. Nothing is done when one is running on the env's port."""
    r = subprocess.run(
        [sys.executable, "-c", PRESTART, str(timeout)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout + 60,
        umask=0o077,
    )
    if r.returncode != 0:
        raise RuntimeError(f"the local Flower SuperLink did not start: {(r.stdout + r.stderr)[-2000:]}")


def start_simulation(
    run_config: dict[str, object], home: Path, *, num_supernodes: int = 1, app_dir: Path = REPO, output=None
) -> tuple[subprocess.Popen, int]:
    """``flwr run <app> --stream`` in the background with its own FLWR_HOME and ports; returns
    the process and the port of the SuperLink it starts (pass it to :func:`stop_superlink`).
    ``output``: an open file for its stdout and stderr together (default: pipes).
    This app's run config is checked first (ConfigError naming the key): Flower 1.41 refuses an
    unknown key as "Invalid run configuration" without naming it."""
    if Path(app_dir).resolve() == REPO:
        from app.config import RunConfig  # lazy: torch and flwr; `python -m deploy.localsim stop` stays light

        RunConfig.from_flower(run_config)
    federation = write_federation(home, num_supernodes)
    port, control = free_port(), free_port()
    bin_dir = str(Path(sys.executable).parent)  # flwr starts `flower-superlink` from PATH
    env = {
        **os.environ,
        **QUIET_ENV,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "FLWR_HOME": str(home),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control),
        "RAY_TMPDIR": private_ray_tmp(),  # the simulation's Ray: its 0777 session folders in a 0700 one
    }
    flwr = shutil.which("flwr", path=bin_dir) or "flwr"
    cmd = [
        flwr,
        "run",
        str(app_folder(Path(app_dir))),
        "--stream",
        "--run-config",
        run_config_arg(run_config),
        "--federation-config",
        federation,
    ]
    out, err = (output, subprocess.STDOUT) if output is not None else (subprocess.PIPE, subprocess.PIPE)
    start_superlink(env)  # umask 077: the SuperLink, and the apps it runs, write private files
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True, umask=0o077), port


def simulate(
    run_config: dict[str, object], home: Path, *, num_supernodes: int = 1, timeout: float = 600.0, app_dir: Path = REPO
) -> subprocess.CompletedProcess:
    """``flwr run <app> --stream`` with its own FLWR_HOME and ports; stops its SuperLink after."""
    proc, port = start_simulation(run_config, home, num_supernodes=num_supernodes, app_dir=app_dir)
    try:
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
    finally:
        stop_superlink(port)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(
        description="Start the local SuperLink `flwr run` uses (waiting up to "
        f"{STARTUP_S:.0f} s, not Flower's 15), or stop the one it left running."
    )
    ap.add_argument("command", choices=["start", "stop"])
    ap.add_argument("--port", type=int, default=int(os.environ.get("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "39091")))
    args = ap.parse_args()
    if args.command == "start":
        start_superlink({**os.environ, "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(args.port)})
    else:
        print(f"stopped {stop_superlink(args.port)} process(es) of the local SuperLink on port {args.port}")
