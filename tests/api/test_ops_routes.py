"""/healthz, /readyz, /, /openapi.json, /docs, and the JSON answers to wrong URLs, methods and bugs."""

from __future__ import annotations

import tomllib

import pytest

from api.schemas import InferenceRequest, InferenceResponse
from api.state import EXTENSION_KEY
from config import REPO_ROOT


def test_healthz_answers_ok(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok"}


def test_readyz_answers_ready_when_corrector_and_batcher_run(client):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.get_json() == {"ready": True, "reasons": []}


def test_readyz_answers_503_when_corrector_not_set_up(client, corrector):
    corrector.ready = False
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.get_json() == {"ready": False, "reasons": ["corrector is not set up"]}


def test_readyz_answers_503_when_batcher_stopped(app, client):
    app.extensions[EXTENSION_KEY].batcher.close()
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.get_json()["reasons"] == ["batcher worker is not running"]


def test_index_describes_service_model_and_settings(client, config):
    data = client.get("/").get_json()
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert (data["name"], data["version"]) == (project["name"], project["version"])
    assert data["model"] == {"name": "fake-corrector", "version": "test", "parameters": 0, "weights": "/nowhere"}
    assert data["config"]["max_batch_size"] == config.max_batch_size
    assert data["config"]["budget_s"] == pytest.approx(config.budget_s)
    assert data["config"]["server_uuid_salt"] == "<set>"  # secrets are never shown


def test_openapi_documents_inference_from_the_validating_schemas(client):
    spec = client.get("/openapi.json").get_json()
    operation = spec["paths"]["/inference"]["post"]
    schemas = spec["components"]["schemas"]
    request_ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    request_schema = schemas[request_ref.rsplit("/", 1)[1]]
    assert set(request_schema["properties"]) == set(InferenceRequest.model_fields)
    response_ref = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    assert set(schemas[response_ref.rsplit("/", 1)[1]]["properties"]) == set(InferenceResponse.model_fields)
    assert {"400", "413", "500"} <= set(operation["responses"])
    assert {"/healthz", "/readyz", "/"} <= set(spec["paths"])


def test_docs_serves_a_browsable_page_of_the_spec(client):
    response = client.get("/docs", follow_redirects=True)
    assert response.status_code == 200
    assert response.mimetype == "text/html"
    assert "/docs/openapi.json" in response.get_data(as_text=True)
    assert client.get("/docs/openapi.json").get_json() == client.get("/openapi.json").get_json()


def test_unknown_url_answers_json_404(client):
    response = client.get("/nowhere")
    assert response.status_code == 404
    assert response.get_json()["error"] == "not_found"


def test_wrong_method_answers_json_405_with_allow(client):
    response = client.get("/inference")
    assert response.status_code == 405
    assert response.get_json()["error"] == "method_not_allowed"
    assert "POST" in response.headers["Allow"]


def test_unexpected_error_answers_json_500_without_traceback(make_app, caplog):
    app = make_app()

    def explode():
        raise KeyError("secret internals")

    app.add_url_rule("/explode", "explode", explode)
    response = app.test_client().get("/explode")
    assert response.status_code == 500
    assert response.get_json() == {"error": "internal_error", "detail": "the server met an unexpected error"}
    assert "secret internals" not in response.get_data(as_text=True)
    assert any(r.name == "api.errors" and r.exc_info for r in caplog.records)
