"""A real local deployment: SuperLink + one SuperNode per secondary party + the linkage service.

    python -m deploy up   DIR --dataset house3            # TLS + SuperNode auth (default)
    python -m deploy link DIR --k 20                      # every party links through the service
    python -m deploy run  DIR --run-config 'epochs=2'     # `flwr run . fedsim-deploy` against it
    python -m deploy predict DIR --run NAME --input new.csv --out p.csv  # deploy/predict.py
    python -m deploy down DIR                             # stops exactly what `up` started

Everything listens on 127.0.0.1. ``up`` writes DIR/credentials (a local CA, the servers'
certificate, one OpenSSH EC key pair per SuperNode; see deploy/certs.py), registers each node's
public key with the SuperLink (``flwr supernode register``), and starts each SuperNode with its
own ``--node-config 'party=... data-dir=... linkage-dir=...'``. ``--insecure`` (plain HTTP, no
node auth) is an explicit opt-in for local experiments. DIR/deploy.json records the processes,
ports and parties (deploy/deployment.py); DIR/logs holds every process's log. docs/deployment.md
writes the same steps up for separate hosts.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

from deploy.app_source import app_folder
from deploy.deployment import CONNECTION, PRIMARY, SECRET, Deployment, LinkRequest, party_levels
from deploy.localsim import REPO, free_port, run_config_arg
from deploy.processes import Proc, listening, running, stop
from deploy.servers import linkage_service, register_node, start_node, start_service, start_superlink, tool
from files.atomic import write_atomic
from files.private import private_dir
from files.source_tree import exit_if_source
from linkage.protection import DEFAULT_LEVEL
from strategies.vfl.methods import REGISTRY

# A deployed run unless its run config says otherwise: exact split learning (S = 1) over the
# direct transport, each party worker's encrypted link (a Flower exchange costs 6-8 s, the link
# milliseconds: docs/deployment.md "Direct transport", docs/benchmarks.md "Deployment").


def up(
    folder: Path,
    dataset: str,
    data_dir: str = "",
    parties: list[str] | None = None,
    *,
    secure: bool = True,
    timeout: float = 60.0,
    privacy: str = "",
) -> Deployment:
    """Start SuperLink, the linkage service and one SuperNode per secondary; ``privacy`` is each
    secondary's own level (party_levels), in its node config and its floor at `link`."""
    from datasets import load_dataset  # lazy: pandas (the loaders), not for status / down
    from deploy.certs import make_credentials  # lazy: cryptography, for `up` only

    folder = Path(folder).resolve()
    exit_if_source(folder, "the deployment's folder")  # secrets, data and runs never land in the source tree
    if (folder / "deploy.json").exists() and any(running(p) for p in _procs(Deployment.load(folder))):
        raise SystemExit(f"a deployment is already running from {folder}; `fedsim deploy down {folder}` first")
    os.chmod(private_dir(folder), 0o700)  # the deployment's folder: every party's files are under it
    data_dir = data_dir or data_root(dataset)
    if parties is None:
        parties = sorted(load_dataset(dataset, data_dir).secondaries)
    if len(set(parties)) != len(parties):
        raise SystemExit(f"a party is named twice in {parties}")
    levels = party_levels(privacy, list(parties))  # refused by name before anything starts
    dep = Deployment(str(folder), dataset, str(Path(data_dir).resolve()) if data_dir else "", secure, list(parties))
    dep.privacy = levels
    try:
        if secure:
            make_credentials(dep.creds, parties)
        start_superlink(dep, timeout)
        start_service(dep)
        for party in parties:
            if secure:
                register_node(dep, party)
            dep.nodes[party] = start_node(dep, party)
            dep.save()
            private_dir(dep.linkage_dir(party))
        _listening(dep, timeout)
    except BaseException:
        stop_all(dep)  # what this call started, from memory (deploy.json may be older or absent)
        raise
    return dep


