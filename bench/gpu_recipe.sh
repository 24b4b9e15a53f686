#!/usr/bin/env bash
# bench/gpu_recipe.sh on a lent GPU box (the `run` tool): the hdb recipe runs that two CPU cores
# cannot afford, three sweeps side by side, each pinned to its own cores:
#   cores 0-10   hdb_baselines_ple (AvgSim, Top1Sim, Solo; device cpu, one thread each)
#   cores 11-13  hdb_gpu_ple       (the paper's FedSim; device cuda, three runs at once)
#   cores 14-15  hdb_start_probe   (fedsim_attn starting silent, seeds 0-2; cuda, two at once)
# (13 runs at once on one GPU once took turns so slowly that none finished: docs/benchmarks.md
# "Sweeps on a GPU box"; five here, each host-bound at ~9 ms of host work to ~1.2 ms of kernels.)
#
#   here:   NO_RAY=1 bash bench/gpu_wheels.sh   # wheels for the device's Python 3.12 -> .whl, data -> .gpudata
#   device: `run` with carry [".whl", ".gpudata"], command `bash bench/gpu_recipe.sh`, timeout_s 590
#   back:   $OUT/gpu-recipe.log (keep it in docs/device-logs/), each sweep's log, and runs.tgz: every
#           run's summary, config, metrics and status (no models), to tabulate here.
#   a local rehearsal on a CPU: QUICK=1 OUT=/tmp/out bash bench/gpu_recipe.sh (the sweeps' --quick,
#   on cores 0-1, with .venv's Python). Exits non-zero when any sweep failed or ran out of time.
set -o pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the logs go to}"
export PYTHONUNBUFFERED=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 OMP_NUM_THREADS=1
export FEDSIM_DATA_DIR=${FEDSIM_DATA_DIR:-$PWD/.gpudata}
L=$OUT/gpu-recipe.log R=/tmp/recipe-runs LIMIT=${LIMIT:-505} Q=${QUICK:+--quick} PY=python3
[ -n "$QUICK" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
if [ -d .whl ] && [ -z "$QUICK" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
    export PYTHONPATH=/tmp/site:$PWD
fi
date -u | tee -a $L
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a $L
$PY -c "import torch, flwr, os; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'flwr', flwr.__version__, 'cpus', os.cpu_count())" 2>&1 | tee -a $L
git log -1 --format='git %h %s' 2>/dev/null | cut -c1-100 | tee -a $L

sweep() {  # cores, sweep name, jobs; returns the sweep's exit status (124: out of time)
    local t0=$SECONDS cores=$1 rc
    [ -n "$QUICK" ] && cores=0-1
    taskset -c "$cores" timeout "$LIMIT" $PY -m experiments.sweep "conf/sweeps/$2.toml" --jobs "$3" --root $R $Q > "$OUT/$2.log" 2>&1
    rc=$?
    echo "$2: exit $rc after $((SECONDS - t0)) s" | tee -a $L
    return $rc
}
sweep 0-10 hdb_baselines_ple 11 &
a=$!
sweep 11-13 hdb_gpu_ple 3 &
b=$!
sweep 14-15 hdb_start_probe 2 &
c=$!
(while sleep 30; do echo "gpu $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>&1) at $SECONDS s"; done) >> $L &
m=$!
failed=0
for pid in $a $b $c; do wait $pid || failed=1; done
kill $m 2>/dev/null
grep -h "test \(rmse\|accuracy\)\|^|" $OUT/hdb_*.log | tee -a $L
(cd $R && find . \( -name summary.json -o -name config.json -o -name metrics.jsonl -o -name status.json \
    -o -name progress.json -o -name 'results.*' \) -not -path '*/.linkage/*' -not -path '*/kept/*' -print0 |
    tar --null -czf $OUT/runs.tgz -T -)
ls -la $OUT | tee -a $L
exit $failed
