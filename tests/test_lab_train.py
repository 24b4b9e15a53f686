"""lab/training.py (issue 32, training): the SuperLink and the primary on one host as one user,
each secondary's SuperNode on its own host as its own user, TLS verified and SuperNode auth; two
epochs over the direct transport; then each home holds only its own files, readable by no other
host. Needs root and `ip netns` (as tests/test_hosts.py); slow (about 1.5 min)."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from lab.hosts import Lab
from lab.training import PRIMARY, WORKER_PORT, refused_supernode, register, start_superlink, train_across_hosts
from tests.test_hosts import _leftovers, _why_not, read_by_others

pytestmark = [pytest.mark.slow, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]

DATASET, PARTY = "hdb", "school"
DATA = Path(os.environ.get("FEDSIM_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture(scope="module")
def trained():
    if not (DATA / DATASET).is_dir():
        pytest.skip(f"no {DATASET} data under {DATA} (FEDSIM_DATA_DIR)")
    base = Path(tempfile.mkdtemp(prefix="fsl-lab-train-", dir="/tmp"))  # not under pytest's 0700 tmp
    logs = Path(tempfile.mkdtemp(prefix="fsl-lab-logs-"))
    with Lab(base, [PRIMARY, PARTY]) as lab:
        run = train_across_hosts(lab, DATASET, DATA, {PARTY: PARTY}, epochs=2, n_rows=2000, logs=logs)
        print(f"\ntrained in {run.seconds:.0f} s; transfers between hosts:")
        for t in lab.transfers:
            print(f"  {t.sender} -> {t.receiver}: {t.name} ({t.size} bytes)")
        for host, commands in run.commands.items():
            print(f"{host} ran:", *(" ".join(c) for c in commands), sep="\n  ")
        yield lab, run, logs
    assert not _leftovers(lab)
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(logs, ignore_errors=True)


def _numbers(value) -> list[float]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return [float(value)] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def _files(home: Path) -> list[Path]:
    return sorted(p for p in home.rglob("*") if p.is_file() and not p.is_symlink())


def _two_epochs_train_across_hosts_over_tls_auth_and_the_direct_transport(trained):
    lab, run, logs = trained
    party = lab.hosts[PARTY]
    assert (run.run_dir / "status.json").exists() and run.summary["test"]
    assert _numbers(run.summary["test"]) and all(math.isfinite(x) for x in _numbers(run.summary["test"]))
    assert "direct links to the party workers" in run.output, run.output[-3000:]
    node_log = (logs / f"supernode-{PARTY}.log").read_text(errors="replace")
    assert "[party worker] pid" in node_log and f"at {party.address}:{WORKER_PORT}" in node_log, node_log[-3000:]
    superlink = run.commands[PRIMARY][0]
    assert "--enable-supernode-auth" in superlink and lab.hosts[PRIMARY].address in superlink
    assert "--insecure" not in " ".join(c for cmd in run.commands[PARTY] for c in cmd)


def _each_home_holds_only_its_own_files(trained):
    lab, _, _ = trained
    primary, party = lab.hosts[PRIMARY], lab.hosts[PARTY]
    for host in (primary, party):
        assert {p.stat().st_uid for p in _files(host.home)} == {host.uid}
    assert not (primary.home / "keys").exists()
    assert all(b"OPENSSH PRIVATE KEY" not in p.read_bytes() for p in _files(primary.home))  # no node key
    assert (party.home / "keys" / PARTY).exists() and (primary.home / "nodekeys" / f"{PARTY}.pub").exists()
    assert not (party.home / "creds").exists()
    assert all(b"BEGIN PRIVATE KEY" not in p.read_bytes() for p in _files(party.home))  # no CA / server key
    assert not (party.home / "runs").exists()  # the run folder is the primary's
    linkage = {p.name for p in _files(party.home / "linkage")}
    assert linkage and all(PARTY in name for name in linkage), linkage  # its own result only
    assert not any(PARTY in p.name for p in _files(primary.home / "linkage"))


def _no_file_of_a_home_is_readable_by_the_other_hosts_user(trained):
    lab, _, _ = trained
    for owner in lab.hosts.values():
        files = _files(owner.home)
        assert files
        assert read_by_others(lab, owner, files) == []
        for other in (h for h in lab.hosts.values() if h is not owner):
            for secret in (owner.home / "keys" / PARTY, owner.home / "creds" / "ca.key"):
                if secret.exists():
                    assert lab.readable_by(owner, secret) and not lab.readable_by(other, secret)


def _a_supernode_with_an_unregistered_key_is_refused(trained):
    lab, _, logs = trained
    primary, party = lab.hosts[PRIMARY], lab.hosts[PARTY]
    superlink = start_superlink(lab, primary, logs, {PRIMARY: []})
    try:
        register(lab, primary, PARTY, {PRIMARY: []})  # the party's real key is registered, not this one
        code, log = refused_supernode(lab, PARTY, party, logs)
    finally:
        superlink.stop(grace=5)
    assert code not in (0, None), log[-3000:]
    print(f"refused SuperNode exit {code}; its log ends:\n{log[-1500:]}")


def test_training_across_hosts(trained):
    """One test, every check on one lab (a module fixture is built again on every xdist worker that runs one of its tests)."""
    for check in (
        _two_epochs_train_across_hosts_over_tls_auth_and_the_direct_transport,
        _each_home_holds_only_its_own_files,
        _no_file_of_a_home_is_readable_by_the_other_hosts_user,
        _a_supernode_with_an_unregistered_key_is_refused,
    ):
        check(trained)
