# bench/gpu_step.sh on a lent GPU: the step-speed table, before and after, on one warm machine.
#
#   here:   bash bench/gpu_wheels.sh      # wheels for the device's Python 3.12 (+ a slim Ray) -> .whl, data -> .gpudata
#           rm -rf .before && mkdir .before && git archive 4824eaa | tar -x -C .before && rm -rf .before/{tests,docs}
#   device: `run` with carry [".whl", ".gpudata", ".before"], command `bash bench/gpu_step.sh`,
#           timeout_s 580; the log comes back as $OUT/gpu-step.log (keep it in docs/device-logs/).
#
# Rows (hdb all flats, K = 50, batch 128, fedsim_attn, one epoch = 489 steps, train s/epoch), most
# important first (a run cut at its limit keeps what it logged): in process at S = 1 on cuda and
# cpu, after and before; S = 8 and the twin; a profile of 100 steps (GPU busy, launches per step);
# torch.compile and CUDA graphs for the padded step; `flwr run` (simulation) with device = cuda;
# the CUDA tests; the optimiser step alone.
set -o pipefail
export PYTHONUNBUFFERED=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 FEDSIM_DATA_DIR=$PWD/.gpudata
L=$OUT/gpu-step.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
tar -xJf .whl/ray-site.tar.xz -C /tmp/site || echo "no Ray: the flwr run row fails" | tee -a $L
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a $L
python3 -c "import torch, flwr, os; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'flwr', flwr.__version__, 'cpus', os.cpu_count())" 2>&1 | tee -a $L
DC="python3 -m bench.device_cost --dataset hdb --epochs 1"
rows() { grep "^|\|Error\|threads:" | grep -v "^|---\|^| device" ; }
for tree in . .before; do
  echo "== $tree: in process, S = 1 (cuda, cpu with the chosen threads)" | tee -a $L
  (cd $tree && PYTHONPATH=/tmp/site:$PWD timeout 110 $DC --devices cuda,cpu --set steps-per-exchange=1 2>&1 | rows) | tee -a $L
done
echo "== after: cpu with threads = 16; cuda S = 8; the twin at S = 1 on cuda" | tee -a $L
timeout 60 $DC --devices cpu --set steps-per-exchange=1 --set threads=16 2>&1 | rows | tee -a $L
timeout 50 $DC --devices cuda --set steps-per-exchange=8 2>&1 | rows | tee -a $L
timeout 60 $DC --devices cuda --set steps-per-exchange=1 --twin 2>&1 | rows | tee -a $L
echo "== after: profile of 100 steps on cuda, S = 1" | tee -a $L
timeout 60 python3 -m bench.step_profile --steps 100 --rows 15 --set device='"cuda"' 2>&1 | grep -v "^USDT\|^STAGE" | tail -22 | tee -a $L
echo "== after: torch.compile / CUDA graphs of the padded step, cuda, S = 1" | tee -a $L
timeout 150 python3 -m bench.step_compile --steps 150 --set device='"cuda"' 2>&1 | grep "^|\|Error" | tee -a $L
echo "== after: flwr run (simulation, 1 SuperNode), device = cuda, S = 1" | tee -a $L
timeout 120 python3 - <<'PY' 2>&1 | grep -v "^INFO" | tail -6 | tee -a $L
import tempfile
from pathlib import Path
from experiments.runner import run_flower
with tempfile.TemporaryDirectory() as tmp:
    s, _, wall = run_flower({"dataset": "hdb", "epochs": 1, "steps-per-exchange": 1, "device": "cuda"}, Path(tmp), "gpu")
    print(f"| flwr run cuda S=1 | {s['seconds']['epochs'][0]:.2f} s/epoch | device {s.get('device')} | threads {s.get('threads')} | wall {wall:.1f} s |")
PY
echo "== CUDA tests: the LAMB oracle on cuda with no host sync, device=cuda == device=cpu" | tee -a $L
timeout 90 python3 -m pytest -p no:cacheprovider -q -rs tests/test_lamb.py tests/test_equivalence.py tests/test_step_sync.py 2>&1 | tail -6 | tee -a $L
echo "== optimiser step alone, hdb shapes, cuda" | tee -a $L
timeout 40 python3 -m bench.lamb_step --device cuda --rounds 5 --steps 50 2>&1 | tail -8 | tee -a $L
