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
         tomli tomli-w uvicorn torch-optimizer pytorch-ranger rapidfuzz threadpoolctl \
         jsonschema jsonschema-specifications referencing rpds-py; do
    v=$(.venv/bin/pip show "$n" | awk '/^Version/{print $2}')
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl "$n==$v"
done
# Ray (Flower's simulation engine) for `flwr run` there: its wheel (74 MB) is over the 64 MiB a call
# carries, so it travels unpacked without its Java jars, dashboard UI, RLlib, Serve, LLM and tests,
# as one xz archive (25 MB) that the device script unpacks into its site folder. NO_RAY=1: not
# fetched (the in-process sweeps of bench/gpu_recipe.sh need no Ray).
if [ "${NO_RAY:-0}" != 1 ] && [ ! -s .whl/ray-site.tar.xz ]; then
    v=$(.venv/bin/pip show ray | awk '/^Version/{print $2}'); t=$(mktemp -d)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 -d "$t" "ray==$v"
    (cd "$t" && mkdir site && cd site && unzip -q ../ray-*.whl && rm -rf ray/jars ray/dashboard/client ray/rllib \
        ray/llm ray/serve && find . -name tests -type d -prune -exec rm -rf {} + && tar -cJf ../ray-site.tar.xz .)
    mv "$t/ray-site.tar.xz" .whl/ && rm -rf "$t"
fi
cp -r ../shared/data/house_melbourne ../shared/data/frog ../shared/data/hdb ../shared/data/game .gpudata/
