# Source me: environment for `flwr run` in this repo (simulation on this machine).
# FLWR_HOME inside the repo (or $FEDSIM_FLWR_HOME), telemetry/update checks off, and no
# runtime dependency installation (it would pull a CUDA torch with uv on every run).
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export FLWR_HOME="${FEDSIM_FLWR_HOME:-$REPO/.flwr}"
export FLWR_TELEMETRY_ENABLED=0
export FLWR_DISABLE_UPDATE_CHECK=1
export RAY_USAGE_STATS_ENABLED=0
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
# the simulation's size goes on the command line (Flower 1.41 and later deprecate `options.` in config.toml):
#   flwr run . --federation-config "$FEDERATION" ...   (one SuperNode per secondary; set N for more)
export FEDERATION="num-supernodes=${N:-1} client-resources-num-cpus=1"
mkdir -p "$FLWR_HOME"
if [ ! -f "$FLWR_HOME/config.toml" ] || grep -q '^options\.' "$FLWR_HOME/config.toml"; then
  cat > "$FLWR_HOME/config.toml" <<'TOML'
[superlink]
default = "local"

[superlink.local]
address = ":local:"
TOML
fi
# Ray (the simulation's backend) makes its session folders 0777: give it one inside a 0700 folder of ours
export RAY_TMPDIR="${RAY_TMPDIR:-$(mktemp -d /tmp/fedsim-ray-XXXXXX)/r}"
