"""Replica scaling on one host: 1, 2, 3 replicas behind nginx, closed-loop throughput and memory.

    .venv/bin/python -m testing.replicas [--replicas 1,2,3] [--clients 64] [--duration 15] [--out DIR] [--fake]
                                         [--server-setting TORCH_THREADS=1 ...]
    .venv/bin/python -m testing.bench --sections e          # the same, as the benchmark's section e

Each replica is gunicorn as `make run` starts it (testing/server.py: one worker process, the shipped corrector,
settings from the environment, no Redis), on its own loopback port; nginx is in front with the upstream and
proxy settings of deploy/nginx/ (deploy/nginx/proxy.conf is included as it is). Replicas are added one at a
time (the first is measured alone, then with a second, ...), and nginx is started anew over each set. The load is
the benchmark's closed loop (wrk with testing/wrk.lua, or testing/aioload.py without wrk) through nginx.
Reported per set: answers/s, p50/p99, failures, answers by path (from every replica's request log), each replica's
RSS and PSS (gunicorn master + worker), nginx's and the generator's CPU share.

Why one host: the question is what a second replica buys when the cores are already shared. On a 2-core machine
each replica's model batch and torch threads compete for the same two cores, so expect little more throughput and
one more model's memory per replica.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from testing import cli

with cli.dev_requirements("testing.replicas"):
    import psutil
    import requests

    from testing import aioload, wrkload
    from testing.report import MIB, count_paths, paths_by_uuid, summarise, tag_paths
    from testing.server import REPO_ROOT, ServerProcess, free_port, start_server

PROXY_CONF = REPO_ROOT / "deploy" / "nginx" / "proxy.conf"
BENCH_APP = "testing.bench_app:create_bench_app()"
FAKE_APP = "testing.bench_app:create_bench_app(fake=True)"
# nginx in front of the replicas: deploy/nginx/nginx.conf's upstream settings with static servers on loopback
# (no Docker DNS), one worker (a second would only take CPU from the replicas on 2 cores), no access log.
NGINX_CONF = """\
worker_processes 1;
error_log {tmp}/error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log off;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    upstream api {{
{servers}
        keepalive 64;
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


class NginxMissing(RuntimeError):
    """nginx is not installed (deploy/install_tools.sh installs Debian's)."""


def nginx_path() -> str | None:
    """Return nginx's path (Debian puts it in /usr/sbin, often off a user's PATH), None when missing."""
    return shutil.which("nginx") or next((str(p) for p in (Path("/usr/sbin/nginx"),) if os.access(p, os.X_OK)), None)


@contextlib.contextmanager
def running_nginx(replicas: list[ServerProcess], tmp: Path) -> Iterator[tuple[str, psutil.Process]]:
    """Run nginx over these replicas on a free loopback port; yield its URL and its master process."""
    nginx = nginx_path()
    if nginx is None:
        raise NginxMissing("nginx is not installed: run `bash deploy/install_tools.sh`")
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    servers = "\n".join(f"        server {r.url.removeprefix('http://')} max_fails=1 fail_timeout=10s;"
                        for r in replicas)
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, port=port, servers=servers, proxy_conf=PROXY_CONF), encoding="utf-8")
    process = subprocess.Popen([nginx, "-p", str(tmp), "-e", str(tmp / "error.log"), "-c", str(conf), "-g",
                                f"daemon off; pid {tmp / 'nginx.pid'};"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_up(url + "/readyz", process)
        yield url, psutil.Process(process.pid)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def _wait_up(url: str, process: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    with requests.Session() as http:
        http.trust_env = False
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"nginx exited with {process.returncode} before it answered")
            with contextlib.suppress(requests.RequestException):
                if http.get(url, timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
    raise TimeoutError(f"nginx did not answer {url} within {timeout_s:g} s")


def replica_memory(server: ServerProcess) -> dict[str, float]:
    """Return a replica's RSS and PSS in MiB: gunicorn's master and its worker(s) together."""
    rss = pss = 0
    with contextlib.suppress(psutil.NoSuchProcess):
        master = psutil.Process(server.process.pid)
        for process in [master, *master.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                info = process.memory_full_info()
                rss += info.rss
                pss += getattr(info, "pss", info.rss)
    return {"rss_mib": round(rss / MIB, 1), "pss_mib": round(pss / MIB, 1)}


def _cpu_s(process: psutil.Process) -> float:
    """CPU seconds (user + system) of a process and its children so far."""
    total = 0.0
    with contextlib.suppress(psutil.NoSuchProcess):
        for p in [process, *process.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = p.cpu_times()
                total += times.user + times.system
    return total


def measure_through(url: str, replicas: list[ServerProcess], nginx: psutil.Process, clients: int,
                    duration_s: float, templates: list[str]) -> dict[str, Any]:
    """Run one closed-loop point through nginx; summarise it with every replica's log and memory."""
    warmup_s = min(1.0, duration_s / 5)
    nginx_cpu0, wall0 = _cpu_s(nginx), time.perf_counter()
    if wrkload.wrk_path() is not None:
        shots, start, end, info = wrkload.closed_loop(url, clients, duration_s, warmup_s, templates)
        generator = {"generator": "wrk", "generator_cpu_pct": info["generator_cpu_pct"]}
    else:
        cpu0 = time.process_time()
        shots, start, end, info = aioload.closed_loop(url, clients, duration_s, warmup_s, templates)
        generator = {"generator": f"aioload ({info['event_loop']})",
                     "generator_cpu_pct": round(100 * (time.process_time() - cpu0) / (time.perf_counter() - wall0),
                                                1)}
    nginx_cpu_pct = round(100 * (_cpu_s(nginx) - nginx_cpu0) / (time.perf_counter() - wall0), 1)
    logs = [line for r in replicas for line in r.request_log()]
    shots = tag_paths(shots, paths_by_uuid(logs))
    per_replica = [count_paths(r.request_log(), start, end) for r in replicas]
    memory = [replica_memory(r) for r in replicas]
    return {"replicas": len(replicas), "clients": clients, "duration_s": duration_s,
            **summarise(shots, (start, end), count_paths(logs, start, end), None),
            "answers_per_replica": [sum(c.values()) for c in per_replica],
            "rss_mib_per_replica": [m["rss_mib"] for m in memory],
            "pss_mib_per_replica": [m["pss_mib"] for m in memory],
            "rss_mib_total": round(sum(m["rss_mib"] for m in memory), 1),
            "pss_mib_total": round(sum(m["pss_mib"] for m in memory), 1),
            "nginx_cpu_pct": nginx_cpu_pct, **generator, "_shots": shots, "_start": start}


def replica_section(counts: tuple[int, ...], clients: int, duration_s: float, templates: list[str], log_dir: Path,
                    fake: bool = False, settings: dict[str, str] | None = None) -> dict[str, Any]:
    """Measure 1..n replicas behind nginx (replicas added one at a time, nginx anew over each set); `settings`:
    environment variables for every replica (Config's), on top of make run's defaults."""
    replicas: list[ServerProcess] = []
    points = []
    app = FAKE_APP if fake else BENCH_APP
    try:
        for count in counts:
            while len(replicas) < count:
                name = f"replica-{len(replicas) + 1}"
                print(f"replicas: starting {name}", flush=True)
                replicas.append(start_server({"LOG_LEVEL": "INFO", **(settings or {})},
                                             log_dir / f"server-{name}.log", app=app))
            idle_memory = [replica_memory(r) for r in replicas]
            with running_nginx(replicas, log_dir / f"nginx-{count}") as (url, nginx):
                point = measure_through(url, replicas, nginx, clients, duration_s, templates)
            point["rss_mib_per_replica_before"] = [m["rss_mib"] for m in idle_memory]
            points.append(point)
            print(f"replicas: {count}: {point['throughput_rps']} req/s, p50 {point['p50_ms']} p99 {point['p99_ms']} "
                  f"ms, non-200 {point['non_200']}, RSS {point['rss_mib_per_replica']} MiB (total "
                  f"{point['rss_mib_total']}, PSS {point['pss_mib_total']}), paths {point['paths']}", flush=True)
    finally:
        for server in replicas:
            server.stop()
    return {"clients": clients, "duration_s": duration_s, "points": points, "replica_settings": settings or {},
            "settings": "make run's defaults (no Redis), one gunicorn worker per replica; nginx 1 worker"}


def main(argv: list[str] | None = None) -> int:
    from testing.bench import request_pool
    from testing.loadgen import payload_templates
    from testing.report import replica_markdown
    from testing.server import missing_weights

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m testing.replicas", description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", default="1,2,3", help="replica counts, in order (default 1,2,3)")
    parser.add_argument("--clients", type=int, default=64, help="closed-loop clients through nginx (default 64)")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds measured per count (default 15)")
    parser.add_argument("--out", type=Path, default=None, help="write replicas.json and replicas.md here")
    parser.add_argument("--fake", action="store_true", help="serve testing/fakes.py's FakeCorrector (smoke runs)")
    parser.add_argument("--server-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting (environment variable) for every replica, e.g. TORCH_THREADS=1; repeatable")
    args = parser.parse_args(argv)
    settings = dict(item.split("=", 1) for item in args.server_setting if "=" in item)
    if len(settings) != len(args.server_setting):
        raise cli.ToolError("--server-setting takes NAME=VALUE")
    counts = tuple(int(x) for x in args.replicas.split(",") if x.strip())
    if not counts or min(counts) < 1:
        raise cli.ToolError(f"--replicas must list counts of at least 1, got {args.replicas!r}")
    if not args.fake and (missing := missing_weights()):
        raise cli.ToolError(f"model/weights/ lacks {', '.join(missing)}: train the model first (make train)")
    if nginx_path() is None:
        raise cli.ToolError("nginx is not installed: run `bash deploy/install_tools.sh`")
    templates = payload_templates(request_pool(400))
    log_dir = Path(tempfile.mkdtemp(prefix="esun-replicas-"))
    try:
        result = replica_section(counts, args.clients, args.duration, templates, log_dir, args.fake, settings)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    for p in result["points"]:
        p.pop("_shots", None)
        p.pop("_start", None)
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    text = "\n".join(replica_markdown(result))
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "replicas.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        (args.out / "replicas.md").write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    cli.run(main, "testing.replicas")
