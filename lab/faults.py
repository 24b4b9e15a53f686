"""Faults across hosts: a deployment on a :class:`lab.hosts.Lab` (lab/training.py's
pieces) that loses a secondary's network mid-epoch, or its SuperLink, and a linkage service that
restarts between the uploads and the job's start. Each fault is measured from the user's side:
the error the run records (status.json) and `flwr run` prints, the seconds from the fault until
the run is known failed, what the operator had to restart, and whether the resumed run
(``resume = true``, same run name) ends bit for bit like an uninterrupted run of the same config
on the same linkage files (``threads = 1``: CPU runs repeat bit for bit, docs/reference.md).

    python -m lab.faults --base /tmp/lab-faults --n-rows 1500 --epochs 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from deploy.app_source import app_folder
from deploy.localsim import REPO, run_config_arg
from lab.hosts import IP, Host, Lab, Running
from lab.placement import place_data, place_linkage
from lab.run_watch import compare, settled, wait_failed, wait_mid_epoch
from lab.training import (
    CONNECTION,
    PRIMARY,
    credentials,
    flwr_env,
    register,
    run_values,
    start_superlink,
    start_supernode,
    supervised,
    tail,
    tool,
)

PARTY = "school"  # hdb's secondary


@dataclass
class Stack:
    """A running deployment on a lab: the SuperLink on the primary's host, one SuperNode each."""

    lab: Lab
    dataset: str
    primary: Host
    hosts: dict[str, Host]  # party -> its host
    logs: Path
    link_values: dict
    commands: dict = field(default_factory=dict)
    superlink: Running | None = None
    nodes: dict[str, Running] = field(default_factory=dict)
    service: dict = field(default_factory=dict)  # the linkage service's restart (link_across_restart)

    def run_dir(self, name: str) -> Path:
        return self.primary.home / "runs" / name

    def stop(self) -> None:
        for proc in [*self.nodes.values(), *([self.superlink] if self.superlink else [])]:
            proc.stop(grace=5)  # the SuperNodes first: they would retry the SuperLink


@dataclass
class Outcome:
    """One fault as the user meets it."""

    fault: str
    error: str  # status.json's error ("" when the status says no error)
    state: str  # status.json's state after the fault
    output: str  # the end of what `flwr run` printed
    detected_s: float  # from the fault until `flwr run` returned or the status said failed
    restarted: list[str]  # what the operator restarted before resuming
    resumed: dict  # the resumed run's summary
    same: dict  # compare(): the resumed run against the uninterrupted one
    exit_code: int | None = None  # `flwr run`'s
    resumed_run: bool = True  # False: the run had finished on its own (nothing to resume)


# ---------------------------------------------------------------- the linkage service, restarted


def link_across_restart(lab: Lab, hosts: dict[str, Host], dataset: str, data_dir: Path, k: int, n_rows: int):
    """lab.placement.link_as_operator's linkage job, its service stopped after every upload and
    started again on the same data folder before the primary starts the job (no re-upload).
    Returns (the link values, what the restart showed: the job's uploads seen by the new service)."""
    from app.vfl.linking import metric_of  # lazy: torch and flwr
    from datasets import load_dataset  # lazy: pandas
    from datasets.registry import DatasetOptions  # lazy: pandas
    from deploy.commands import stop_all  # lazy: the linkage client and pandas
    from deploy.deployment import Deployment  # lazy: with deploy.commands
    from deploy.processes import stop  # lazy: with deploy.commands
    from deploy.servers import linkage_service  # lazy: with deploy.commands
    from linkage_server.client import LinkageClient, create_job  # lazy: httpx and scipy
    from linkage_server.params import JobParams  # lazy: with the client

    folder = Path(tempfile.mkdtemp(prefix="lab-link-"))
    parties = [p for p in hosts if p != PRIMARY]
    dep = Deployment(str(folder), dataset, str(Path(data_dir).resolve()), False, parties)
    ds = load_dataset(dataset, dep.data_dir, DatasetOptions(seed=0, n_rows=n_rows))
    try:
        linkage_service(dep, 120)
        token = (dep.root / "admin.token").read_text().strip()
        job = create_job(dep.service_url, token, PRIMARY, parties, verify=False)
        secret = job["secrets"]

        def client(party: str) -> LinkageClient:
            return LinkageClient(dep.service_url, job["job"], party, secret[party], verify=False)

        for party in parties:
            with client(party) as c:
                c.upload(ds.secondaries[party].identifiers)
        with client(PRIMARY) as c:
            c.upload(ds.primary.identifiers)
            c.upload_train_rows(ds.split.train)
            before, uploaded = c.status(), c.uploaded  # the primary's own record of its upload
        stop(dep.service)  # the service goes down between the uploads and the job's start
        t0 = time.monotonic()  # ... and comes back on the same --data-dir (another port)
        linkage_service(dep, 120, "the restarted linkage service")
        restart_s = time.monotonic() - t0
        with client(PRIMARY) as c:
            c.uploaded, after = uploaded, c.status()  # the same primary, its client's record kept
            c.start(JobParams(metric_of(ds), k))  # the secondaries' floors set the noise
            state = c.wait(timeout=600)
            if state["state"] != "done":
                raise RuntimeError(f"linkage job {job['job']} {state['state']} after a restart: {state.get('error')}")
            c.fetch(dep.linkage_dir(PRIMARY))
        for party in parties:
            with client(party) as c:
                c.fetch(dep.linkage_dir(party))
        place_linkage(lab, dep, hosts)
        seen = {"job": job["job"], "before": before, "after": after, "state": state["state"], "restart_s": restart_s}
        return {"k": k, "tau": 1.0, "seed": 0, "n-rows": n_rows, "layout": "independent"}, seen
    finally:
        stop_all(dep)
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- the deployment and its runs


