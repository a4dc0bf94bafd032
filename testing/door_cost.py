"""CPU of one door answer, in process: `python -m testing.door_cost [--answers 5000] [--rounds 3]`."""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from types import SimpleNamespace

from gunicorn.config import Config as GunicornConfig
from gunicorn.http import get_parser

from api.state import EXTENSION_KEY
from server.framing import RequestReader
from sidecar.log_writer import LOG_WRITER
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


def thread_parse_us(requests: list[bytes]) -> float:
    """µs of CPU for gunicorn's parser to read each request and its body, as a thread of the pool does."""
    cfg = GunicornConfig()
    cpu0 = time.process_time()
    for raw in requests:
        next(get_parser(cfg, SimpleNamespace(recv=io.BytesIO(raw).read), ("127.0.0.1", 0))).body.read()
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
        LOG_WRITER.start()  # as in gunicorn's worker: the lines go through the log writer's queue and thread
        state = create_fake_app().extensions[EXTENSION_KEY]
        for _ in range(state.config.pool_cap):
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
            LOG_WRITER.flush()  # the round's lines written, on the writer's thread, within the round's CPU
            results.append((time.process_time() - cpu0) / len(requests) * 1e6)
    finally:
        LOG_WRITER.stop()
        os.dup2(saved, 2)
    print(json.dumps({"us_cpu_per_door_answer": [round(r, 1) for r in results], "answers": args.answers,
                      "us_cpu_per_thread_parse": round(thread_parse_us(requests), 1),
                      "log_lines_dropped": LOG_WRITER.dropped,
                      "python": sys.version.split()[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
