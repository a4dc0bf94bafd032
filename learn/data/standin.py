"""Stand-ins for a team's labelled file, and the error statistics to compare them with real ones.

`python -m learn.data.standin --stats FILE [--against OTHER]` prints a labelled file's aggregate TOP1 errors
(`learn.error_stats`: definitions there) beside the real competition data's (`REAL`), and, with
`--against`, the share of OTHER's spans already seen in FILE.

`python -m learn.data.standin --profile real|hard|real-shaped|hard-shaped|easy --out DIR [--train N --test M]` writes one, in two versions of
the same lists: `nbest_*.jsonl` (10 hypotheses with phone strings) and `top1_*.jsonl` (TOP1 alone, no phones);
`*_train.jsonl` and `*_test.jsonl` come from disjoint clauses. Without `--profile`, the easy one (what docs
report figures on, and what `make standin` writes to data/standin).

**real** (`RealRecogniser`): calibrated to the real data's aggregate figures (`REAL`, tolerances `TOLERANCE_*`),
never to a model's results.

- *Truths*: corpus clauses (news train and dev, reviews past `REVIEW_HOLDOUT`) holding a finance word
  (`FINANCE_WORDS`) first, others only when those run out; each clause cut at word boundaries into utterances of
  a drawn length (mean about 10.8 characters); `p_start_filler` of them start with a spoken filler (呃, 欸, 嗯,
  痾), as call-centre speech does. The test file's utterances come first, from clauses of news dev and reviews
  (text the shipped model never trained on); train's from the other clauses, no utterance in both.
- *TOP1*: a list is wrong with `p_wrong`, with 1-5 error spans (`spans_when_wrong`) kept apart by a correct
  character. A span is, with `p_systematic`, one of the recogniser's systematic rewrites (a seeded inventory
  ranked Zipf-like: the fillers 呃→痾, 嗯→呃 and dropped 呃/欸/嗯, function-word homophones 在/再, 的/得/地,
  有/又, 以/已, the domain's 券→卷, 帳→賬, the variant forms 周→週, 布→佈, 臺→台, then rewrites of frequent
  words of each class), chosen among those whose spoken side occurs in the truth (a rewrite's chance is its
  Zipf weight over how often its spoken side occurs, so that what is seen follows the ranks); otherwise, or
  where none applies, a one-off span of a class drawn towards the real mix (`SPAN_MIX`: each class weighted by
  how far it lags its share so far, so that classes a truth cannot hold, such as a filler or a variant form, are
  made up later), its length drawn per class (`SPAN_LENGTHS`), its characters from the sound-alike sets
  (`ConfusionSet` of corpus character counts) or, for `other`, characters of other sounds.
- *Hypotheses 2-10*: TOP1 with its spans kept, undone or heard otherwise, and sound-alike errors elsewhere;
  in `p_truth_listed` of the lists with a wrong TOP1 the truth itself, at a rank drawn uniformly from 2-10 (the
  only evidence: 3 of the 4 wrong TOP1s among 11 public real lists had the truth at ranks 3, 9 and 10); all
  distinct; spaced as the truth's corpus words, an added word its own.

**hard** (`--profile hard`, issue 39): the real profile's recogniser whose one-off homophone, near and other
spans are decoder's errors: a whole word heard as a sound-alike corpus word, drawn by how much the shipped word
trigram prefers the sentence with it (`p_fluent`), else the writing its character bigram of corpus text prefers
(`p_decoded`). Real errors are mostly plausible text: on real lists the shipped trigram prefers the wrong TOP1 in
39 % of the wrong lists, on the real profile in 11 %, on this one in about 35 %.

**real-shaped**, **hard-shaped** (issue 60): the same two recognisers whose lower hypotheses vary one or two of the
list's few uncertain stretches, as a real recogniser's do (`learn.data.focused`; `python -m learn.list_shape` compares
shapes), instead of each adding errors of its own anywhere.

**easy** (`--profile easy`): product reviews through `learn.data.decode_sim`'s decoding recogniser, with a
transcriber layer: the truths write one orthographic variant where the recogniser writes the other
(`VARIANT_CONVENTIONS`), one spoken filler where it writes another (`FILLER_CONVENTIONS`), and the words most
over-represented in reviews against news are heard, each consistently, as one homophone in `p_domain_error` of
the hypotheses. Far easier than real data: few distinct rewrites, most repeated.

Seeded and deterministic.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from learn.data.decode_sim import REVIEW_HOLDOUT, DecodingSimulator
from learn.data.labelled import Labelled, read_labelled_lenient, write_labelled
from learn.data.real_profile import PROFILES, RealConfig
from learn.data.standin_easy import (
    FILLER_CONVENTIONS,
    VARIANT_CONVENTIONS,
    Transcribers,
    domain_homophones,
    make_lists,
)
from learn.data.standin_real import FINANCE_WORDS, build_real
from learn.error_stats import (
    LENGTH_CHANGES,
    REAL,
    REAL_HARDNESS,
    REAL_HELD_OUT,
    REAL_LISTS,
    SPAN_CLASSES,
    Against,
    ErrorStats,
    against,
    error_stats,
)
from preprocess.text import NBest


def top1_only(items: list[Labelled]) -> list[Labelled]:
    """The same lists with TOP1 alone and no phone strings."""
    return [Labelled(it.id, it.truth, NBest(it.nbest.sentences[:1])) for it in items]


def stats_rows(stats: ErrorStats, seen: Against | None = None) -> list[tuple[str, str, str]]:
    """The table `--stats` prints: (measure, this file, real)."""

    def pct(x: float | None) -> str:
        return "" if x is None else f"{100 * x:.1f} %"

    rows = [("lists", f"{stats.lists:,}", f"{REAL_LISTS:,}"),
            ("TOP1 exactly right", pct(stats.top1_right), pct(REAL.top1_right)),
            ("TOP1 CER (pooled)", pct(stats.cer), pct(REAL.cer)),
            ("truth length (characters, mean)", f"{stats.truth_chars:.1f}", f"{REAL.truth_chars:.1f}"),
            ("wrong TOP1 with one error span", pct(stats.one_span), pct(REAL.one_span)),
            ("spans", f"{stats.rewrites.spans:,}", "")]
    for cls in SPAN_CLASSES:
        real_chars = REAL.char_share.get(cls)
        rows.append((f"  {cls}: % of spans / % of error characters",
                     f"{pct(stats.span_share[cls])} / {pct(stats.char_share[cls])}",
                     f"{pct(REAL.span_share[cls])} / {pct(real_chars) if real_chars is not None else '-'}"))
    rows.append(("  added + dropped + other length: % of error characters",
                 pct(sum(stats.char_share[c] for c in LENGTH_CHANGES)), pct(REAL.char_share_length_changes)))
    r = stats.rewrites
    rows += [("distinct rewrites (whole file)", f"{r.distinct:,}; {r.twice:,} twice+; {r.thrice:,} thrice+", ""),
             ("  per 1,000 spans", f"{r.distinct_per_1000:.0f}", ""),
             (f"  top {30} rewrites' share of spans", pct(r.top_share), "")]
    at = stats.rewrites_at_real
    if at is not None:
        rows += [(f"distinct rewrites in the first {REAL_LISTS:,} lists",
                  f"{at.distinct:,}; {at.twice:,} twice+; {at.thrice:,} thrice+",
                  f"{REAL.distinct:,}; {REAL.twice} twice+; {REAL.thrice} thrice+"),
                 ("  per 1,000 spans", f"{at.distinct_per_1000:.0f}", ""),
                 ("  top 30 rewrites' share of spans", pct(at.top_share), pct(REAL.top_share))]
    if seen is not None:
        rows.append(("other file's spans seen here / seen twice+", f"{pct(seen.seen)} / {pct(seen.seen_twice)}",
                     ""))
        if seen.seen_at_real is not None:
            rows.append((f"  its first {REAL_HELD_OUT:,} lists' spans in this file's first {REAL_LISTS:,}",
                         f"{pct(seen.seen_at_real)} / {pct(seen.seen_twice_at_real)}",
                         f"{pct(REAL.seen)} / {pct(REAL.seen_twice)}"))
    return rows


def hardness_rows(items: list[Labelled]) -> list[tuple[str, str, str]]:
    """The hardness measures (issue 39) of the file's first REAL_LISTS lists, its last REAL_HELD_OUT of them held
    out: how often the shipped trigram (alone, and with half a character trigram of the other lists' truths) scores
    the truth above a wrong TOP1, the rates of the rules the other lists teach, and the rule memo (the reference
    learner, `learn.memo_baseline`) against TOP1. They need the shipped language model: the one measure here that
    reaches past pure strings, imported only when asked for."""
    from learn.memo_baseline import MEMO_MARGINS, hardness
    from model.lm import LanguageModel

    pairs = [(it.nbest.top1, it.truth) for it in items[:REAL_LISTS]]
    cut = max(1, len(pairs) - REAL_HELD_OUT) if len(pairs) > REAL_HELD_OUT else len(pairs) * 3 // 5
    h = hardness(pairs[:cut], pairs[cut:], LanguageModel())
    q = " / ".join(f"{x:.2f}" for x in h.rate_quartiles)
    rq = " / ".join(f"{x:.2f}" for x in REAL_HARDNESS.rate_quartiles)
    rows = [(f"hardness ({cut:,} lists teach, {len(pairs) - cut:,} held out; {h.wrong_lists:,} wrong TOP1s)", "", ""),
            ("  trigram scores the truth above a wrong TOP1", f"{100 * h.lm_prefers_truth:.1f} %",
             f"{100 * REAL_HARDNESS.lm_prefers_truth:.1f} %"),
            ("  same + 0.5 x character trigram of the taught truths", f"{100 * h.lm_chars_prefers_truth:.1f} %",
             f"{100 * REAL_HARDNESS.lm_chars_prefers_truth:.1f} %"),
            ("  rate quartiles of rules seen twice+ (share at 0.5+)", f"{q} ({100 * h.rate_share_half:.0f} %)",
             f"{rq} ({100 * REAL_HARDNESS.rate_share_half:.0f} %)")]
    for margin in MEMO_MARGINS:
        real = REAL_HARDNESS.memo_cer_change.get(margin)
        rows.append((f"  rule memo vs TOP1, margin {margin:g} (lists made worse)",
                     f"{100 * h.memo_cer_change[margin]:+.1f} % ({h.memo_worse[margin]})",
                     f"{100 * real:+.1f} % ({REAL_HARDNESS.memo_worse[margin]})" if real is not None else ""))
    return rows


def print_stats(path: Path, other: Path | None, hard: bool = True) -> None:
    """Print a labelled file's error statistics beside the real data's (and, with `hard`, its hardness)."""
    read = read_labelled_lenient(path)
    stats = error_stats([(it.nbest.top1, it.truth) for it in read.items])
    seen = None
    if other is not None:
        seen = against(stats, [(it.nbest.top1, it.truth) for it in read_labelled_lenient(other).items])
    rows = [("measure", str(path.name), "real"), *stats_rows(stats, seen)]
    if hard:
        rows += hardness_rows(read.items)
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, width, strict=True)).rstrip())
    if read.malformed:
        print(f"({len(read.malformed)} malformed rows skipped; first: {read.malformed[0]})", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description="Write a stand-in labelled file (two versions, train and test), or "
                                             "print a labelled file's error statistics beside the real data's.")
    ap.add_argument("--stats", type=Path, metavar="FILE", help="print FILE's error statistics and stop")
    ap.add_argument("--against", type=Path, metavar="OTHER", help="with --stats: OTHER's spans seen in FILE")
    ap.add_argument("--no-hardness", action="store_true",
                    help="with --stats: leave out the hardness measures (they load the shipped language model)")
    ap.add_argument("--profile", choices=("easy", *PROFILES), default="easy",
                    help="easy: the decoding recogniser on reviews (docs' figures); real: calibrated to REAL; "
                         "hard: real with fluent, decoded errors (issue 39); real-shaped, hard-shaped: the same "
                         "with lower hypotheses that vary one or two uncertain stretches, as real lists' do (issue 60)")
    ap.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    ap.add_argument("--out", type=Path,
                    help="default data/standin (easy), data/standin-real (real), data/standin-hard (hard)")
    ap.add_argument("--train", type=int, help="lists in the train files (default 20,000 easy, 40,000 real and hard)")
    ap.add_argument("--test", type=int, default=2_000, help="lists in the test files (other clauses)")
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--p-decoded", type=float,
                    help="real and hard profiles: share of one-off spans its own character bigram pulls (default 0 "
                         "real, 1 hard)")
    ap.add_argument("--p-fluent", type=float,
                    help="real and hard profiles: share of one-off spans that are a whole word heard as another, "
                         "drawn by the shipped trigram (default 0 real, 1 hard)")
    args = ap.parse_args()
    if args.stats is not None:
        print_stats(args.stats, args.against, not args.no_hardness)
        return
    if args.against is not None:
        ap.error("--against needs --stats")
    if not (args.corpus / "reviews.txt").exists():
        from learn.data.corpus import build, write

        write(build(), args.corpus)
    t0 = time.perf_counter()
    if args.profile == "easy":
        write_easy(args.corpus, args.out or Path("data/standin"), args.train or 20_000, args.test, args.seed, t0)
    else:
        knobs = (("p_decoded", args.p_decoded), ("p_fluent", args.p_fluent))
        config = replace(PROFILES[args.profile], **{k: v for k, v in knobs if v is not None})
        write_real(args.corpus, args.out or Path(f"data/standin-{args.profile}"), args.train or 40_000, args.test,
                   args.seed, t0, config, args.profile)


def write_real(corpus: Path, out: Path, n_train: int, n_test: int, seed: int, t0: float,
               config: RealConfig | None = None, profile: str = "real") -> None:
    """Write the calibrated stand-in's four files and its recogniser's description (`profile`: its name there)."""
    config = config if config is not None else PROFILES[profile]
    train, test, recogniser, truths = build_real(corpus, n_train, n_test, seed, config)
    out.mkdir(parents=True, exist_ok=True)
    for name, items in (("train", train), ("test", test)):
        write_labelled(items, out / f"nbest_{name}.jsonl")
        write_labelled(top1_only(items), out / f"top1_{name}.jsonl")
    (out / "recogniser.json").write_text(json.dumps(
        {"profile": profile, "seed": seed, "config": asdict(config), "finance_share": round(truths.finance_share, 4),
         "finance_words": FINANCE_WORDS, "systematic_rewrites": [asdict(r) for r in recogniser.inventory]},
        ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"wrote {out}: {len(train)} train and {len(test)} test lists, two versions ({profile} profile, "
          f"{truths.finance_share:.0%} of truths from finance clauses), in {time.perf_counter() - t0:.0f} s")


def write_easy(corpus: Path, out: Path, n_train: int, n_test: int, seed: int, t0: float) -> None:
    """Write the easy stand-in (the decoding recogniser on reviews with a transcriber layer)."""
    config = Transcribers()
    sim = DecodingSimulator.from_corpus(corpus)
    reviews = [s for s in (corpus / "reviews.txt").read_text(encoding="utf-8").split("\n")[REVIEW_HOLDOUT:] if s]
    news = [s for s in (corpus / "train.txt").read_text(encoding="utf-8").split("\n") if s]
    random.Random(seed).shuffle(reviews)
    homophones = domain_homophones(reviews, news, sim, config)
    out.mkdir(parents=True, exist_ok=True)
    parts = {"test": reviews[:n_test], "train": reviews[n_test : n_test + n_train]}
    for name, sentences in parts.items():
        items = make_lists(sim, sentences, homophones, config, seed + (name == "test"), f"standin-{name}")
        write_labelled(items, out / f"nbest_{name}.jsonl")
        write_labelled(top1_only(items), out / f"top1_{name}.jsonl")
    (out / "transcribers.json").write_text(json.dumps(
        {"variants": VARIANT_CONVENTIONS, "fillers": FILLER_CONVENTIONS, "domain_homophones": homophones,
         "config": asdict(config)}, ensure_ascii=False, indent=1),
        encoding="utf-8")
    print(f"wrote {out}: {len(parts['train'])} train and {len(parts['test'])} test lists, two versions, "
          f"{len(homophones)} domain words, in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
