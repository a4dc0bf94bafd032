"""testing/plots.py on small synthetic results, no server: model answers and TOP1 fallbacks apart, axes from 0,
no port in a title. Read back through matplotlib's own objects (Agg backend)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from testing import plots  # noqa: E402
from testing.report import FALLBACK_PATHS, kind_latency, tag_paths  # noqa: E402
from testing.server import REPO_ROOT  # noqa: E402
from testing.shots import Shot  # noqa: E402

ADDRESS = re.compile(r"https?://|localhost|\d+\.\d+\.\d+\.\d+|:\d{4,5}\b")


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Keep the figures the drawing functions close, to read them back; close them at the end."""
    kept: dict[str, Any] = {}
    savefig = matplotlib.figure.Figure.savefig

    def save(fig: Any, path: Any, *args: Any, **kwargs: Any) -> None:
        kept[Path(path).name] = fig
        savefig(fig, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", save)
    monkeypatch.setattr(plt, "close", lambda fig=None: None)
    yield kept
    monkeypatch.undo()
    plt.close("all")


def point(clients: int, p50: float, p99: float, paths: dict[str, int], **extra: Any) -> dict[str, Any]:
    return {"clients": clients, "throughput_rps": 10.0 * clients, "model_rps": 9.0 * clients, "p50_ms": p50,
            "p99_ms": p99, "paths": paths, **extra}


def synthetic_bench() -> tuple[dict[str, Any], dict[str, list[list[Any]]]]:
    mixed = {"model": 90, "overload": 10}
    results = {
        "a": {"rows": [{"batch_size": b, "items_per_s": r} for b, r in ((1, 150.0), (8, 380.0), (64, 520.0))],
              "ceiling_items_per_s": 520.0},
        "b": {side: [point(1, 10, 15, {"model": 100}), point(64, 250, 760, mixed, model_p50_ms=240,
                                                                 model_p99_ms=500, fallback_p99_ms=760)]
              for side in ("on", "off")},
    }
    model_rows = [[i / 10, 20.0 + i, 200, 1, 0.1, "model"] for i in range(20)]
    fallback_rows = [[i / 10, 2.0, 200, 1, 0.1, "overload"] for i in range(5)]
    raw = {
        "b/batching on/1 clients": model_rows,
        "c/overload/2x": model_rows + fallback_rows + [[1.0, 2000.0, 0, 0, 0.1, None]],
        "c/overload/3x": [[0.5, 30.0, 200, 1, 0.0]],  # a row saved before paths were recorded
    }
    return results, raw


def scatter_labels(ax: Any) -> dict[str, int]:
    """Label -> number of points of each scatter series of an axes."""
    return {c.get_label(): len(c.get_offsets()) for c in ax.collections if not c.get_label().startswith("_")}


def check_axes_and_titles(fig: Any) -> None:
    titles = [fig._suptitle.get_text()] if fig._suptitle else []
    for ax in fig.axes:
        titles.append(ax.get_title())
        assert ax.get_ylim()[0] == 0, (ax.get_title(), ax.get_ylim())
        if ax.get_xscale() == "linear" and re.search("seconds|minutes", ax.get_xlabel()):
            assert ax.get_xlim()[0] == 0, (ax.get_title(), ax.get_xlim())
    for title in titles:
        assert not ADDRESS.search(title), title


def test_bench_plots_tell_model_answers_from_fallbacks_from_zero_without_ports(tmp_path: Path, figures: Any):
    results, raw = synthetic_bench()
    written = plots.draw_bench(results, raw, tmp_path)
    assert set(written) == {"a_offline_throughput_by_batch_size.png", "response_time_over_time.png",
                            "b_throughput_and_p99_by_clients.png"}
    for name in written:
        assert (tmp_path / name).stat().st_size > 0
        check_axes_and_titles(figures[name])

    b_panel, c_panel = figures["response_time_over_time.png"].axes
    assert scatter_labels(b_panel) == {"1 clients: model answer (20)": 20}
    labels = scatter_labels(c_panel)
    assert labels["2x: model answer (20)"] == 20
    assert labels["2x: TOP1 fallback (5)"] == 5
    assert labels["2x: no answer (1)"] == 1
    assert labels["3x: path not logged (1)"] == 1
    fallback = next(c for c in c_panel.collections if c.get_label() == "2x: TOP1 fallback (5)")
    model = next(c for c in c_panel.collections if c.get_label() == "2x: model answer (20)")
    assert not (set(map(tuple, fallback.get_facecolors())) & set(map(tuple, model.get_facecolors())))
    assert {t.get_text() for t in c_panel.get_legend().get_texts()} >= {"2x: TOP1 fallback (5)",
                                                                       "2x: model answer (20)"}

    _, p99 = figures["b_throughput_and_p99_by_clients.png"].axes
    legend = {t.get_text() for t in p99.get_legend().get_texts()}
    assert {"batching on p99, all answers", "batching on p99, model answers only",
            "includes TOP1 fallbacks (share)"} <= legend
    assert "10 % TOP1" in {t.get_text() for t in p99.texts}
    model_only = next(line for line in p99.get_lines() if line.get_label() == "batching on p99, model answers only")
    assert list(model_only.get_ydata()) == [15, 500]  # the model's own p99 where fallbacks were mixed in


def test_summaries_keep_model_and_fallback_latency_apart():
    assert {"deadline", "overload", "shed", "pool_full"} <= set(FALLBACK_PATHS) and "model" not in FALLBACK_PATHS
    shots = tag_paths([Shot(0, 0.3, 200, None, esun_uuid="a"), Shot(0, 0.001, 200, None, esun_uuid="b")],
                      {"a": "model", "b": "deadline"})
    stats = kind_latency(shots)
    assert (stats["model_answers"], stats["model_p99_ms"]) == (1, 300.0)
    assert (stats["fallback_answers"], stats["fallback_p99_ms"]) == (1, 1.0)
    assert kind_latency([Shot(0, 0.3, 200, None)]) == {}  # paths unknown: no split claimed


def test_saved_benchmarks_redraw_from_their_json(tmp_path: Path, figures: Any):
    """The committed bench.json files (summaries only, no per-request paths) still draw."""
    for sub in ("", "overload"):  # policy/ holds section d only, which the benchmark no longer has
        source = REPO_ROOT / "docs" / "bench" / sub / "bench.json"
        target = tmp_path / (sub or "main")
        target.mkdir()
        shutil.copy(source, target / "bench.json")
        drawn = plots.redraw(target)
        assert drawn and "response_time_over_time.png" not in drawn  # bench_raw.json is not committed
        for name in drawn:
            check_axes_and_titles(figures[name])
        json.loads((target / "bench.json").read_text())  # left as it was
