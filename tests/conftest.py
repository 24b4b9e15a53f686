import os

import pytest

# Tests never phone home and never install dependencies at run time.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
# The parties' defence noise (on by default) from a known seed, so that a federated run equals its
# one-process twin and a resumed run its uninterrupted one; tests of the secret itself unset it.
os.environ.setdefault("FEDSIM_PARTY_SEED", "20261205")

# The pytest-xdist workers (scripts/test.sh) share two cores: one torch thread each. With the
# default (a thread per core) the workers' OpenMP threads oversubscribe the cores: the tests that
# are not `slow` took 110 s instead of 95 s (2026-11-23).
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(1)


# The longest end-to-end tests first, longest first (seconds on a quiet 2-core VM, 2026-11-24),
# with scripts/test.sh's `--maxschedchunk 1`: pytest-xdist then deals the first tests two per
# worker and every later one to the next worker that is free, so the long tests spread over the
# workers (longest processing time first). Without it, the first worker got the first ~38 tests
# in one chunk, and two long tests on one worker's tail set the suite's wall time.
LONGEST_FIRST = (
    "tests/test_lab_faults.py::test_faults_across_hosts",  # ~270 (issue 32, under load; 218 -> 181 alone)
    "tests/test_lab_deploy.py::test_the_lifecycle_across_hosts",  # ~150 (under load)
    "tests/test_deploy.py::test_deployment_with_tls_node_auth_three_parties_and_the_linkage_service",  # 258
    "tests/test_predict_ea_flower.py::test_a_run_trained_through_flower_predicts_through_flower_as_it_evaluated",
    # ^ 257 under load
    "tests/test_cli.py::test_train_predict_and_report_through_flower",  # 165
    "tests/test_primary_own_data.py::test_a_deployment_with_one_data_folder_per_party",  # 111
    "tests/test_deploy.py::test_deployment_refuses_unknown_and_twin_nodes_and_names_a_killed_one",  # 120
    "tests/test_entity_aug.py::test_flower_secondary_timeout_falls_back_to_the_last_activation",  # 90
    "tests/test_run_status.py::test_the_demo_exits_non_zero_with_the_error_of_a_failed_flower_run",  # 77
    "tests/test_flower_run.py::test_a_killed_flower_run_resumes_from_its_checkpoint_with_the_same_metrics",  # 66
    "tests/test_flower_run.py::test_flower_run_equals_one_process_twin",  # 36
    "tests/test_chunk_search.py::test_a_job_whose_ray_worker_is_killed_finishes_with_the_same_result",  # ~20
    "tests/test_sweep.py::test_runs_on_ray_equal_serial_runs",  # ~20 (75 under load)
    "tests/test_cli.py::test_entity_augmentation_on_csv_guests_with_id_columns",  # 26
)
FIRST_WAVE = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "4"))  # one long test per worker, each
# dealt with one short test (xdist first deals two consecutive tests to each worker)


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        nodeid = item.nodeid.split("[")[0]
        return next((i for i, name in enumerate(LONGEST_FIRST) if nodeid == name), len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: every other test keeps its place
    n_long = sum(rank(item) < len(LONGEST_FIRST) for item in items)
    longs, shorts = items[:n_long], items[n_long:]
    k = min(FIRST_WAVE, len(longs), len(shorts))  # [L0, s, L1, s, L2, s, L3, L4, ..., the other shorts]
    first = [x for pair in zip(longs[:k], shorts[:k]) for x in pair]
    items[:] = first + longs[k:] + shorts[k:]  # every test kept, whatever subset was collected


CONFIG: list = []  # the controller's config (pytest_configure); a worker's own output is not shown


def pytest_configure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        CONFIG[:] = [config]


def pytest_runtest_logstart(nodeid, location):
    """Say when one of the longest tests starts: between them a quiet run can print no dot for
    minutes (under xdist the controller hears of each test a worker starts)."""
    reporter = CONFIG[0].pluginmanager.get_plugin("terminalreporter") if CONFIG else None
    if reporter is not None and nodeid.split("[")[0] in LONGEST_FIRST:
        reporter.write_line(f"started, one of the longest (end to end): {nodeid}")


@pytest.fixture
def run_identity(monkeypatch):
    """Flower's Message reads the run id of the process it runs in (set by a ServerApp); tests
    that build Messages outside one take this fixture."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
