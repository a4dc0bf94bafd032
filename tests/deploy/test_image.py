"""The service's image: built as `make image` builds it (deploy/image.sh), run as a container with its port published.

It answers the README's example with the README's answer and a retry of it with the same sentence, its HEALTHCHECK
says healthy, and SIGTERM (`stop`) ends it gracefully: gunicorn drains and exits 0, never killed at the grace's end.
The engine is the one deploy/engine.sh picks (docker with a daemon, else podman as root); where none can run, the
tests skip saying why in one line. The first build on a machine takes minutes (base, dependencies); later ones reuse
the engine's cached layers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests

from tests.deploy.procs import REPO_ROOT, free_port, readyz_status, wait_for

pytestmark = pytest.mark.live

IMAGE = "esun-asr"
BUILD_TIMEOUT_S = 1800
STOP_GRACE_S = 20
# The README's example request and its answer: `curl ... -d '{...}'` and the JSON line after it.
README_EXAMPLE = re.compile(r"-d '(\{.*?\})'\n(\{.*?\})\n", re.DOTALL)


@dataclass(frozen=True)
class Engine:
    """The container engine's command line, with the environment podman reads its settings from."""

    name: str
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.name, *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def inspect(self, container: str, template: str) -> str:
        return self.run("inspect", "--format", template, container).stdout.strip()


@dataclass(frozen=True)
class Container:
    engine: Engine
    name: str
    url: str

    def logs(self) -> str:
        logs = self.engine.run("logs", self.name)
        return logs.stdout + logs.stderr


def readme_example() -> tuple[dict[str, Any], str]:
    match = README_EXAMPLE.search((REPO_ROOT / "README.md").read_text())
    assert match, "README.md has no example request (curl ... -d '{...}') followed by its answer"
    return json.loads(match.group(1)), json.loads(match.group(2))["answer"]


@pytest.fixture(scope="module")
def engine() -> Engine:
    picked = subprocess.run(["bash", "deploy/engine.sh"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    if picked.returncode != 0:
        pytest.skip(picked.stderr.strip().splitlines()[-1])
    env = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF",
                                                           str(REPO_ROOT / "deploy" / "podman" / "containers.conf"))}
    return Engine(picked.stdout.strip(), env)


@pytest.fixture(scope="module")
def image(engine: Engine) -> str:
    """The image `make image` builds (its layers cached between runs by the engine)."""
    built = subprocess.run(["bash", "deploy/image.sh"], cwd=REPO_ROOT, env={**engine.env, "IMAGE": IMAGE,
                                                                           "ENGINE": engine.name},
                           capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert built.returncode == 0, f"deploy/image.sh failed:\n{(built.stdout + built.stderr)[-4000:]}"
    print(f"\n{built.stdout.strip().splitlines()[-1]}")
    return IMAGE


@pytest.fixture(scope="module")
def container(engine: Engine, image: str) -> Iterator[Container]:
    """The image run with its port published on a free loopback port; yielded once /readyz is 200."""
    port = free_port()
    name = f"esun-asr-test-{os.getpid()}"
    engine.run("rm", "-f", name)
    started = engine.run("run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8080", image)
    assert started.returncode == 0, started.stderr
    running = Container(engine, name, f"http://127.0.0.1:{port}")
    try:
        try:
            wait_for(lambda: readyz_status(port) == 200, "the container's /readyz", timeout_s=180)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{running.logs()[-3000:]}") from None
        yield running
    finally:
        engine.run("rm", "-f", name)


def ask(container: Container, body: dict[str, Any]) -> str:
    response = requests.post(f"{container.url}/inference", json=body, timeout=5)
    assert response.status_code == 200, response.text
    return response.json()["answer"]


def test_the_container_answers_the_readme_example_and_its_retry_with_the_readmes_answer(container):
    body, expected = readme_example()
    assert ask(container, body) == expected
    assert ask(container, {**body, "retry": 1, "esun_timestamp": time.time()}) == expected


def test_the_containers_healthcheck_says_healthy_once_it_is_ready(container):
    if container.engine.name == "podman":  # podman's checks run on systemd timers, which a machine may lack
        checked = container.engine.run("healthcheck", "run", container.name)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    wait_for(lambda: container.engine.inspect(container.name, "{{.State.Health.Status}}") == "healthy",
             "the container's HEALTHCHECK", timeout_s=30)


def test_the_container_stops_gracefully_on_sigterm(container):
    """Last in this module: it stops the container the others use."""
    stopped = container.engine.run("stop", "-t", str(STOP_GRACE_S), container.name, timeout=STOP_GRACE_S + 30)
    assert stopped.returncode == 0, stopped.stderr
    assert container.engine.inspect(container.name, "{{.State.ExitCode}}") == "0"  # 137 had it been killed
    logs = container.logs()
    messages = [json.loads(line)["msg"] for line in logs.splitlines() if line.startswith("{")]
    assert "Handling signal: term" in messages and "Shutting down: Master" in messages, logs[-2000:]
