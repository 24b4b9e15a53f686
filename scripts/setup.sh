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
# a .venv already set up from this very pyproject.toml (and these setup scripts) is left as it is:
# the demo and the tests call this script every time (FEDSIM_SETUP_FORCE=1 reinstalls anyway)
STAMP=.venv/.fedsim-setup
WANT=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -z "${FEDSIM_SETUP_FORCE:-}" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    say "setup up to date (.venv installed from this pyproject.toml; FEDSIM_SETUP_FORCE=1 reinstalls)"
    exit 0
fi
rm -f "$STAMP"
run_phase "upgrading pip" .venv/bin/python -m pip install -q --upgrade pip
run_phase "installing $TORCH (the CPU build, ~200 MB on a fresh machine)" .venv/bin/python -m pip install -q "$TORCH"
run_phase "installing the project and its test dependencies (pip install -e .[test])" \
    .venv/bin/python -m pip install -q -e ".[test]"
# compile the Hamming and q-gram top-K kernels once, into the user's cache folder (no first-use stall)
run_phase "compiling the linkage kernels (numba: Hamming and q-gram top-K)" \
    .venv/bin/python -c "from linkage.hamming import warm; warm(); from linkage.qgram import warm; warm()"
echo "$WANT" > "$STAMP"
say "setup done: .venv/bin/fedsim is ready"
