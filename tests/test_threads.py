"""Issue 31: every engine picks its threads (app/threads.py), and a CPU run is repeatable."""

import json

import numpy as np
import pytest
import torch

from app import threads
from app.config import ConfigError, RunConfig
from app.modes import run_experiment
from app.threads import PARAMS_PER_THREAD, choose_threads, cpu_quota
from tests.fresh_python import imported_after


@pytest.mark.parametrize(
    ("cpus", "processes", "params", "override", "cap", "busy", "want"),
    [
        (2, 1, 60_000, 0, 0, 0.0, 1),  # small models (a secondary's): one thread, whatever the cores
        (16, 1, 60_000, 0, 0, 0.0, 1),
        (16, 1, 1_900_000, 0, 0, 0.0, 16),  # hdb's primary on a quiet 16-core box: every core (2x one)
        (2, 1, 1_900_000, 0, 0, 1.5, 1),  # ... on 2 cores another job holds: one (8x two)
        (16, 1, 1_900_000, 0, 0, 4.2, 12),  # the CPUs other work keeps busy are left to it
        (16, 1, 10 * PARAMS_PER_THREAD, 0, 0, 0.0, 10),  # a thread per PARAMS_PER_THREAD
        (16, 4, 10 * PARAMS_PER_THREAD, 0, 0, 0.0, 4),  # ... at most its share of the CPUs
        (16, 40, 10 * PARAMS_PER_THREAD, 0, 0, 0.0, 1),  # more processes than CPUs: still one
        (16, 1, 10 * PARAMS_PER_THREAD, 0, 3, 0.0, 3),  # OMP_NUM_THREADS (Ray's num-cpus) caps it
        (16, 1, 60_000, 0, 3, 0.0, 1),  # ... but never raises it
        (2, 3, 60_000, 6, 1, 9.0, 6),  # the run config's threads overrides everything
        (0, 0, 0, 0, 0, 0.0, 1),  # nothing known: one
    ],
)
def test_the_choice_from_planted_inputs(cpus, processes, params, override, cap, busy, want):
    choice = choose_threads(cpus, processes, 3, params, override, cap, busy)
    assert choice.threads == want
    assert choice.line().startswith(f"threads: {want} (")


def test_the_line_says_what_it_was_chosen_from():
    line = choose_threads(2, 1, 4, 60_000).line()
    assert line == "threads: 1 (2 CPUs, 4 parties in this process, model 0.06 M params; auto)"
    shared = choose_threads(2, 3, 1, 300_000, env_cap=1).line()
    assert "3 processes share them, 1 party in this process" in shared
    busy = choose_threads(16, 1, 1, 1_900_000, busy=4.2).line()
    assert busy.endswith("model 1.90 M params; auto, 4 of 16 CPUs busy)")


@pytest.mark.parametrize(
    ("text", "want"),
    [("200000 100000\n", 2.0), ("150000 100000", 1.5), ("max 100000\n", None), ("", None), ("x y", None)],
)
def test_cgroup_cpu_max(text, want):
    assert cpu_quota(text) == want


def test_usable_cpus_is_within_the_affinity_mask():
    import os

    assert 1 <= threads.usable_cpus() <= len(os.sched_getaffinity(0))


def test_a_negative_thread_count_is_refused():
    with pytest.raises(ConfigError, match="threads"):
        RunConfig.from_flower({"threads": -1})


def _run(out_dir, name: str, **extra) -> tuple[np.ndarray, dict]:
    cfg = RunConfig.of(  # no exchange report: training's losses are the point, its attacks were half the time
        dataset="synthetic",
        n_rows=1200,
        k=10,
        batch_size=64,
        epochs=2,
        seed=0,
        out_dir=str(out_dir),
        exchange_report=False,
        **extra,
    )
    run_experiment(cfg, out_dir / name)
    return np.load(out_dir / name / "step_losses.npy"), json.loads((out_dir / name / "summary.json").read_text())


@pytest.fixture
def same_job_secret(monkeypatch):
    """The linkage job's secret from the operator seed (docs/reference.md "The linkage service"), not drawn per
    out-dir: the runs below link the same tokens in different folders."""
    monkeypatch.setenv("FEDSIM_LINKAGE_OPERATOR_SEED", "7")
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_same_seed_same_losses_bit_for_bit_at_the_chosen_threads(tmp_path, same_job_secret, monkeypatch):
    """Two in-process CPU runs with the same seed (and job secret), in different folders: every
    step loss equal to the last bit, at the thread count the engine picks (in summary.json). The
    choice follows the machine's load (app/threads.py), which a test cannot hold still between two
    runs: the load read is fixed here, as two runs at the same load would read it."""
    monkeypatch.setattr(threads, "others_load", lambda: 0.0)
    a, summary = _run(tmp_path / "a", "run")
    b, second = _run(tmp_path / "b", "run")
    assert len(a) == 28
    assert a.tobytes() == b.tobytes()
    chosen = summary["threads"]
    assert chosen == second["threads"]
    assert chosen["threads"] == chosen["torch"] >= 1 and chosen["source"] == "auto"
    assert chosen["parties"] == 2 and chosen["processes"] == 1 and chosen["params"] > 0
    assert chosen["deterministic"]


