"""The benchmark's plots (matplotlib, imported only when drawing); `python -m testing.plots DIR...` redraws them."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from testing.load import JUDGE_TIMEOUT_S
from testing.report import answer_kind, fallback_share

MODEL_COLORS = ("tab:blue", "tab:green", "tab:purple", "tab:cyan", "tab:olive")
FALLBACK_COLORS = ("tab:red", "tab:orange", "tab:pink", "tab:brown", "gold")
FALLBACK_COLOR = "tab:red"
KIND_LABELS = {"model": "model answer", "fallback": "TOP1 fallback", "unknown": "path not logged",
               "none": "no answer"}


def _row_kind(row: list[Any]) -> str:
    """Say who made the answer of one raw row [t, latency ms, status, valid, lag ms, path?]."""
    if not row[2]:
        return "none"
    return answer_kind(row[5]) if len(row) > 5 else "unknown"


def _latency_lines(ax: Any, points: list[dict[str, Any]], name: str, color: str) -> bool:
    """Draw p99 by clients, all answers and (dotted) the model's alone, and ring each point whose answers include TOP1
    fallbacks, with their share; say whether any was ringed."""
    xs, shares = [p["clients"] for p in points], [fallback_share(p.get("paths") or {}) for p in points]
    pairs = list(zip(points, shares, strict=True))
    ax.plot(xs, [p.get("p99_ms") or math.nan for p in points], "-", marker="o", color=color,
            label=f"{name} p99, all answers")
    if any(shares) and any(p.get("model_p99_ms") is not None for p in points):
        # A point without fallbacks: its model answers are all its answers.
        model = [p.get("model_p99_ms") if share > 0 else p.get("p99_ms") for p, share in pairs]
        ax.plot(xs, [y if y is not None else math.nan for y in model], ":", marker=".", color=color,
                label=f"{name} p99, model answers only")
    ringed = [(p, share) for p, share in pairs if share > 0 and p.get("p99_ms") is not None]
    for p, share in ringed:
        ax.scatter([p["clients"]], [p["p99_ms"]], s=140, facecolors="none", edgecolors=FALLBACK_COLOR, linewidths=1.5,
                   zorder=3)
        ax.annotate(f"{share * 100:.2g} % TOP1", (p["clients"], p["p99_ms"]), textcoords="offset points",
                    xytext=(6, -12), fontsize=7, color=FALLBACK_COLOR)
    return bool(ringed)


def draw_bench(results: dict[str, Any], raw: dict[str, list[list[Any]]], out: Path) -> list[str]:
    """Draw the PNG plots; return their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[str] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)

    if "a" in results:
        rows = results["a"]["rows"]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([r["batch_size"] for r in rows], [r["items_per_s"] for r in rows], marker="o")
        ax.set(xscale="log", xlabel="batch size", ylabel="items/s", title="a. Offline corrector throughput")
        ax.set_xticks([r["batch_size"] for r in rows], [str(r["batch_size"]) for r in rows])
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)  # every quantity axis from 0, set once everything is drawn
        save(fig, "a_offline_throughput_by_batch_size.png")

    over_time = [(key, series) for key, series in raw.items() if key.startswith(("b/", "c/"))]
    if over_time:
        groups = list(dict.fromkeys(key.split("/")[0] + "/" + key.split("/")[1] for key, _ in over_time))
        fig, axes = plt.subplots(len(groups), 1, figsize=(9, 3.6 * len(groups)), squeeze=False)
        for ax, group in zip(axes[:, 0], groups, strict=True):
            members = [(key, series) for key, series in over_time if key.startswith(group + "/") and series]
            # Model answers first, fallbacks on top: a few instant TOP1 answers must not hide under the dots.
            for kind, marker, size, colors in (("model", "o", 3, MODEL_COLORS), ("unknown", "o", 3, MODEL_COLORS),
                                               ("none", "+", 14, ("black",)),
                                               ("fallback", "x", 10, FALLBACK_COLORS)):
                for i, (key, series) in enumerate(members):
                    rows = [r for r in series if _row_kind(r) == kind]
                    if rows:
                        ax.scatter([r[0] for r in rows], [r[1] for r in rows], s=size, alpha=0.6, marker=marker,
                                   color=colors[i % len(colors)],
                                   label=f"{key.split('/', 2)[2]}: {KIND_LABELS[kind]} ({len(rows)})")
            ax.axhline(JUDGE_TIMEOUT_S * 1000, color="red", linewidth=0.8, linestyle="--", label="judge timeout")
            ax.set(xlabel="seconds into the point", ylabel="response time (ms)",
                   title=f"Response time over time: {group.replace('/', ', ')}")
            ax.legend(markerscale=3, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
            ax.grid(alpha=0.3)
            ax.set(xlim=(0, None), ylim=(0, None))
        save(fig, "response_time_over_time.png")

    if "b" in results:
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
        ringed = False
        for mode, color in (("on", "C0"), ("off", "C1")):
            points = results["b"].get(mode, [])
            xs = [p["clients"] for p in points]
            left.plot(xs, [p["throughput_rps"] for p in points], marker="o", color=color,
                      label=f"batching {mode}: all answers/s")
            left.plot(xs, [p["model_rps"] for p in points], ":", marker=".", color=color,
                      label=f"batching {mode}: model answers/s")
            ringed = _latency_lines(right, points, f"batching {mode}", color) or ringed
        if ringed:  # the legend says what the rings mean, or that no point had a TOP1 fallback among its answers
            right.scatter([], [], s=140, facecolors="none", edgecolors=FALLBACK_COLOR, linewidths=1.5,
                          label="includes TOP1 fallbacks (share)")
        else:
            right.plot([], [], " ", label="(no TOP1 fallback at any point)")
        if "a" in results:
            left.axhline(results["a"]["ceiling_items_per_s"], color="grey", linestyle=":", label="offline ceiling")
        right.axhline(JUDGE_TIMEOUT_S * 1000, color="red", linestyle="--", linewidth=0.8, label="judge timeout")
        left.set(xscale="log", xlabel="clients", ylabel="answers/s", title="b. Throughput by clients")
        right.set(xscale="log", xlabel="clients", ylabel="p99 latency (ms)", title="b. p99 by clients")
        ticks = sorted({p["clients"] for mode in ("on", "off") for p in results["b"].get(mode, [])})
        for ax in (left, right):
            ax.set_xticks(ticks, [str(x) for x in ticks])
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
            ax.set_ylim(bottom=0)
        save(fig, "b_throughput_and_p99_by_clients.png")

    return written


SOAK_ROLES = {"master": ("gunicorn master", "tab:gray"), "worker": ("gunicorn workers (sum)", "tab:blue"),
              "model": ("processes under the workers (sum)", "tab:purple")}


def draw_soak(results: dict[str, Any], out: Path) -> list[str]:
    """Draw testing.soak's record against time (soak.png); return its file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["intervals"]
    minutes = [r["end_s"] / 60 for r in rows]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), sharex=True)
    for ax, key, label in ((axes[0][0], "rss_mib", "RSS (MiB)"), (axes[0][1], "fds", "open file descriptors"),
                           (axes[0][2], "threads", "threads")):
        for role, (name, color) in SOAK_ROLES.items():
            values = [r["by_role"][role][key] for r in rows]
            if any(r["by_role"][role]["processes"] for r in rows):
                ax.plot(minutes, values, marker=".", color=color, label=name)
        ax.set(ylabel=label, title=label)
        ax.legend(fontsize=8)
    ax = axes[1][0]
    ax.plot(minutes, [r["p50_ms"] for r in rows], marker=".", label="p50", color="tab:blue")
    ax.plot(minutes, [r["p99_ms"] for r in rows], marker=".", label="p99", color="tab:orange")
    ax.axhline(JUDGE_TIMEOUT_S * 1000, color=FALLBACK_COLOR, linestyle="--", label="judge's timeout")
    ax.set(ylabel="ms, from each request's due time", title="latency per interval")
    ax.legend(fontsize=8)
    ax = axes[1][1]
    ax.plot(minutes, [r["late_over_1s"] for r in rows], marker="x", color=FALLBACK_COLOR, label="later than 1 s")
    ax.plot(minutes, [r["non_200"] for r in rows], marker="+", color="tab:orange", label="non-200")
    ax.plot(minutes, [round((1 - (r["model_share"] or 1)) * r["requests"]) for r in rows], marker=".",
            color="tab:brown", label="TOP1 fallbacks")
    ax.set(ylabel="answers per interval", title="late, non-200 and TOP1 answers")
    ax.legend(fontsize=8)
    ax = axes[1][2]
    ax.plot(minutes, [r["cache_entries"] for r in rows], marker=".", color="tab:green")
    ax.set(ylabel="answers held", title="answer cache (one worker's)")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)  # every quantity axis from 0, set once everything is drawn
    for ax in axes[1]:
        ax.set_xlabel("minutes")
    fig.suptitle(f"soak: {results['rate_rps']} req/s ({results['share']:g} x the 64-client rate) for "
                 f"{results['minutes']:g} min")
    fig.tight_layout()
    fig.savefig(out / "soak.png", dpi=100)
    plt.close(fig)
    return ["soak.png"]


def redraw(directory: Path) -> list[str]:
    """Redraw a benchmark's plots from its saved bench.json (and bench_raw.json, if kept); return the files drawn."""
    results = json.loads((directory / "bench.json").read_text(encoding="utf-8"))
    raw_path = directory / "bench_raw.json"
    raw = json.loads(raw_path.read_text(encoding="utf-8")) if raw_path.exists() else {}
    return draw_bench(results, raw, directory)


def main(argv: list[str] | None = None) -> int:
    directories = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not directories:
        print("usage: python -m testing.plots DIR [DIR ...] (each holding a bench.json)", file=sys.stderr)
        return 2
    for directory in directories:
        if not (directory / "bench.json").is_file():
            print(f"plots: {directory / 'bench.json'} not found", file=sys.stderr)
            return 2
        print(f"plots: {directory}: redrew {', '.join(redraw(directory)) or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
