"""Two real replicas (gunicorn with server/gunicorn_conf.py) behind nginx (deploy/nginx/proxy.conf and the
upstream servers' failure marking of deploy/nginx/nginx-1.22.conf), sharing Redis.

What docker-compose.yml runs, without Docker: one replica is killed with SIGKILL under load, and

- no request fails: nginx re-sends the POSTs the dead replica dropped or refused to the other one;
- a retry of a question the dead replica answered lands on the other one and gets the corrected answer from
  Redis (not TOP1), without entering its model queue;
- with the shipped model (as `make run` serves it, issue 40): no answer is late either, every retry gets its
  question's first answer, and the killed replica, started again, gets traffic within 10 s of its /readyz 200.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from testing.samples import request_bodies
from tests.deploy.procs import REPO_ROOT, find_tool, free_port, stop, wait_for
from tests.fakes import FakeCorrector

pytestmark = pytest.mark.live

GUNICORN = Path(sys.executable).parent / "gunicorn"
PROXY_CONF = REPO_ROOT / "deploy" / "nginx" / "proxy.conf"
# The upstream's `server` lines are compose's (the Debian nginx's, which resolves `api` once), one per replica.
UPSTREAM_CONF = REPO_ROOT / "deploy" / "nginx" / "nginx-1.22.conf"
SERVER_LINE = re.compile(r"^\s*server api:8080( [^;]*)?;", re.MULTILINE)
CLIENTS = 8
LOAD_S = 1.6
KILL_AFTER_S = 0.6
JUDGE_TIMEOUT_S = 1.0
READY_TIMEOUT_S = 240.0  # two replicas loading the shipped model at once on a busy 2-core machine
SENTENCES = ["喂 你好 密碼 我 要 進去", "喂 你好 密碼 哇 進去"]

NGINX_CONF = """\
worker_processes 1;
events {{ worker_connections 256; }}
http {{
    log_format judge '$status upstream=$upstream_addr ustatus=$upstream_status';
    access_log {tmp}/access.log judge;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream api {{
{servers}
        keepalive 16;
        keepalive_timeout 4s;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            include {proxy_conf};
            # Which replicas each request went to, in order, for the client to see (not in compose's config).
            add_header X-Upstream $upstream_addr always;
        }}
    }}
}}
"""


@dataclass
class Replica:
    name: str
    port: int
    process: subprocess.Popen[bytes]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class Cluster:
    url: str
    replicas: dict[str, Replica]
    tmp: Path
    redis_url: str

    def access_log(self) -> list[str]:
        return (self.tmp / "access.log").read_text().splitlines()


@dataclass
class Attempt:
    body: dict[str, Any]
    started: float
    ended: float
    status: int | str
    answer: str | None = None
    replica: str | None = None
    upstreams: tuple[str, ...] = ()  # the replicas nginx tried, in order (its $upstream_addr)

    @property
    def in_time(self) -> bool:
        return self.status == 200 and self.ended - self.started <= JUDGE_TIMEOUT_S


FAKE_REPLICA = ("tests.fakes:create_replica_app()", {
    "HTTP_THREADS": "16", "MAX_BATCH_SIZE": "8", "MAX_BATCH_WAIT_S": "0.01", "LOG_LEVEL": "WARNING",
    "FAKE_DELAY_S": "0.05"})
# `make run`'s app and settings, except torch's threads: two replicas share this machine's cores, one each
# (compose gives each container its own cores).
SHIPPED_REPLICA = ("api:create_app()", {"TORCH_THREADS": "1", "LOG_LEVEL": "INFO"})


def start_replica(name: str, redis_url: str, tmp: Path, kind: tuple[str, dict[str, str]] = FAKE_REPLICA,
                  port: int | None = None) -> Replica:
    """Start gunicorn with the repository's config serving `kind`'s app on a free port (or `port`), in its own
    process group."""
    app, settings = kind
    port = port or free_port()
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "REDIS_URL": redis_url, "REPLICA_NAME": name,
           **settings}
    with open(tmp / f"replica-{name}.log", "ab") as log:  # a file, not a pipe: nobody must have to drain it
        process = subprocess.Popen(
            [str(GUNICORN), "-c", "server/gunicorn_conf.py", "--no-control-socket", app],
            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    return Replica(name, port, process)


def render_nginx_conf(tmp: Path, port: int, addresses: list[str]) -> Path:
    """Write nginx's config: compose's upstream `server` lines, each once per address, and deploy/nginx/proxy.conf."""
    shipped = [match.group(1) or "" for match in SERVER_LINE.finditer(UPSTREAM_CONF.read_text())]
    assert shipped, f"no `server api:8080 ...;` line in {UPSTREAM_CONF}"
    servers = "\n".join(f"        server {address}{params};" for params in shipped for address in addresses)
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, port=port, servers=servers, proxy_conf=PROXY_CONF))
    return conf


def start_nginx(tmp: Path, addresses: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    """Start nginx over these upstream addresses on a free loopback port; return it and its port."""
    port = free_port()
    conf = render_nginx_conf(tmp, port, addresses)
    proxy = subprocess.Popen(
        [find_tool("nginx"), "-p", str(tmp), "-e", str(tmp / "error.log"), "-c", str(conf),
         "-g", f"daemon off; pid {tmp / 'nginx.pid'};"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    return proxy, port


def http_ok(url: str) -> bool:
    return requests.get(url, timeout=1).status_code == 200


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path, redis_server: str, redis_client: Any) -> Iterator[Cluster]:
    """Redis, two replicas a and b (the fake model's, or `kind` as the test's parameter), and nginx over them on
    free loopback ports."""
    find_tool("nginx")  # before the replicas: a missing nginx fails at once
    kind = getattr(request, "param", FAKE_REPLICA)
    replicas = {name: start_replica(name, redis_server, tmp_path, kind) for name in ("a", "b")}
    proxy, port = start_nginx(tmp_path, [r.address for r in replicas.values()])
    try:
        for replica in replicas.values():
            wait_for(lambda r=replica: http_ok(f"http://{r.address}/readyz"), f"replica {replica.name}",
                     replica.process, timeout_s=30 if kind is FAKE_REPLICA else READY_TIMEOUT_S)
        wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), "nginx", proxy)
        yield Cluster(f"http://127.0.0.1:{port}", replicas, tmp_path, redis_server)
    finally:
        stop(proxy)
        for replica in replicas.values():  # the one a test started again included
            stop(replica.process)


def question(uuid: str, retry: int = 2) -> dict[str, Any]:
    return {"esun_uuid": uuid, "esun_timestamp": time.time(), "sentence_list": SENTENCES, "retry": retry}


def send(session: requests.Session, url: str, body: dict[str, Any]) -> Attempt:
    started = time.monotonic()
    try:
        response = session.post(f"{url}/inference", data=json.dumps(body), timeout=JUDGE_TIMEOUT_S)
    except requests.RequestException as exc:
        return Attempt(body, started, time.monotonic(), f"{type(exc).__name__}: {exc}")
    ended = time.monotonic()
    answer = response.json().get("answer") if response.status_code == 200 else None
    upstreams = tuple(a.strip() for a in response.headers.get("X-Upstream", "").split(",") if a.strip())
    return Attempt(body, started, ended, response.status_code, answer, response.headers.get("X-Replica"), upstreams)


def load(url: str, index: int, stop_event: threading.Event, attempts: list[Attempt],
         make_question: Callable[[str], dict[str, Any]] = question) -> None:
    """Send new questions one after another, as one of the judge's concurrent senders."""
    with requests.Session() as session:
        session.trust_env = False
        number = 0
        while not stop_event.is_set():
            attempts.append(send(session, url, make_question(f"lb-{index}-{number}-{uuid.uuid4().hex[:8]}")))
            number += 1


