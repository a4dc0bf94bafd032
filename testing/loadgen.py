"""What the load tools share: one `Shot` per request, payload templates, timeouts, the one percentile."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

JUDGE_TIMEOUT_S = 1.0
# Clients wait longer than the judge, to see how late a late answer is.
CLIENT_TIMEOUT_S = 5.0
UUID_MARK = "@@ESUN_UUID@@"
# How a Shot's problem starts when no answer came: its connection failed, or nothing came in the client's timeout.
CONNECTION_PROBLEM = "connection: "
TIMEOUT_PROBLEM = "timeout: "


@dataclass(frozen=True)
class Shot:
    """One request: when it was due (wall clock; latency counts from it, lag included), how long it took, its status
    (0: no answer), its problem (None: valid), the generator's lag, its esun_uuid and (`report.tag_paths`) its path."""

    due: float
    latency_s: float
    status: int
    problem: str | None
    lag_s: float = 0.0
    esun_uuid: str = ""
    path: str | None = None

    @property
    def valid(self) -> bool:
        return self.problem is None

    @property
    def done(self) -> float:
        return self.due + self.latency_s


def payload_templates(bodies: list[dict[str, Any]]) -> list[str]:
    """Serialise each body once, with a mark where each request puts its own esun_uuid (client CPU is scarce)."""
    return [json.dumps({**body, "esun_uuid": UUID_MARK}, ensure_ascii=False) for body in bodies]


def fresh_payload(template: str) -> tuple[str, bytes]:
    """Return a new esun_uuid (64 hex, like the judge's) and the template's body under it."""
    esun_uuid = uuid.uuid4().hex + uuid.uuid4().hex
    return esun_uuid, template.replace(UUID_MARK, esun_uuid).encode("utf-8")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Return the q-th percentile (nearest rank: a latency some request really had) of values, None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def cpu_figures(cpu_s: float, wall_s: float) -> dict[str, float]:
    """A load generator's own CPU over a run, as a share of one core (it shares the machine with the server)."""
    return {"generator_cpu_pct": round(100 * cpu_s / wall_s, 1) if wall_s > 0 else 0.0,
            "generator_cpu_s": round(cpu_s, 3), "generator_wall_s": round(wall_s, 2)}
