# bench/gpu_issue31.sh on a lent GPU: issue 31's table, before and after, on one warm machine.
#
#   here:   bash bench/gpu_wheels.sh            # wheels for the device's Python 3.12 -> .whl, data -> .gpudata
#           rm -rf .before && mkdir .before && git archive <commit before issue 31> | tar -x -C .before
#   device: `run` with carry [".whl", ".gpudata", ".before"], command `bash bench/gpu_issue31.sh`,
#           timeout_s 540; the log comes back as $OUT/gpu-issue31.log (keep it in docs/device-logs/).
#
# Rows (hdb all flats, K = 50, batch 128, fedsim_attn, one epoch = 489 steps, train s/epoch):
# cpu (all cores) and cuda in process at S = 1 and S = 8, the one-process twin, and `flwr run`
# (simulation) with device = cuda at S = 1; then the CUDA-only tests and the optimiser step alone.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
L=$OUT/gpu-issue31.log
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $L
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 FEDSIM_DATA_DIR=$PWD/.gpudata
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
python3 -c "import torch, flwr, os; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'flwr', flwr.__version__, 'cpus', os.cpu_count())" 2>&1 | tee -a $L
DC="python3 -m bench.device_cost --dataset hdb --epochs 1"
for tree in .before .; do
  echo "== $tree: in process, S = 1 (cuda, cpu)" | tee -a $L
  (cd $tree && PYTHONPATH=/tmp/site:$PWD timeout 120 $DC --devices cuda,cpu --set steps-per-exchange=1 2>&1 | grep "^|\|Error" | tail -4) | tee -a $L
done
echo "== after: S = 8 on cuda, and the twin at S = 1 on cuda" | tee -a $L
timeout 60 $DC --devices cuda --set steps-per-exchange=8 2>&1 | grep "^|\|Error" | tail -2 | tee -a $L
timeout 60 $DC --devices cuda --set steps-per-exchange=1 --twin 2>&1 | grep "^|\|Error" | tail -3 | tee -a $L
echo "== after: flwr run (simulation, 1 SuperNode), device = cuda, S = 1" | tee -a $L
timeout 150 python3 - <<'EOF' 2>&1 | grep -v "^INFO" | tail -5 | tee -a $L
import tempfile
from pathlib import Path
from experiments.runner import run_flower
with tempfile.TemporaryDirectory() as tmp:
    s, _, wall = run_flower({"dataset": "hdb", "epochs": 1, "steps-per-exchange": 1, "device": "cuda"}, Path(tmp), "gpu")
    print(f"| flwr run cuda S=1 | {s['seconds']['epochs'][0]:.2f} s/epoch | device {s.get('device')} | wall {wall:.1f} s |")
EOF
echo "== CUDA tests: the LAMB oracle on cuda with no host sync, device=cuda == device=cpu" | tee -a $L
timeout 120 python3 -m pytest -p no:cacheprovider -q -rs tests/test_lamb.py tests/test_equivalence.py tests/test_step_sync.py 2>&1 | tail -6 | tee -a $L
echo "== optimiser step alone, hdb shapes, cuda" | tee -a $L
timeout 60 python3 -m bench.lamb_step --device cuda --rounds 5 --steps 50 2>&1 | tail -8 | tee -a $L
