"""What limits a (adapted) corrector on labelled lists, error span by error span: `learn.crossval --limits`, or
`python -m learn.limits --weights DIR --data FILE [--train FILE]`.

Each wrong TOP1 is cut into its error spans (`preprocess.rules.edit_spans(top1, truth)`, classed by
`learn.error_stats.classify_span`). Every span lands in the first of these that holds:

- `fixed`: the answer makes that very edit;
- `ranked_wrong`: some candidate of the second stage makes it, the answer does not (the stage kept TOP1, or chose
  another sentence); split by whether the word trigram alone, and the domain LM alone, prefer TOP1 with this span
  fixed to TOP1;
- `under_floor`: no candidate makes it, but one of the folder's confusion rules would (its trust under the trust
  floor, or past the rewrites offered per list);
- `seen_rarely`: no rule, but the train lists (`--train`) hold the same rewrite, fewer times than a rule needs;
- `unseen`: the train lists never hold it.

A TOP1 longer than the service's `max_top1_chars` is answered TOP1 there: such lists are counted, not diagnosed.
Counted in spans and in error characters (a span weighs max(len(source), len(target))), per class. Lists: how
many wrong TOP1s have the whole truth among the candidates, and how many lists the answer made worse.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rapidfuzz.distance import Levenshtein

from config import Config
from learn.error_stats import SPAN_CLASSES, classify_span
from model.corrector import Corrector
from preprocess.rules import Span, edit_spans, span_context
from preprocess.text import NBest, han_chars, strip_spaces

OUTCOMES = ("fixed", "ranked_wrong", "under_floor", "seen_rarely", "unseen")


def _key(span: Span) -> tuple[int, int, str]:
    return span.i1, span.i2, span.target


def train_rewrites(pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
    """Every (source, target) and (source in context, target in context) rewrite the train pairs hold."""
    out: set[tuple[str, str]] = set()
    for top1, truth in pairs:
        for s in edit_spans(top1, truth):
            ctx = span_context(top1, s)
            out.add((s.source, s.target))
            out.add((ctx, ctx[0] + s.target + ctx[-1]))
    return out


def limits_of(corrector: Corrector, lists: list[NBest], truths: list[str],
              train: Sequence[tuple[str, str]] = (), max_top1_chars: int | None = None) -> dict[str, Any]:
    """Count each error span's outcome, in spans and characters, per class (the module's docstring); a list whose
    TOP1 is longer than `max_top1_chars` (the service answers it TOP1) is only counted."""
    assert corrector.reranker is not None, "the limits are the second stage's: a folder with a fitted full stage"
    reranker = corrector.reranker
    seen = train_rewrites(train)
    spans: Counter[tuple[str, str]] = Counter()
    chars: Counter[tuple[str, str]] = Counter()
    ranked: Counter[str] = Counter()  # ranked_wrong spans by what prefers their fix
    lists_out: Counter[str] = Counter()
    w = reranker.weights.vector()
    for start in range(0, len(lists), 64):
        chunk = lists[start : start + 64]
        batch = corrector.batch(chunk)
        probs = corrector.predict(batch)
        for k, example in enumerate(batch.examples):
            truth = truths[start + k]
            if example is None:
                continue
            top1 = example.top1
            if max_top1_chars is not None and len(strip_spaces(chunk[k].top1)) > max_top1_chars:
                lists_out["too_long"] += 1
                continue
            p = probs[k]
            answer = reranker.choose(example, p)
            before, after = Levenshtein.distance(top1, truth), Levenshtein.distance(answer, truth)
            lists_out["lists"] += 1
            lists_out["made_worse"] += after > before
            lists_out["made_better"] += after < before
            if before == 0:
                lists_out["right_changed"] += answer != top1
                continue
            cands = reranker.candidates(example, p)
            texts = [c.text for c in cands]
            lists_out["wrong"] += 1
            lists_out["truth_among_candidates"] += truth in texts
            lists_out["better_candidate"] += min(Levenshtein.distance(t, truth) for t in texts) < before
            made = {t: {_key(s) for s in edit_spans(top1, t)} for t in texts}
            by_rule = {(a, b, target) for a, b, target, _ in reranker.adaptation.confusions.matches(top1)} \
                if reranker.adaptation is not None else set()
            answer_edits = {_key(s) for s in edit_spans(top1, answer)}
            for span in edit_spans(top1, truth):
                cls = classify_span(span.source, span.target)
                key = _key(span)
                ctx = span_context(top1, span)
                if key in answer_edits:
                    outcome = "fixed"
                elif any(key in edits for edits in made.values()):
                    outcome = "ranked_wrong"
                    fixed = top1[: span.i1] + span.target + top1[span.i2 :]
                    row = np.array(reranker.rows(example, p, [cands[0], *[c for c in cands if c.text == fixed]])
                                   if fixed in texts else [], dtype=np.float64)
                    assert reranker.lm is not None
                    ranked["trigram prefers the fix"] += reranker.lm.score(fixed).logp > reranker.lm.score(top1).logp
                    if reranker.adaptation is not None:
                        dom = reranker.adaptation.domain_lm
                        ranked["domain LM prefers the fix"] += dom.score(fixed) > dom.score(top1)
                    ranked["the fix alone is a candidate"] += len(row) == 2
                    if len(row) == 2:
                        lead = float((row[1] - row[0]) @ w)
                        ranked["its lead clears the margin"] += lead >= reranker.weights.margin
                    ranked["the stage kept TOP1"] += answer == top1
                    ranked["spans"] += 1
                elif key in by_rule:
                    outcome = "under_floor"
                elif (span.source, span.target) in seen or (ctx, ctx[0] + span.target + ctx[-1]) in seen:
                    outcome = "seen_rarely"
                else:
                    outcome = "unseen"
                spans[(cls, outcome)] += 1
                chars[(cls, outcome)] += max(len(span.source), len(span.target))
    return {"lists": dict(lists_out), "ranked_wrong": dict(ranked),
            "spans": {f"{c}/{o}": n for (c, o), n in sorted(spans.items())},
            "chars": {f"{c}/{o}": n for (c, o), n in sorted(chars.items())}}


def add(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Sum two `limits_of` results (folds)."""
    return {part: dict(Counter(a.get(part, {})) + Counter(b.get(part, {})))
            for part in ("lists", "ranked_wrong", "spans", "chars")}


