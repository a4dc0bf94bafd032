"""The Makefile's install paths: the Python it needs, a .venv of another Python, the GPU build of torch (its plan)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

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
    assert ("-m pip install --force-reinstall --no-deps \"$(grep -m1 '^torch==' requirements.txt)\" --index-url "
            "https://download.pytorch.org/whl/cu128") in run.stdout
    pinned = [line for line in (REPO_ROOT / "requirements.txt").read_text().splitlines() if line.startswith("torch==")]
    assert pinned == ["torch==2.13.0"]
