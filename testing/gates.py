"""Each gate that keeps a question from the model, shown acting: `python -m testing.gates [--seconds S] [--out DIR]`."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from testing import load
from testing.load import JUDGE_TIMEOUT_S, Target, fresh_payload, payload_templates
from testing.report import count_paths, table, write_json
from testing.samples import request_bodies
from testing.server import FAKE_APP, start_server

SLOW = {"FAKE_DELAY_S": "0.4", "MAX_BATCH_SIZE": "8", "HTTP_THREADS": "32", "MAX_BATCH_WAIT_S": "0.05"}
# settings, and the offered load: a multiple of the model's capacity (8 questions a batch / FAKE_DELAY_S)
SCENARIOS: dict[str, tuple[dict[str, str], float]] = {
    "slow model": (SLOW, 3.0),
    "slow model, 5x": (SLOW, 5.0),
}
SENDER_DELAY_S = 0.7


async def slow_send(url: str, template: str) -> int:
    """Send one request's head and the first byte of its body, the rest SENDER_DELAY_S later; return the status."""
    target = Target.from_url(url)
    reader, writer = await asyncio.open_connection(target.host, target.port)
    body = fresh_payload(template)[1]
    request = target.request(body)
    writer.write(request[:len(request) - len(body) + 1])
    await writer.drain()
    await asyncio.sleep(SENDER_DELAY_S)
    writer.write(body[1:])
    status = int((await reader.readline()).split()[1])
    writer.close()
    return status


def run(name: str, settings: dict[str, str], factor: float, seconds: float, templates: list[str],
        log_dir: Path) -> dict[str, Any]:
    with start_server(settings, log_dir / f"{name.replace(' ', '-')}.log", app=FAKE_APP) as server:
        if name == "slow senders":
            async def senders() -> list[int]:
                return await asyncio.gather(*(slow_send(server.url, t) for t in templates[:20]))

            start = time.time()
            statuses = asyncio.run(senders())
            end, late, offered = time.time(), None, None
        else:
            offered = factor * 8 / float(settings["FAKE_DELAY_S"])
            point = load.run(load.open_loop(server.url, offered, seconds, 2.0, templates))
            start, end, statuses = point.start, point.end, [shot.status for shot in point.shots]
            late = sum(shot.latency_s > JUDGE_TIMEOUT_S for shot in point.shots)
        paths = count_paths(server.request_log(), start, end)
    return {"scenario": name, "settings": settings, "offered_rps": offered, "sent": len(statuses),
            "non_200": sum(s != 200 for s in statuses), "late": late, "paths": dict(sorted(paths.items()))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Each admission gate shown acting, around a slow fake model.")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds of load per scenario")
    ap.add_argument("--out", type=Path, default=Path("out/gates"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    templates = payload_templates(request_bodies(400))
    results = [run(name, settings, factor, args.seconds, templates, args.out)
               for name, (settings, factor) in [*SCENARIOS.items(), ("slow senders", (SLOW, 0.0))]]
    print("\n".join(table("scenario | offered/s | sent | non-200 | later than the judge's timeout | answers by path",
                          [[r["scenario"], r["offered_rps"], r["sent"], r["non_200"], r["late"] or 0, r["paths"]]
                           for r in results])))
    write_json(args.out / "gates.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
