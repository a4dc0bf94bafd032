"""hosting.swap and the in-process host: WEIGHTS_DIR as a symlink repointed under traffic. The folder it leads to is
checked, built and warmed beside the served model, then swapped in; a folder that fails changes nothing (the old model
answers, /readyz 200, one log line, a counter); a retry keeps its first attempt's answer. The process engine's swap:
tests/batching/test_process_batcher.py."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from prometheus_client.parser import text_string_to_metric_families

from api import create_app
from api.state import EXTENSION_KEY
from config import DEFAULT_WEIGHTS_DIR, Config
from hosting.swap import DONE, FAILED, ModelSwapper
from model.contract import sha256
from model.weights_meta import CONFIG_FILE, NETWORK_FILE, VOCAB_FILE
from preprocess.text import NBest, han_chars
from tests.api.test_ops_routes import metric
from tests.fakes import FakeCorrector
from tests.model.test_weights_meta import ADAPTED_427BA62

# The answer's first character tells which folder's corrector gave it (a model answer is Han characters only).
MARKS = {"a": "甲", "b": "乙"}


class FolderCorrector(FakeCorrector):
    """A fake corrector built from a weights folder: its answers start with the folder's mark."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.released = False
        super().__init__(answer=lambda item: MARKS.get(folder.name, "丙") + han_chars(item.top1))

    def release(self) -> None:
        self.released = True


def build_fake(folder: Path) -> FolderCorrector:
    return FolderCorrector(folder)


def shipped_copy(path: Path) -> Path:
    """A weights folder with the shipped parts (linked, not copied: they are read only)."""
    path.mkdir(parents=True)
    for name in (CONFIG_FILE, NETWORK_FILE, VOCAB_FILE):
        (path / name).symlink_to(DEFAULT_WEIGHTS_DIR / name)
    return path


def repoint(link: Path, folder: Path) -> None:
    """`ln -sfn folder link`: a new link beside, renamed over the old one (atomic)."""
    beside = link.with_name(link.name + ".new")
    beside.symlink_to(folder)
    beside.replace(link)


# The broken folders tests/model builds (test_weights_meta.py, test_contract.py): each refused by the weights contract.
def missing_part(path: Path) -> Path:
    folder = shipped_copy(path)
    (folder / VOCAB_FILE).unlink()
    return folder


def part_of_another_run(path: Path) -> Path:
    shutil.copytree(ADAPTED_427BA62, path)
    for name in (NETWORK_FILE, VOCAB_FILE):
        (path / name).symlink_to(DEFAULT_WEIGHTS_DIR / name)
    with (path / "confusions.json").open("a", encoding="utf-8") as f:  # as tests/learn/test_adapt.py edits it
        f.write("\n")
    return path


def wrong_typed_field(path: Path) -> Path:
    path.mkdir(parents=True)
    for name in (NETWORK_FILE, VOCAB_FILE):
        (path / name).symlink_to(DEFAULT_WEIGHTS_DIR / name)
    raw = json.loads((DEFAULT_WEIGHTS_DIR / CONFIG_FILE).read_text(encoding="utf-8")) | {"threshold": "high"}
    (path / CONFIG_FILE).write_text(json.dumps(raw), encoding="utf-8")
    return path


def not_a_model(path: Path) -> Path:
    folder = shipped_copy(path)
    (folder / NETWORK_FILE).unlink()
    (folder / NETWORK_FILE).write_text("this is a text file, not a network's weights\n", encoding="utf-8")
    return folder


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    """`current` -> folder `a` (the shipped parts), as `ln -sfn a current` makes it."""
    shipped_copy(tmp_path / "a")
    (tmp_path / "current").symlink_to(tmp_path / "a")
    return tmp_path / "current"


