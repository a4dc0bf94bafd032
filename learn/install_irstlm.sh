#!/usr/bin/env bash
# Install IRSTLM (Debian's irstlm), which `python -m learn.adapt` estimates the domain language model with;
# idempotent. `make adapt` and `make test` run it. Needs root (or sudo) for apt.
set -euo pipefail
if [ -x /usr/lib/irstlm/bin/tlm ] || command -v tlm >/dev/null 2>&1; then
    exit 0
fi
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null 2>&1; then sudo "$@"; else
        echo "make adapt needs IRSTLM: run 'apt-get install irstlm' as root, then again" >&2; exit 1; fi
}
echo "install_irstlm: apt-get install irstlm"
as_root apt-get update -qq
DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends irstlm >/dev/null
