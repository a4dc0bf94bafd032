"""What serves never imports what learns or measures: `learn/` and the tools in `testing/` stay out of the service."""

from __future__ import annotations

import ast
import subprocess
import sys

from config import REPO_ROOT

SERVING = ("api", "batching", "cache", "server", "model", "preprocess")
NOT_SERVED = ("learn", "testing", "tests")


def _imported_roots(path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_serving_module_imports_learn_or_the_tools_even_inside_a_function():
    files = [REPO_ROOT / "config.py", *(f for folder in SERVING for f in (REPO_ROOT / folder).rglob("*.py"))]
    offenders = {str(f.relative_to(REPO_ROOT)): sorted(_imported_roots(f) & set(NOT_SERVED)) for f in files}
    assert {f: roots for f, roots in offenders.items() if roots} == {}


def test_the_app_and_the_gunicorn_worker_load_without_learn():
    code = ("import sys, api, server.worker, model.corrector; api.create_app; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'learn', 'testing', 'tests'}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
