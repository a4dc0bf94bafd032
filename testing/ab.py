"""A/B the corrector against other commits in git worktrees: offline or served (testing/README.md)."""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from testing.server import ServerProcess

REPO_ROOT = Path(__file__).resolve().parent.parent
SETS = ("test", "reviews", "decoded")
FRESH_WARM_LISTS = 2_500  # --fresh: the warm-up's own lists (3 s at 64 clients is under 2,000 answers here)
WARM_LISTS, BATCHES, SINGLES = 640, 20, 200  # --mode time, per child: lists answered untimed, batches of 64 and of 1


def child(mode: str, lists_path: Path) -> dict:
    """Run in a tree: answer every list (`answers`) or time batches of 64 and of 1 (`time`)."""
    import torch

    from model.corrector import Corrector
    from preprocess.text import NBest

    rows = [json.loads(line) for line in lists_path.read_text(encoding="utf-8").splitlines()]
    lists = [NBest(tuple(r["sentences"]), tuple(r["phonemes"])) for r in rows]
    t0 = time.perf_counter()
    corrector = Corrector(device="cpu")
    corrector.setup()
    setup_s = time.perf_counter() - t0
    if mode == "answers":
        answers: list[str] = []
        for start in range(0, len(lists), 64):
            answers += corrector.predict_batch(lists[start : start + 64])
        return {"answers": answers}
    out: dict = {"setup_s": setup_s, "threads": torch.get_num_threads(), "ms_64": [], "ms_1": []}
    hooks: dict[str, list[float]] = {"featurize": [], "network": [], "second": []}
    for start in range(0, WARM_LISTS, 64):  # untimed: the caches as a served process has them after a while
        corrector.predict_batch(lists[start : start + 64])
    for start in range(WARM_LISTS, min(len(lists), WARM_LISTS + 64 * BATCHES), 64):
        items = lists[start : start + 64]
        # predict_batch's three hooks, each timed: featurizing, the network, the second stage
        t = [time.perf_counter()]
        batch = corrector.batch(items)
        t.append(time.perf_counter())
        probs = corrector.predict(batch)
        t.append(time.perf_counter())
        corrector.unbatch(items, batch, probs)
        t.append(time.perf_counter())
        out["ms_64"].append(1000 * (t[3] - t[0]))
        for k, name in enumerate(hooks):
            hooks[name].append(1000 * (t[k + 1] - t[k]))
    for item in lists[-SINGLES:]:  # lists the batches above did not hold
        t = time.perf_counter()
        corrector.predict_batch([item])
        out["ms_1"].append(1000 * (time.perf_counter() - t))
    out["median_ms_64"] = statistics.median(out["ms_64"])
    out |= {f"median_ms_{name}": statistics.median(values) for name, values in hooks.items()}
    out["median_ms_1"] = statistics.median(out["ms_1"])
    return out


def build_lists(limit: int, path: Path) -> dict[str, list]:
    """Write the evaluation sets' lists (`limit` each), interleaved by a seeded shuffle; return sets, truths, lists."""
    from learn.evaluate import simulated_set
    from preprocess.text import NBest

    rows = []
    for name in SETS:
        data = simulated_set(REPO_ROOT / "data" / "corpus", name, limit)
        rows += [{"set": name, "sentences": nb.sentences, "phonemes": nb.phonemes, "truth": truth}
                 for nb, truth in zip(data.nbests, data.truths, strict=True)]
    random.Random(21).shuffle(rows)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return {"set": [r["set"] for r in rows], "truth": [r["truth"] for r in rows],
            "nbest": [NBest(r["sentences"], r["phonemes"]) for r in rows]}


def run_child(tree: Path, mode: str, lists_path: Path) -> dict:
    """Run this file's `child` in `tree`'s code; its JSON comes back on stdout's last line."""
    env = os.environ | {"PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--lists-file", str(lists_path)]
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"child in {tree} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare_answers(sides: dict[str, Path], lists_path: Path, meta: dict) -> dict:
    """Answer the lists on every side; print per set each side's CER and how many answers differ from this tree's."""
    from learn.evaluate import cer_score

    answers = {name: run_child(tree, "answers", lists_path)["answers"] for name, tree in sides.items()}
    here = answers["here"]
    report: dict = {"sets": {}, "differences": []}
    print("| set | side | lists | answer CER | answers unlike this tree's |\n|---|---|---:|---:|---:|")
    for name in SETS:
        idx = [i for i, s in enumerate(meta["set"]) if s == name]
        truths = [meta["truth"][i] for i in idx]
        for side, got in answers.items():
            diff = [i for i in idx if got[i] != here[i]]
            value = cer_score([meta["nbest"][i] for i in idx], truths, [got[i] for i in idx]).answer_cer
            report["sets"].setdefault(name, {})[side] = {"lists": len(idx), "cer": value, "differ": len(diff)}
            report["differences"] += [{"set": name, "side": side, "index": i, "here": here[i], "there": got[i],
                                       "truth": meta["truth"][i]} for i in diff]
            print(f"| {name} | {side} | {len(idx)} | {value:.4%} | {len(diff)} |")
    return report


