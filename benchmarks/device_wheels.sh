#!/usr/bin/env bash
# Wheels the GPU machine lacks for benchmarks/device_check.py (its image has torch, transformers,
# accelerate, pandas, pyarrow, scipy, pytest; not TRL or datasets), downloaded HERE into .whl/
# (git-ignored through .git/info/exclude) for Python 3.12, the device image's interpreter.
# Then one `run` (device tool) with carry [".whl"]:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 &&
#   python3 benchmarks/device_check.py --out $OUT
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
ls -la .whl
