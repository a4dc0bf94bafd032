#!/usr/bin/env bash
# Make a Debian bookworm base image from Debian's archive, for machines that reach no container registry:
#
#   deploy/base.sh ENGINE TAG        (deploy/image.sh calls it; ENGINE is docker or podman)
#
# mmdebstrap (minbase, ca-certificates) from the machine's own Debian sources on a bookworm machine (so its mirror,
# or the proxy it goes through, is used), else from deb.debian.org; then imported as TAG. The machine's extra
# certificate authorities (/usr/local/share/ca-certificates) go into the base, and pip's `cert` setting with them
# when the machine's pip has one, so that apt and pip inside a build trust what the machine trusts (a
# TLS-inspecting proxy). Nothing on the machine is changed. bookworm, because its python3.11 is what the Dockerfile
# installs. An image already tagged TAG from the same inputs (sources, certificates, this script) is kept.
set -euo pipefail

engine=${1:?usage: deploy/base.sh ENGINE TAG}
tag=${2:?usage: deploy/base.sh ENGINE TAG}
suite=bookworm

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The machine's apt sources for the Debian archive's bookworm suites (other vendors' lists are left out).
sources=()
if grep -qs "^VERSION_CODENAME=$suite$" /etc/os-release; then
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [[ -f $file ]] || continue
        if [[ $file == *.sources ]]; then
            grep -qE "debian\.org/.*debian" "$file" && grep -qE "^Suites:.*\b$suite\b" "$file" \
                && sources+=("$file")
        else
            kept="$work/$(basename "$file").list"
            grep -E "^deb .*debian\.org/.*debian.* $suite" "$file" >"$kept" || true
            [[ -s $kept ]] && sources+=("$kept")
        fi
    done
fi

# pip's cert setting: the machine's pip config (or PIP_CERT); inside the base it names the base's own bundle,
# which holds the same authorities once the extra ones are added.
pip_cert=${PIP_CERT:-}
if [[ -z $pip_cert ]] && command -v python3 >/dev/null 2>&1; then
    pip_cert=$(python3 -m pip config get global.cert 2>/dev/null || true)
fi
extra_certs=()
if [[ -d /usr/local/share/ca-certificates ]]; then
    mapfile -t extra_certs < <(find /usr/local/share/ca-certificates -type f -name '*.crt' | sort)
fi

inputs=$( { cat "$0"; echo "$suite pip_cert=${pip_cert:+yes}"; cat "${sources[@]}" "${extra_certs[@]}" /dev/null; } \
          | sha256sum | cut -c1-16)
if [[ $("$engine" image inspect --format '{{ index .Labels "esun.base.inputs" }}' "$tag" 2>/dev/null) == "$inputs" ]]
then
    echo "base: $tag is up to date"
    exit 0
fi

hooks=()
if [[ ${#extra_certs[@]} -gt 0 ]]; then
    hooks+=(--customize-hook="copy-in ${extra_certs[*]} /usr/local/share/ca-certificates/"
            --customize-hook='chroot "$1" update-ca-certificates >/dev/null')
fi
if [[ -n $pip_cert ]]; then
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$work/pip.conf"
    hooks+=(--customize-hook="upload $work/pip.conf /etc/pip.conf")
fi

echo "base: making $tag with mmdebstrap ($suite, from ${sources[*]:-deb.debian.org})"
# As Debian's slim images: no manuals, documentation (but copyrights) or translations.
mmdebstrap --quiet --variant=minbase --include=ca-certificates \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    "${hooks[@]}" "$suite" "$work/base.tar" "${sources[@]}"
"$engine" import --change 'CMD ["/bin/bash"]' --change "LABEL esun.base.inputs=$inputs" \
    "$work/base.tar" "$tag" >/dev/null
echo "base: $tag made ($(du -h "$work/base.tar" | cut -f1) tar)"
