"""CPU of one door answer, in process: `python -m testing.door_cost [--answers 5000] [--rounds 3]`.

What the worker's event loop does for a `POST /inference` that the admission keeps from the model (the thread pool
full): frame the request as its bytes arrive (`server.framing.RequestReader`), ask the answer policy
(`AnswerPolicy.at_door`: parse, TOP1, the request's JSON log line and metrics, as served), and write the response's
bytes. The app is the service's own around tests/fakes.py's corrector (never asked: the pool is full), its log
lines written to /dev/null through stderr's descriptor as a served process writes them to its pipe. The requests
are the real competition requests of testing/data/ (1.0-1.5 kB), each with a new `esun_uuid`, sent as the judge's
client sends them. Prints µs of process CPU per answer, each round, and what gunicorn's parser then costs the thread
of a request the door hands on (its second reading of the same bytes, server/framing.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from gunicorn.config import Config as GunicornConfig
from gunicorn.http import get_parser

from api.state import EXTENSION_KEY
from server.framing import RequestReader
from testing.samples import real_bodies
from tests.fakes import create_fake_app


def raw_requests(n: int) -> list[bytes]:
    """n HTTP/1.1 requests of the real bodies, each with its own esun_uuid."""
    bodies = real_bodies()
    out = []
    for i in range(n):
        body = json.dumps(bodies[i % len(bodies)] | {"esun_uuid": f"door-{i}"}, ensure_ascii=False).encode()
        out.append(b"POST /inference HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: python-requests/2.34.2\r\n"
                   b"Accept-Encoding: gzip, deflate\r\nAccept: */*\r\nConnection: keep-alive\r\n"
                   b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    return out


class _Bytes:
    """A socket that holds one request's bytes, for gunicorn's parser."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def recv(self, size: int) -> bytes:
        chunk, self.data = self.data[:size], self.data[size:]
        return chunk


def thread_parse_us(requests: list[bytes]) -> float:
    """µs of CPU for gunicorn's parser to read each request and its body, as a thread of the pool does."""
    cfg = GunicornConfig()
    cpu0 = time.process_time()
    for raw in requests:
        next(get_parser(cfg, _Bytes(raw), ("127.0.0.1", 0))).body.read()
    return (time.process_time() - cpu0) / len(requests) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="µs of CPU per door answer, in process.")
    ap.add_argument("--answers", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    requests = raw_requests(args.answers)
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    results = []
    try:
        os.dup2(devnull, 2)
        state = create_fake_app().extensions[EXTENSION_KEY]
        for _ in range(state.config.http_threads):
            state.admission.enter_pool()  # the pool is full: the door answers every question
        max_body = state.config.max_body_bytes
        for _ in range(args.rounds):
            cpu0 = time.process_time()
            for raw in requests:
                reader = RequestReader(max_body)
                reader.feed(raw)
                body = state.answers.at_door(bytes(reader.body), time.monotonic())
                assert body is not None
                reader.response(200, body, keep_alive=True)
            results.append((time.process_time() - cpu0) / len(requests) * 1e6)
    finally:
        os.dup2(saved, 2)
    print(json.dumps({"us_cpu_per_door_answer": [round(r, 1) for r in results], "answers": args.answers,
                      "us_cpu_per_thread_parse": round(thread_parse_us(requests), 1),
                      "python": sys.version.split()[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
