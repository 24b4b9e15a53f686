"""End to end through `flwr run` (Flower simulation): the federated run equals the twin.

Each run starts its own local SuperLink (own FLWR_HOME and ports) and stops it after.
"""

import json
import time

import numpy as np
import pytest
import torch

from app.config import RunConfig
from app.kept import kept_attempt, party_model_file
from app.vfl.inprocess import max_param_gap, run_twin
from deploy.localsim import processes_mentioning, simulate

pytestmark = pytest.mark.slow

# S = 1 through `flwr run` is compared with the in-process run (which the twin oracles prove
# exact) by the kill-and-resume test below; unpipelined windows through Flower are the same
# channel calls as these (step = receive(send())).
RUNS = {
    # pipelined (window w + 1 requested before window w computes: two requests in flight) over
    # the direct transport (each party worker's own encrypted link, the deployment's default).
    # One Flower start-up for both: the suite is near its 10-minute budget. Flower messages
    # through `flwr run` are the kill-and-resume test's (S = 1) and test_cli's.
    "hdb-S3-pipelined-direct": dict(
        dataset="hdb", n_rows=1500, k=20, batch_size=64, steps_per_exchange=3, pipeline=True, transport="direct"
    ),
}


def _workers_of(flwr_home: str) -> list[int]:
    """Party workers started under this FLWR_HOME (their environment says; other tests' differ)."""
    from pathlib import Path

    found = []
    for pid in processes_mentioning("app.party_worker"):
        try:
            if f"FLWR_HOME={flwr_home}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(pid)
        except OSError:
            pass  # gone meanwhile
    return found


def flower_keys(values: dict) -> dict:
    return {k.replace("_", "-"): v for k, v in values.items()}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_flower_run_equals_one_process_twin(name, tmp_path):
    values = dict(
        RUNS[name], epochs=2, max_steps=12, dtype="float64", out_dir=str(tmp_path / "out"), run_name=name
    )  # float64: rounding cannot grow past the tolerance (test_equivalence)
    proc = simulate(flower_keys(values), tmp_path / "flwr-home", timeout=400)
    run_dir = tmp_path / "out" / name
    assert processes_mentioning(str(tmp_path / "flwr-home")) == []  # the SuperLink it started is gone
    deadline = time.monotonic() + 20  # a direct transport's party workers end with the run's links
    while _workers_of(str(tmp_path / "flwr-home")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _workers_of(str(tmp_path / "flwr-home")) == []
    assert (run_dir / "summary.json").exists(), proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["exchange"]["bytes_down"] > 0
    assert "[primary] best epoch" in proc.stdout
    assert ("direct links to the party workers" in proc.stdout) == (values.get("transport") == "direct")

    cfg = RunConfig.of(**values)
    twin = run_twin(cfg)
    np.testing.assert_allclose(np.load(run_dir / "step_losses.npy"), twin.losses, rtol=1e-9, atol=1e-10)
    assert max_param_gap(torch.load(run_dir / "primary_model.pt", weights_only=True), twin.primary) < 1e-9
    for party, state in twin.secondaries.items():
        final = run_dir / party / party_model_file(kept_attempt(run_dir))  # the party's final state
        assert max_param_gap(torch.load(final, weights_only=True), state) < 1e-9
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(set(r["val"]) == set(r["test"]) for r in rows)
    # predict mode of the same apps: tests/test_cli.py (a user's CSV, simulation) and
    # tests/test_deploy.py (prepared .npz arrays, the deployment)


# A bad input through `flwr run` (named on stderr, the run marked failed, the command's exit
# status non-zero): tests/test_run_status.py::test_the_demo_exits_non_zero_with_the_error_of_a_failed_flower_run


def test_a_killed_flower_run_resumes_from_its_checkpoint_with_the_same_metrics(tmp_path):
    """Kill the whole simulation (SuperLink, ServerApp, ClientApps) after epoch 0's checkpoint;
    `flwr run` with resume=true ends with the metrics of an uninterrupted run (S = 1)."""
    from app.modes import run_experiment
    from deploy.localsim import start_simulation, stop_superlink

    # 20 epochs: over the direct transport an epoch of these 7 steps takes ~0.25 s, and a run of 3
    # finished before the kill that follows its first checkpoint (~0.2 s of polling, then the stop);
    # 20 leave ~5 s of training after it, 25x that latency, and more on a loaded machine
    base = dict(
        dataset="hdb", n_rows=1200, k=10, batch_size=128, epochs=20, steps_per_exchange=1, out_dir=str(tmp_path / "out")
    )
    # the uninterrupted run: in one process, which the twin oracles prove equal to `flwr run`
    run_experiment(RunConfig.of(**base, run_name="whole"), tmp_path / "whole")
    want = [json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert len(want) == 20

    proc, port = start_simulation(flower_keys(dict(base, run_name="killed")), tmp_path / "home-killed")
    manifest = tmp_path / "out" / "killed" / "checkpoint" / "checkpoint.json"
    deadline = time.monotonic() + 400
    while not manifest.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert manifest.exists(), "no checkpoint was written"
    proc.kill()  # `flwr run` first: nothing of it is left to start a SuperLink again
    proc.communicate()
    stop_superlink(port)  # kills the run mid-training
    assert processes_mentioning(str(tmp_path / "home-killed")) == []
    rows = (tmp_path / "out" / "killed" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) < 20  # it really was interrupted

    again = simulate(flower_keys(dict(base, run_name="killed", resume=True)), tmp_path / "home-resume", timeout=500)
    assert "resumed from the checkpoint of epoch" in again.stdout, again.stdout[-3000:] + again.stderr[-2000:]
    got = [json.loads(x) for x in (tmp_path / "out" / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in got] == list(range(20))
    for a, b in zip(got, want):
        for split in ("val", "test"):
            for key in b[split]:
                assert a[split][key] == pytest.approx(b[split][key], rel=1e-4, abs=1e-5), (split, key, a, b)
