"""What serves never imports what learns or measures: `learn/` (with the data makers, `learn/data/`) and the tools in
`testing/` stay out of the service, and a served app loads exactly the serving packages."""

from __future__ import annotations

import ast
import subprocess
import sys

from config import REPO_ROOT

SERVING = ("api", "batching", "cache", "server", "model", "preprocess")  # with config.py and compiled.py
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
    files = [REPO_ROOT / "config.py", REPO_ROOT / "compiled.py",
             *(f for folder in SERVING for f in (REPO_ROOT / folder).rglob("*.py"))]
    offenders = {str(f.relative_to(REPO_ROOT)): sorted(_imported_roots(f) & set(NOT_SERVED)) for f in files}
    assert {f: roots for f, roots in offenders.items() if roots} == {}


def test_the_app_and_the_gunicorn_worker_load_without_learn():
    code = ("import sys, api, server.worker, model.corrector; api.create_app; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'learn', 'testing', 'tests'}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# The project's own top-level modules a served app may load, and of preprocess/ the pure text functions it runs.
SERVED_PACKAGES = ["api", "batching", "cache", "compiled", "config", "hosting", "model", "preprocess", "server",
                   "sidecar"]
SERVED_PREPROCESS = ["preprocess.align", "preprocess.confusion", "preprocess.phones", "preprocess.rules",
                     "preprocess.text"]


def test_a_served_app_with_its_model_loads_exactly_the_serving_packages_and_no_data_maker():
    project = sorted(p.stem if p.is_file() else p.name for p in REPO_ROOT.iterdir()
                     if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py")
    code = ("import sys, api, server.worker, model.corrector; from config import Config; "
            "c = model.corrector.Corrector(); c.setup(); "
            f"project = {project!r}; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & set(project))); "
            "print(sorted(m for m in sys.modules if m.startswith('preprocess.')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    packages, preprocess = done.stdout.strip().splitlines()[-2:]
    assert packages == str(SERVED_PACKAGES)
    assert preprocess == str(SERVED_PREPROCESS)
