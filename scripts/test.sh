#!/usr/bin/env bash
# Set up, then run every test (the end-to-end Flower runs are marked `slow`; -m "not slow" skips them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# three workers (pytest-xdist) on 2 cores: the end-to-end Flower runs spend much of their time
# waiting on Flower's polls, so a third worker fills that time (two workers: 9 min 56 s on a fresh
# clone; four were no faster than three). tests/conftest.py orders the longest tests first and
# --maxschedchunk 1 deals them one at a time to free workers. PYTEST_WORKERS=0: one process
if [ "${PYTEST_WORKERS:-3}" = "0" ]; then exec .venv/bin/python -m pytest "$@"; fi
exec .venv/bin/python -m pytest -n "${PYTEST_WORKERS:-3}" --maxschedchunk 1 "$@"
