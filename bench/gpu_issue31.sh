# bench/gpu_issue31.sh on a lent GPU (`run` tool, carry [".whl", ".gpudata", ".before"]): issue 31's
# first step measured on the device. .before is `git archive` of the commit before the step (the
# torch_optimizer LAMB), so both run on the same warm machine. Log: $OUT/gpu-issue31.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
L=$OUT/gpu-issue31.log
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $L
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 FEDSIM_DATA_DIR=$PWD/.gpudata
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import torch, flwr; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'flwr', flwr.__version__, 'cpus', __import__('os').cpu_count())" 2>&1 | tee -a $L
echo "== CUDA tests: the LAMB oracle on cuda, device=cuda == device=cpu" | tee -a $L
timeout 200 python3 -m pytest -p no:cacheprovider -q -rs tests/test_lamb.py tests/test_equivalence.py 2>&1 | tail -8 | tee -a $L
echo "== optimiser step alone, hdb shapes, cuda" | tee -a $L
timeout 90 python3 -m bench.lamb_step --device cuda --rounds 7 --steps 50 2>&1 | tail -12 | tee -a $L
for tree in .before .; do
  echo "== in-process hdb epoch, fedsim_attn, S=1, batch 128, cuda then cpu (16 threads): tree $tree" | tee -a $L
  (cd $tree && PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -m bench.device_cost --dataset hdb --epochs 1 --devices cuda,cpu \
     --set steps-per-exchange=1 2>&1 | grep -v "^INFO\|^\s*$" | tail -8) | tee -a $L
done
