#!/usr/bin/env bash
# Set up, then run every test (the end-to-end Flower runs are marked `slow`; -m "not slow" skips them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# four workers (pytest-xdist) on 2 cores: the end-to-end Flower runs spend much of their time
# waiting on Flower's polls and process starts, so more workers than cores fill that time. In
# /work/main on 2026-11-24: 3 workers 8 min 17 s of pytest; 4 workers 7 min 14 s, then 6 min 47 s
# once a deployed run's handshake was one Flower exchange (docs/benchmarks.md "Test suite").
# tests/conftest.py orders the longest tests first and --maxschedchunk 1 deals them one at a
# time to free workers. PYTEST_WORKERS=0: one process
if [ "${PYTEST_WORKERS:-4}" = "0" ]; then exec .venv/bin/python -m pytest "$@"; fi
exec .venv/bin/python -m pytest -n "${PYTEST_WORKERS:-4}" --maxschedchunk 1 "$@"
