"""lab/faults.py (issue 32, faults across hosts): on a primary host and a secondary's host
(hdb, "school"), one deployment (TLS, SuperNode auth, the direct transport):

(c) the linkage service is stopped after every upload and started again on the same data
    folder: the job keeps its uploads and runs to the end without a re-upload;
(a) the secondary's host loses its network (``ip link set eth0 down``) mid-epoch: the run fails
    naming the party, within node-timeout; the network comes back; ``resume = true`` ends bit for
    bit like the uninterrupted run (same seed, linkage files, run config, ``threads = 1``);
(b) the SuperLink is stopped mid-epoch and started again (in memory: keys registered again, the
    SuperNodes restarted): `flwr run` stops streaming within seconds, but the ServerApp (Flower
    1.42 starts it in a session of its own) goes on over the direct links and finishes the run,
    which ends bit for bit like the uninterrupted one (a resume is needed only where it failed).

The same lab also carries what training across hosts must show (one lab, not two: each costs a
deployment): the uninterrupted run trains over TLS, SuperNode auth and the direct transport; each
home holds only its own files, readable by no other host's user; a SuperNode with an unregistered
key is refused.

Needs root and `ip netns` (as tests/test_hosts.py); slow (about 4 min on 2 loaded cores)."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from lab.faults import PARTY, faults_across_hosts
from lab.hosts import Lab
from lab.training import PRIMARY, WORKER_PORT, refused_supernode, register, start_superlink
from tests.test_hosts import _leftovers, _why_not, read_by_others

pytestmark = [pytest.mark.slow, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]

DATASET = "hdb"
DATA = Path(os.environ.get("FEDSIM_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
NODE_TIMEOUT = 45.0  # lab.faults' node-timeout: the link-down fault is detected by it


@pytest.fixture(scope="module")
def faulted():
    if not (DATA / DATASET).is_dir():
        pytest.skip(f"no {DATASET} data under {DATA} (FEDSIM_DATA_DIR)")
    base = Path(tempfile.mkdtemp(prefix="fsl-lab-faults-", dir="/tmp"))  # not under pytest's 0700 tmp
    logs = Path(tempfile.mkdtemp(prefix="fsl-lab-faults-logs-"))
    with Lab(base, [PRIMARY, PARTY]) as lab:
        # 3 epochs: a fault lands mid-epoch after the first checkpoint, found by polling progress.json;
        # an epoch of these 66 steps takes ~1 s over the direct transport, and with 2 epochs a run on a
        # loaded machine once finished between two polls (the window is epochs 1-2 now, twice that)
        out = faults_across_hosts(lab, DATASET, DATA, epochs=3, n_rows=1500, logs=logs, **{"batch-size": 16})
        for f in out["faults"]:
            print(
                f"\n{f.fault}: {f.state!r} after {f.detected_s:.1f} s: {f.error!r}; restarted {f.restarted}; {f.same}"
            )
        yield lab, out, logs  # the lab stays up for the checks on its homes
    assert not _leftovers(lab)
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(logs, ignore_errors=True)


def _fault(outcome, name):
    return next(f for f in outcome["faults"] if f.fault == name)


def _assert_resumed_like_uninterrupted(fault) -> None:
    same = fault.same
    assert same["steps"][0] == same["steps"][1] > 0, same
    assert same["losses_equal"] and same["max_loss_diff"] == 0.0, same  # bit for bit, threads = 1
    assert same["epochs_equal"] and same["summary_equal"], same
    assert all(math.isfinite(v) for v in fault.resumed["test"].values())


def _the_linkage_service_restarted_between_uploads_and_start_keeps_the_job(outcome):
    seen = outcome["service"]
    assert seen["state"] == "done"
    assert seen["after"]["state"] == seen["before"]["state"]  # the same job, as the uploads left it
    assert {k: v for k, v in seen["after"].items() if "upload" in k} == {
        k: v for k, v in seen["before"].items() if "upload" in k
    }
    assert outcome["uninterrupted"]["summary"]["test"]  # and training ran on its result


def _a_secondary_losing_its_network_mid_epoch_fails_naming_it_and_resumes_bit_for_bit(outcome):
    fault = _fault(outcome, "link down")
    assert fault.state == "failed" and f"party {PARTY!r}" in fault.error, fault
    assert f"party {PARTY!r}" in fault.output, fault.output[-3000:]  # what `flwr run` printed
    assert fault.detected_s < NODE_TIMEOUT + 60, fault.detected_s  # node-timeout, and the teardown
    _assert_resumed_like_uninterrupted(fault)


def _a_superlink_restarted_mid_epoch_loses_nothing(outcome):
    fault = _fault(outcome, "SuperLink restart")
    assert fault.detected_s < 60, fault  # `flwr run` returned: its log stream is gone
    assert "superlink" in fault.restarted
    # The ServerApp either outlives the SuperLink (its own session) and ends "finished", or went
    # down with the SuperLink's session: a killed process leaves "running" with its pid gone, which
    # `python -m app.run_status check` reports as not finished ("a run killed then says so too");
    # both were seen (2026-11-26). Either way nothing is lost: the run resumes to the same result.
    assert fault.state in ("finished", "failed") or (fault.state == "running" and fault.resumed_run), fault
    _assert_resumed_like_uninterrupted(fault)  # finished on its own, or resumed


# ---------------------------------------------------------------- training across hosts, on the same lab


def _numbers(value) -> list[float]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return [float(value)] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def _files(home: Path) -> list[Path]:
    return sorted(p for p in home.rglob("*") if p.is_file() and not p.is_symlink())


def _the_run_trains_across_hosts_over_tls_auth_and_the_direct_transport(faulted):
    lab, outcome, logs = faulted
    party, run = lab.hosts[PARTY], outcome["uninterrupted"]
    assert (lab.hosts[PRIMARY].home / "runs" / "uninterrupted" / "status.json").exists() and run["summary"]["test"]
    assert _numbers(run["summary"]["test"]) and all(math.isfinite(x) for x in _numbers(run["summary"]["test"]))
    assert "direct links to the party workers" in run["output"], run["output"][-3000:]
    node_log = (logs / f"supernode-{PARTY}.log").read_text(errors="replace")
    assert "[party worker] pid" in node_log and f"at {party.address}:{WORKER_PORT}" in node_log, node_log[-3000:]
    superlink = outcome["commands"][PRIMARY][0]
    assert "--enable-supernode-auth" in superlink and lab.hosts[PRIMARY].address in superlink
    assert "--insecure" not in " ".join(c for cmd in outcome["commands"][PARTY] for c in cmd)


def _each_home_holds_only_its_own_files(faulted):
    lab, _, _ = faulted
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


def _no_file_of_a_home_is_readable_by_the_other_hosts_user(faulted):
    lab, _, _ = faulted
    for owner in lab.hosts.values():
        files = _files(owner.home)
        assert files
        assert read_by_others(lab, owner, files) == []
        for other in (h for h in lab.hosts.values() if h is not owner):
            for secret in (owner.home / "keys" / PARTY, owner.home / "creds" / "ca.key"):
                if secret.exists():
                    assert lab.readable_by(owner, secret) and not lab.readable_by(other, secret)


def _a_supernode_with_an_unregistered_key_is_refused(faulted):
    lab, _, logs = faulted
    primary, party = lab.hosts[PRIMARY], lab.hosts[PARTY]
    superlink = start_superlink(lab, primary, logs, {PRIMARY: []})
    try:
        register(lab, primary, PARTY, {PRIMARY: []})  # the party's real key is registered, not this one
        code, log = refused_supernode(lab, PARTY, party, logs)
    finally:
        superlink.stop(grace=5)
    assert code not in (0, None), log[-3000:]
    print(f"refused SuperNode exit {code}; its log ends:\n{log[-1500:]}")


TRAINING_CHECKS = (
    _the_run_trains_across_hosts_over_tls_auth_and_the_direct_transport,
    _each_home_holds_only_its_own_files,
    _no_file_of_a_home_is_readable_by_the_other_hosts_user,
    _a_supernode_with_an_unregistered_key_is_refused,
)


def test_faults_across_hosts(faulted):
    """One test, every check on one lab (a module fixture is built again on every xdist worker that runs one of its tests)."""
    _, outcome, _ = faulted
    for check in (
        _the_linkage_service_restarted_between_uploads_and_start_keeps_the_job,
        _a_secondary_losing_its_network_mid_epoch_fails_naming_it_and_resumes_bit_for_bit,
        _a_superlink_restarted_mid_epoch_loses_nothing,
    ):
        check(outcome)
    for check in TRAINING_CHECKS:
        check(faulted)
