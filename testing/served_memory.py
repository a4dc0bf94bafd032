"""The served process's memory over 100 k varied lists: do its bounded caches stay bounded?

    python -m testing.served_memory [--lists 100000] [--chunk 12800] [--clients 64] [--json FILE]

Serves the shipped model as `make run` does (one gunicorn worker), then sends it distinct n-best lists (simulated
from the corpus's train and review sentences, seeded; every one a question the model takes, each under a fresh
esun_uuid) through wrk's closed loop, one chunk of new lists after another, until the model has answered `--lists`.
After the set-up and after each chunk it reads the worker's resident set (VmRSS), counts the lists the model
answered so far (from the request log), and reads from `/metrics` the full collections of Python's cyclic GC so far,
their time and the longest (each one stops every request of the process). Prints a table, writes JSON. The lists
are not the evaluation sets: this measures memory and pauses, never accuracy.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

from testing.server import APP, REPO_ROOT

# Lists built per list to be answered: a wrk run stops short of its chunk's end (see --rate-guess)
POOL_SHARE = 1.5


def varied_bodies(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """`n` request bodies of distinct simulated lists, from the train and review sentences (shuffled, seeded)."""
    from config import Config
    from preprocess.simulate import load_simulator
    from testing.bench import _ensure_corpus, _model_takes

    corpus = REPO_ROOT / "data" / "corpus"
    _ensure_corpus(corpus)
    simulator = load_simulator(corpus)
    sentences = [s for name in ("train.txt", "reviews.txt")
                 for s in (corpus / name).read_text(encoding="utf-8").splitlines() if s.strip()]
    rng = random.Random(seed)
    rng.shuffle(sentences)
    limit = Config().max_top1_chars
    seen: set[tuple[str, ...]] = set()
    bodies = []
    for sentence in sentences:
        if len(bodies) >= n:
            break
        nbest = simulator.simulate(sentence, rng, phones=True)
        if _model_takes(nbest.top1, limit) and nbest.sentences not in seen:
            seen.add(nbest.sentences)
            bodies.append({"esun_uuid": "", "esun_timestamp": 1656000000.5, "sentence_list": list(nbest.sentences),
                           "phoneme_sequence_list": list(nbest.phonemes), "retry": 2})
    if len(bodies) < n:
        raise SystemExit(f"served_memory: the corpus gave {len(bodies)} distinct lists, fewer than --lists {n}")
    return bodies


def rss_mib(pid: int) -> float:
    """The resident set of a process, MiB (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for process {pid}")


def full_collections(url: str) -> dict[str, float]:
    """The worker's full GC collections so far, their seconds and the longest (`/metrics`; zeros where not exposed)."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {"esun_gc_collections_total": "collections", "esun_gc_pause_seconds_total": "seconds",
              "esun_gc_pause_longest_seconds": "longest_s"}
    out = dict.fromkeys(wanted.values(), 0.0)
    for family in text_string_to_metric_families(requests.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name in wanted and sample.labels.get("generation") == "2":
                out[wanted[sample.name]] = sample.value
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import psutil

    from testing import wrkload
    from testing.loadgen import payload_templates
    from testing.server import start_server

    pool = int(args.lists * POOL_SHARE)
    print(f"building {pool} distinct lists ...", flush=True)
    templates = payload_templates(varied_bodies(pool, args.seed))
    server = start_server(app=args.app)
    try:
        worker = psutil.Process(server.process.pid).children()[0].pid
        points = [{"lists_sent": 0, "answered_by_model": 0, "rss_mib": rss_mib(worker), "when": "after set-up",
                   "full_gc": full_collections(server.url)}]
        print(f"worker {worker}: {points[0]['rss_mib']} MiB after set-up", flush=True)
        sent = answered = 0
        started = time.monotonic()
        while answered < args.lists and sent < len(templates):
            chunk = templates[sent : sent + args.chunk]
            # wrk takes the bodies in turn, and wraps round: a run short enough not to reach the chunk's end (unless
            # the server is faster than --rate-guess; the lists answered are counted from the request log either way)
            seconds = max(1.0, len(chunk) / args.rate_guess - wrkload.TAIL_S)
            wrkload.closed_loop(server.url, args.clients, seconds, 0.0, chunk)
            sent += len(chunk)
            paths = server.paths()
            answered = paths.get("model", 0)
            points.append({"lists_sent": sent, "answered_by_model": answered, "rss_mib": rss_mib(worker),
                           "requests_logged": sum(paths.values()), "full_gc": full_collections(server.url)})
            print(f"{sent:>7} lists offered, {answered:>7} answered by the model: {points[-1]['rss_mib']} MiB",
                  flush=True)
        return {"points": points, "paths": dict(server.paths()), "seconds": round(time.monotonic() - started, 1)}
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lists", type=int, default=100_000, help="distinct lists the model is to answer")
    ap.add_argument("--chunk", type=int, default=12_800, help="lists per wrk run, between two readings")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--rate-guess", type=float, default=300.0,
                    help="answers/s at most: sizes each wrk run so that it does not wrap round its chunk")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--app", default=APP, help="the WSGI app to serve (gunicorn's form)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    result = measure(args)
    # the mean of the collections since the reading before: the longest so far is the loading's own, at set-up
    print("\n| lists answered by the model | worker RSS MiB | full GC collections | their seconds | mean ms since the "
          "row before |\n|---:|---:|---:|---:|---:|")
    before = None
    for p in result["points"]:
        gc = p["full_gc"]
        mean = ""
        if before is not None and gc["collections"] > before["collections"]:
            mean = f"{1000 * (gc['seconds'] - before['seconds']) / (gc['collections'] - before['collections']):.0f}"
        print(f"| {p['answered_by_model']:,} | {p['rss_mib']:,} | {gc['collections']:.0f} | {gc['seconds']:.2f} | "
              f"{mean} |")
        before = gc
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "machine": platform.processor()
                                         or platform.machine(), **result}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