def _listening(dep: Deployment, timeout: float) -> None:
    """Each SuperNode and the linkage service, started together, waited for until each listens
    itself; one whose port another process took meanwhile starts again on a fresh one."""
    for party, proc in dep.nodes.items():
        restart = functools.partial(_restart_node, dep, party)
        dep.nodes[party] = listening(restart, free_port, f"party {party!r}'s SuperNode", timeout, proc)
        dep.save()
    linkage_service(dep, timeout, started=dep.service)


def _restart_node(dep: Deployment, party: str, port: int) -> Proc:
    """The party's SuperNode again, on ``port``, recorded at once (`down` stops it whatever follows)."""
    dep.nodes[party] = start_node(dep, party, port=port)
    dep.save()
    return dep.nodes[party]


def data_root(dataset: str) -> str:
    """The data folder the dataset loads from here, made explicit for the parties' processes
    (Flower runs the apps from their own install folder, where relative defaults do not resolve)."""
    from datasets import load_dataset  # lazy: pandas (the loaders), not for status / down
    from datasets.base import DatasetError  # lazy: with load_dataset, not for status / down

    roots = [os.environ.get("FEDSIM_DATA_DIR", ""), REPO / "data", REPO.parent / "shared" / "data"]
    for root in [Path(r) for r in roots if r]:
        try:
            load_dataset(dataset, root)
            return str(root.resolve())
        except (DatasetError, FileNotFoundError):
            continue
    raise SystemExit(f"dataset {dataset!r} found in none of {roots}; pass --data-dir")


def _procs(dep: Deployment) -> list[Proc]:
    return [p for p in (dep.superlink, *dep.nodes.values(), dep.service) if p is not None]


def down(folder: Path) -> int:
    """Stop what `up` started (each process's whole session); returns how many were running."""
    return stop_all(Deployment.load(folder))


def stop_all(dep: Deployment) -> int:
    alive = [p for p in _procs(dep) if running(p)]
    for p in [*dep.nodes.values(), dep.service, dep.superlink]:  # nodes first: they would retry the link
        stop(p)
    return len(alive)


def save_primary_secret(dep: Deployment, secret: str) -> None:
    """The primary's job secret, for its later queries (predict): 0600 from its first byte."""
    write_atomic(dep.party_dir(PRIMARY) / SECRET, secret.encode())


def link(dep: Deployment, request: LinkRequest, timeout: float = 600.0) -> str:
    """Every secondary states its privacy floor (``request.privacy`` for all; None: each its own
    level from `up`, linkage_server.floors) and uploads its identifiers to the linkage service
    (over TLS; ``request.private``: encoded with the parties' key, deploy/private_mode.py), the
    primary starts the job (tau None: none asked, the floors set the noise; radius, compose:
    docs/privacy.md; the job's files carry them), and each party fetches only its own result
    into its own folder."""
    from app.vfl.linking import metric_of  # lazy: torch and flwr, for `link` only
    from datasets import load_dataset  # lazy: pandas (the loaders), not for status / down
    from datasets.registry import DatasetOptions  # lazy: pandas, for `link` only
    from deploy.private_mode import as_uploaded, forget_key, make_key  # lazy: the encoders, for `link` only
    from linkage.metrics import DEFAULT_OF_KIND  # lazy: with the linkage library, for `link` only
    from linkage_server.client import LinkageClient, create_job  # lazy: httpx and scipy, for `link` only
    from linkage_server.params import JobParams  # lazy: with the client, for `link` only

    ds = load_dataset(dep.dataset, dep.data_dir or None, DatasetOptions(seed=request.seed, n_rows=request.n_rows))
    key = make_key(dep, ds, metric_of(ds), request.k) if request.private else forget_key(dep)
    token = (dep.root / "admin.token").read_text().strip()
    job = create_job(dep.service_url, token, PRIMARY, dep.parties, verify=dep.verify)
    save_primary_secret(dep, job["secrets"][PRIMARY])  # the primary's own, for its later queries (predict)
    for party in dep.parties:
        with LinkageClient(dep.service_url, job["job"], party, job["secrets"][party], verify=dep.verify) as c:
            c.set_floor(request.privacy or dep.privacy.get(party, DEFAULT_LEVEL))  # before its identifiers leave it
            ids, raw, fingerprint = as_uploaded(key, ds.secondaries[party].identifiers)
            c.upload(ids, raw, fingerprint=fingerprint)
    with LinkageClient(dep.service_url, job["job"], PRIMARY, job["secrets"][PRIMARY], verify=dep.verify) as c:
        ids, raw, fingerprint = as_uploaded(key, ds.primary.identifiers)
        c.upload(ids, raw, fingerprint=fingerprint)
        c.upload_train_rows(ds.split.train)
        metric = DEFAULT_OF_KIND["bits"] if key else metric_of(ds)
        tau = request.tau or 0.0  # none asked: the secondaries' floors set the noise
        c.start(
            JobParams(metric, request.k, tau, layout=request.layout, radius=request.radius, compose=request.compose)
        )  # no seed: the job's randomness is the service's secret
        st = c.wait(timeout=timeout)
        if st["state"] != "done":
            raise RuntimeError(f"linkage job {job['job']} {st['state']}: {st.get('error')}")
        c.fetch(dep.linkage_dir(PRIMARY))
    for party in dep.parties:
        with LinkageClient(dep.service_url, job["job"], party, job["secrets"][party], verify=dep.verify) as c:
            c.fetch(dep.linkage_dir(party))
    dep.job = job["job"]
    dep.link_params = request.run_values()
    dep.save()
    return job["job"]


