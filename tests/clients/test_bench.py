"""testing/bench.py end to end on the fake corrector: the overload section (testing/load.py's open loop) runs
and writes its tables and JSON; section f holds slow connections beside the clients."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testing.server import REPO_ROOT

pytestmark = pytest.mark.live


def run_bench(out: Path, section: str, timeout_s: float = 180) -> dict[str, Any]:
    """Run one section of the benchmark, quick and on the fake corrector, into `out`; return its bench.json."""
    run = subprocess.run(
        [sys.executable, "-m", "testing.bench", "--quick", "--fake", "--sections", section, "--duration", "1",
         "--out", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return json.loads((out / "bench.json").read_text())


def test_bench_overload_section_runs_the_lean_generators_and_counts_every_request(tmp_path: Path):
    results = run_bench(tmp_path, "c")
    assert results["open_loop_timeout_s"] == 10.0
    (point,) = results["c"]["points"]  # --quick: 2x only
    assert point["factor"] == 2.0 and point["generator"].startswith("testing.load open loop")
    assert point["latency_from"] == "due" and point["requests"] > 0
    assert point["non_200"] == 0 and point["connection_errors"] == 0 and point["no_answer"] == 0
    # one raw row per request due in the window, each a 200 whose path the server's log named
    rows = json.loads((tmp_path / "bench_raw.json").read_text())["c/overload/2x"]
    assert len(rows) == point["requests"] and {row[2] for row in rows} == {200}
    assert all(row[5] is not None for row in rows)
    assert sum(point["paths"].values()) >= point["requests"]  # the server logged an answer for each
    assert 0 <= point["model_share"] <= 1 and 0 < point["generator_cpu_pct"] <= 100 * (os.cpu_count() or 1)
    assert "connection errors" in (tmp_path / "bench.md").read_text()


def test_bench_slow_client_section_holds_slow_connections_while_clients_are_answered(tmp_path: Path):
    results = run_bench(tmp_path, "f")
    f = results["f"]
    assert f["slow"]["asked"] == 200 and f["slow"]["held_min"] > 0  # --quick: 200 slow connections
    assert f["requests"] > 0 and f["valid_within_1s"] == f["requests"] and f["non_200"] == f["invalid"] == 0
    assert 0 < f["slow"]["tool_cpu_pct"] <= 100 * (os.cpu_count() or 1)
    assert f["server_cpu_pct"] > 0 and f["others_cpu_pct"] >= 0
    assert sum(f["paths"].values()) >= f["requests"]  # the server logged an answer for each question
    assert "## f. Slow clients" in (tmp_path / "bench.md").read_text()


def test_bench_closed_loop_section_says_what_one_answer_costs_the_server_cpu(tmp_path: Path):
    results = run_bench(tmp_path, "b")
    for point in results["b"]["on"] + results["b"]["off"]:
        assert 0 < point["server_cpu_pct"] <= 100 * (os.cpu_count() or 1)
        assert point["server_cpu_ms_per_answer"] > 0
    assert "server CPU ms per answer" in (tmp_path / "bench.md").read_text()


@pytest.mark.real_model
def test_bench_hooks_section_times_a_batch_s_three_hooks_apart(tmp_path: Path):
    run = subprocess.run(
        [sys.executable, "-m", "testing.bench", "--sections", "hooks", "--devices", "cpu", "--rounds", "2",
         "--out", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if k not in ("CPU_RUNTIME", "CPU_PRECISION")},  # the defaults
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    (profile,) = json.loads((tmp_path / "bench.json").read_text())["hooks"]
    assert (profile["device"], profile["batch_size"], profile["rounds"], profile["runtime"]) == ("cpu", 64, 2, "torch")
    assert set(profile["median_ms"]) == {"batch", "predict", "unbatch"} and min(profile["median_ms"].values()) > 0
    assert profile["total_ms"] == pytest.approx(sum(profile["median_ms"].values()))
    assert "| device | batch | predict (the network) | unbatch | total | network's share |" in run.stdout


def test_cpu_clock_reads_the_cpu_used_between_two_moments_linearly_between_its_samples():
    from testing.server import CpuClock

    clock = CpuClock([(at, (cpu_s, busy_s)) for at, cpu_s, busy_s in ((10.0, 1.0, 100.0), (11.0, 1.5, 101.0),
                                                                      (12.0, 3.5, 104.0))])
    assert clock.between(10.0, 12.0) == 2.5
    assert clock.between(10.5, 11.5) == 1.25  # 1.25 → 2.5
    assert clock.between(9.0, 13.0) == 2.5  # clamped to the samples taken
    assert clock.between(10.0, 12.0, machine=True) == 4.0
    # the machine was busy 4 s of the 2: the server's 2.5 and the tool's 0.5 (25 % of a core) leave 1 s to others
    assert clock.figures(10.0, 12.0, 5, own_pct=25.0) == {"server_cpu_pct": 125.0, "server_cpu_ms_per_answer": 500.0,
                                                          "others_cpu_pct": 50.0}
    assert clock.figures(10.0, 12.0, 0)["server_cpu_ms_per_answer"] is None


def test_distinct_simulated_bodies_are_lists_the_model_takes():
    from preprocess.text import has_han
    from testing.samples import simulated_bodies

    bodies = simulated_bodies(300, ("train", "reviews"), distinct=True)
    assert len({tuple(b["sentence_list"]) for b in bodies}) == 300
    assert all(has_han(b["sentence_list"][0]) for b in bodies)


def test_bench_short_lists_keep_only_top1s_of_at_most_max_chars():
    from preprocess.text import strip_spaces
    from testing.bench import build_parser, make_plan, request_pool

    plan = make_plan(build_parser().parse_args(["--sections", "c", "--max-chars", "8"]))
    pool = request_pool(200, plan.max_chars)
    assert len(pool) == 200 and max(len(strip_spaces(b["sentence_list"][0])) for b in pool) == 8


def test_ab_fresh_serves_its_window_lists_the_warm_up_never_sent():
    from testing.ab import FRESH_WARM_LISTS, served_bodies

    warm, window = served_bodies(200, fresh=True)
    assert len(window) == 200 and len(warm) == FRESH_WARM_LISTS
    assert len(set(window)) == 200 and not set(window) & set(warm)
    assert served_bodies(50, fresh=False)[0] == served_bodies(50, fresh=False)[1]


def test_ab_serves_every_side_with_the_settings_given_and_refuses_a_malformed_one(monkeypatch, capsys):
    import argparse
    import contextlib

    from testing import ab

    served = []

    @contextlib.contextmanager
    def fake_serve(tree, settings=None):
        served.append(settings)
        raise RuntimeError("stop here")  # the settings are all this test needs
        yield

    monkeypatch.setattr(ab, "serve", fake_serve)
    args = argparse.Namespace(env=[ab.setting("MAX_TOP1_CHARS=1"), ab.setting("LOG_LEVEL=warning")])
    with pytest.raises(RuntimeError, match="stop here"):
        ab.served_point(Path("."), [], [], args)
    assert served == [{"MAX_TOP1_CHARS": "1", "LOG_LEVEL": "warning"}]
    with pytest.raises(SystemExit) as exit_info:
        ab.main(["--mode", "served", "--env", "MAX_TOP1_CHARS"])
    assert exit_info.value.code == 2 and "expected KEY=VALUE" in capsys.readouterr().err


@pytest.mark.real_model
def test_ab_time_child_times_each_hook_of_a_batch_and_they_make_up_the_batch(tmp_path, monkeypatch):
    import json

    from testing import ab

    monkeypatch.setattr(ab, "WARM_LISTS", 64)
    monkeypatch.setattr(ab, "BATCHES", 2)
    monkeypatch.setattr(ab, "SINGLES", 2)
    row = {"sentences": ["今天 天 氣 很好", "今天 天氣 很好", "今天 天器 很好"], "phonemes": []}
    lists = tmp_path / "lists.jsonl"
    lists.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for _ in range(64 * 3 + 2)), encoding="utf-8")
    got = ab.child("time", lists)
    assert len(got["ms_64"]) == 2 and len(got["ms_1"]) == 2
    hooks = [got[f"median_ms_{name}"] for name in ("featurize", "network", "second")]
    assert all(ms > 0 for ms in hooks)
    # each batch's hooks are consecutive slices of its time; with two batches the medians are their means
    assert sum(hooks) == pytest.approx(got["median_ms_64"], rel=1e-6)
