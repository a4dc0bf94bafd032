#!/usr/bin/env bash
# The GPU check, in at most 8 minutes: [MLM_DIR=DIR] bash testing/gpu_check.sh [OUT_DIR]
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
# the model's hot modules compiled for this machine's Python where it has a C compiler (one line either way)
"$PY" -m compiled
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
export PYTHONUNBUFFERED=1
# MLM_DIR (a masked-LM folder copied beside the wheels): also what it costs a batch of 64 on the GPU (testing.mlm_cost)
bench_s=430
[ -n "${MLM_DIR:-}" ] && bench_s=340
timeout $bench_s "$PY" -m testing.bench --sections gpu,hooks --rounds 20 --out "$out" --markdown docs/benchmarks.md --duration 30
if [ -n "${MLM_DIR:-}" ]; then
  timeout 80 "$PY" -m testing.mlm_cost --mlm-dir "$MLM_DIR" --device cuda --out "$out/mlm" || echo "testing.mlm_cost failed"
fi