@pytest.fixture
def make_swap_app(config: Config, weights: Path) -> Iterator[Callable[..., Flask]]:
    """Apps serving `weights` (the link) through `build`; the swapper looks only when a test calls check()."""
    apps: list[Flask] = []

    def make(build: Callable[[Path], Any] = build_fake, **settings: Any) -> Flask:
        settings = {"weights_dir": weights, "weights_poll_s": 0.0} | settings
        app = create_app(dataclasses.replace(config, **settings), build_corrector=build)
        apps.append(app)
        state = app.extensions[EXTENSION_KEY]
        assert state.corrector.wait(timeout=10) and state.corrector.ready
        deadline = time.monotonic() + 5
        while state.host.swapper.served is None and time.monotonic() < deadline:  # recorded on its thread
            time.sleep(0.01)
        return app

    yield make
    for app in apps:
        state = app.extensions[EXTENSION_KEY]
        state.host.swapper.close()
        state.engine.close(timeout=2.0)


def swapper_of(app: Flask) -> ModelSwapper:
    swapper = app.extensions[EXTENSION_KEY].host.swapper
    assert swapper is not None
    return swapper


def served_folders(client: Any) -> list[str]:
    """The folders /metrics says this app serves (esun_model_served_since_seconds' labels), each since a moment."""
    text = client.get("/metrics").get_data(as_text=True)
    return [sample.labels["folder"] for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == "esun_model_served_since_seconds" and sample.value > 0]


def answer(app: Flask, make_body: Callable[..., dict[str, Any]], **fields: Any) -> str:
    response = app.test_client().post("/inference", json=make_body(**fields))
    assert response.status_code == 200
    return response.get_json()["answer"]


def test_the_folder_the_link_leads_to_is_swapped_in_and_every_new_question_gets_its_answers(
        make_swap_app, make_body, weights, tmp_path):
    app = make_swap_app()
    assert answer(app, make_body).startswith(MARKS["a"])
    shipped_copy(tmp_path / "b")

    repoint(weights, tmp_path / "b")
    assert swapper_of(app).check() == DONE

    assert answer(app, make_body, esun_uuid="after-the-swap").startswith(MARKS["b"])
    client = app.test_client()
    serving = client.get("/").get_json()["serving"]
    assert serving["folder"] == str(tmp_path / "b") and serving["weights_dir"] == str(weights)
    assert serving["sha256"] == sha256(DEFAULT_WEIGHTS_DIR / NETWORK_FILE)
    assert serving["swaps"] == {"done": 1, "failed": 0}
    assert metric(client, "esun_model_swaps_total", result="done") == 1
    assert served_folders(client) == [str(tmp_path / "b")]
    assert client.get("/readyz").status_code == 200


def test_an_adapted_folder_swapped_in_is_shown_with_its_provenance(make_swap_app, make_body, weights, tmp_path):
    app = make_swap_app()
    adapted = tmp_path / "adapted"
    shutil.copytree(ADAPTED_427BA62, adapted)
    for name in (NETWORK_FILE, VOCAB_FILE):
        (adapted / name).symlink_to(DEFAULT_WEIGHTS_DIR / name)

    repoint(weights, adapted)
    assert swapper_of(app).check() == DONE

    client = app.test_client()
    serving = client.get("/").get_json()["serving"]
    assert serving["folder"] == str(adapted) and serving["adaptation"]["split"]["seed"] == 7
    [sample] = [s for family in text_string_to_metric_families(client.get("/metrics").get_data(as_text=True))
                for s in family.samples if s.name == "esun_model_served_since_seconds"]
    data_sha = serving["adaptation"]["data"][0]["sha256"]
    assert sample.labels["adapted"] == data_sha[:12] and sample.labels["name"] == serving["name"]


def test_swapping_back_serves_the_first_folder_again(make_swap_app, make_body, weights, tmp_path):
    app = make_swap_app()
    shipped_copy(tmp_path / "b")
    repoint(weights, tmp_path / "b")
    assert swapper_of(app).check() == DONE
    repoint(weights, tmp_path / "a")

    assert swapper_of(app).check() == DONE

    assert answer(app, make_body, esun_uuid="back").startswith(MARKS["a"])
    assert swapper_of(app).counts()["done"] == 2


def test_the_old_corrector_is_released_once_no_batch_runs_on_it(make_swap_app, weights, tmp_path):
    app = make_swap_app()
    old = app.extensions[EXTENSION_KEY].corrector._corrector
    shipped_copy(tmp_path / "b")
    repoint(weights, tmp_path / "b")

    assert swapper_of(app).check() == DONE

    assert isinstance(old, FolderCorrector) and old.released


