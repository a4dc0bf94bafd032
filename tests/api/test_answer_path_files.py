"""docs/architecture.md lists the files one model answer passes through: this runs one answer and compares.

A profiler on every thread records the project files whose functions run while one question is answered by the
model (a fake corrector: the model's own files are listed from a run with the shipped one, see the page); the
gunicorn seam (`server/`) is not run by Flask's test client. The page must name exactly the rest.
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

from config import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "architecture.md"
NOT_TRACED = ("server/", "model/", "preprocess/")


def documented_files() -> set[str]:
    section = PAGE.read_text(encoding="utf-8").split("## The files a model answer passes through", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return {name for row in rows for name in re.findall(r"`([a-z_/]+\.py)`", row)}


def test_the_documented_files_are_the_ones_a_model_answer_runs(make_app, make_body, request_paths):
    seen: set[str] = set()
    tracing = threading.Event()
    root = str(REPO_ROOT)

    def profile(frame, event, _arg):  # type: ignore[no-untyped-def]
        name = frame.f_code.co_filename
        if tracing.is_set() and event == "call" and name.startswith(root) and "/.venv/" not in name:
            seen.add(str(Path(name).relative_to(REPO_ROOT)))

    threading.setprofile(profile)  # before the app starts its batch thread, so that it is traced too
    try:
        client = make_app().test_client()
        client.post("/inference", json=make_body(esun_uuid="warm"))
        sys.setprofile(profile)
        tracing.set()
        client.post("/inference", json=make_body(esun_uuid="traced"))
        tracing.clear()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert request_paths()[-1] == "model"
    served = {f for f in seen if not f.startswith(("tests/", "testing/", *NOT_TRACED))}
    listed = {f for f in documented_files() if not f.startswith(NOT_TRACED)}
    assert served == listed
