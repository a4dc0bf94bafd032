#!/usr/bin/env bash
# docker-compose.yml with `docker compose` or podman-compose, whichever engine deploy/engine.sh picks:
#
#   deploy/compose.sh up -d --scale api=5      deploy/compose.sh ps      deploy/compose.sh down
#
# Before `up` it builds the api's image as `make image` does (deploy/image.sh; API_IMAGE, default esun-asr), and
# where redis:7.4-alpine or nginx:1.28-alpine cannot be pulled it builds both from Debian's packages on the base
# deploy/base.sh makes (deploy/debian/), with nginx-1.22.conf for Debian's older nginx. podman reads
# deploy/podman/containers.conf. Every other argument goes to the compose command as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

engine=$(bash deploy/engine.sh) || exit 2
if [[ $engine == podman ]]; then
    export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/podman/containers.conf}
    # podman-compose 1.1 or newer: Debian bookworm's 1.0.3 ignores --scale and passes ${VAR:-} on literally.
    # `|| true`: command -v fails when neither is there, which set -e would turn into a silent exit 1 before the hint.
    compose=("$(command -v .venv/bin/podman-compose || command -v podman-compose || true)")
    version=$("${compose[0]:-false}" version 2>/dev/null | sed -n 's/^podman-composer\? version  *//p' || true)
    if [[ -z $version ]] || [[ $(printf '%s\n' 1.1 "$version" | sort -V | head -n1) != 1.1 ]]; then
        echo "podman-compose 1.1 or newer is needed (found: ${version:-none}):" \
             ".venv/bin/pip install podman-compose==1.6.0 (make install-dev does)" >&2
        exit 2
    fi
else
    compose=(docker compose)
fi

pullable() {
    "$engine" image inspect "$1" >/dev/null 2>&1 || "$engine" pull -q "$1" >/dev/null 2>&1
}

if [[ ${1:-} == up ]]; then
    export API_IMAGE=${API_IMAGE:-esun-asr}
    IMAGE=$API_IMAGE bash deploy/image.sh | grep '^image: '
    if ! pullable docker.io/library/redis:7.4-alpine || ! pullable docker.io/library/nginx:1.28-alpine; then
        base=localhost/esun-base:bookworm
        bash deploy/base.sh "$engine" "$base"
        for name in redis nginx; do
            flags=(build -q -t "localhost/esun-$name:bookworm" --build-arg "BASE_IMAGE=$base" \
                   -f "deploy/debian/$name.Dockerfile")
            [[ $engine == podman ]] && flags+=(--format docker)
            "$engine" "${flags[@]}" deploy/debian >/dev/null
        done
        export REDIS_IMAGE=localhost/esun-redis:bookworm NGINX_IMAGE=localhost/esun-nginx:bookworm \
               NGINX_CONF=./deploy/nginx/nginx-1.22.conf
        echo "compose: Docker Hub cannot be reached: redis and nginx from Debian's packages ($REDIS_IMAGE, $NGINX_IMAGE)"
    fi
fi
if [[ $engine == podman && ${1:-} == down ]]; then
    # podman-compose's `down` removes only the containers the compose file names (api_1, not the api_2.. of
    # --scale), then fails quietly to remove the pod and the network they still use, and exits 0. Its
    # --remove-orphans removes every container labelled with the project first; then check that none is left.
    "${compose[@]}" "$@" --remove-orphans
    left=$("${compose[@]}" ps -q 2>/dev/null || true)
    if [[ -n $left ]]; then
        echo "compose: down left containers of the project running: $(tr '\n' ' ' <<<"$left")" >&2
        exit 1
    fi
    exit 0
fi
exec "${compose[@]}" "$@"
