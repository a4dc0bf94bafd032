"""deploy/compose.sh as a new user meets it (issue 40).

- Without podman-compose (the usual case on a fresh machine) `up` prints the script's own hint and exits 2.
- Where no engine can run, its one line says which engine is not installed and which is and does not answer.
- With podman-compose, `down` after `up -d --scale api=2` leaves no container, pod or network of the project, and a
  second `down` is harmless. This runs real podman and podman-compose on a tiny compose file whose one service
  sleeps in an image made here from the host's `sleep` (no registry, no build: seconds).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.procs import REPO_ROOT, find_tool

COMPOSE_SH = REPO_ROOT / "deploy" / "compose.sh"
CONTAINERS_CONF = REPO_ROOT / "deploy" / "podman" / "containers.conf"
SLEEP_IMAGE = "localhost/esun-compose-test:sleep"
# What the script needs from the system in the first test: nothing that could be a podman-compose.
SCRIPT_TOOLS = ("bash", "sed", "sort", "head", "dirname", "id", "tr", "cat", "grep")


def run_script(args: list[str], env: dict[str, str], script: Path = COMPOSE_SH,
               timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=timeout_s)


def script_tree(tmp_path: Path, fakes: dict[str, str]) -> tuple[Path, Path]:
    """A copy of the scripts in a tree without .venv, and a PATH folder holding only `SCRIPT_TOOLS` and `fakes` (name:
    a /bin/sh script's body). Return the copy's compose.sh and the folder."""
    tree = tmp_path / "tree"  # the script looks in its tree's .venv: a copy whose tree has none
    (tree / "deploy" / "podman").mkdir(parents=True)
    for name in ("compose.sh", "engine.sh"):
        shutil.copy(REPO_ROOT / "deploy" / name, tree / "deploy" / name)
    shutil.copy(CONTAINERS_CONF, tree / "deploy" / "podman" / "containers.conf")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in SCRIPT_TOOLS:
        if tool not in fakes:
            (bin_dir / tool).symlink_to(find_tool(tool))
    for name, body in fakes.items():
        fake = bin_dir / name
        fake.write_text(f"#!/bin/sh\n{body}\n")
        fake.chmod(0o755)
    return tree / "deploy" / "compose.sh", bin_dir


def test_compose_up_without_podman_compose_prints_the_install_hint_and_exits_2(tmp_path: Path) -> None:
    """Regression: `command -v ... | head` failed under `set -euo pipefail` when neither .venv/bin/podman-compose
    nor podman-compose existed, so `up` exited 1 with no output before the script's own hint could print."""
    # a podman that works, so that the engine is podman, as on a fresh machine
    script, bin_dir = script_tree(tmp_path, {"podman": "exit 0"})

    result = run_script(["up", "-d", "--scale", "api=5"], {"PATH": str(bin_dir), "ENGINE": "podman"}, script=script)

    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "podman-compose 1.1 or newer is needed (found: none)" in result.stderr
    assert "pip install podman-compose==" in result.stderr


NO_DAEMON = "echo 'Cannot connect to the Docker daemon' >&2; exit 1"


@pytest.mark.parametrize(("fakes", "engine", "line"), [
    ({"docker": NO_DAEMON}, "", "no container engine can run: docker has no daemon here and podman is not installed "
                                "(deploy/install_tools.sh installs it, as root)"),
    ({}, "podman", "ENGINE=podman cannot run here: podman is not installed"),
    ({"podman": "exit 125"}, "podman", "ENGINE=podman cannot run here: 'podman info' fails"),
    ({"podman": "exit 125"}, "", "no container engine can run: docker is not installed and 'podman info' fails"),
    ({}, "dokker", "ENGINE must be docker or podman, got 'dokker'"),
], ids=["podman-missing", "engine-podman-missing", "engine-podman-failing", "docker-missing", "engine-misspelt"])
def test_compose_says_which_engine_is_not_installed_and_which_does_not_answer(tmp_path: Path, fakes: dict[str, str],
                                                                             engine: str, line: str) -> None:
    """Regression: where podman was not installed at all, the script said "'podman info' fails"."""
    script, bin_dir = script_tree(tmp_path, {"id": "echo 0", **fakes})  # as root, where podman is an engine

    result = run_script(["ps"], {"PATH": str(bin_dir), "ENGINE": engine}, script=script)

    assert (result.returncode, result.stdout, result.stderr) == (2, "", line + "\n")


def podman_compose() -> str:
    """Return the podman-compose the script would use (the project's .venv, else PATH), failing when missing."""
    local = REPO_ROOT / ".venv" / "bin" / "podman-compose"
    found = str(local) if os.access(local, os.X_OK) else shutil.which("podman-compose")
    if found is None:
        pytest.fail("podman-compose not found: make install-dev (requirements-dev.txt) installs it", pytrace=False)
    return found


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=120)


