#!/usr/bin/env bash
# Install the system tools the deployment tests start; skip what is already there. Idempotent: a second run does
# nothing. Needs root (or sudo) for apt-get; `make test` runs it first.
#
#   deploy/install_tools.sh          redis-server and nginx, and the image's tools (below)
#   deploy/install_tools.sh image    podman, runc, netavark, aardvark-dns, iptables and mmdebstrap (deploy/image.sh,
#                                    tests/deploy/test_image.py), unless a docker daemon answers
set -euo pipefail

missing=()
if [[ ${1:-} != image ]]; then
    command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
    command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]] || missing+=(nginx)
fi
if ! docker info >/dev/null 2>&1; then
    # runc: crun, podman's other runtime, refuses hosts with hybrid cgroups (deploy/podman/containers.conf);
    # netavark and aardvark-dns: podman's bridge networks with names (compose's services find each other);
    # iptables: netavark sets a build step's network up with it (only a Suggests of Debian's podman, and without it
    # every RUN step that needs the network fails with "netavark: No such file or directory").
    for tool in podman runc netavark iptables mmdebstrap; do
        command -v "$tool" >/dev/null 2>&1 || [[ -x /usr/lib/podman/$tool || -x /usr/sbin/$tool ]] \
            || missing+=("$tool")
    done
    [[ -x /usr/lib/podman/aardvark-dns ]] || missing+=(aardvark-dns)
fi
if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_tools: ${missing[*]} missing and no apt-get here: install them with the system's packages" >&2
    exit 1
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
    sudo_cmd=(sudo)
fi
echo "install_tools: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
# --no-install-recommends: no extra modules; the tests start the servers themselves, never as services.
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts installed services where it can; the tests run their own on free ports, so stop those.
if command -v service >/dev/null 2>&1; then
    for name in "${missing[@]}"; do
        case $name in redis-server|nginx) "${sudo_cmd[@]}" service "${name}" stop >/dev/null 2>&1 || true ;; esac
    done
fi
