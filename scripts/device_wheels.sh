#!/usr/bin/env bash
# The wheels scripts/device_check.sh installs on a lent GPU machine (Python 3.12, no registry): the project and
# the dependencies that machine's image lacks (its PyTorch image has numpy, pyarrow, nvidia-ml-py, pytest and
# hypothesis). Extra names (e.g. cupti-python==13.0.1, matching the image's CUDA 13.0) may follow.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> "$(git rev-parse --git-path info/exclude)"
python3 -m pip wheel -q --no-deps -w .whl .
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  aiokafka cramjam duckdb pydantic pydantic-core annotated-types typing-inspection typing-extensions opentelemetry-proto ijson async-timeout plotly "$@"
du -sh .whl
