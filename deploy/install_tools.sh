#!/usr/bin/env bash
# Install the system tools the deployment tests start (redis-server, nginx); skip what is already there.
# Idempotent: a second run does nothing. Needs root (or sudo) for apt-get; `make test` runs it first.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]] || missing+=(nginx)
if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
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
        "${sudo_cmd[@]}" service "${name}" stop >/dev/null 2>&1 || true
    done
fi