def test_a_batch_that_outlasts_the_swaps_wait_keeps_its_corrector_unreleased_and_the_next_runs_on_the_new(
        make_swap_app, weights, tmp_path):
    import threading

    app = make_swap_app()
    loader = app.extensions[EXTENSION_KEY].corrector
    old = loader._corrector
    old.gate = threading.Event()  # its next batch hangs until set
    stuck = threading.Thread(target=loader.predict_batch, args=([NBest(("卡 住",))],))
    stuck.start()
    assert old.started.wait(5)
    app.extensions[EXTENSION_KEY].host.batch_wait_s = 0.1
    shipped_copy(tmp_path / "b")
    repoint(weights, tmp_path / "b")

    assert swapper_of(app).check() == DONE
    old.gate.set()
    stuck.join(5)

    assert not old.released  # it was running a batch: left to reference counting, once that batch returns
    assert loader.predict_batch([NBest(("你 好",))]) == [MARKS["b"] + "你好"]


def test_the_link_leading_where_it_did_changes_nothing(make_swap_app):
    app = make_swap_app()
    corrector = app.extensions[EXTENSION_KEY].corrector

    assert swapper_of(app).check() is None
    assert swapper_of(app).counts() == {"done": 0, "failed": 0}
    assert app.extensions[EXTENSION_KEY].corrector is corrector


@pytest.mark.parametrize("broken", [missing_part, part_of_another_run, wrong_typed_field],
                         ids=["a_missing_part", "a_part_of_another_run", "a_wrong_typed_field_in_config_json"])
def test_a_broken_folder_is_refused_and_the_old_model_keeps_answering(make_swap_app, make_body, weights, tmp_path,
                                                                      caplog, broken):
    app = make_swap_app()
    client = app.test_client()
    folder = broken(tmp_path / "broken")
    caplog.set_level(logging.INFO, logger="hosting.swap")

    repoint(weights, folder)
    assert swapper_of(app).check() == FAILED

    assert answer(app, make_body, esun_uuid="after-the-failure").startswith(MARKS["a"])
    assert client.get("/readyz").status_code == 200
    assert client.get("/").get_json()["serving"]["folder"] == str(tmp_path / "a")
    assert served_folders(client) == [str(tmp_path / "a")]
    assert metric(client, "esun_model_swaps_total", result="failed") == 1
    [line] = [r for r in caplog.records if r.name == "hosting.swap"]
    assert line.levelno == logging.ERROR and line.fields["folder"] == str(folder) and line.exc_info is None
    assert "\n" not in line.getMessage() + line.fields["error"]
    # not tried again while the link leads there; tried again once it leads elsewhere and back
    assert swapper_of(app).check() is None
    assert [r for r in caplog.records if r.name == "hosting.swap"] == [line]


@pytest.mark.real_model
def test_a_file_that_is_not_a_model_is_refused_and_the_old_model_keeps_answering(make_swap_app, make_body, weights,
                                                                                  tmp_path, caplog):
    """A network file that is no safetensors file is found by the folder's check (model.contract.check_network_file),
    which the swap runs, as the start does, before anything is built."""
    from hosting.build import load_corrector

    app = make_swap_app(build=lambda folder: build_fake(folder) if folder.name == "a" else load_corrector(
        Config(device="cpu", stage="net"), folder))
    folder = not_a_model(tmp_path / "not_a_model")
    caplog.set_level(logging.INFO, logger="hosting.swap")

    repoint(weights, folder)
    assert swapper_of(app).check() == FAILED

    assert answer(app, make_body, esun_uuid="after-the-failure").startswith(MARKS["a"])
    assert app.test_client().get("/readyz").status_code == 200
    [line] = [r for r in caplog.records if r.name == "hosting.swap"]
    # the start's check finds it, before the real corrector's setup would
    assert line.levelno == logging.ERROR and "is no whole safetensors file" in line.fields["error"]


