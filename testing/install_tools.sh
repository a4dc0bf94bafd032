#!/usr/bin/env bash
# Install the tools the client tests (tests/clients/) need; idempotent: what is already there is skipped.
#   - JMeter 2.13 from Debian (`jmeter` + its HTTP sampler, `jmeter-http`), a JDK to build the XStream fix that
#     lets Debian's JMeter 2.13 load plans at all (testing/jmeter/xstream/), and that fix;
#   - newman, pinned in testing/postman/package.json(+ lock), installed in testing/postman/node_modules;
#   - Debian's chromium, headless, for the test that renders /docs (tests/api/test_docs_pages.py).
# Run from anywhere: `bash testing/install_tools.sh` (`make test` runs it first). Needs root (or sudo) for apt.
set -euo pipefail
cd "$(dirname "$0")"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=0
apt_install() {
    if [ "$apt_updated" -eq 0 ]; then
        as_root apt-get update -qq
        apt_updated=1
    fi
    echo "install_tools: apt-get install $*"
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# JMeter 2.13 and its HTTP sampler (a separate Debian package).
missing=()
command -v jmeter >/dev/null 2>&1 || missing+=(jmeter)
[ -f /usr/share/jmeter/lib/ext/ApacheJMeter_http.jar ] || missing+=(jmeter-http)
command -v javac >/dev/null 2>&1 && command -v jar >/dev/null 2>&1 || missing+=(default-jdk-headless)
if [ "${#missing[@]}" -gt 0 ]; then
    apt_install "${missing[@]}"
else
    echo "install_tools: jmeter, jmeter-http and a JDK already installed"
fi
bash jmeter/xstream/build.sh

# newman, locally, at the version the lock file pins.
if ! command -v npm >/dev/null 2>&1; then
    apt_install nodejs npm
fi
newman_bin=postman/node_modules/.bin/newman
if [ -x "$newman_bin" ] && [ postman/node_modules/.package-lock.json -nt postman/package-lock.json ]; then
    echo "install_tools: newman already installed ($("$newman_bin" --version))"
else
    echo "install_tools: installing newman into testing/postman/node_modules"
    (cd postman && npm ci --no-audit --no-fund --loglevel=error)
fi

# Chromium, to render the API docs pages as a browser does.
if command -v chromium >/dev/null 2>&1; then
    echo "install_tools: chromium already installed ($(chromium --version 2>/dev/null || echo '?'))"
else
    apt_install chromium
fi