def run_values(dep: Deployment, run_config: dict[str, object]) -> dict[str, object]:
    """The run config against this deployment: its dataset and data, its linkage job, and the
    values that job was linked with (another seed would sample other rows of the same count)."""
    known = REGISTRY.get(str(run_config.get("method", "fedsim_attn")))  # an unknown one is refused by the config check
    links = (known is None or known.federated) and run_config.get("mode", "vfl") == "vfl"
    if links and not dep.job:
        raise SystemExit(
            f"the deployment at {dep.folder} has no linkage job: each party reads its own copy of the "
            f"result, so run `python -m deploy link {dep.folder} --k K` first"
        )
    clash = {k: (v, run_config[k]) for k, v in dep.link_params.items() if k in run_config and run_config[k] != v}
    if clash:
        raise SystemExit(
            f"the deployment's linkage job {dep.job} was linked with {clash} (linked, asked); "
            f"re-link with `python -m deploy link` for other values"
        )
    return {
        "dataset": dep.dataset,
        "data-dir": dep.data_dir,
        "out-dir": str(dep.root / "runs"),
        **({"linkage-dir": str(dep.linkage_dir(PRIMARY))} if dep.job else {}),
        **dep.link_params,
        **run_config,
    }


def start_run(dep: Deployment, run_config: dict[str, object], output=None) -> subprocess.Popen:
    """`flwr run <repo> fedsim-deploy --stream` with the deployment's dataset and linkage
    (``output``: an open file for its stdout and stderr together; default: pipes)."""
    from app.config import RunConfig  # lazy: torch and flwr, for `run` only (fedsim train imports this module)

    values = run_values(dep, run_config)
    RunConfig.from_flower(values)  # names an unknown key, which Flower 1.41 refuses unnamed
    cmd = [tool("flwr"), "run", str(app_folder(REPO)), CONNECTION, "--stream", "--run-config", run_config_arg(values)]
    out, err = (output, subprocess.STDOUT) if output is not None else (subprocess.PIPE, subprocess.PIPE)
    return subprocess.Popen(cmd, env=dep.env(), stdout=out, stderr=err, text=True, cwd=dep.root, umask=0o077)


def flwr_run(dep: Deployment, run_config: dict[str, object], timeout: float = 3600.0) -> subprocess.CompletedProcess:
    """A run to its end; past ``timeout`` the run itself is stopped on the SuperLink (`flwr stop`),
    not only this command, so the SuperNodes are free again."""
    proc = start_run(dep, run_config)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        run_id = re.search(r"Successfully started run (\d+)", out or "")
        if run_id:
            subprocess.run(
                [tool("flwr"), "stop", run_id.group(1), CONNECTION], env=dep.env(), capture_output=True, timeout=60
            )
        err = (err or "") + f"\n[deploy.commands] run stopped after its {timeout} s timeout"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
