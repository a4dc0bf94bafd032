"""Two real replicas (gunicorn with server/gunicorn_conf.py) behind nginx (deploy/nginx/proxy.conf), sharing Redis.

What docker-compose.yml runs, without Docker: one replica is killed with SIGKILL under load, and

- no request fails: nginx re-sends the POSTs the dead replica dropped or refused to the other one;
- a retry of a question the dead replica answered lands on the other one and gets the corrected answer from
  Redis (not TOP1), without entering its model queue.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.procs import REPO_ROOT, find_tool, free_port, stop, wait_for
from tests.fakes import FakeCorrector

pytestmark = pytest.mark.live

GUNICORN = Path(sys.executable).parent / "gunicorn"
PROXY_CONF = REPO_ROOT / "deploy" / "nginx" / "proxy.conf"
CLIENTS = 8
LOAD_S = 1.6
KILL_AFTER_S = 0.6
JUDGE_TIMEOUT_S = 1.0
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


def start_replica(name: str, redis_url: str, tmp: Path, app: str = "tests.fakes:create_replica_app()") -> Replica:
    """Start gunicorn with the repository's config serving `app` on a free port, in its own process group."""
    port = free_port()
    env = {
        **os.environ, "HOST": "127.0.0.1", "PORT": str(port), "REDIS_URL": redis_url, "HTTP_THREADS": "16",
        "MAX_BATCH_SIZE": "8", "MAX_BATCH_WAIT_S": "0.01", "LOG_LEVEL": "WARNING", "FAKE_DELAY_S": "0.05",
        "REPLICA_NAME": name,
    }
    with open(tmp / f"replica-{name}.log", "wb") as log:  # a file, not a pipe: nobody must have to drain it
        process = subprocess.Popen(
            [str(GUNICORN), "-c", "server/gunicorn_conf.py", "--no-control-socket", app],
            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    return Replica(name, port, process)


def render_nginx_conf(tmp: Path, port: int, replicas: list[Replica]) -> Path:
    servers = "\n".join(f"        server {r.address} max_fails=1 fail_timeout=10s;" for r in replicas)
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, port=port, servers=servers, proxy_conf=PROXY_CONF))
    return conf


def http_ok(url: str) -> bool:
    return requests.get(url, timeout=1).status_code == 200


@pytest.fixture
def cluster(tmp_path: Path, redis_server: str, redis_client: Any) -> Iterator[Cluster]:
    """Redis, two replicas a and b, and nginx over them on free loopback ports."""
    nginx = find_tool("nginx")
    replicas = {name: start_replica(name, redis_server, tmp_path) for name in ("a", "b")}
    port = free_port()
    conf = render_nginx_conf(tmp_path, port, list(replicas.values()))
    proxy = subprocess.Popen(
        [nginx, "-p", str(tmp_path), "-e", str(tmp_path / "error.log"), "-c", str(conf),
         "-g", f"daemon off; pid {tmp_path / 'nginx.pid'};"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        for replica in replicas.values():
            wait_for(lambda r=replica: http_ok(f"http://{r.address}/readyz"), f"replica {replica.name}",
                     replica.process, timeout_s=30)
        wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), "nginx", proxy)
        yield Cluster(f"http://127.0.0.1:{port}", replicas, tmp_path)
    finally:
        stop(proxy)
        for replica in replicas.values():
            stop(replica.process)


def question(uuid: str, retry: int = 2) -> dict[str, Any]:
    return {"esun_uuid": uuid, "esun_timestamp": time.time(), "sentence_list": SENTENCES, "retry": retry}


def send(session: requests.Session, url: str, body: dict[str, Any]) -> Attempt:
    started = time.monotonic()
    try:
        response = session.post(f"{url}/inference", data=json.dumps(body), timeout=JUDGE_TIMEOUT_S)
    except requests.RequestException as exc:
        return Attempt(body, started, time.monotonic(), f"{type(exc).__name__}: {exc}")
    answer = response.json().get("answer") if response.status_code == 200 else None
    return Attempt(body, started, time.monotonic(), response.status_code, answer, response.headers.get("X-Replica"))


def load(url: str, index: int, stop_event: threading.Event, attempts: list[Attempt]) -> None:
    """Send new questions one after another, as one of the judge's concurrent senders."""
    with requests.Session() as session:
        session.trust_env = False
        number = 0
        while not stop_event.is_set():
            attempts.append(send(session, url, question(f"lb-{index}-{number}")))
            number += 1


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