def engine_or_skip() -> None:
    result = subprocess.run(["bash", str(REPO_ROOT / "deploy" / "engine.sh")], capture_output=True, text=True,
                            env={**os.environ, "ENGINE": "podman"} if os.geteuid() == 0 else None)
    if result.returncode != 0 or result.stdout.strip() != "podman":
        pytest.skip(result.stderr.strip() or "the engine here is docker, whose compose down needs no help")


def build_sleep_image(tmp_path: Path) -> None:
    """Import an image holding the host's `sleep` and the libraries it links: a container that only waits."""
    if podman("image", "exists", SLEEP_IMAGE).returncode == 0:
        return
    sleep = Path(find_tool("sleep")).resolve()
    ldd = subprocess.run(["ldd", str(sleep)], capture_output=True, text=True, check=True).stdout
    libraries = [Path(part) for line in ldd.splitlines() for part in line.split() if part.startswith("/")]
    archive = tmp_path / "sleep.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(sleep, arcname="sleep")
        for library in libraries:
            tar.add(library.resolve(), arcname=str(library).lstrip("/"))
    imported = podman("import", str(archive), SLEEP_IMAGE)
    assert imported.returncode == 0, imported.stderr


@pytest.fixture
def project(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A compose project of one service `api` that sleeps; yield its name and the script's environment."""
    engine_or_skip()
    build_sleep_image(tmp_path)
    compose_file = tmp_path / "compose.yml"
    compose_file.write_text(f'services:\n  api:\n    image: {SLEEP_IMAGE}\n    command: ["/sleep", "3600"]\n'
                            '    stop_grace_period: 1s\n')
    name = f"esuncomposetest{uuid.uuid4().hex[:8]}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "podman-compose").symlink_to(podman_compose())
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "ENGINE": "podman",
           "CONTAINERS_CONF": str(CONTAINERS_CONF), "COMPOSE_FILE": str(compose_file), "COMPOSE_PROJECT_NAME": name}
    try:
        yield name, env
    finally:
        for container in podman("ps", "-aq", "--filter", f"label=io.podman.compose.project={name}").stdout.split():
            podman("rm", "-f", "-t", "0", container)
        podman("pod", "rm", "-f", f"pod_{name}")
        podman("network", "rm", "-f", f"{name}_default")


def leftovers(name: str) -> dict[str, list[str]]:
    """What the project has in podman: containers (running or not), its pod, its network."""
    containers = podman("ps", "-a", "--format", "{{.Names}}", "--filter", f"label=io.podman.compose.project={name}")
    pods = podman("pod", "ps", "--format", "{{.Name}}", "--filter", f"name=pod_{name}")
    networks = podman("network", "ls", "--format", "{{.Name}}", "--filter", f"name={name}_default")
    return {"containers": containers.stdout.split(), "pods": pods.stdout.split(), "networks": networks.stdout.split()}


def test_compose_down_after_scale_removes_every_replica_the_pod_and_the_network(
    project: tuple[str, dict[str, str]],
) -> None:
    """Regression: podman-compose's `down` removed only the first replica of `--scale api=2` and exited 0, leaving
    the second running and the pod and network it held; a second `down` changed nothing."""
    name, env = project
    up = subprocess.run([podman_compose(), "up", "-d", "--scale", "api=2"], env=env, capture_output=True,
                        text=True, timeout=120)
    assert up.returncode == 0, up.stderr[-2000:]
    started = leftovers(name)
    assert len(started["containers"]) == 2 and started["pods"] and started["networks"], started

    down = run_script(["down"], env)
    assert down.returncode == 0, (down.stdout[-2000:], down.stderr[-2000:])
    assert leftovers(name) == {"containers": [], "pods": [], "networks": []}

    again = run_script(["down"], env)
    assert again.returncode == 0, (again.stdout[-2000:], again.stderr[-2000:])
    assert leftovers(name) == {"containers": [], "pods": [], "networks": []}
