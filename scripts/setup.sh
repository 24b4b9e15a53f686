#!/usr/bin/env bash
# Create .venv and install the project with its test dependencies (CPU torch, pinned). Each phase
# is said as it starts, with the time so far, and shows a live clock while it runs (scripts/phase.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/phase.sh
PYTHON="${PYTHON:-python3}"
TORCH=$(grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"')
if [ -x .venv/bin/python ]; then
    say "using the existing .venv"
else
    run_phase "creating .venv ($PYTHON -m venv)" "$PYTHON" -m venv .venv
fi
run_phase "upgrading pip" .venv/bin/python -m pip install -q --upgrade pip
run_phase "installing $TORCH (the CPU build, ~200 MB on a fresh machine)" .venv/bin/python -m pip install -q "$TORCH"
run_phase "installing the project and its test dependencies (pip install -e .[test])" \
    .venv/bin/python -m pip install -q -e ".[test]"
# compile the Hamming and q-gram top-K kernels once, into the user's cache folder (no first-use stall)
run_phase "compiling the linkage kernels (numba: Hamming and q-gram top-K)" \
    .venv/bin/python -c "from linkage.hamming import warm; warm(); from linkage.qgram import warm; warm()"
say "setup done: .venv/bin/fedsim is ready"
