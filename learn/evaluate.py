"""Score the corrector on labelled n-best lists: `python -m learn.evaluate [--data FILE] [--stage all]`.

Evaluation sets (3,000 lists each by default, seeded; none of them is what the second stage was fitted on):
- `test`: the news test split (documents never trained on), our default simulated recogniser;
- `reviews`: product-review text (never trained on), the REVIEWS recogniser with other error rates and mix;
- `decoded`: the news test split decoded by `learn.data.decode_sim` — lattices of sound-alike characters
  decoded under a character bigram of the review text, so errors are fluent as a real recogniser's are;
- any labelled file given with `--data` (the competition's JSON list or JSONL of the same objects).

Per set: TOP1 CER, answer CER, n-best oracle CER, the share of the TOP1 → oracle gap closed, sentences made
better / worse, right TOP1s changed. Answers come from the corrector in this process (`--stage` picks the
network alone, LM rescoring alone or both; `--stage all` prints the ablation table), under the service's rule for
long lists: a TOP1 of more than `max_top1_chars` characters is answered as itself (`served_answers`). A running
service is scored the same way, asked as the judge asks, by `python -m testing.judge --url URL --data FILE` (or
`--sets`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rapidfuzz.distance import Levenshtein

from config import DEFAULT_WEIGHTS_DIR, STAGES, Config
from learn.data.simulate import DEFAULT, REVIEWS, load_simulator
from learn.written import wrote
from model.corrector import Corrector
from model.weights_meta import WeightsMeta
from preprocess.text import NBest, han_chars, strip_spaces, top1_answer

# The ablation table's rows: the network alone first, the whole corrector last.
ABLATION = STAGES[::-1]
SHOWN_MALFORMED = 20
SIM_SETS = ("test", "reviews", "decoded")


@dataclass(frozen=True)
class LabelledSet:
    name: str
    nbests: list[NBest]
    truths: list[str]


@dataclass(frozen=True)
class SetScore:
    """What a user's score is made of, on one set."""

    sentences: int
    top1_cer: float
    answer_cer: float
    oracle_cer: float
    gap_closed: float | None  # (TOP1 errors - answer errors) / (TOP1 errors - oracle errors); None: no gap (TOP1 alone)
    made_better: int
    made_worse: int
    made_worse_share: float
    top1_right: int
    top1_right_changed: int
    top1_right_changed_share: float


def cer_score(nbests: list[NBest], truths: list[str], answers: list[str]) -> SetScore:
    """Score answers against truths, beside TOP1 and the n-best oracle (characters as the judge counts)."""
    total = max(1, sum(map(len, truths)))
    top1_e = ans_e = oracle_e = better = worse = right = right_changed = 0
    for nb, ans, ref in zip(nbests, answers, truths, strict=True):
        hyps = [han_chars(h) or strip_spaces(h) for h in nb.sentences] or [""]
        t1 = Levenshtein.distance(hyps[0], ref)
        a = Levenshtein.distance(ans, ref)
        top1_e += t1
        ans_e += a
        oracle_e += min(Levenshtein.distance(h, ref) for h in hyps)
        better += a < t1
        worse += a > t1
        right += t1 == 0
        right_changed += t1 == 0 and ans != hyps[0]
    n = max(1, len(truths))
    gap = (top1_e - ans_e) / (top1_e - oracle_e) if top1_e > oracle_e else None
    return SetScore(len(truths), top1_e / total, ans_e / total, oracle_e / total, gap, better, worse, worse / n,
                    right, right_changed, right_changed / max(1, right))