@pytest.mark.real_model
def test_a_folder_fitted_with_a_masked_lm_the_server_lacks_is_refused_and_the_old_model_keeps_answering(
        make_swap_app, make_body, weights, tmp_path, caplog):
    """MLM_DIR is not set: the real corrector's setup refuses the folder in one line before anything changes."""
    from hosting.build import load_corrector
    from tests.model.tiny_mlm import tiny_masked_lm, weighing_folder

    app = make_swap_app(build=lambda folder: build_fake(folder) if folder.name == "a" else load_corrector(
        Config(device="cpu"), folder))
    folder = weighing_folder(tmp_path / "weighs_mlm", tiny_masked_lm(tmp_path / "mlm"))
    caplog.set_level(logging.INFO, logger="hosting.swap")

    repoint(weights, folder)
    assert swapper_of(app).check() == FAILED

    assert answer(app, make_body, esun_uuid="after-the-failure").startswith(MARKS["a"])
    [line] = [r for r in caplog.records if r.name == "hosting.swap"]
    assert "MaskedLMError" in line.fields["error"] and "set MLM_DIR" in line.fields["error"]
    assert "\n" not in line.fields["error"]


def test_a_retry_gets_its_first_attempts_answer_after_the_swap_and_a_new_question_the_new_model(
        make_swap_app, make_body, weights, tmp_path, request_paths):
    app = make_swap_app()
    first = answer(app, make_body, esun_uuid="asked-before", retry=2)
    shipped_copy(tmp_path / "b")
    repoint(weights, tmp_path / "b")
    assert swapper_of(app).check() == DONE

    assert answer(app, make_body, esun_uuid="asked-before", retry=1) == first
    assert answer(app, make_body, esun_uuid="asked-after", retry=2).startswith(MARKS["b"])
    assert request_paths() == ["model", "retry_cached", "model"]


def test_the_watcher_thread_swaps_within_its_poll_interval(make_swap_app, make_body, weights, tmp_path):
    app = make_swap_app(weights_poll_s=0.05)
    shipped_copy(tmp_path / "b")

    repoint(weights, tmp_path / "b")
    deadline = time.monotonic() + 5
    while swapper_of(app).folder != tmp_path / "b" and time.monotonic() < deadline:
        time.sleep(0.02)

    assert answer(app, make_body, esun_uuid="after-the-swap").startswith(MARKS["b"])


def test_no_question_is_answered_model_loading_while_the_new_folder_loads(make_swap_app, make_body, weights,
                                                                          tmp_path, request_paths):
    """The new corrector is built beside the old one: the old one answers until the new one is set up."""
    import threading

    gate = threading.Event()

    def slow_build(folder: Path) -> FolderCorrector:
        if folder.name == "b":
            gate.wait(timeout=10)
        return build_fake(folder)

    app = make_swap_app(build=slow_build)
    shipped_copy(tmp_path / "b")
    repoint(weights, tmp_path / "b")
    swap = threading.Thread(target=swapper_of(app).check)
    swap.start()

    answers = [answer(app, make_body, esun_uuid=f"while-loading-{i}") for i in range(3)]
    gate.set()
    swap.join(timeout=10)

    assert all(a.startswith(MARKS["a"]) for a in answers)
    assert request_paths() == ["model"] * 3
    assert answer(app, make_body, esun_uuid="after").startswith(MARKS["b"])


def test_a_link_repointed_to_a_folder_that_does_not_exist_is_refused_saying_so(make_swap_app, weights, tmp_path,
                                                                              caplog):
    """Issue 62: a swap to a dangling link said "incomplete: config.json, vocab.json, model.safetensors missing"."""
    app = make_swap_app()
    caplog.set_level(logging.INFO, logger="hosting.swap")

    repoint(weights, tmp_path / "no_such_run")
    assert swapper_of(app).check() == FAILED

    [line] = [r for r in caplog.records if r.name == "hosting.swap"]
    assert line.fields["error"] == f"{weights} leads to {tmp_path / 'no_such_run'}, which does not exist"
    assert swapper_of(app).folder == tmp_path / "a"


def test_the_folder_served_is_the_one_the_link_led_to_at_start_not_the_link(make_swap_app, weights, tmp_path):
    app = make_swap_app()

    assert swapper_of(app).folder == tmp_path / "a"
    assert swapper_of(app).served is not None and swapper_of(app).served.folder == tmp_path / "a"
    assert app.test_client().get("/").get_json()["serving"]["weights_dir"] == str(weights)
