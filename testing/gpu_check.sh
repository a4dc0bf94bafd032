#!/usr/bin/env bash
# The GPU check, in at most 8 minutes: bash testing/gpu_check.sh [OUT_DIR]
# On a GPU machine with torch and transformers: the wheels in .whl/ (make gpu-wheels, made on a machine with a
# network) are installed first when present. Then testing.bench (section gpu) serves the shipped model as `make run` does,
# DEVICE=cuda then DEVICE=cpu, under 64 and 256 closed-loop clients, samples the GPU's use, times a batch's hooks,
# and appends its table to docs/benchmarks.md (and writes it, with bench.json, to OUT_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/gpu_check}
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/esun-site .whl/*.whl
  export PYTHONPATH=/tmp/esun-site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/esun-site/bin:$PATH
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
export PYTHONUNBUFFERED=1
timeout 470 "$PY" -m testing.bench --sections gpu,hooks --rounds 20 --out "$out" --markdown docs/benchmarks.md --duration 30