def simulated_set(corpus: Path, name: str, limit: int) -> LabelledSet:
    """Build one of the simulated evaluation sets, seeded."""
    if name == "decoded":
        from learn.data.decode_sim import DecodeConfig, DecodingSimulator

        sim = DecodingSimulator.from_corpus(corpus, DecodeConfig())
        split, seed = "test", 13
    else:
        sim = load_simulator(corpus, DEFAULT if name == "test" else REVIEWS)
        split, seed = ("test", 11) if name == "test" else ("reviews", 12)
    rng = random.Random(seed)
    sents = [s for s in (corpus / f"{split}.txt").read_text(encoding="utf-8").split("\n") if s][:limit]
    # what was said holds, now and then, a spoken filler that the truth keeps
    pairs = [sim.sample(s, rng, phones=True) for s in sents]
    return LabelledSet(name, [nb for nb, _ in pairs], [t for _, t in pairs])


def file_set(path: Path, limit: int) -> LabelledSet:
    """Read a labelled file (the competition's format) as an evaluation set; a malformed row is named on stderr and
    skipped, as `learn.adapt` does."""
    from learn.data.labelled import read_labelled_lenient

    read = read_labelled_lenient(path)
    for line in read.malformed[:SHOWN_MALFORMED]:
        print(f"skipped, malformed: {line}", file=sys.stderr)
    if len(read.malformed) > SHOWN_MALFORMED:
        print(f"skipped {len(read.malformed) - SHOWN_MALFORMED} more malformed rows of {path}", file=sys.stderr)
    items = read.items[: limit or None]
    return LabelledSet(path.name, [it.nbest for it in items], [it.truth for it in items])


def distinct_names(sets: list[LabelledSet]) -> list[LabelledSet]:
    """The sets, each named once: files of one name (two folders' `nbest_test.jsonl`) are numbered in the order given,
    else the second would be scored into the first's column."""
    counts = Counter(s.name for s in sets)
    out, seen = [], Counter()
    for s in sets:
        seen[s.name] += 1
        out.append(replace(s, name=f"{s.name} ({seen[s.name]})") if counts[s.name] > 1 else s)
    return out


def local_answers(corrector: Corrector, nbests: list[NBest]) -> list[str]:
    """Answer every list with the corrector in this process, in batches of 64."""
    answers: list[str] = []
    for i in range(0, len(nbests), 64):
        answers += corrector.predict_batch(nbests[i : i + 64])
    return answers


def served_answers(corrector: Corrector, lists: list[NBest], max_top1_chars: int) -> list[str]:
    """Answer as the service does (`api.answers`): a TOP1 of more than `max_top1_chars` characters besides whitespace
    is answered TOP1 without asking the model (which reads at most `model.features.MAX_LEN` of them)."""
    long = [len(strip_spaces(nb.top1)) > max_top1_chars for nb in lists]
    asked = local_answers(corrector, [nb for nb, skip in zip(lists, long, strict=True) if not skip])
    said = iter(asked)
    return [top1_answer(nb.sentences) if skip else next(said) for nb, skip in zip(lists, long, strict=True)]


