#!/usr/bin/env bash
# Print the container engine this machine can build and run images with: docker where its daemon answers, else
# podman run as root (with deploy/podman/containers.conf); ENGINE=docker|podman chooses. Where none can, one line
# on stderr says why, and the exit status is 1. deploy/image.sh and tests/deploy/test_image.py ask it.
set -uo pipefail
conf="$(cd "$(dirname "$0")" && pwd)/podman/containers.conf"

usable() {
    case $1 in
        docker) docker info >/dev/null 2>&1 ;;
        podman) CONTAINERS_CONF=${CONTAINERS_CONF:-$conf} podman info >/dev/null 2>&1 ;;
    esac
}

if [[ -n ${ENGINE:-} ]]; then
    usable "$ENGINE" && { echo "$ENGINE"; exit 0; }
    echo "ENGINE=$ENGINE cannot run here: '$ENGINE info' fails" >&2
    exit 1
fi
usable docker && { echo docker; exit 0; }
if [[ $(id -u) -eq 0 ]] && usable podman; then
    echo podman
    exit 0
fi
if ! command -v docker >/dev/null 2>&1 && ! command -v podman >/dev/null 2>&1; then
    reason="neither docker nor podman is installed (deploy/install_tools.sh installs podman, as root)"
elif [[ $(id -u) -ne 0 ]]; then
    reason="docker has no daemon here and podman is run as root only (ENGINE=podman for a rootless podman)"
else
    reason="docker has no daemon here and 'podman info' fails"
fi
echo "no container engine can run: $reason" >&2
exit 1
