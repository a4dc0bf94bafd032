"""What the fault tests send and read: judge-like questions and client, and the service's request log lines."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import requests

from batching import BatcherStats

# One Han character per question, from U+4E00 on, so each question's TOP1 tells which one it was.
_HAN_BASE = 0x4E00


class CountingBatcher(Protocol):
    """A batcher whose counters can be read: batching.Batcher or batching.process.ProcessBatcher."""

    def stats(self) -> BatcherStats: ...


def question(index: int, uuid_prefix: str = "fault") -> dict[str, Any]:
    """Build the judge's body for question `index`: a unique esun_uuid and a TOP1 unique to it."""
    mark = chr(_HAN_BASE + index)
    return {
        "esun_uuid": f"{uuid_prefix}-{index:05d}",
        "esun_timestamp": time.time(),
        "sentence_list": [f"喂 你好 {mark} 進去", f"喂 您好 {mark} 進去"],
        "phoneme_sequence_list": [],
        "retry": 2,
    }


def top1_of(body: dict[str, Any]) -> str:
    """Return the TOP1 answer of a body built by `question`."""
    return body["sentence_list"][0].replace(" ", "")


@dataclass(frozen=True)
class Answer:
    """One request as the client saw it."""

    body: dict[str, Any]
    status: int
    data: dict[str, Any]
    elapsed_s: float

    @property
    def answer(self) -> str:
        return self.data.get("answer", "")


class JudgeClient:
    """POST questions like the judge: a new connection each, the judge's timeout, and the time it took."""

    def __init__(self, base_url: str, timeout_s: float) -> None:
        self.base_url = base_url
        self.timeout_s = timeout_s
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            session.trust_env = False  # the server is on loopback: no proxy from the environment
        return session

    def post(self, body: dict[str, Any]) -> Answer:
        started = time.monotonic()
        response = self._session().post(f"{self.base_url}/inference", json=body, timeout=self.timeout_s,
                                        headers={"Connection": "close"})
        return Answer(body, response.status_code, response.json(), time.monotonic() - started)

    def ready(self) -> tuple[int, dict[str, Any]]:
        response = self._session().get(f"{self.base_url}/readyz", timeout=self.timeout_s,
                                       headers={"Connection": "close"})
        return response.status_code, response.json()


def request_lines(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Index the one-per-request log lines by esun_uuid."""
    return {line["esun_uuid"]: line for line in lines if line["logger"] == "api.requests"}


def wait_until(predicate: Callable[[], bool], timeout_s: float = 3.0, poll_s: float = 0.005) -> None:
    """Poll until predicate() holds; fail the test after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(poll_s)
