"""The closed loop through Debian's `wrk` and testing/wrk.lua, read back as the core's `LoadRun` (testing/load.py):
wrk's C costs the machine half the CPU per request of the core's own closed loop (docs/bench/loadgen_cost.md)."""

from __future__ import annotations

import math
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from testing import load
from testing.load import CLIENT_TIMEOUT_S, CONNECTION_PROBLEM, LoadRun, Shot, cpu_figures
from testing.samples import check_answer

SCRIPT = Path(__file__).resolve().parent / "wrk.lua"
# wrk runs this long past the window, for its requests' answers (it stops at its duration, whatever is in flight).
TAIL_S = 2.0


def wrk_path() -> str | None:
    """Return wrk's path, None when it is not installed."""
    return shutil.which("wrk")


def _run(command: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, float, str]:
    """Run a command to its end; return its exit status, its own CPU seconds (user + system) and its output."""
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
        killer = threading.Timer(timeout_s, process.kill)  # wrk ends at its duration; this is for a hung one
        killer.start()
        _, status, usage = os.wait4(process.pid, 0)  # the child's own resource usage, as it is reaped
        killer.cancel()
        process.returncode = os.waitstatus_to_exitcode(status)
        output.seek(0)
        return process.returncode, usage.ru_utime + usage.ru_stime, output.read().decode("utf-8", "replace")


def closed_loop(url: str, clients: int, duration_s: float, warmup_s: float, templates: list[str],
                timeout_s: float = CLIENT_TIMEOUT_S) -> LoadRun:
    """Run wrk (one thread, `clients` connections) for warmup_s + duration_s; the core's own closed loop where wrk is
    not installed (a lent GPU machine)."""
    wrk = wrk_path()
    if wrk is None:
        return load.closed_loop(url, clients, duration_s, warmup_s, templates, timeout_s)
    with tempfile.TemporaryDirectory(prefix="esun-wrk-") as tmp:
        bodies = Path(tmp) / "bodies.jsonl"
        bodies.write_text("".join(t.replace("\n", " ") + "\n" for t in templates), encoding="utf-8")
        out = Path(tmp) / "answers"
        run_s = math.ceil(warmup_s + duration_s + TAIL_S)
        env = {**os.environ, "ESUN_WRK_BODIES": str(bodies), "ESUN_WRK_OUT": str(out),
               "ESUN_WRK_UUID_PREFIX": secrets.token_hex(16)}
        command = [wrk, "-t", "1", "-c", str(clients), "-d", f"{run_s}s", "--timeout", f"{math.ceil(timeout_s)}s",
                   "-s", str(SCRIPT), url.rstrip("/") + "/inference"]
        launched = time.time()
        code, cpu_s, output = _run(command, env, run_s + 30)
        wall_s = time.time() - launched
        if code != 0:
            raise RuntimeError(f"wrk exited with {code}: {output[-2000:]}")
        answers, left, errors = _read(out)
    start = launched + warmup_s
    end = start + duration_s
    shots = [Shot(sent, done - sent, status, check_answer(status, body, esun_uuid), esun_uuid=esun_uuid)
             for esun_uuid, sent, done, status, body in answers if esun_uuid != "-"]
    shots += [Shot(sent, 0.0, 0, f"{CONNECTION_PROBLEM}no answer before wrk stopped", esun_uuid=esun_uuid)
              for esun_uuid, sent in left]
    # Error answers carry no esun_uuid: their send time is unknown; they count at their answer's time.
    shots += [Shot(done, 0.0, status, check_answer(status, body, "")) for esun_uuid, _, done, status, body in answers
              if esun_uuid == "-"]
    return LoadRun([s for s in shots if start <= s.due < end], start, end,
                   {"generator": "wrk", **cpu_figures(cpu_s, wall_s), "wrk_errors": errors})


def _read(out: Path) -> tuple[list[tuple[str, float, float, int, str]], list[tuple[str, float]], dict[str, int]]:
    """Read what testing/wrk.lua wrote: answers, and (by its done(), on exit 0) requests never answered, errors."""
    answers = []
    for path in sorted(out.parent.glob(out.name + "-*.tsv")):
        if path.name.endswith(("-left.tsv", "-errors.tsv")):
            continue
        for line in filter(None, path.read_text(encoding="utf-8", errors="replace").split("\n")):
            esun_uuid, sent, done, status, body = line.split("\t", 4)
            answers.append((esun_uuid, float(sent), float(done), int(status), body))
    left = [line.split("\t") for line in Path(f"{out}-left.tsv").read_text().splitlines()]
    errors = [line.split("\t") for line in Path(f"{out}-errors.tsv").read_text().splitlines()]
    return answers, [(u, float(t)) for u, t in left], {k: int(v) for k, v in errors}
