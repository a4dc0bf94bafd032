"""The app serves while its corrector loads (hosting.loading): /healthz at once, /readyz 503 with the reason, TOP1
answers (path model_loading), then the model's answers once it is loaded; a failed load is TOP1 for good."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

import pytest

from hosting.loading import LoadingCorrector, ModelNotLoaded
from preprocess.text import NBest, top1_answer
from tests.api.test_ops_routes import metric


class SlowLoad:
    """A build function for LoadingCorrector that returns `corrector` once `gate` is set (or raises `error`)."""

    def __init__(self, corrector: object, error: Exception | None = None) -> None:
        self.corrector = corrector
        self.error = error
        self.gate = threading.Event()

    def __call__(self) -> object:
        self.gate.wait(timeout=10)
        if self.error is not None:
            raise self.error
        return self.corrector


@pytest.fixture
def slow_load(corrector) -> SlowLoad:
    return SlowLoad(corrector)


@pytest.fixture
def loading_app(make_app: Callable, config, slow_load: SlowLoad):
    loader = LoadingCorrector(slow_load).start()
    yield make_app(config, loader), loader
    slow_load.gate.set()
    loader.wait(timeout=5)


def test_healthz_answers_at_once_while_the_model_loads(loading_app):
    app, _ = loading_app
    started = time.monotonic()
    response = app.test_client().get("/healthz")
    assert response.status_code == 200
    assert time.monotonic() - started < 0.1


def test_readyz_answers_503_with_the_reason_until_the_model_is_loaded(loading_app, slow_load):
    app, loader = loading_app
    client = app.test_client()
    response = client.get("/readyz")
    assert response.status_code == 503
    [reason] = response.get_json()["reasons"]
    assert reason.startswith("model is loading (for ")
    slow_load.gate.set()
    assert loader.wait(timeout=5)
    assert client.get("/readyz").get_json() == {"ready": True, "reasons": []}


def test_inference_answers_top1_at_once_while_the_model_loads(loading_app, make_body, request_paths, caplog,
                                                              corrector):
    app, _ = loading_app
    client = app.test_client()
    body = make_body()
    started = time.monotonic()
    response = client.post("/inference", json=body)
    assert time.monotonic() - started < 0.1  # not the budget: the model is not waited for
    assert response.status_code == 200
    assert response.get_json()["answer"] == top1_answer(body["sentence_list"])
    assert request_paths() == ["model_loading"]
    [line] = [r for r in caplog.records if r.name == "api.requests"]
    assert line.fields["reason"].startswith("model is loading")
    assert metric(client, "esun_fallbacks_total", reason="model_loading") == 1
    assert corrector.calls == 0


def test_inference_answers_with_the_model_once_it_is_loaded(loading_app, slow_load, make_body, request_paths,
                                                            corrector):
    app, loader = loading_app
    client = app.test_client()
    client.post("/inference", json=make_body(esun_uuid="during-load"))
    slow_load.gate.set()
    assert loader.wait(timeout=5)
    body = make_body(esun_uuid="after-load")
    assert client.post("/inference", json=body).get_json()["answer"] == corrector.expected(
        NBest(tuple(body["sentence_list"])))
    assert request_paths() == ["model_loading", "model"]


def test_failed_load_answers_top1_and_readyz_names_the_error(make_app, config, corrector, make_body,
                                                            request_paths, caplog):
    slow_load = SlowLoad(corrector, error=FileNotFoundError("model/weights/model.safetensors"))
    slow_load.gate.set()
    loader = LoadingCorrector(slow_load).start()
    assert loader.wait(timeout=5)
    client = make_app(config, loader).test_client()
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.get_json()["reasons"] == [
        "model failed to load: FileNotFoundError: model/weights/model.safetensors"]
    body = make_body()
    assert client.post("/inference", json=body).get_json()["answer"] == top1_answer(body["sentence_list"])
    assert request_paths() == ["error"]
    assert any(r.name == "hosting.loading" and r.exc_info for r in caplog.records)
    assert client.get("/").get_json()["model"]["state"] == "failed"


def test_loading_corrector_refuses_to_predict_before_it_is_loaded(slow_load):
    loader = LoadingCorrector(slow_load).start()
    with pytest.raises(ModelNotLoaded, match="model is loading"):
        loader.predict_batch([NBest(("喂 你好",))])
    assert loader.info == {"name": "corrector", "state": "loading", "error": None}
    slow_load.gate.set()
    assert loader.wait(timeout=5)


def test_loading_shortens_the_gil_switch_interval_until_the_last_load_ends(corrector):
    before = sys.getswitchinterval()
    first, second = SlowLoad(corrector), SlowLoad(corrector)
    loaders = [LoadingCorrector(first).start(), LoadingCorrector(second).start()]
    first.gate.set()
    assert loaders[0].wait(timeout=5)
    assert sys.getswitchinterval() < before  # the second still loads
    second.gate.set()
    assert loaders[1].wait(timeout=5)
    assert sys.getswitchinterval() == before


def test_a_loaded_model_is_frozen_out_of_the_cyclic_gcs_full_collections(corrector):
    """Guards freeze_set_up: what set-up built (the model's ~600,000 tracked objects) is no longer scanned by every
    full collection, which on a served process took 0.3-1.7 s each."""
    import gc

    gc.unfreeze()
    built = {"model": [object() for _ in range(1000)]}  # stands for what a build leaves alive
    try:
        loader = LoadingCorrector(lambda: corrector)
        loader.setup()
        assert loader.ready
        assert gc.get_freeze_count() > len(built["model"])
    finally:
        gc.unfreeze()
