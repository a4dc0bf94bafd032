"""/healthz, /readyz, /, /openapi.json, /docs, /metrics, and the JSON answers to wrong URLs, methods and bugs."""

from __future__ import annotations

import dataclasses
import threading
import tomllib

import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.metrics import BATCHER_COUNTERS
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
    app.extensions[EXTENSION_KEY].engine.close()
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
    assert data["config"]["pool_cap"] == 2 * config.max_batch_size  # the running batch and the next one
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


def test_openapi_lists_metrics_among_the_ops_routes(client):
    """Issue 62: /openapi.json lacked /metrics."""
    operation = client.get("/openapi.json").get_json()["paths"]["/metrics"]["get"]
    assert operation["tags"] == ["ops"] and "200" in operation["responses"]
    assert client.get("/metrics").content_type.startswith("text/plain")


@pytest.mark.parametrize("path", ["/docs", "/docs/"])
def test_docs_serves_a_browsable_page_of_the_spec(client, path):
    """/docs/ was a 404 while /docs worked (issue 41)."""
    response = client.get(path, follow_redirects=True)
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


def metric(client, name: str, **labels: str) -> float:
    """Read one sample from the app's /metrics."""
    text = client.get("/metrics").get_data(as_text=True)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise KeyError(f"{name}{labels} not in /metrics")


def test_metrics_serves_prometheus_text_with_every_series_at_zero(client):
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.mimetype == "text/plain"
    text = response.get_data(as_text=True)
    for series in ("esun_request_duration_seconds_bucket", "esun_requests_in_flight", "esun_fallbacks_total",
                   "esun_batch_size_bucket", "esun_batch_duration_seconds_bucket",
                   "esun_batch_queue_wait_seconds_bucket", "esun_cache_lookups_total", "esun_redis_circuit_open",
                   "esun_batcher_alive", "esun_batcher_worker_restarts_total"):
        assert series in text
    assert metric(client, "esun_batcher_alive") == 1
    assert metric(client, "esun_batcher_worker_restarts_total") == 0
    assert metric(client, "esun_cache_entries") == 0
    for name in BATCHER_COUNTERS:
        assert metric(client, f"esun_batcher_{name}_total") == 0
    assert metric(client, "esun_request_duration_seconds_count", path="deadline") == 0
    assert metric(client, "esun_fallbacks_total", reason="overload") == 0


def test_every_series_served_is_named_in_the_deployment_guide(client):
    guide = (REPO_ROOT / "deploy" / "README.md").read_text(encoding="utf-8")
    families = list(text_string_to_metric_families(client.get("/metrics").get_data(as_text=True)))
    served = {f.name for f in families if f.name.startswith("esun_") and not f.name.endswith("_created")}
    assert len(served) > 20
    assert [name for name in served if f"`{name}`" not in guide and f"`{name}_total`" not in guide] == []


def test_metrics_count_requests_by_path_with_batches_queue_wait_and_cache_lookups(client, make_body):
    assert client.post("/inference", json=make_body()).status_code == 200
    client.post("/inference", json=make_body())  # same question again: cached
    client.post("/inference", json=make_body(retry=1))  # its retry: cached answer
    client.post("/inference", json=make_body(esun_uuid="other", retry=1))  # retry of an unknown question: TOP1
    client.post("/inference", data=b"not json")

    assert metric(client, "esun_request_duration_seconds_count", path="model") == 1
    assert metric(client, "esun_request_duration_seconds_count", path="cached") == 1
    assert metric(client, "esun_request_duration_seconds_count", path="retry_cached") == 1
    assert metric(client, "esun_request_duration_seconds_count", path="retry_top1") == 1
    assert metric(client, "esun_request_duration_seconds_count", path="rejected") == 1
    assert metric(client, "esun_fallbacks_total", reason="retry_top1") == 1
    assert metric(client, "esun_batch_size_count") == 1
    assert metric(client, "esun_batch_size_sum") == 1
    assert metric(client, "esun_batcher_batches_total") == 1 and metric(client, "esun_batcher_items_total") == 1
    assert metric(client, "esun_batch_queue_wait_seconds_count") == 1
    assert metric(client, "esun_cache_lookups_total", level="local", result="hit") == 2
    assert metric(client, "esun_cache_lookups_total", level="local", result="miss") == 2
    assert metric(client, "esun_cache_entries") == 1  # one question answered by the model, the retry's TOP1 not kept
    assert metric(client, "esun_requests_in_flight") == 0


def test_metrics_count_a_request_in_flight_while_the_model_holds_it(make_app, config, fake_corrector, make_body):
    """A patient budget (60 s): the request stays in flight until the test lets the model answer, however slow CI is."""
    gate = threading.Event()
    corrector = fake_corrector(gate=gate)
    patient = dataclasses.replace(config, judge_timeout_s=60.0, safety_margin_s=1.0)
    client = make_app(config=patient, corrector=corrector).test_client()
    answered = []
    waiter = threading.Thread(target=lambda: answered.append(client.post("/inference", json=make_body())))
    waiter.start()
    try:
        assert corrector.started.wait(5)
        assert metric(client, "esun_requests_in_flight") == 1
    finally:
        gate.set()
        waiter.join(timeout=10)
    assert answered[0].status_code == 200
    assert metric(client, "esun_request_duration_seconds_count", path="model") == 1
    assert metric(client, "esun_requests_in_flight") == 0


def test_metrics_count_a_deadline_fallback(make_app, fake_corrector, make_body):
    """The model never answers within the 0.3 s budget: TOP1 at the deadline, counted, nothing left in flight."""
    gate = threading.Event()
    client = make_app(corrector=fake_corrector(gate=gate)).test_client()
    try:
        answer = client.post("/inference", json=make_body())
    finally:
        gate.set()
    assert answer.status_code == 200
    assert metric(client, "esun_fallbacks_total", reason="deadline") == 1
    assert metric(client, "esun_request_duration_seconds_count", path="deadline") == 1
    assert metric(client, "esun_requests_in_flight") == 0


def test_metrics_are_kept_per_app(make_app, make_body):
    first, second = make_app().test_client(), make_app().test_client()
    first.post("/inference", json=make_body())
    assert metric(first, "esun_request_duration_seconds_count", path="model") == 1
    assert metric(second, "esun_request_duration_seconds_count", path="model") == 0


def test_metrics_count_the_cyclic_gc_s_full_collections_and_their_pauses(client):
    """Guards api.metrics.GC_PAUSES: a full collection holds the GIL, so /metrics says how many ran and how long."""
    import gc

    before = metric(client, "esun_gc_collections_total", generation="2")
    gc.collect()
    assert metric(client, "esun_gc_collections_total", generation="2") >= before + 1
    assert metric(client, "esun_gc_pause_seconds_total", generation="2") > 0
    assert metric(client, "esun_gc_pause_longest_seconds", generation="2") > 0


def test_metrics_show_the_thread_pools_count_and_cap(app, client):
    """The pool's count is the gate that acts first under overload (pool_full): it has a gauge."""
    admission = app.extensions[EXTENSION_KEY].admission
    assert metric(client, "esun_pool_cap") == admission.pool_cap
    assert metric(client, "esun_pool_requests") == 0
    admission.enter_pool()
    admission.enter_pool()
    assert metric(client, "esun_pool_requests") == 2
    admission.leave_pool()
    assert metric(client, "esun_pool_requests") == 1
