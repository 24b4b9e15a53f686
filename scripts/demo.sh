#!/usr/bin/env bash
# Set up, then train FedSim on hdb (resale flats <- GPS -> schools) as a Flower simulation.
# Extra arguments are run-config overrides, e.g.:  scripts/demo.sh epochs=20 steps-per-exchange=1
# Exits non-zero unless the run finished: `flwr run` exits 0 even when the ServerApp fails, so the
# run's runs/<run-name>/status.json decides (app/run_status.py); the error goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
. scripts/flwr_env.sh
base="run-name='demo-$(date +%Y%m%d-%H%M%S)' data-dir='$PWD/data' out-dir='$PWD/runs' epochs=2"
# the overrides win over $base (as in flwr run); a bad or unknown key is named here, Flower would not name it
run_dir="$(python -m app.run_status folder "$base" "$*")"
since="$(python -c 'import time; print(time.time())')"
# this demo's own ports and Ray folder: another user's (or checkout's) demo on this host is left alone
port() { python -c 'from linkage_server.local import free_port; print(free_port())'; }
export FLWR_LOCAL_SUPERLINK_HTTP_API_PORT="${FLWR_LOCAL_SUPERLINK_HTTP_API_PORT:-$(port)}"
export FLWR_LOCAL_CONTROL_API_PORT="${FLWR_LOCAL_CONTROL_API_PORT:-$(port)}"
export RAY_TMPDIR="$(mktemp -d /tmp/fedsim-ray-XXXXXX)/r"
trap 'python -m deploy.localsim stop; rm -rf "$(dirname "$RAY_TMPDIR")"' EXIT   # the SuperLink flwr run leaves running: ours only
python -m deploy.localsim start               # started here: Flower gives it only 15 s (too few under load)
flwr run . --stream --federation-config "$FEDERATION" --run-config "$base" --run-config "$*"
python -m app.run_status check "$run_dir" --since "$since"