def deploy_stack(lab: Lab, dataset: str, data_dir: Path, parties: dict[str, str], *, k: int, n_rows: int, logs: Path):
    """Credentials, data, the linkage (across a service restart), the SuperLink, SuperNodes."""
    primary = lab.hosts[PRIMARY]
    hosts = {p: lab.hosts[h] for p, h in parties.items()}
    credentials(lab, primary, hosts)
    place_data(lab, [primary, *hosts.values()], dataset, data_dir)
    link_values, seen = link_across_restart(lab, {PRIMARY: primary, **hosts}, dataset, data_dir, k, n_rows)
    stack = Stack(lab, dataset, primary, hosts, logs, link_values, {primary.name: []}, service=seen)
    try:
        stack.superlink = start_superlink(lab, primary, logs, stack.commands)
        for party in hosts:
            register(lab, primary, party, stack.commands)
            stack.nodes[party] = start_supernode(lab, party, hosts[party], primary, logs, stack.commands)
    except BaseException:
        stack.stop()
        raise
    return stack


def values(stack: Stack, name: str, run_config: dict) -> dict:
    return run_values(stack.primary, stack.dataset, stack.link_values, {**run_config, "run-name": name})


def launch(stack: Stack, config: dict, log_name: str) -> Running:
    """`flwr run <repo> lab --stream` on the primary's host, in the background, into a log."""
    from app.config import RunConfig  # lazy: torch and flwr, for the run only

    RunConfig.from_flower(config)  # names an unknown key
    cmd = [tool("flwr"), "run", str(app_folder(REPO)), CONNECTION, "--stream", "--run-config", run_config_arg(config)]
    stack.commands[PRIMARY].append(cmd)
    return stack.lab.start(stack.primary, cmd, stack.logs / f"{log_name}.log", env=flwr_env(stack.primary))


def run_to_end(stack: Stack, config: dict, log_name: str, timeout: float = 900.0) -> dict:
    """A run launched and waited for; its summary (RunFailed otherwise, with its output)."""
    from app.run_status import require_finished  # lazy: the status reader, for the run only

    since = time.time()
    proc = launch(stack, config, log_name)
    try:
        proc.popen.wait(timeout)
    finally:
        proc.stop(grace=5)
    return require_finished(stack.run_dir(config["run-name"]), since, tail(stack.logs / f"{log_name}.log"))


# ---------------------------------------------------------------- the faults


def set_link(lab: Lab, host: Host, up: bool) -> None:
    """The host's only interface down (its cable pulled) or up again."""
    r = subprocess.run([IP, "-n", host.netns, "link", "set", "eth0", "up" if up else "down"], capture_output=True)
    if r.returncode:
        raise RuntimeError(f"ip link set eth0 on {host.name}: {r.stderr.decode(errors='replace')}")


GAVE_UP = "Giving up reconnection"  # Flower 1.42's SuperNode, past --max-retries: it logs the error and
# then never exits (its Runtime API's HTTP thread is not a daemon), so a supervisor sees it alive


def log_size(stack: Stack, party: str) -> int:
    path = stack.logs / f"supernode-{party}.log"
    return path.stat().st_size if path.exists() else 0


def revive_nodes(stack: Stack, since: dict[str, int], reregister: bool = False, every: bool = False) -> list[str]:
    """The operator's part after a fault: each SuperNode that exited or gave up reconnecting (its
    log past ``since``, a size) is started again under supervision; with ``every`` every one (one
    still in its reconnect loop gives up ~30 s later, alive); with ``reregister`` every one, its
    key registered again first (a restarted SuperLink forgot it). Returns what was restarted, why."""
    restarted = []
    for party, node in stack.nodes.items():
        with open(stack.logs / f"supernode-{party}.log", "rb") as f:
            f.seek(since.get(party, 0))
            gave_up = GAVE_UP.encode() in f.read()
        exited = node.popen.poll()
        if exited is None and not gave_up and not (reregister or every):
            continue
        node.stop(grace=5)
        if reregister:
            register(stack.lab, stack.primary, party, stack.commands)
        stack.nodes[party] = supervised(stack.lab, party, stack.hosts[party], stack.primary, stack.logs, stack.commands)
        why = (
            f"exited {exited}" if exited is not None else "gave up reconnecting, still alive" if gave_up else "restart"
        )
        restarted.append(f"supernode-{party} ({why})")
    return restarted


