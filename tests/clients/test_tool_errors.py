"""The client tools from a fresh clone: a missing package or sample file is one line on stderr, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testing import cli
from testing.samples import REAL_REQUESTS, main, real_bodies
from testing.server import REPO_ROOT


def run_module_without(module: str, missing: str, *args: str) -> subprocess.CompletedProcess:
    """Run `python -m module` in its own process, with the package `missing` not importable."""
    code = ("import runpy, sys; sys.modules[sys.argv[1]] = None; sys.argv = sys.argv[2:]; "
            "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")
    return subprocess.run([sys.executable, "-c", code, missing, module, *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)


def test_real_samples_ship_with_the_repository():
    bodies = real_bodies()
    assert REAL_REQUESTS.is_relative_to(REPO_ROOT)
    assert len(bodies) == 5
    assert all(len(body["esun_uuid"]) == 64 and body["sentence_list"] for body in bodies)


@pytest.mark.parametrize(("module", "missing"), [
    ("testing.concurrent_requests", "grequests"),
    ("testing.bench", "requests"),
    ("testing.soak", "psutil"),
])
def test_tool_names_the_install_step_when_a_package_is_missing(module, missing):
    run = run_module_without(module, missing, "--help")
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.splitlines() == [cli.missing_module_line(module, missing)]
    assert cli.INSTALL_STEP in run.stderr


def test_concurrent_requests_says_in_one_line_when_the_samples_are_missing(tmp_path: Path):
    missing = tmp_path / "real_requests.jsonl"
    run = subprocess.run([sys.executable, "-m", "testing.concurrent_requests", "--url", "http://127.0.0.1:9",
                          "--samples", str(missing)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        f"testing.concurrent_requests: cannot read the request bodies in {missing}: No such file or directory"]


@pytest.mark.parametrize(("content", "problem"), [
    (None, "No such file or directory"),
    ("", "holds no request body"),
    ('{"esun_uuid": "x"}\n', ":1: not a request body"),
    ("{\n", ":1: not JSON"),
])
def test_samples_tool_says_what_is_wrong_with_the_samples_file(tmp_path, capsys, content, problem):
    path = tmp_path / "bodies.jsonl"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        cli.run(lambda: main(["--samples", str(path)]), "testing.samples")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("testing.samples: ") and problem in err
