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
# Ray (the simulation's backend) makes its session folders 0777: give it one inside a 0700 folder
# of this user's own: one per user, reused by every shell that sources this file (a fresh one per
# source left an empty folder each time), never one that another user made or opened (then a fresh one)
if [ -z "${RAY_TMPDIR:-}" ]; then
  _fedsim_ray="${TMPDIR:-/tmp}/fedsim-ray-$(id -u)"
  mkdir -m 700 "$_fedsim_ray" 2>/dev/null || true   # there already: checked below
  if [ -d "$_fedsim_ray" ] && [ ! -L "$_fedsim_ray" ] && [ "$(stat -c '%u %a' "$_fedsim_ray")" = "$(id -u) 700" ]; then
    export RAY_TMPDIR="$_fedsim_ray/r"
  else
    export RAY_TMPDIR="$(mktemp -d "${TMPDIR:-/tmp}/fedsim-ray-XXXXXX")/r"
  fi
  unset _fedsim_ray
fi