def timings(corrector: Corrector, nbests: list[NBest]) -> dict:
    """Median time of a batch of 64 and of 1, and the process's peak memory."""
    return {"ms_per_batch_64": 1000 * timed(corrector.predict_batch, nbests[:64]),
            "ms_per_batch_1": 1000 * timed(corrector.predict_batch, nbests[:1], repeat=20),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


ROWS = [("sentences", "{:d}"), ("top1_cer", "{:.2%}"), ("answer_cer", "{:.2%}"), ("oracle_cer", "{:.2%}"),
        ("gap_closed", "{:.1%}"), ("made_better", "{:d}"), ("made_worse", "{:d}"), ("made_worse_share", "{:.2%}"),
        ("top1_right", "{:d}"), ("top1_right_changed", "{:d}"), ("top1_right_changed_share", "{:.2%}")]


def table(results: dict[str, dict], rows: list[tuple[str, str]] = ROWS) -> str:
    """Render {set: {metric: value}} as a markdown table, one column per set."""
    names = list(results)
    lines = [f"| metric | {' | '.join(names)} |", "|---|" + "---|" * len(names)]
    for key, fmt in rows:
        if not any(key in results[s] for s in names):
            continue
        cells = [("n/a" if results[s][key] is None else fmt.format(results[s][key])) if key in results[s] else ""
                 for s in names]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def evaluate(sets: list[LabelledSet], answer: Callable[[LabelledSet], tuple[list[str], dict]]) -> dict[str, dict]:
    """Answer and score each set; extra figures from `answer` (timings) join its column."""
    results = {}
    for data in sets:
        answers, extra = answer(data)
        results[data.name] = asdict(cer_score(data.nbests, data.truths, answers)) | extra
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Score the corrector on labelled n-best lists.")
    ap.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS_DIR)
    ap.add_argument("--data", type=Path, action="append", default=[], help="labelled file(s) to score")
    ap.add_argument("--sets", default=None, help=f"simulated sets, comma-separated (default {','.join(SIM_SETS)};"
                    " none when --data is given)")
    ap.add_argument("--limit", type=int, default=None,
                    help="lists per set (default: 3,000 per simulated set, all of a --data file)")
    ap.add_argument("--stage", choices=(*ABLATION, "all"), default="full", help="all: the ablation table")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mlm-dir", type=Path, help="the masked LM (MLM_DIR) a --weights folder was fitted with")
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ap.add_argument("--write", action="store_true", help="store the figures in the weights' config.json")
    args = ap.parse_args(argv)
    names = [s for s in (args.sets if args.sets is not None else ("" if args.data else ",".join(SIM_SETS)))
             .split(",") if s]
    if names and not (args.corpus / "test.txt").exists():
        from learn.data.corpus import build, write

        write(build(), args.corpus)
    try:
        sets = [simulated_set(args.corpus, n, args.limit or 3000) for n in names]
        sets += [file_set(p, args.limit or 0) for p in args.data]
        sets = distinct_names(sets)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from model.contract import FeatureContractError, check_weights_dir
    from model.masked_lm import MaskedLMError

    try:
        if not args.weights.is_dir():
            raise FeatureContractError(f"--weights must name an existing weights folder, got {str(args.weights)!r}")
        check_weights_dir(args.weights)
    except FeatureContractError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    results = {}
    longest = Config().max_top1_chars  # a longer TOP1 is answered as itself, as the service answers it
    for stage in ABLATION if args.stage == "all" else (args.stage,):
        corrector = Corrector(args.weights, device=args.device, stage=stage, masked_lm_dir=args.mlm_dir)
        try:
            corrector.setup()
        except MaskedLMError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        results[stage] = evaluate(sets, lambda d, c=corrector: (served_answers(c, d.nbests, longest),
                                                                timings(c, d.nbests)))
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    written = ""
    if args.write:
        evaluation = results.get("full", next(iter(results.values()))) | {"machine": machine}
        written = wrote(WeightsMeta.load(args.weights).replace(evaluation=evaluation).save(args.weights))
    if args.json:
        print(json.dumps(results | {"machine": machine}, indent=1))
        if written:
            print(written, file=sys.stderr)  # stdout is the JSON
        return 0
    extra = [("ms_per_batch_64", "{:.1f}"), ("ms_per_batch_1", "{:.1f}"), ("peak_rss_mib", "{:.0f}")]
    for stage, by_set in results.items():
        print(f"\n## {stage}\n\n{table(by_set, ROWS + extra)}")
    if len(results) > 1:
        print("\n## ablation: answer CER (gap closed)\n")
        print("| set | " + " | ".join(results) + " |\n|---|" + "---|" * len(results))
        for name in next(iter(results.values())):
            print(f"| {name} | " + " | ".join(f"{r[name]['answer_cer']:.2%} ({_share(r[name]['gap_closed'])})"
                                              for r in results.values()) + " |")
    print(f"\nmachine: {machine}")
    if written:
        print(written)
    return 0


def timed(fn, *args, repeat: int = 5) -> float:
    """Return the median wall time of fn(*args) in seconds."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


if __name__ == "__main__":
    sys.exit(main())
