#!/usr/bin/env bash
# Set up, then run every test (the end-to-end Flower runs are marked `slow`; -m "not slow" skips them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# two workers (pytest-xdist): the end-to-end Flower runs spend most of their time waiting, so
# the suite takes ~7 min instead of ~10 on 2 cores; PYTEST_WORKERS=0 runs it in one process
exec .venv/bin/python -m pytest -n "${PYTEST_WORKERS:-2}" "$@"
