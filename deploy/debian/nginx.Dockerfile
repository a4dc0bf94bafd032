# nginx from Debian's package, for docker-compose.yml where nginx:1.28-alpine cannot be pulled (deploy/compose.sh
# builds it on the base deploy/image.sh used). bookworm's nginx is 1.22: its upstream cannot re-resolve the
# replicas' names (`resolve` needs 1.27.3), so compose mounts deploy/nginx/nginx-1.22.conf instead.
ARG BASE_IMAGE=localhost/esun-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends nginx \
    && rm -rf /var/lib/apt/lists/* \
    && ln -sf /dev/stdout /var/log/nginx/access.log \
    && ln -sf /dev/stderr /var/log/nginx/error.log
EXPOSE 80
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
