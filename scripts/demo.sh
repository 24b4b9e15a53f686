#!/usr/bin/env bash
# Set up, then train FedSim on hdb (resale flats <- GPS -> schools) as a Flower simulation.
# Extra arguments are run-config overrides, e.g.:  scripts/demo.sh epochs=20 steps-per-exchange=1
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
. scripts/flwr_env.sh
trap 'python -m app.localsim stop' EXIT   # flwr run leaves its local SuperLink running
flwr run . --stream --run-config "data-dir='$PWD/data' out-dir='$PWD/runs' $*"
