#!/usr/bin/env bash
# Create .venv and install the project with its test dependencies (CPU torch, pinned).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"
# compile the Hamming and q-gram top-K kernels once, into the user's cache folder (no first-use stall)
.venv/bin/python -c "from linkage.hamming import warm; warm(); from linkage.qgram import warm; warm()"
