"""Over real HTTP: a threaded werkzeug server on a loopback port, serving a fake corrector."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from preprocess.text import top1_answer

pytestmark = pytest.mark.live

RESPONSE_KEYS = {"esun_uuid", "server_uuid", "server_timestamp", "answer"}
JUDGE_TIMEOUT_S = 1.0


def test_live_inference_answers_real_samples(live_server, http, real_requests):
    for body in real_requests:
        response = http.post(f"{live_server}/inference", json=body, timeout=JUDGE_TIMEOUT_S)
        assert response.status_code == 200
        data = response.json()
        assert set(data) == RESPONSE_KEYS
        assert data["answer"] and " " not in data["answer"]


def test_live_inference_reads_body_sent_without_content_type(live_server, http, real_requests):
    body = json.dumps(real_requests[0]).encode()
    response = http.post(f"{live_server}/inference", data=body, timeout=JUDGE_TIMEOUT_S)
    assert "Content-Type" not in response.request.headers
    assert response.status_code == 200
    assert set(response.json()) == RESPONSE_KEYS


def test_live_inference_serves_ten_concurrent_clients_within_the_judge_timeout(
    live_server, http, real_requests, corrector
):
    def client(index: int) -> list[tuple[int, set[str], float]]:
        results = []
        for round_ in range(3):
            for body in real_requests:
                body = {**body, "esun_uuid": f"{body['esun_uuid'][:56]}-{index:02d}-{round_}"}
                started = time.monotonic()
                response = http.post(f"{live_server}/inference", json=body, timeout=JUDGE_TIMEOUT_S)
                results.append((response.status_code, set(response.json()), time.monotonic() - started))
        return results

    with ThreadPoolExecutor(max_workers=10) as pool:
        results = [r for rs in pool.map(client, range(10)) for r in rs]
    assert len(results) == 10 * 3 * len(real_requests)
    assert all(status == 200 for status, _, _ in results)
    assert all(keys == RESPONSE_KEYS for _, keys, _ in results)
    assert max(elapsed for _, _, elapsed in results) < JUDGE_TIMEOUT_S
    # Concurrent questions share model calls.
    assert corrector.calls < len(results)


def test_live_inference_answers_top1_when_deadline_passes_then_retry_gets_late_answer(
    make_app, make_live_server, fake_corrector, config, http, make_body
):
    slow = fake_corrector(delay_s=config.budget_s + 0.2)
    base = make_live_server(make_app(corrector=slow))
    body = make_body()
    started = time.monotonic()
    response = http.post(f"{base}/inference", json=body, timeout=JUDGE_TIMEOUT_S)
    assert time.monotonic() - started < config.judge_timeout_s
    assert response.json()["answer"] == top1_answer(body["sentence_list"])

    time.sleep(0.4)  # the model finishes after its request gave up
    retry = http.post(f"{base}/inference", json={**body, "retry": "1"}, timeout=JUDGE_TIMEOUT_S)
    assert retry.json()["answer"].startswith(slow.MARK)


def test_live_inference_rejects_chunked_body_over_max_body_bytes(live_server, http, config):
    def chunks():
        for _ in range(config.max_body_bytes // 1024 + 2):
            yield b" " * 1024

    response = http.post(f"{live_server}/inference", data=chunks(), timeout=5)
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"


@pytest.mark.parametrize(("extra", "status"), [(0, 200), (1, 413)], ids=["at-the-limit", "one-byte-over"])
def test_live_inference_takes_a_chunked_body_up_to_max_body_bytes_as_one_with_content_length(
    live_server, http, config, make_body, extra, status
):
    """Regression: a chunked body of exactly max_body_bytes was refused (413) while the same body sent with a
    Content-Length was answered."""
    text = json.dumps(make_body()).encode()
    body = text + b" " * (config.max_body_bytes - len(text) + extra)

    def chunks():
        for start in range(0, len(body), 1024):
            yield body[start:start + 1024]

    chunked = http.post(f"{live_server}/inference", data=chunks(), timeout=5)
    with_length = http.post(f"{live_server}/inference", data=body, timeout=5)
    assert (chunked.status_code, with_length.status_code) == (status, status)
