import os

# Tests never phone home and never install dependencies at run time.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

# Two pytest-xdist workers share two cores (scripts/test.sh): one torch thread each. With the
# default (a thread per core) the workers' OpenMP threads oversubscribe the cores: the tests that
# are not `slow` took 110 s instead of 95 s (2026-11-23).
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(1)
