"""Where one answer's time goes: `python -m testing.answer_path [--weights DIR]... [--lists N] [--out DIR]`.

Each folder's corrector, built and set up as the service builds it (`hosting.build.load_corrector`, the settings of
the environment), answers simulated lists (`testing.samples.simulated_bodies`, the test split) one question at a time,
each list asked once, so that no cache answers it in part. Half of the lists are asked in process, half through the
app (`api.create_app` around the same corrector, Flask's test client: the view, the answer policy, admission, the
threaded batcher and the response; not the gunicorn seam, docs/architecture.md). Each answer's time is cut into:

- `batch`: featurizing and padding (the corrector's hook); `predict`: the network;
- the second stage (`unbatch`), apart: `candidates`, `features` (the trigram, the domain LM and the confusions of an
  adapted folder), `gate` (the abstain gate, `model.gate`: its features and its verdict, asked only where the best
  change clears the stage's margin) and `choose` (the rest: scores, margin, the rule pass);
- served, `outside the model`: the request's wall time less the model's (`predict_batch`).

A list is classed once answered: `changed, gate admits` (the gate ran and let the change through), `gate refuses`,
`changed` (no gate ran: the stage has none, or the rule pass changed it) or `kept` (TOP1 answered). Prints a table of
means in ms per folder, way and class (and the total's median), and writes answer_path.json under `--out`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from config import DEFAULT_WEIGHTS_DIR, Config
from testing import cli, report

STEPS = ("batch", "predict", "candidates", "features", "gate", "choose")
CLASSES = ("changed, gate admits", "gate refuses", "changed", "kept")


class Clock:
    """The milliseconds each wrapped step took since the last `take`, and the gate's verdict."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self.verdict: bool | None = None

    def wrap(self, owner: Any, method: str, step: str, gate: bool = False) -> None:
        """Time `owner.method` as `step` (an instance attribute in front of the method; `gate`: note its verdict)."""
        inner = getattr(owner, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = inner(*args, **kwargs)
            self.ms[step] = self.ms.get(step, 0.0) + (time.perf_counter() - t0) * 1000
            if gate:
                self.verdict = bool(out)
            return out

        setattr(owner, method, timed)

    def take(self) -> tuple[dict[str, float], bool | None]:
        ms, verdict = self.ms, self.verdict
        self.ms, self.verdict = {}, None
        return ms, verdict


def instrument(corrector: Any) -> Clock:
    """Wrap the corrector's hooks and its second stage's steps (the abstain gate's only where the stage has one)."""
    clock = Clock()
    for method in ("predict_batch", "batch", "predict", "unbatch"):
        clock.wrap(corrector, method, method)
    reranker = corrector.reranker
    if reranker is not None:
        clock.wrap(reranker, "candidates", "candidates")
        clock.wrap(reranker, "rows", "features")
        if reranker.gate is not None:
            clock.wrap(reranker, "_gate_admits", "gate", gate=True)
    return clock


def classify(top1: str, answer: str, verdict: bool | None) -> str:
    """The list's class (the module's docstring) from TOP1, the answer and the gate's verdict (None: not asked)."""
    if verdict is False:
        return "gate refuses"
    if answer == top1:
        return "kept"
    return "changed, gate admits" if verdict else "changed"


def steps_of(ms: dict[str, float]) -> dict[str, float]:
    """One answer's steps (`STEPS`) from the wrapped methods' times: `choose` is `unbatch` less the steps inside it."""
    inside = sum(ms.get(step, 0.0) for step in ("candidates", "features", "gate"))
    return {step: ms.get(step, 0.0) for step in STEPS[:-1]} | {"choose": ms.get("unbatch", 0.0) - inside,
                                                                "model": ms.get("predict_batch", 0.0)}


def ask_in_process(corrector: Any, clock: Clock, bodies: list[dict]) -> list[dict[str, Any]]:
    """Answer each list alone through `predict_batch`; one row per list: its class and its steps' ms."""
    from preprocess.text import NBest, top1_answer

    rows = []
    for body in bodies:
        nbest = NBest(tuple(body["sentence_list"]), tuple(body.get("phoneme_sequence_list") or ()))
        t0 = time.perf_counter()
        [answer] = corrector.predict_batch([nbest])
        total = (time.perf_counter() - t0) * 1000
        ms, verdict = clock.take()
        rows.append({"way": "in process", "class": classify(top1_answer(nbest.sentences), answer, verdict),
                     "total": total, **steps_of(ms)})
    return rows


def ask_served(config: Config, corrector: Any, clock: Clock, bodies: list[dict]) -> list[dict[str, Any]]:
    """Answer each list alone through the app around `corrector`; one row per list the model answered."""
    from api.app import create_app
    from api.state import EXTENSION_KEY
    from preprocess.text import top1_answer

    app = create_app(config, corrector=corrector)
    client = app.test_client()
    rows = []
    try:
        for body in bodies:
            clock.take()
            t0 = time.perf_counter()
            response = client.post("/inference", json=body)
            total = (time.perf_counter() - t0) * 1000
            ms, verdict = clock.take()
            if response.status_code != 200 or "predict_batch" not in ms:
                continue  # answered without the model (its path says why): not this table's
            steps = steps_of(ms)
            rows.append({"way": "served", "total": total, **steps, "outside the model": total - steps["model"],
                         "class": classify(top1_answer(body["sentence_list"]), response.get_json()["answer"], verdict)})
    finally:
        app.extensions[EXTENSION_KEY].engine.close(timeout=2.0)
    return rows


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per way and class: how many lists, each figure's mean in ms (the steps' means add up to the total's), and the
    total's median."""
    out = []
    for way in ("in process", "served"):
        for cls in CLASSES:
            group = [r for r in rows if r["way"] == way and r["class"] == cls]
            if group:
                keys = [k for k in group[0] if k not in ("way", "class")]
                out.append({"way": way, "class": cls, "lists": len(group),
                            **{k: round(statistics.fmean(r[k] for r in group), 3) for k in keys},
                            "total_median": round(statistics.median(r["total"] for r in group), 3)})
    return out


def measure(folder: Path, bodies: list[dict], config: Config,
            build: Callable[[Config, Path], Any] | None = None) -> dict[str, Any]:
    """One folder's rows and medians: half of `bodies` asked in process, half served."""
    if build is None:
        from hosting.build import load_corrector as build
    corrector = build(config, folder)
    clock = instrument(corrector)
    half = len(bodies) // 2
    asked = ask_in_process(corrector, clock, bodies[:half]) + ask_served(config, corrector, clock, bodies[half:])
    rows = [{k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()} for row in asked]
    reranker = corrector.reranker
    return {"folder": str(folder), "adapted": getattr(corrector, "adaptation", None) is not None,
            "gate": reranker is not None and reranker.gate is not None, "summary": summary(rows), "rows": rows}


def table(results: list[dict[str, Any]]) -> list[str]:
    """The summary as one markdown table, a row per folder, way and class (means in ms; the total's median last)."""
    head = "folder | way | class | lists | " + " | ".join(STEPS) + " | model | outside the model | total | median"
    return report.table(head, [[Path(r["folder"]).name, m["way"], m["class"], m["lists"],
                                *(f"{m[k]:.2f}" for k in STEPS), f"{m['model']:.2f}",
                                f"{m['outside the model']:.2f}" if "outside the model" in m else "-",
                                f"{m['total']:.2f}", f"{m['total_median']:.2f}"]
                               for r in results for m in r["summary"]])


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m testing.answer_path", description=__doc__.split("\n")[0])
    parser.add_argument("--weights", type=Path, action="append",
                        help="a weights folder to measure (repeat; default: the shipped one)")
    parser.add_argument("--lists", type=int, default=400, help="simulated lists per folder, half served (default 400)")
    parser.add_argument("--seed", type=int, default=11, help="the simulated lists' seed (default 11)")
    parser.add_argument("--out", type=Path, default=Path("out/answer_path"), help="where answer_path.json goes")
    args = parser.parse_args()
    from testing.samples import simulated_bodies

    # a patient budget: one question at a time is never late, and none is refused for the clock
    config = replace(Config.from_env(), judge_timeout_s=30.0, log_level="WARNING")
    folders = args.weights or [DEFAULT_WEIGHTS_DIR]
    # each folder its own lists: what one featurized is in caches shared by every corrector of the process
    bodies = [body | {"esun_uuid": f"answer-path-{k}"}
              for k, body in enumerate(simulated_bodies(args.lists * len(folders), seed=args.seed, distinct=True))]
    results = [measure(folder, bodies[k * args.lists : (k + 1) * args.lists], config)
               for k, folder in enumerate(folders)]
    lines = table(results)
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "answer_path.json").write_text(json.dumps(
        {"machine": f"{platform.node()}, {platform.processor() or platform.machine()}", "lists": args.lists,
         "seed": args.seed, "results": results}, ensure_ascii=False, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    cli.run(main, "testing.answer_path")