def markdown(result: dict[str, Any], unit: str = "chars") -> str:
    """A class × outcome table (error characters by default), with totals."""
    counts = result[unit]
    lines = [f"| class ({unit}) | " + " | ".join(OUTCOMES) + " | all |", "|---|" + "---|" * (len(OUTCOMES) + 1)]
    col = Counter()
    for cls in (*SPAN_CLASSES, "all"):
        cells = [sum(counts.get(f"{c}/{o}", 0) for c in SPAN_CLASSES) if cls == "all" else counts.get(f"{cls}/{o}", 0)
                 for o in OUTCOMES]
        if not sum(cells):
            continue
        col.update(dict(zip(OUTCOMES, cells, strict=True)))
        lines.append(f"| {cls} | " + " | ".join(str(c) for c in cells) + f" | {sum(cells)} |")
    total = max(1, sum(sum(counts.get(f"{c}/{o}", 0) for c in SPAN_CLASSES) for o in OUTCOMES))
    lines.append("| share | " + " | ".join(f"{sum(counts.get(f'{c}/{o}', 0) for c in SPAN_CLASSES) / total:.1%}"
                                         for o in OUTCOMES) + " | 100 % |")
    lists = result["lists"]
    lines += ["", "lists: " + ", ".join(f"{k} {v}" for k, v in lists.items()),
              "ranked wrong: " + ", ".join(f"{k} {v}" for k, v in result["ranked_wrong"].items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from learn.data.labelled import read_labelled

    ap = argparse.ArgumentParser(description="Tell what limits a corrector on a labelled file, span by span.")
    ap.add_argument("--weights", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True, help="the labelled lists to diagnose")
    ap.add_argument("--train", type=Path, help="the labelled lists the folder learned from (seen_rarely vs unseen)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    corrector = Corrector(args.weights, device="cpu")
    corrector.setup()
    items = read_labelled(args.data)
    train = [(han_chars(it.nbest.top1), han_chars(it.truth)) for it in read_labelled(args.train)] if args.train else []
    result = limits_of(corrector, [it.nbest for it in items], [han_chars(it.truth) for it in items], train,
                       Config().max_top1_chars)
    print(json.dumps(result, indent=1, ensure_ascii=False) if args.json else
          markdown(result) + "\n\n" + markdown(result, "spans"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
