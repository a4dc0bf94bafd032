#!/usr/bin/env bash
# Build the service's image from the Dockerfile with docker or podman (deploy/engine.sh picks; podman is installed
# from Debian where neither can run). `make image` runs it; its settings come from the environment:
#
#   IMAGE        the tag to build (esun-asr)
#   BASE_IMAGE   the base; unset: python:3.11-slim where it can be pulled, else a Debian bookworm base made here
#                from Debian's archive (deploy/base.sh, tagged localhost/esun-base:bookworm)
#   TORCH_INDEX  the wheel index that adds torch's build for the image's hardware (the Dockerfile's default is
#                PyTorch's CPU index; empty: PyPI's torch, the CUDA build); unset and a wheel folder (below) holding
#                the pinned torch: empty, the folder's torch is used
#   WHEELS       a folder of wheels pip may install from while the image is built (its --find-links); unset: the
#                machine's pip's find-links setting when it names one folder. It is mounted for the install only:
#                nothing of it stays in the image.
#
# podman reads deploy/podman/containers.conf (CONTAINERS_CONF) and builds in docker's format, which keeps the
# HEALTHCHECK (podman's OCI format drops it). Layers are cached by the engine: a second build with the same
# requirements reinstalls nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! engine=$(bash deploy/engine.sh 2>/dev/null); then
    if [[ $(id -u) -eq 0 ]] && ! command -v podman >/dev/null 2>&1; then
        bash deploy/install_tools.sh image
    fi
    engine=$(bash deploy/engine.sh) || exit 2
fi
if [[ $engine == podman ]]; then
    export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/podman/containers.conf}
fi

image=${IMAGE:-esun-asr}
base=${BASE_IMAGE:-}
if [[ -z $base ]]; then
    base=docker.io/library/python:3.11-slim
    if ! "$engine" image inspect "$base" >/dev/null 2>&1 && ! pulled=$("$engine" pull -q "$base" 2>&1); then
        echo "image: $base cannot be pulled ($(tail -n1 <<<"$pulled")): a Debian base instead"
        base=localhost/esun-base:bookworm
        bash deploy/base.sh "$engine" "$base"
    fi
fi

wheels=${WHEELS-}
if [[ -z ${WHEELS+set} ]]; then
    wheels=${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}
    wheels=${wheels#file://}
    [[ -d $wheels && $wheels != *[[:space:]]* ]] || wheels=
fi
args=(build -t "$image" --build-arg "BASE_IMAGE=$base")
if [[ -n $wheels ]]; then
    [[ -d $wheels ]] || { echo "image: WHEELS=$wheels is not a folder" >&2; exit 2; }
    args+=(--build-context "wheels=$(cd "$wheels" && pwd)"
           --build-arg "WHEELS_ID=$(find "$wheels" -maxdepth 1 -type f -printf '%f %s\n' | sort | sha256sum | cut -c1-16)")
    torch=$(grep -m1 '^torch==' requirements.txt | cut -d= -f3)
    if [[ -z ${TORCH_INDEX+set} ]] && compgen -G "$wheels/torch-${torch}[-+]*.whl" >/dev/null; then
        TORCH_INDEX=
    fi
fi
if [[ -n ${TORCH_INDEX+set} ]]; then
    args+=(--build-arg "TORCH_INDEX=$TORCH_INDEX")
fi
if [[ $engine == podman ]]; then
    args+=(--format docker)
else
    export DOCKER_BUILDKIT=1
fi

echo "image: $engine ${args[*]} ."
started=$SECONDS
"$engine" "${args[@]}" .
size=$("$engine" image inspect --format '{{.Size}}' "$image")
echo "image: $image built with $engine on $base in $((SECONDS - started)) s, $((size / 1000000)) MB"