def _fault_run(stack: Stack, config: dict, log_name: str, fault, recover, timeout: float) -> tuple:
    """Launches the run, waits until it is mid-epoch, calls ``fault()``, waits for the failure,
    then ``recover()`` (whatever happened); returns (seconds from the fault until the failure was
    seen, what `flwr run` printed, status.json)."""
    run_dir = stack.run_dir(config["run-name"])
    proc = launch(stack, config, log_name)
    try:
        wait_mid_epoch(run_dir, proc)
        t0 = time.monotonic()
        fault()
        detected = wait_failed(run_dir, proc, t0, timeout)
        proc.popen.wait(timeout)
    finally:
        proc.stop(grace=5)
        recover()
    return detected, tail(stack.logs / f"{log_name}.log", 6000), settled(run_dir, timeout), proc.popen.returncode


def _resume(stack: Stack, fault: str, config: dict, baseline: Path, seen: tuple, restarted: list, timeout: float):
    detected, output, status, code = seen
    run_dir, error, state = stack.run_dir(config["run-name"]), status.get("error") or "", status.get("state", "")
    if state == "finished":  # the ServerApp outlived the fault (the direct links do not need the SuperLink)
        resumed = json.loads((run_dir / "summary.json").read_text())
    else:
        resumed = run_to_end(stack, {**config, "resume": True}, f"run-{config['run-name']}-resumed", timeout)
    same = compare(baseline, run_dir)
    return Outcome(fault, error, state, output, detected, restarted, resumed, same, code, state != "finished")


def link_down(stack: Stack, party: str, config: dict, baseline: Path, timeout: float = 600.0) -> Outcome:
    """(a) The party's host loses its network mid-epoch; the run fails naming the party; the
    network comes back (and any SuperNode that gave up, started again); the run resumes."""
    host, since = stack.hosts[party], {p: log_size(stack, p) for p in stack.nodes}
    seen = _fault_run(
        stack,
        config,
        f"run-{config['run-name']}",
        lambda: set_link(stack.lab, host, False),
        lambda: set_link(stack.lab, host, True),
        timeout,
    )
    return _resume(stack, "link down", config, baseline, seen, revive_nodes(stack, since, every=True), timeout)


def superlink_restart(stack: Stack, config: dict, baseline: Path, timeout: float = 600.0) -> Outcome:
    """(b) The SuperLink (its whole session: the ServerApp it runs too) is stopped mid-epoch and
    started again; its state is in memory, so the nodes' keys are registered again and the
    SuperNodes restarted; the run resumes."""

    def restart() -> None:
        stack.superlink = start_superlink(stack.lab, stack.primary, stack.logs, stack.commands)

    since = {p: log_size(stack, p) for p in stack.nodes}
    seen = _fault_run(stack, config, f"run-{config['run-name']}", stack.superlink.stop, restart, timeout)
    restarted = ["superlink", *revive_nodes(stack, since, reregister=True)]
    return _resume(stack, "SuperLink restart", config, baseline, seen, restarted, timeout)


def faults_across_hosts(lab: Lab, dataset: str, data_dir: Path, *, epochs: int, n_rows: int, logs: Path, **run) -> dict:
    """The uninterrupted run, then each fault and its resume, on one deployment; the outcomes."""
    stack = deploy_stack(lab, dataset, data_dir, {PARTY: PARTY}, k=8, n_rows=n_rows, logs=logs)
    config = {"epochs": epochs, "node-timeout": 45.0, "threads": 1, **run}
    try:
        t0 = time.monotonic()
        base = run_to_end(stack, values(stack, "uninterrupted", config), "run-uninterrupted")
        seconds = time.monotonic() - t0
        baseline = stack.run_dir("uninterrupted")
        a = link_down(stack, PARTY, values(stack, "link-down", config), baseline)
        b = superlink_restart(stack, values(stack, "superlink", config), baseline)
    finally:
        stack.stop()
    output = tail(stack.logs / "run-uninterrupted.log", 10**6)  # all `flwr run` printed for it
    return {
        "service": stack.service,
        "uninterrupted": {"summary": base, "seconds": seconds, "output": output},
        "faults": [a, b],
        "commands": stack.commands,  # what each host ran
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="folder for the homes (not under a 0700 folder)")
    ap.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--n-rows", type=int, default=1500)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="lab-faults-logs-"))
    with Lab(args.base, [PRIMARY, PARTY]) as lab:
        out = faults_across_hosts(
            lab,
            "hdb",
            args.data_dir,
            epochs=args.epochs,
            n_rows=args.n_rows,
            logs=logs,
            **{"batch-size": args.batch_size},
        )
    out["faults"] = [{**asdict(f), "output": f.output[-1500:]} for f in out["faults"]]
    print(json.dumps({**out, "logs": str(logs)}, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
