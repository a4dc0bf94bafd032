"""Fixtures for the deployment tests: real redis-server and nginx processes on free loopback ports.

The tools come from deploy/install_tools.sh (`make test` runs it first). A missing tool fails these tests
instead of skipping them: a green run must mean the load-balanced setup was exercised.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
import redis

from tests.deploy.procs import find_tool, free_port, stop, wait_for


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start a throwaway redis-server (no persistence) on a free loopback port; yield its URL."""
    binary = find_tool("redis-server")
    workdir = tmp_path_factory.mktemp("redis")
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir), "--daemonize", "no", "--loglevel", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url, socket_timeout=1)
    try:
        wait_for(client.ping, "redis-server", process)
        yield url
    finally:
        client.close()
        stop(process)


@pytest.fixture
def redis_client(redis_server: str) -> Iterator[redis.Redis]:
    """A plain client of the test Redis, emptied before each test."""
    client = redis.Redis.from_url(redis_server, socket_timeout=1)
    client.flushdb()
    yield client
    client.close()