def compare_times(sides: dict[str, Path], lists_path: Path, args: argparse.Namespace) -> dict:
    """Time every side once per round, in turn (the order rotated each round); print the medians."""
    return alternate(sides, args.rounds, lambda tree: run_child(tree, "time", lists_path),
                     lambda got: f"{got['median_ms_64']:.1f} / {got['median_ms_1']:.2f} ms",
                     {"ms_64": "median_ms_64", "ms_1": "median_ms_1", "featurize": "median_ms_featurize",
                      "network": "median_ms_network", "second": "median_ms_second"},
                     "| side | batch of 64: median ms | featurize / network / second stage ms | per list | "
                     "batch of 1: median ms | 64 vs here |\n|---|---:|---:|---:|---:|---:|",
                     lambda m, here: f"{m['ms_64']:.1f} | {m['featurize']:.1f} / {m['network']:.1f} / "
                                     f"{m['second']:.1f} | {m['ms_64'] / 64:.2f} | {m['ms_1']:.2f} | "
                                     f"{m['ms_64'] / here['ms_64']:.2f}x")


def serve(tree: Path, settings: dict[str, str] | None = None) -> ServerProcess:
    """Serve `tree` as its own `make run` does (the command moved), its code on `PYTHONPATH`, with `settings` (env)."""
    from testing.server import start_server

    code = "import json; from testing.server import gunicorn_command as g; print(json.dumps(g()))"
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=os.environ | {"PYTHONPATH": str(tree)},
                          capture_output=True, text=True, check=True)
    return start_server({**(settings or {}), "PYTHONPATH": str(tree)}, tree=tree,
                        command=json.loads(done.stdout.strip().splitlines()[-1]))


def setting(text: str) -> tuple[str, str]:
    """`--env KEY=VALUE`: one of the service's settings (its environment variable), as a pair."""
    key, sep, value = text.partition("=")
    if not sep or not key or not key.replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (an environment variable), got {text!r}")
    return key, value


def alternate(sides: dict[str, Path], rounds: int, measure: Callable[[Path], dict], show: Callable[[dict], str],
              keys: dict[str, str], head: str, row: Callable[[dict, dict], str]) -> dict:
    """Measure every side once per round, in turn (the order rotated each round); print each round, then under `head`
    a `row` per side of its medians over the rounds of `keys` (name in the medians: key in a round); return both."""
    names = list(sides)
    done: list[dict[str, dict]] = []
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        done.append({name: measure(sides[name]) for name in order})
        print(f"round {r + 1}: " + ", ".join(f"{n} {show(done[-1][n])}" for n in names), flush=True)
    medians = {n: {k: statistics.median(rd[n][key] for rd in done) for k, key in keys.items()} for n in names}
    print(f"\n{head}")
    for n, m in medians.items():
        print(f"| {n} | {row(m, medians['here'])} |")
    return {"rounds": done, "medians": medians}


def served_point(tree: Path, warm: list[str], templates: list[str], args: argparse.Namespace) -> dict:
    """Serve `tree`, warm it for 3 s, then measure `--clients` closed-loop clients for `--served-s` seconds."""
    from testing import load
    from testing.report import measure_closed

    with serve(tree, dict(args.env)) as server:
        load.run(load.closed_loop(server.url, args.clients, 3.0, 1.0, warm))  # the first batches, the caches
        point = measure_closed(server, args.clients, args.served_s, templates)
    # the paths of the window's requests only (each shot's, from the request log): the warm-up's last requests,
    # abandoned in flight when its loop stopped, still hold pool places while the next run's first ones arrive
    return {"model_answers_per_s": round(point["model_rps"], 1), "answers_per_s": round(point["throughput_rps"], 1),
            "p99_ms": point["p99_ms"], "non_200": point["non_200"],
            "paths": dict(Counter(s.path or "?" for s in point["_shots"])),
            **{k: point[k] for k in ("server_cpu_pct", "server_cpu_ms_per_answer", "generator_cpu_pct")}}


