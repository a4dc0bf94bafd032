"""testing.door_cost: the door answers every request in process, and the thread's second reading is timed."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

from testing import door_cost


def test_door_cost_answers_every_request_at_the_door_and_times_the_thread_parse(capsys):
    assert door_cost.main(["--answers", "40", "--rounds", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["answers"] == 40 and len(result["us_cpu_per_door_answer"]) == 2
    assert all(us > 0 for us in result["us_cpu_per_door_answer"]) and result["us_cpu_per_thread_parse"] > 0


def test_gunicorn_reads_the_door_s_requests_whole():
    raw = door_cost.raw_requests(1)[0]
    parsed = door_cost.get_parser(door_cost.GunicornConfig(), SimpleNamespace(recv=io.BytesIO(raw).read), ("::1", 0))
    request = next(parsed)
    assert (request.method, request.path) == ("POST", "/inference")
    assert json.loads(request.body.read())["esun_uuid"] == "door-0"
