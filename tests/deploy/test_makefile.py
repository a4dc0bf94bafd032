"""The Makefile's install paths: the Python it needs, a .venv of another Python, the GPU build of torch (its plan)."""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.procs import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
OLD_PYTHON = '#!/bin/sh\nif [ "$1" = "--version" ]; then echo Python 3.10.13; exit 0; fi\nexit 1\n'


def _project(tmp_path: Path) -> Path:
    for name in ("Makefile", "requirements.txt", "requirements-dev.txt"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    fake = tmp_path / "python3.10"
    fake.write_text(OLD_PYTHON)
    fake.chmod(0o755)
    return tmp_path


def test_make_run_with_an_old_python_stops_in_one_line_naming_the_fix(tmp_path):
    """Regression: with Python 3.10 the install failed deep inside pip ("No matching distribution ...")."""
    project = _project(tmp_path)
    run = subprocess.run(["make", "install", f"PYTHON={project / 'python3.10'}"], cwd=project,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    first = run.stderr.splitlines()[0]
    assert first.startswith("Python 3.11 or newer is needed") and "PYTHON=python3.11" in first
    assert not (project / ".venv").exists()


NEW_PYTHON = """#!/bin/sh
case "$1" in
    -c) exit 0 ;;
    --version) echo Python 3.11.7 ;;
    -m) if [ "$2" = venv ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0; fi
        echo "pip is not run in this test" >&2; exit 3 ;;
esac
"""


def test_make_rebuilds_a_venv_made_by_an_older_python(tmp_path):
    """Regression: a .venv left by a failed 3.10 install was reused, broken, after PYTHON=python3.11."""
    project = _project(tmp_path)
    (project / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(project / "python3.10", project / ".venv" / "bin" / "python")
    new = project / "python3.11"
    new.write_text(NEW_PYTHON)
    new.chmod(0o755)
    run = subprocess.run(["make", "install", f"PYTHON={new}"], cwd=project, capture_output=True, text=True,
                         timeout=60)
    assert ".venv was made by Python 3.10.13: rebuilding it" in run.stdout
    assert (project / ".venv" / "bin" / "python").read_text() == NEW_PYTHON  # the new Python's venv
    assert run.returncode != 0 and "pip is not run in this test" in run.stderr  # (it stops at pip, by design)


def test_make_install_gpu_replaces_torch_with_the_cuda_build_of_the_pinned_version(tmp_path):
    run = subprocess.run(["make", "--no-print-directory", "-n", "install-gpu", "-o", ".venv/.installed"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0
    assert "spec=\"$(grep -m1 '^torch==' requirements.txt)\"" in run.stdout
    assert ("-m pip install -q --force-reinstall --no-deps \"$spec\" --index-url "
            "https://download.pytorch.org/whl/cu128") in run.stdout
    pinned = [line for line in (REPO_ROOT / "requirements.txt").read_text().splitlines() if line.startswith("torch==")]
    assert pinned == ["torch==2.13.0"]


# .venv's Python for the install-gpu tests: pip does what the test says (no download, the shared torch untouched);
# anything else runs this Python, whose torch is the CPU build unless the test puts a CUDA build's first on its path.
VENV_PYTHON = """#!/bin/sh
if [ "$1" = -m ] && [ "$2" = pip ]; then
    printf '%s' "$FAKE_PIP_OUTPUT" >&2
    exit "${FAKE_PIP_EXIT:-0}"
fi
exec PYTHON "$@"
"""
CUDA_TORCH = """__version__ = "2.13.0+cu128"


class version:
    cuda = "12.8"


class cuda:
    @staticmethod
    def is_available():
        return False
"""


def _install_gpu(tmp_path: Path, index: str, **env: str) -> subprocess.CompletedProcess[str]:
    project = _project(tmp_path)
    python = project / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(VENV_PYTHON.replace("PYTHON", sys.executable))
    python.chmod(0o755)
    return subprocess.run(["make", "--no-print-directory", "install-gpu", "-o", ".venv/.installed",
                           f"TORCH_INDEX={index}"], cwd=project, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env})


def _one_line(stderr: str) -> str:
    """The recipe's line on stderr; make's own "*** [install-gpu] Error 1" line may follow it."""
    first, *rest = stderr.splitlines()
    assert all(line.startswith("make: ***") for line in rest), stderr
    return first


@pytest.fixture
def empty_index(tmp_path: Path) -> Iterator[str]:
    """A package index on loopback that answers, and holds nothing."""
    (tmp_path / "index").mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "index"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_make_install_gpu_fails_in_one_line_when_pip_left_the_cpu_build_from_an_unreachable_index(tmp_path):
    """Regression: with the CUDA index out of reach, pip took the CPU build from its find-links and make install-gpu
    exited 0 printing `torch 2.13.0+cpu CUDA available: False`."""
    index = f"http://127.0.0.1:{free_port()}/whl/cu128"
    run = _install_gpu(tmp_path, index)
    assert run.returncode != 0
    line = _one_line(run.stderr)
    assert line.startswith(f"make install-gpu: the CUDA build of torch could not be installed: {index} is "
                           "unreachable (")
    assert "Connection refused" in line
    assert line.endswith("pip installed torch 2.13.0+cpu, a CPU build, from its other sources")


def test_make_install_gpu_fails_in_one_line_when_the_index_has_no_cuda_build_for_this_machine(tmp_path, empty_index):
    run = _install_gpu(tmp_path, empty_index)
    assert run.returncode != 0
    assert _one_line(run.stderr) == (f"make install-gpu: the CUDA build of torch could not be installed: {empty_index} "
                                     "offers none for this Python and platform; pip installed torch 2.13.0+cpu, a "
                                     "CPU build, from its other sources")


def test_make_install_gpu_fails_in_one_line_with_pips_reason_when_pip_fails(tmp_path):
    pip_says = ("Looking in indexes: https://download.pytorch.org/whl/cu128\n"
                "ERROR: Could not find a version that satisfies the requirement torch==2.13.0 (from versions: none)\n"
                "ERROR: No matching distribution found for torch==2.13.0\n")
    run = _install_gpu(tmp_path, "https://download.pytorch.org/whl/cu128", FAKE_PIP_OUTPUT=pip_says,
                       FAKE_PIP_EXIT="1")
    assert run.returncode != 0
    assert _one_line(run.stderr) == ("make install-gpu: the CUDA build of torch could not be installed: pip: ERROR: "
                                     "Could not find a version that satisfies the requirement torch==2.13.0 (from "
                                     "versions: none)")


def test_make_install_gpu_succeeds_with_the_cuda_build_on_a_machine_without_a_gpu(tmp_path):
    cuda_build = tmp_path / "cuda-build"
    (cuda_build / "torch").mkdir(parents=True)
    (cuda_build / "torch" / "__init__.py").write_text(CUDA_TORCH)
    run = _install_gpu(tmp_path, "https://download.pytorch.org/whl/cu128", PYTHONPATH=str(cuda_build))
    assert run.returncode == 0, run.stderr
    assert run.stdout == "torch 2.13.0+cu128 CUDA 12.8 CUDA available: False\n"
    assert run.stderr == ""
