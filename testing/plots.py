"""The load tools' pictures (matplotlib, imported only when drawing): the benchmark's and the soak run's PNGs."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from testing.loadgen import JUDGE_TIMEOUT_S, Shot
from testing.report import MIB, POLICIES


def draw_bench(results: dict[str, Any], raw: dict[str, list[list[float]]], out: Path) -> list[str]:
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
        save(fig, "a_offline_throughput_by_batch_size.png")

    over_time = [(key, series) for key, series in raw.items() if key.startswith(("b/", "c/"))]
    if over_time:
        groups = list(dict.fromkeys(key.split("/")[0] + "/" + key.split("/")[1] for key, _ in over_time))
        fig, axes = plt.subplots(len(groups), 1, figsize=(9, 3.2 * len(groups)), squeeze=False)
        for ax, group in zip(axes[:, 0], groups, strict=True):
            for key, series in over_time:
                if key.startswith(group + "/") and series:
                    ax.scatter([s[0] for s in series], [s[1] for s in series], s=3, alpha=0.5,
                               label=key.split("/", 2)[2])
            ax.axhline(JUDGE_TIMEOUT_S * 1000, color="red", linewidth=0.8, linestyle="--", label="judge timeout")
            ax.set(xlabel="seconds into the point", ylabel="response time (ms)", yscale="log",
                   title=f"Response time over time: {group.replace('/', ', ')}")
            ax.legend(markerscale=4, fontsize=8)
            ax.grid(alpha=0.3)
        save(fig, "response_time_over_time.png")

    if "b" in results:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        for mode in ("on", "off"):
            points = results["b"].get(mode, [])
            xs = [p["clients"] for p in points]
            left.plot(xs, [p["throughput_rps"] for p in points], marker="o", label=f"batching {mode}")
            right.plot(xs, [p["p99_ms"] or float("nan") for p in points], marker="o", label=f"batching {mode}")
        if "a" in results:
            left.axhline(results["a"]["ceiling_items_per_s"], color="grey", linestyle=":", label="offline ceiling")
        right.axhline(JUDGE_TIMEOUT_S * 1000, color="red", linestyle="--", linewidth=0.8, label="judge timeout")
        left.set(xscale="log", xlabel="clients", ylabel="answers/s", title="b. Throughput by clients")
        right.set(xscale="log", yscale="log", xlabel="clients", ylabel="p99 latency (ms)", title="b. p99 by clients")
        ticks = sorted({p["clients"] for mode in ("on", "off") for p in results["b"].get(mode, [])})
        for ax in (left, right):
            ax.set_xticks(ticks, [str(x) for x in ticks])
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
        save(fig, "b_throughput_and_p99_by_clients.png")

    if "d" in results:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        for policy, color in (("fixed", "C0"), ("adaptive", "C1")):
            points = results["d"].get(policy, [])
            xs = [p["clients"] for p in points]
            for key, style in (("p50_ms", "-"), ("p99_ms", "--")):
                left.plot(xs, [p[key] or float("nan") for p in points], style, marker="o", color=color,
                          label=f"{policy} {key[:3]}")
            rounds = (results["d"].get("throughput_rounds") or {}).get("rounds", {}).get(policy)
            if rounds:
                right.bar(policy, statistics.median(rounds), color=color)
                right.plot([policy] * len(rounds), rounds, "k.", label=None)
            else:
                right.bar(policy, points[-1]["throughput_rps"] if points else 0, color=color)
        left.set(xscale="log", yscale="log", xlabel="clients", ylabel="latency (ms)",
                 title="d. Latency by clients, fixed vs adaptive")
        ticks = sorted({p["clients"] for policy in POLICIES for p in results["d"].get(policy, [])})
        left.set_xticks(ticks, [str(x) for x in ticks])
        left.legend(fontsize=8)
        left.grid(alpha=0.3)
        top = max(results["d"]["fixed"][-1]["clients"] if results["d"].get("fixed") else 0,
                  results["d"]["adaptive"][-1]["clients"] if results["d"].get("adaptive") else 0)
        right.set(ylabel="answers/s", title=f"d. Throughput at {top} clients (median, dots: rounds)")
        save(fig, "d_policy_latency_by_clients.png")
    return written


def draw_soak(path: Path, shots: list[Shot], rss: list[tuple[float, int, int]], table: list[dict[str, Any]],
         budget_s: float | None, title: str) -> None:
    """Draw latency, throughput and server RSS over time into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_lat, ax_rate, ax_rss) = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    mids = [(b["start_s"] + b["end_s"]) / 2 / 60 for b in table]
    answered = [s for s in shots if s.status]
    ax_lat.scatter([s.due / 60 for s in answered], [s.latency_s * 1000 for s in answered], s=2, alpha=0.25,
                   color="tab:gray", label="each request")
    for name, color in (("p50", "tab:blue"), ("p95", "tab:orange"), ("p99", "tab:red")):
        ax_lat.plot(mids, [b["latency_ms"][name] for b in table], color=color, label=name)
    ax_lat.axhline(JUDGE_TIMEOUT_S * 1000, color="black", linestyle="--", label="judge timeout")
    if budget_s:
        ax_lat.axhline(budget_s * 1000, color="tab:green", linestyle=":", label="answer budget")
    ax_lat.set_ylabel("latency (ms)")
    ax_lat.legend(loc="upper right", fontsize="small")
    widths = [(b["end_s"] - b["start_s"]) or 1 for b in table]
    ax_rate.plot(mids, [b["sent"] / w for b, w in zip(table, widths, strict=True)], label="sent/s")
    ax_rate.plot(mids, [b["answered"] / w for b, w in zip(table, widths, strict=True)], label="valid answers/s")
    ax_rate.plot(mids, [(b["failed"] + b["late"]) / w for b, w in zip(table, widths, strict=True)],
                 color="tab:red", label="failed or late/s")
    ax_rate.set_ylabel("requests/s")
    ax_rate.legend(loc="upper right", fontsize="small")
    if rss:
        ax_rss.plot([t / 60 for t, _, _ in rss], [total / MIB for _, total, _ in rss], label="all processes")
        ax_rss.plot([t / 60 for t, _, _ in rss], [big / MIB for _, _, big in rss], label="largest (the worker)")
        ax_rss.legend(loc="lower right", fontsize="small")
    else:
        ax_rss.text(0.5, 0.5, "server processes unknown: no RSS", ha="center", transform=ax_rss.transAxes)
    ax_rss.set_ylabel("server RSS (MiB)")
    ax_rss.set_xlabel("minutes into the run")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
