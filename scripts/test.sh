#!/usr/bin/env bash
# Set up, then run every test (the end-to-end Flower runs are marked `slow`; -m "not slow" skips them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
