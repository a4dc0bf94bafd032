"""/docs (Swagger UI) and /docs/redoc/ render offline: their scripts are served by the app (spectree[offline]).

The browser test loads each page in Debian's headless chromium (installed by `make tools`), with no network
but loopback, and looks for the /inference route and the request schema in the rendered page. Without chromium
it is skipped, except under CI (CI=true), where a missing browser is a failure.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from api.schemas import InferenceRequest

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--no-first-run")
# Virtual time lets the page's scripts fetch the spec and render before the DOM is dumped, without a real wait.
VIRTUAL_TIME_BUDGET_MS = 10_000
_REMOTE_ASSET = re.compile(r"<(?:script|link)\b[^>]*\b(?:src|href)\s*=\s*[\"']?(?:https?:)?//", re.IGNORECASE)
_CODE = re.compile(r"<(script|style)\b[^>]*>.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]+>")


@pytest.fixture(scope="module")
def chromium() -> str:
    """Return the chromium executable; skip without one, unless under CI."""
    path = shutil.which("chromium")
    if path is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("chromium is not installed: run `bash testing/install_tools.sh` (make test runs it)")
        pytest.skip("chromium is not installed (bash testing/install_tools.sh installs it; required when CI=true)")
    return path


def rendered_text(chromium: str, url: str, profile: Path) -> str:
    """Load the page in headless chromium and return the text it shows (scripts and styles left out)."""
    command = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
               f"--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}", "--dump-dom", url]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    text = _TAG.sub(" ", _CODE.sub(" ", run.stdout))
    return " ".join(html.unescape(text).split())


@pytest.mark.parametrize("path", ["/docs/swagger/", "/docs/redoc/"])
def test_docs_pages_load_no_asset_from_another_host(client, path):
    """Regression: the pages loaded their scripts from a CDN, so they were blank without internet."""
    response = client.get(path)
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert _REMOTE_ASSET.search(page) is None
    assert "<script>" in page or '<script type="module">' in page  # the assets, inline


@pytest.mark.live
def test_swagger_ui_renders_the_inference_route_and_request_schema(chromium, live_server, tmp_path):
    text = rendered_text(chromium, f"{live_server}/docs", tmp_path)
    assert "POST /inference" in text
    assert InferenceRequest.__name__ in text


@pytest.mark.live
def test_redoc_renders_the_inference_route_and_request_schema(chromium, live_server, tmp_path):
    # Redoc shows an operation's request body on the operation's own view.
    text = rendered_text(chromium, f"{live_server}/docs/redoc/#/judge/post__inference", tmp_path)
    assert "post /inference" in text
    assert all(field in text for field in InferenceRequest.model_fields)
