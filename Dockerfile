# The inference service: gunicorn (server/gunicorn_conf.py) serving the shipped corrector on $PORT (8080).
#
#   CPU (default):  docker build -t esun-asr .          (or `make image`: docker or podman, README "Docker")
#   CUDA:           docker build -t esun-asr:cuda --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
#                   docker run --gpus all -e DEVICE=cuda -p 8080:8080 esun-asr:cuda
#
# The CUDA image needs no CUDA base: torch's CUDA wheels bring the CUDA runtime, cuDNN and NCCL (nvidia-* wheels);
# the host needs only the NVIDIA driver (docs/deploy.md, "Docker"). An Ubuntu base (nvidia/cuda:...) works too: Python 3.11
# is then installed from its archive.
#
# Dependencies are installed by `make install` from requirements.txt, the same path `make run` and `make test`
# take, before the code is copied: changing code does not reinstall them. model/weights/ must hold the trained
# weights when the image is built (they are copied with the code).
ARG BASE_IMAGE=docker.io/library/python:3.11-slim

# Wheels pip may install from while the dependencies are installed (--build-context wheels=DIR, as deploy/image.sh
# passes the machine's wheel folder); bound for that one step only, so nothing of it stays in the image. Empty
# unless given.
FROM scratch AS wheels

FROM ${BASE_IMAGE}

# torch==2.13.0 is pinned in requirements.txt; this index adds the build for the image's hardware (+cpu, +cu128),
# which pip prefers over the plain one from the default index.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_EXTRA_INDEX_URL=${TORCH_INDEX}

# make for `make install`, gcc and g++ for the model's compiled modules (compiled.py; the segmenter kernel is C++);
# Python 3.11 with its headers where the base image lacks it (Debian's base made by deploy/base.sh, Ubuntu).
RUN apt-get update \
    && apt-get install -y --no-install-recommends make gcc g++ libc6-dev \
    && if ! command -v python3.11 >/dev/null 2>&1; then \
         DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3.11 python3.11-venv \
           python3.11-dev; \
       fi \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY Makefile requirements.txt ./
# WHEELS_ID names the wheel folder's contents (deploy/image.sh: a hash of its file names): the engines' layer caches
# do not look into a bound folder, and without it a build with other wheels (or none) would reuse this layer.
ARG WHEELS_ID=none
RUN --mount=type=bind,from=wheels,target=/wheels PIP_FIND_LINKS=/wheels make install PYTHON=python3.11

COPY . .
# the model's hot modules compiled to C for this image's Python (one line; interpreted, said so, where it cannot)
RUN .venv/bin/python -m compiled
RUN useradd --system --uid 10001 --create-home --home-dir /home/app app
USER app

ENV PATH=/app/.venv/bin:$PATH \
    HOST=0.0.0.0 \
    PORT=8080
EXPOSE 8080

# Healthy = ready: /readyz answers 200 once the model is loaded and warmed (503 before, and while a batch is stuck;
# urlopen raises on a 503). docker compose starts nginx only once every replica is healthy. /healthz, for a
# liveness probe, answers from the port's first moment.
HEALTHCHECK --interval=5s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('PORT', '8080'), timeout=2)"]

CMD ["gunicorn", "-c", "server/gunicorn_conf.py", "api:create_app()"]
