#!/usr/bin/env bash
# Set up, then run every test (the end-to-end Flower runs are marked `slow`; -m "not slow" skips them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# four workers (pytest-xdist) on 2 cores: the end-to-end Flower runs spend most of their time
# waiting on Flower's polls (3 workers used the cores 49 % of the time), so more workers fill that
# time (2 workers: 9 min 56 s on a fresh clone, 3: 9 min 6 s; docs/benchmarks.md "Test suite");
# PYTEST_WORKERS=0 runs it in one process
exec .venv/bin/python -m pytest -n "${PYTEST_WORKERS:-4}" "$@"
