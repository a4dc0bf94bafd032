"""The Postman smoke collection (testing/postman/), run with newman against a served service."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from testing.server import ServerProcess

POSTMAN_DIR = Path(__file__).resolve().parents[2] / "testing" / "postman"

pytestmark = pytest.mark.live


def test_postman_smoke_collection_passes_with_newman(served: ServerProcess, newman: Path, tmp_path: Path):
    logged_before = len(served.request_log())
    report = tmp_path / "newman.json"
    run = subprocess.run(
        [str(newman), "run", str(POSTMAN_DIR / "smoke.postman_collection.json"),
         "-e", str(POSTMAN_DIR / "local.postman_environment.json"), "--env-var", f"base_url={served.url}",
         "--color", "off", "--reporters", "cli,json", "--reporter-json-export", str(report)],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    stats = json.loads(report.read_text(encoding="utf-8"))["run"]["stats"]
    assert stats["requests"] == {"total": 7, "pending": 0, "failed": 0}
    assert stats["assertions"]["failed"] == 0 and stats["assertions"]["total"] >= 25
    # The collection walks every guard of the view once.
    paths = served.paths(since=logged_before)
    assert {"model", "retry_cached", "retry_top1", "too_long"} <= set(paths)