def test_same_seed_same_losses_at_two_threads(tmp_path, same_job_secret):
    """At two threads too (run config ``threads``): before torch's deterministic algorithms, the
    gates' indexed gather summed its gradient atomically in the threads' order, and about one run
    in three of this config differed from the first in the last digits (2026-11-26)."""
    runs = [_run(tmp_path / str(i), "run", threads=2) for i in range(3)]
    assert all(s["threads"]["threads"] == s["threads"]["torch"] == 2 for _, s in runs)
    assert runs[0][1]["threads"]["source"] == "run config threads=2"
    assert all(losses.tobytes() == runs[0][0].tobytes() for losses, _ in runs[1:])


def test_others_load_reads_the_cpus_busy_share_now_not_the_minute_before(tmp_path, monkeypatch):
    """Two /proc/stat samples a window apart: 50 of 100 jiffies busy on 2 CPUs is 1 CPU busy,
    whatever the 1-minute load average still remembers of work that has ended."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  60 0 40 880 20 0 0 0 0 0\ncpu0 30 0 20 440 10 0 0 0 0 0\ncpu1 30 0 20 440 10 0 0 0 0 0\n")
    assert threads._cpu_times(stat) == (100, 1000, 2)  # busy = all but idle and iowait
    samples = iter([(100, 1000, 2), (150, 1100, 2)])
    monkeypatch.setattr(threads, "_sampled", None)
    monkeypatch.setattr(threads, "_cpu_times", lambda: next(samples))
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert threads.others_load(window=0.0) == pytest.approx(1.0)
    assert threads.others_load(window=0.0) == pytest.approx(1.0)  # reused within the minute: no third sample
    monkeypatch.setattr(threads, "_sampled", None)
    monkeypatch.setattr(threads, "_cpu_times", lambda: None)  # no /proc: the load average, less this process
    assert threads.others_load(window=0.0) == pytest.approx(8.0)


def test_a_small_models_process_does_not_wait_to_watch_the_cpus(monkeypatch):
    """A secondary's small model gets one thread whatever the load, so deciding it costs no
    LOAD_WINDOW window (a deployed ClientApp process may be started for each message); a large one looks."""
    looked = []
    monkeypatch.setattr(threads, "others_load", lambda: looked.append(1) or 0.0)
    monkeypatch.setattr(threads, "usable_cpus", lambda: 4)
    monkeypatch.setattr(threads, "env_cap", lambda: 0)  # whatever OMP_NUM_THREADS the test runs under
    small, large = torch.nn.Linear(10, 10), torch.nn.Linear(1000, 1000)  # 110 and ~1 M parameters
    assert threads.decide(0, 1, [small]).threads == 1 and looked == []
    assert threads.decide(0, 1, [large]).threads == 4 and looked == [1]


def test_a_cpu_party_runs_deterministic_ops_warn_only_without_importing_torchs_compiler():
    """threads.use on the CPU: torch's deterministic algorithms on, warn-only (what a run repeats
    bit for bit by, above). torch.use_deterministic_algorithms also sets its compiler's flag by
    importing torch._inductor (and with it torch._dynamo, ~1.1 s of CPU) in every party's process;
    nothing here compiles, so the eager flag is set alone: checked in a fresh interpreter."""
    steps = (
        "import torch\nfrom app import threads\n"
        "threads.use(threads.ThreadChoice(1, 2, 1, 1, 1000, 'auto'), 'test', cpu=True)\n"
        "assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()"
    )
    assert imported_after(steps, ("torch._dynamo", "torch._inductor")) == []


def test_a_secondary_takes_the_primarys_thread_count_only_up_to_its_own_cpus(monkeypatch):
    """The run config's threads travels from the primary: a secondary bounds it by the CPUs it may
    use (1000 made 2,062 OS threads on a 2-CPU host)."""
    from types import SimpleNamespace

    from app.vfl import client

    seen = {}
    monkeypatch.setattr(threads, "use", lambda choice, *a: seen.setdefault("threads", choice.threads))
    cfg = RunConfig.of(dataset="hdb", threads=1000)
    context = SimpleNamespace(node_config={"party": "school"})
    client.party_threads(cfg, context, SimpleNamespace(model=torch.nn.Linear(2, 2)))
    assert seen["threads"] == threads.usable_cpus()


@pytest.mark.parametrize("given", [0, 2])
def test_entity_augmentation_records_its_threads_and_takes_the_run_configs(tmp_path, given):
    """Entity Augmentation's parties train on one thread (strategies/torch_threads.py); the run
    config's ``threads`` overrides it as for FedSim, and summary.json records the count either way
    (it recorded nothing, and ``threads = 2`` ran one thread without a word)."""
    from tests.test_entity_aug import ea_cfg

    summary = run_experiment(ea_cfg(epochs=1, threads=given), tmp_path / "run")
    rec = summary["threads"]
    assert rec is not None and rec["threads"] == (given or 1), rec
    assert rec["source"] == (f"run config threads={given}" if given else "entity augmentation: one thread")
