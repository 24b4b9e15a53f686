#!/usr/bin/env bash
# Here (with pip and the package index), before bench/gpu_check.sh: the wheels for Python 3.12 of
# what the lent GPU machine's image lacks, at the versions installed in .venv, into .whl/; and the
# shared datasets the checks read, into .gpudata/. Both are git-ignored locally (.git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info .whl .gpudata
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
grep -qx '/.gpudata/' .git/info/exclude 2>/dev/null || echo /.gpudata/ >> .git/info/exclude
for n in flwr alembic mako cryptography cffi pycparser fastapi starlette pydantic pydantic-core annotated-types \
         typing-inspection grpcio-health-checking iterators prompt-toolkit wcwidth pycryptodome sqlalchemy greenlet \
         tomli tomli-w uvicorn torch-optimizer pytorch-ranger rapidfuzz threadpoolctl; do
    v=$(.venv/bin/pip show "$n" | awk '/^Version/{print $2}')
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl "$n==$v"
done
cp -r ../shared/data/house_melbourne ../shared/data/frog .gpudata/
