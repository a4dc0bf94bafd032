# Redis from Debian's package, for docker-compose.yml where redis:7.4-alpine cannot be pulled (deploy/compose.sh
# builds it on the base deploy/image.sh used). As the official image: no config file, protected mode off (compose's
# network is the only way in), the command's arguments are redis-server's.
ARG BASE_IMAGE=localhost/esun-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/*
USER redis
WORKDIR /var/lib/redis
EXPOSE 6379
CMD ["redis-server", "--protected-mode", "no"]
