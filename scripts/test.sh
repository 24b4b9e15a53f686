#!/usr/bin/env bash
# Set up, then run every test (the end-to-end Flower runs are marked `slow`; -m "not slow" skips them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# three workers (pytest-xdist) on 2 cores: the end-to-end Flower runs spend most of their time
# waiting on Flower's polls, so a third worker fills that time (two workers: 9 min 56 s on a fresh
# clone, over the 10-minute budget); PYTEST_WORKERS=0 runs it in one process
exec .venv/bin/python -m pytest -n "${PYTEST_WORKERS:-3}" "$@"
