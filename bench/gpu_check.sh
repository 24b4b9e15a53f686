# bench/gpu_check.sh on a lent GPU (`run` tool): the CUDA-only tests and the equivalence/method tests.
# Carry .whl (flwr and the packages the image lacks, as wheels for Python 3.12: /work/.library/device/README.md)
# and .gpudata (frog and house_melbourne from ../shared/data). Log: $OUT/gpu-check.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu-check.log
python3 -c "import torch, flwr; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'flwr', flwr.__version__)" 2>&1 | tee -a $OUT/gpu-check.log
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 FEDSIM_DATA_DIR=$PWD/.gpudata  # frog, house (../shared/data here)
timeout 420 python3 -m pytest -p no:cacheprovider -q -rs tests/test_equivalence.py tests/test_methods.py 2>&1 | tail -25 | tee -a $OUT/gpu-check.log
