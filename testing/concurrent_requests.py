"""Send N different requests to /inference at once and check every answer as the judge would."""

# grequests monkey-patches the standard library (gevent) on import: only testing.cli may come before it.
from testing import cli  # isort: skip

with cli.dev_requirements("testing.concurrent_requests"):
    import grequests
    import requests
    from requests.adapters import HTTPAdapter

    from testing.samples import REAL_REQUESTS, check_answer, request_bodies
    from testing.shots import Shot

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402


def send_all(url: str, n: int, size: int | None, timeout_s: float, samples: Path) -> tuple[list[Shot], float]:
    """Send n different bodies concurrently; return each one's shot (`question`: its index), in order, and the total
    wall time."""
    # each under a new random esun_uuid, 64 hex characters like the judge's
    bodies = [{**body, "esun_uuid": uuid.uuid4().hex + uuid.uuid4().hex} for body in request_bodies(n, path=samples)]
    session = requests.Session()
    session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=max(n, 1)))
    session.trust_env = urlsplit(url).hostname not in ("127.0.0.1", "localhost", "::1")
    pending = [grequests.post(f"{url.rstrip('/')}/inference", json=body, timeout=timeout_s, session=session)
               for body in bodies]
    errors: dict[int, BaseException] = {}

    def on_error(request: grequests.AsyncRequest, exc: BaseException) -> None:
        errors[pending.index(request)] = exc

    started = time.perf_counter()
    responses = grequests.map(pending, size=size, exception_handler=on_error)
    total_s = time.perf_counter() - started
    session.close()
    return [_result(i, body, responses[i], errors.get(i)) for i, body in enumerate(bodies)], total_s


def _result(index: int, body: dict, response: requests.Response | None, error: BaseException | None) -> Shot:
    uuid = body["esun_uuid"]
    if response is None:
        return Shot(0, float("nan"), 0, f"no answer: {type(error).__name__}: {error}", esun_uuid=uuid, question=index)
    problem = check_answer(response.status_code, response.content, uuid)
    return Shot(0, response.elapsed.total_seconds(), response.status_code, problem, esun_uuid=uuid, question=index,
                answer=response.json()["answer"] if problem is None else "")


def report(results: list[Shot], total_s: float) -> str:
    """Render one line per request, then the totals."""
    lines = [f"{'#':>3}  {'status':>6}  {'latency':>9}  {'esun_uuid':<16}  answer / problem"]
    for r in results:
        latency = f"{r.latency_s * 1000:7.1f}ms" if r.status else "        -"
        text = f"FAIL {r.problem}" if r.problem else r.answer
        lines.append(f"{r.question:>3}  {r.status or '-':>6}  {latency}  {r.esun_uuid[:16]:<16}  {text}")
    failed = sum(r.problem is not None for r in results)
    answered = [r.latency_s for r in results if r.status]
    slowest = f", slowest {max(answered) * 1000:.1f} ms" if answered else ""
    lines.append(f"{len(results)} requests in {total_s * 1000:.1f} ms total{slowest}; "
                 f"{len(results) - failed} valid, {failed} failed")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the service's base URL")
    parser.add_argument("-n", type=int, default=10, help="how many requests to send at once (default 10)")
    parser.add_argument("--size", type=int, default=None, help="grequests pool size: at most this many in flight")
    parser.add_argument("--timeout", type=float, default=1.0, help="seconds before a request fails (the judge's 1)")
    parser.add_argument("--samples", type=Path, default=REAL_REQUESTS, help="JSONL bodies to start from")
    args = parser.parse_args(argv)
    if args.n < 1:
        print("-n must be >= 1", file=sys.stderr)
        return 2
    results, total_s = send_all(args.url, args.n, args.size, args.timeout, args.samples)
    print(report(results, total_s))
    return 1 if any(r.problem for r in results) else 0


if __name__ == "__main__":
    cli.run(main, "testing.concurrent_requests")
