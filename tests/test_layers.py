"""The layers of docs/architecture.md hold: `lint-imports` (pyproject.toml's contracts) finds no upward import and no
import cycle inside a package, and the bottom, config.py, cli.py, machine.py and compiled.py, imports only the standard
library and itself."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from config import REPO_ROOT

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PACKAGES = ("api", "batching", "cache", "hosting", "learn", "model", "preprocess", "server", "sidecar", "testing")
BOTTOM = ("config.py", "cli.py", "machine.py", "compiled.py")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)})


def _copy_of_the_code(tmp_path: Path) -> Path:
    """The project's Python files and pyproject.toml, to plant an import in without touching the tree."""
    root = tmp_path / "repo"
    for package in PACKAGES:
        shutil.copytree(REPO_ROOT / package, root / package,
                        ignore=lambda folder, names: [n for n in names
                                                      if not n.endswith(".py") and not Path(folder, n).is_dir()
                                                      or n == "__pycache__"])
    for name in (*BOTTOM, "pyproject.toml"):
        shutil.copy(REPO_ROOT / name, root / name)
    return root


def _plant(file: Path, line: str) -> None:
    file.write_text(file.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")


def test_the_code_keeps_its_layers_and_has_no_import_cycle():
    run = _lint_imports(REPO_ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


@pytest.mark.parametrize(("plant", "broken"), [
    # the weights check inside Config again: the model imported by a module below it
    ({"model/weights_meta.py": "import api.app"}, "api.app"),
    # a served module importing the learner, even inside a function
    ({"preprocess/rules.py": "def f():\n    import learn.rule_trust"}, "learn.rule_trust"),
    # two modules of one package importing each other
    ({"preprocess/text.py": "import preprocess.align", "preprocess/align.py": "import preprocess.text"},
     "No cycles are allowed in preprocess"),
], ids=["upward", "served-imports-learn", "cycle"])
def test_lint_imports_fails_when_an_upward_import_or_a_cycle_comes_back(tmp_path, plant, broken):
    root = _copy_of_the_code(tmp_path)
    assert _lint_imports(root).returncode == 0  # the copy as it is passes
    for file, line in plant.items():
        _plant(root / file, line)
    run = _lint_imports(root)
    assert run.returncode == 1 and "BROKEN" in run.stdout and broken in run.stdout, run.stdout[-3000:]


@pytest.mark.parametrize("module", BOTTOM)
def test_the_bottom_layer_imports_only_the_standard_library_even_inside_a_function(module):
    tree = ast.parse((REPO_ROOT / module).read_text(encoding="utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module}
    assert imported - set(sys.stdlib_module_names) - {"__future__"} - {name[:-3] for name in BOTTOM} == set()


MAX_MODULE_LINES = 400  # issue 49: a module longer than this is two things; split it where it says so


def test_no_module_outside_the_tests_is_longer_than_the_limit():
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO_ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git work tree: the modules are the ones git tracks")
    modules = [REPO_ROOT / name for name in tracked.stdout.split() if not name.startswith("tests/")]
    assert modules, "git ls-files found no module"
    long = {str(m.relative_to(REPO_ROOT)): n for m in modules if m.is_file()
            and (n := len(m.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}
