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
        *) return 1 ;;
    esac
}

installed() { command -v "$1" >/dev/null 2>&1; }

# Why an engine that is not usable cannot run: not installed at all, or installed and not answering.
why() {
    if ! installed "$1"; then
        echo "$1 is not installed"
    elif [[ $1 == docker ]]; then
        echo "docker has no daemon here"
    else
        echo "'$1 info' fails"
    fi
}

if [[ -n ${ENGINE:-} ]]; then
    if [[ $ENGINE != docker && $ENGINE != podman ]]; then
        echo "ENGINE must be docker or podman, got '$ENGINE'" >&2
        exit 1
    fi
    usable "$ENGINE" && { echo "$ENGINE"; exit 0; }
    echo "ENGINE=$ENGINE cannot run here: $(why "$ENGINE")" >&2
    exit 1
fi
usable docker && { echo docker; exit 0; }
if [[ $(id -u) -eq 0 ]] && usable podman; then
    echo podman
    exit 0
fi
if ! installed docker && ! installed podman; then
    reason="neither docker nor podman is installed (deploy/install_tools.sh installs podman, as root)"
elif ! installed podman; then
    reason="$(why docker) and podman is not installed (deploy/install_tools.sh installs it, as root)"
elif [[ $(id -u) -ne 0 ]]; then
    reason="$(why docker) and podman is run as root only (ENGINE=podman for a rootless podman)"
else
    reason="$(why docker) and $(why podman)"
fi
echo "no container engine can run: $reason" >&2
exit 1