def served_bodies(pool: int, fresh: bool) -> tuple[list[str], list[str]]:
    """The warm-up's and the window's body templates: the bench's first `pool` bodies for both, or (`fresh`) `pool`
    distinct lists for the window and FRESH_WARM_LISTS others for the warm-up."""
    from testing.bench import request_pool
    from testing.load import payload_templates
    from testing.samples import simulated_bodies

    if not fresh:
        templates = payload_templates(request_pool(pool))
        return templates, templates
    templates = payload_templates(simulated_bodies(pool + FRESH_WARM_LISTS, ("train", "reviews"), distinct=True))
    return templates[pool:], templates[:pool]


def compare_served(sides: dict[str, Path], args: argparse.Namespace) -> dict:
    """Serve every side once per round, in turn (the order rotated each round); print the medians."""
    warm, templates = served_bodies(args.pool, args.fresh)
    # Compared on the model's answers: a side that sheds answers TOP1 fast, and its answers/s then say nothing.
    keys = ("model_answers_per_s", "answers_per_s", "p99_ms", "server_cpu_ms_per_answer", "server_cpu_pct")
    return alternate(sides, args.rounds, lambda tree: served_point(tree, warm, templates, args), lambda p: (
        f"{p['model_answers_per_s']} model answers/s of {p['answers_per_s']}, p99 {p['p99_ms']} ms, "
        f"{p['server_cpu_ms_per_answer']} ms CPU per answer ({p['server_cpu_pct']} %), non-200 {p['non_200']}, "
        f"{p['paths']}"), {k: k for k in keys},
        f"| side | {args.clients} clients: model answers/s | all answers/s | p99 ms | server CPU ms per answer | "
        "server CPU % | model answers/s vs here |\n|---|---:|---:|---:|---:|---:|---:|",
        lambda m, here: f"{' | '.join(str(m[k]) for k in keys)} | "
                        f"{m['model_answers_per_s'] / max(here['model_answers_per_s'], 1e-9):.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="A/B the corrector against other commits, offline or served.")
    ap.add_argument("--against", action="append", default=[], help="a commit to compare with (repeatable)")
    ap.add_argument("--mode", choices=("answers", "time", "both", "served"), default="both")
    ap.add_argument("--limit", type=int, default=1000, help="lists per evaluation set")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=64, help="closed-loop clients of --mode served")
    ap.add_argument("--served-s", type=float, default=10.0, help="seconds measured per side and round, served")
    ap.add_argument("--pool", type=int, default=400, help="distinct lists the window of --mode served cycles through")
    ap.add_argument("--fresh", action="store_true", help="--mode served: warm up on other lists than the window's")
    ap.add_argument("--env", action="append", default=[], type=setting, metavar="KEY=VALUE",
                    help="--mode served: a setting every side is served with (repeatable); MAX_TOP1_CHARS=1 answers "
                         "every list TOP1 through the whole HTTP path, without the model: the path's own cost")
    ap.add_argument("--json", type=Path, help="write everything measured here")
    ap.add_argument("--child", choices=("answers", "time"), help=argparse.SUPPRESS)
    ap.add_argument("--lists-file", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.lists_file)))
        return 0
    with tempfile.TemporaryDirectory(prefix="ab-") as tmp:
        parent = Path(tmp)
        lists_path = parent / "lists.jsonl"
        meta = build_lists(args.limit, lists_path) if args.mode != "served" else {"set": []}
        sides = {"here": REPO_ROOT} | {commit: parent / commit for commit in args.against}
        from testing.report import run_record, write_json  # here, not at the top: the children import this file

        result: dict = {**run_record("ab", sys.argv[1:] if argv is None else argv), "lists": len(meta["set"])}
        try:
            for commit in args.against:  # each commit checked out in a new worktree, removed at the end
                subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "add", "--detach", str(sides[commit]),
                                commit], check=True, capture_output=True)
            for tree in sides.values():  # its hot modules built as `make run` builds them (this tree's too: a module
                if (tree / "compiled.py").exists():  # edited since its build would run interpreted)
                    subprocess.run([sys.executable, "-m", "compiled"], cwd=tree, check=True, capture_output=True)
            if args.mode in ("answers", "both"):
                result["answers"] = compare_answers(sides, lists_path, meta)
            if args.mode in ("time", "both"):
                result["time"] = compare_times(sides, lists_path, args)
            if args.mode == "served":
                result["served"] = compare_served(sides, args)
        finally:
            for commit in args.against:
                subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(sides[commit])],
                               capture_output=True)
    print(f"\nmachine: {result['machine']['cpu_model']}, {result['machine']['logical_cpus']} CPUs")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