@contextmanager
def clients(url: str, attempts: list[Attempt], make_question: Callable[[str], dict[str, Any]] = question,
            ) -> Iterator[threading.Event]:
    """Run CLIENTS closed-loop senders while the block runs (or until the event it yields is set)."""
    stop_event = threading.Event()
    threads = [threading.Thread(target=load, args=(url, i, stop_event, attempts, make_question), daemon=True)
               for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    try:
        yield stop_event
    finally:
        stop_event.set()
        for thread in threads:
            thread.join(timeout=JUDGE_TIMEOUT_S + 1)


def metric(url: str, name: str, **labels: str) -> float:
    text = requests.get(f"{url}/metrics", timeout=1).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise KeyError(name)


def test_nginx_keeps_every_request_answered_when_a_replica_is_killed_and_retries_get_shared_answers(cluster):
    victim, survivor = cluster.replicas["a"], cluster.replicas["b"]
    attempts: list[Attempt] = []
    stop_event = threading.Event()
    clients = [threading.Thread(target=load, args=(cluster.url, i, stop_event, attempts), daemon=True)
               for i in range(CLIENTS)]
    for thread in clients:
        thread.start()
    time.sleep(KILL_AFTER_S)
    killed_at = time.monotonic()
    # The whole replica, as `docker kill` does: gunicorn's master and its worker (the worker alone would go on
    # serving until it noticed its master gone).
    os.killpg(victim.process.pid, signal.SIGKILL)
    time.sleep(LOAD_S - KILL_AFTER_S)
    stop_event.set()
    for thread in clients:
        thread.join(timeout=JUDGE_TIMEOUT_S + 1)

    failed = [a for a in attempts if a.status != 200]
    assert not failed, f"{len(failed)} of {len(attempts)} requests failed: {[a.status for a in failed[:5]]}"
    assert {a.replica for a in attempts if a.ended < killed_at} == {"a", "b"}, "load did not reach both replicas"
    assert all(a.replica == "b" for a in attempts if a.started > killed_at + 0.1)
    # nginx logs the upstreams it tried: a request the dead replica dropped or refused went on to the other.
    retried = [line for line in cluster.access_log() if f"{victim.address}, {survivor.address}" in line]
    assert retried, "no request was passed on from the killed replica: the test proves nothing"
    assert all(re.search(r"^200 .* ustatus=(502|504|-), 200$", line) for line in retried), retried[:3]

    # Retries of questions the dead replica answered with the model: all go to b, which has them from Redis.
    answered_by_victim = [a for a in attempts if a.replica == "a" and a.answer == FakeCorrector.MARK + "".join(
        SENTENCES[0].split())]
    assert answered_by_victim
    before = metric(f"http://{survivor.address}", "esun_cache_lookups_total", level="redis", result="hit")
    with requests.Session() as session:
        session.trust_env = False
        retries = [send(session, cluster.url, {**a.body, "retry": 1}) for a in answered_by_victim]
    assert [(r.status, r.replica, r.answer) for r in retries] == [(200, "b", a.answer) for a in answered_by_victim]
    survivor_url = f"http://{survivor.address}"
    assert metric(survivor_url, "esun_cache_lookups_total", level="redis", result="hit") - before == len(retries)
    assert metric(survivor_url, "esun_request_duration_seconds_count", path="retry_top1") == 0
    print(f"\nload balancer: {len(attempts)} requests through nginx, {len(retried)} passed on from the killed "
          f"replica, {len(retries)} retries answered from Redis")


# The real competition lists (testing/data/real_requests.jsonl) and variations of them, as the load tools send.
REAL_LISTS = [body["sentence_list"] for body in request_bodies(400)]


def real_question(esun_uuid: str) -> dict[str, Any]:
    """One of REAL_LISTS under a new esun_uuid."""
    return {"esun_uuid": esun_uuid, "esun_timestamp": time.time(), "retry": 2,
            "sentence_list": REAL_LISTS[zlib.crc32(esun_uuid.encode()) % len(REAL_LISTS)]}


def late_or_failed(attempts: list[Attempt]) -> list[tuple[int | str, float, tuple[str, ...]]]:
    return [(a.status, round(a.ended - a.started, 3), a.upstreams) for a in attempts if not a.in_time]


@pytest.mark.parametrize("cluster", [SHIPPED_REPLICA], indirect=True, ids=["shipped-model"])
def test_nginx_answers_every_request_in_time_when_a_shipped_model_replica_is_killed_and_takes_it_back(
    cluster, redis_client,
):
    """Issue 40: compose's stack lost 5, 41 and 3 requests in three of four kills (late, or nginx's own 502 when the
    survivor was marked down inside the dead one's fail_timeout). With the shipped model on both replicas, under
    CLIENTS closed-loop clients, one replica is killed (SIGKILL to its process group): 0 non-200 and 0 answers later
    than the judge's 1 s, and a retry of every question answered gets its first answer. Then it is started again
    on its port: nginx sends it questions within 10 s of its /readyz saying 200."""
    victim, survivor = cluster.replicas["a"], cluster.replicas["b"]
    attempts: list[Attempt] = []
    with clients(cluster.url, attempts, real_question):
        time.sleep(3.0)
        killed_at = time.monotonic()
        os.killpg(victim.process.pid, signal.SIGKILL)
        time.sleep(4.0)
    victim.process.wait(timeout=5)

    assert not late_or_failed(attempts), f"{len(late_or_failed(attempts))} of {len(attempts)} requests not " \
                                         f"answered 200 within 1 s: {late_or_failed(attempts)[:8]}"
    before = [a for a in attempts if a.ended < killed_at]
    assert {a.upstreams[-1] for a in before} == {victim.address, survivor.address}, "load missed a replica"
    passed_on = [a for a in attempts if a.upstreams[:1] == (victim.address,) and len(a.upstreams) > 1]
    assert passed_on, "no request was passed on from the killed replica: the test proves nothing"

    with requests.Session() as session:
        session.trust_env = False
        retries = [send(session, cluster.url, {**a.body, "retry": 1}) for a in attempts]
    assert not late_or_failed(retries), late_or_failed(retries)[:8]
    # A retry gets its question's first answer, from the answering replica's cache or from Redis. The one exception
    # is by design (cache/layered.py): an answer reaches Redis from a write-behind queue a moment after its response
    # left, and the killed replica lost the writes still queued; a retry of such a question answers TOP1 at once
    # (path retry_top1), never another model answer. (The judge retries only a question it got no answer to.)
    lost, different = [], []
    for first, retry in zip(attempts, retries, strict=True):
        if retry.answer == first.answer:
            continue
        # (Answered by the killed replica: its client may see the answer a few ms after the kill was sent.)
        unwritten = first.upstreams[-1:] == (victim.address,) and \
            not redis_client.exists(f"esun:answer:{first.body['esun_uuid']}") and \
            retry.answer == "".join(first.body["sentence_list"][0].split())
        (lost if unwritten else different).append((first.body["esun_uuid"], first.answer, retry.answer,
                                                   round(killed_at - first.ended, 3)))
    assert not different, f"{len(different)} of {len(retries)} retries got another answer: {different[:5]}"
    assert all(x[3] < 1.0 for x in lost), f"answers a second old were not yet in Redis: {lost[:5]}"

    restarted = start_replica("a", cluster.redis_url, cluster.tmp, SHIPPED_REPLICA, port=victim.port)
    cluster.replicas["a"] = restarted
    wait_for(lambda: http_ok(f"http://{restarted.address}/readyz"), "replica a again", restarted.process,
             timeout_s=READY_TIMEOUT_S)
    ready_at = time.monotonic()
    back: list[Attempt] = []
    with clients(cluster.url, back, real_question) as stop_event:
        while time.monotonic() < ready_at + 10 and not any(a.upstreams[-1:] == (victim.address,) for a in back):
            time.sleep(0.05)
        stop_event.set()
    to_victim = [a for a in back if a.upstreams[-1:] == (victim.address,) and a.status == 200]
    assert to_victim, f"the replica started again got no answered request within 10 s of /readyz 200 ({len(back)} sent)"
    assert not late_or_failed(back), late_or_failed(back)[:8]
    print(f"\nshipped model behind nginx: {len(attempts)} requests, {len(passed_on)} passed on from the killed "
          f"replica, slowest {max(a.ended - a.started for a in attempts):.3f} s; {len(retries)} retries, "
          f"{len(retries) - len(lost)} with the first answer, {len(lost)} TOP1 (answered by the killed replica "
          f"{', '.join(str(x[3]) for x in lost) or '-'} s before the kill, not yet in Redis); the restarted "
          f"replica answered {to_victim[0].ended - ready_at:.2f} s after its /readyz 200")


class FailsOnce(BaseHTTPRequestHandler):
    """A replica whose first POST fails with 503 (which nginx counts against it), then answers 200."""

    posts = 0

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).posts += 1
        status = 503 if type(self).posts == 1 else 200
        body = b'{"answer": "ok"}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_nginx_tries_the_last_live_replica_when_every_replica_is_marked_failed(tmp_path: Path) -> None:
    """Regression (issue 40, run 2 of docs/deploy.md): with max_fails=1, a question whose try on the surviving
    replica failed and which nginx then passed to the dead one marked both down, and for the dead one's
    fail_timeout nginx answered every question 502 itself, asking neither. The shipped upstream lists the replicas
    again as backups that are never marked down, so the live one is still asked."""
    FailsOnce.posts = 0
    live = ThreadingHTTPServer(("127.0.0.1", 0), FailsOnce)
    threading.Thread(target=live.serve_forever, daemon=True).start()
    dead = f"127.0.0.1:{free_port()}"  # nothing listens: refused, as a killed replica's port
    # The live replica first: round robin asks it first, its 503 counts (a try is left), then the dead one refuses.
    proxy, port = start_nginx(tmp_path, [f"127.0.0.1:{live.server_address[1]}", dead])
    try:
        # Listening is enough: a request would count against the upstreams before the test's own.
        wait_for(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() is None, "nginx", proxy)
        with requests.Session() as session:
            session.trust_env = False
            answers = [session.post(f"http://127.0.0.1:{port}/inference", data="{}", timeout=2) for _ in range(3)]
        tried = [a.headers.get("X-Upstream") for a in answers]
        assert FailsOnce.posts >= 2 and tried[0].startswith(f"127.0.0.1:{live.server_address[1]}, {dead}"), tried
        assert [a.status_code for a in answers] == [200, 200, 200], (tried, (tmp_path / "error.log").read_text())
    finally:
        stop(proxy)
        live.shutdown()
        live.server_close()
