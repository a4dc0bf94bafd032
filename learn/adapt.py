"""Adapt the shipped corrector to one recogniser and its transcribers: `python -m learn.adapt --data FILE --out DIR`.

Reads the competition's labelled file(s) (a JSON list or JSONL of `id`, `ground_truth_sentence`, `sentence_list`,
`phoneme_sequence_list`; 1 to 10 hypotheses, with or without phones; a malformed row is named and counted, a row of
more than 10 hypotheses is counted and read as its first 10, as the service reads it), refuses a file of fewer than
MIN_LISTS lists, splits the rows by a seeded hash of their ids into train / dev / test, and then, in a folder built
beside `--out`:

1. builds a **domain language model** of the train truths (IRSTLM, a Witten-Bell character trigram, repaired and
   checked by loading it; `model.adaptation`);
2. learns **the recogniser's confusions** (TOP1 → truth rewrite rules with counts, rates and trust: the rate out of
   fold, shrunk toward its kind's; `learn.rule_trust`) and, among them, **the transcribers' conventions** (variant
   forms and fillers written otherwise, seen clearly);
3. **fine-tunes the network** from the shipped weights on the train lists (checkpoints named by the data's sha256
   and the settings, inside the folder being built or under `--ckpt-dir`, where a stopped run resumes; removed
   when the run ends) and keeps it only if, alone, it does better than the shipped network on the dev lists;
4. **refits the second stage** (its weights, the domain LM's and the confusions' among them, drawn towards the
   shipped stage's, and its margin) on the dev lists and the train lists cross-fitted (each of `--folds` folds
   described by the domain LM and confusions the other folds taught), under the precision bound: at most
   `--max-worse` of those lists made worse and `--max-right-changed` of their right TOP1s changed; once per trust
   floor of `learn.rule_trust.TRUST_FLOORS` (the least trust that lets a rule act), keeping the floor whose stage
   does best on those lists;
5. prints the held-out test split's table: TOP1, the shipped model, the adapted one, the rule memo reference learner
   (`learn.memo_baseline`), and the ceiling of the adapted model's candidates (the best of them on each list) with
   the share of that gap each model closes; where the adapted model does not beat the shipped one there, the folder
   serves the shipped model (its conventions kept) and says so;
6. learns the rules and the domain LM the folder serves again from **every** list given (the stage's weights stay
   those fitted above), then renames the finished folder into place: `WEIGHTS_DIR=DIR make run` serves it.

Steps 2 and 4 live in `learn.adapt_refit`. A run that stops for any reason, Ctrl-C and SIGTERM included (one line
says so), leaves no folder behind (only `--ckpt-dir`'s checkpoints, to resume); an `--out`
that is the weights it starts from, or a folder that is not an earlier adapted one, is refused before anything is
read (the folder and its checkpoints: `learn.adapt_folder`). The settings and their command line:
`learn.adapt_settings`.
"""

from __future__ import annotations

import resource
import shutil
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from rapidfuzz.distance import Levenshtein

from config import Config
from learn.adapt_data import nbests, read_files
from learn.adapt_folder import adaptation_record, building, check_destination, masked_lm_record, run_key, swap_command
from learn.adapt_refit import learn_lm_and_confusions, refit
from learn.adapt_settings import AdaptSettings, parse_args
from learn.data.labelled import Labelled, LabelledFormatError, Split, split_three
from learn.domain_lm import DOMAIN_LM_ORDER, save_confusions
from learn.evaluate import ROWS, cer_score, served_answers, table
from learn.fit import dev_probs, fit
from learn.memo_baseline import MEMO_MARGINS, RuleMemo
from learn.rule_trust import FLOOR_CLOSED
from learn.train import pick_threshold, save, shipped_start
from learn.train_data import labelled_examples
from learn.train_settings import TrainSettings
from learn.tune import described_lists
from learn.written import portable
from model.adaptation import CONFUSIONS_FILE, AdaptationError, Conventions
from model.corrector import Corrector
from model.features import Featurizer
from model.lm import LanguageModel
from model.masked_lm import MaskedLM, MaskedLMError, check_folder
from model.network import CorrectorNet
from model.weights_meta import NETWORK_FILE, VOCAB_FILE, WeightsMeta
from preprocess.rules import Confusions
from preprocess.text import han_chars

# Fewer lists leave the split's parts a handful each, and too little text for the domain LM's estimate.
MIN_LISTS = 50
TEST_ROWS = [*ROWS[:4], ("candidates_cer", "{:.2%}"), ("candidates_gap_closed", "{:.1%}"), *ROWS[4:]]


def fine_tune(settings: AdaptSettings, train: list[Labelled], dev: list[Labelled], device: torch.device,
              out: Path, ckpt: Path) -> dict[str, Any]:
    """Fine-tune the shipped network on the train lists (checkpoints in `ckpt`, named by `run_key`); save it to `out`
    if it beats the shipped one on dev."""
    start = shipped_start(settings.init_from)
    feat = Featurizer(start.vocab)
    train_ex, _, left_train = labelled_examples(feat, train)
    dev_ex, dev_truth, _ = labelled_examples(feat, dev)
    steps = max(1, round(settings.epochs * len(train_ex) / settings.batch_size))
    training = TrainSettings(init="shipped", init_from=settings.init_from, sim_ratio=0.0, steps=steps,
                             warmup=max(1, steps // 10), lr=settings.lr, batch_size=settings.batch_size, ckpt_dir=ckpt,
                             seed=settings.seed, max_minutes=settings.max_train_minutes)
    shipped_net = CorrectorNet(start.net_cfg)
    shipped_net.load_state_dict(start.state)
    net = CorrectorNet(start.net_cfg)
    net.load_state_dict(start.state)
    net = net.to(device)
    done = fit(net, train_ex, training, device) if train_ex else 0
    # the network alone on dev, each at its best threshold within the precision bound: keep the better one
    tuned = pick_threshold(dev_ex, dev_probs(net, dev_ex, device), dev_truth) if dev_ex else (start.threshold, {})
    base = pick_threshold(dev_ex, dev_probs(shipped_net.to(device), dev_ex, device), dev_truth) if dev_ex else tuned
    keep_tuned = bool(dev_ex) and tuned[1]["cer"] < base[1]["cer"]
    chosen_net, (threshold, dev_figures) = (net, tuned) if keep_tuned else (shipped_net, base)
    record = {"network": "fine-tuned" if keep_tuned else "shipped (fine-tuning did not help on dev)",
              "steps": done, "train_lists": len(train_ex), "left_out": left_train,
              "dev_network_alone_fine_tuned": tuned[1], "dev_network_alone_shipped": base[1]}
    save(out, chosen_net, start, threshold, {"adapt": record | {"note": "dev figures were used to choose"}})
    return record


class Terminated(BaseException):
    """SIGTERM (what `timeout`, `docker stop` and a CI cancel send, and make passes on to its recipe), raised where
    the run is so that it unwinds as Ctrl-C does: the folder being built removed, one line said."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    """Adapt as the command line says; exit 2 with one line when the input cannot be used (nothing written); Ctrl-C
    and SIGTERM leave nothing behind but the checkpoints of `--ckpt-dir` and say so in one line."""
    settings = parse_args(argv)
    wall0, cpu0 = time.monotonic(), time.process_time()
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        return run(settings, wall0, cpu0)
    except (LabelledFormatError, AdaptationError, OSError) as e:
        print(f"adapt: {e}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as e:
        how, code = ("interrupted", 130) if isinstance(e, KeyboardInterrupt) else ("terminated (SIGTERM)", 143)
        print(f"adapt: {how}; {settings.out} was not written and nothing of the run is left beside it", file=sys.stderr)
        return code
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(settings: AdaptSettings, wall0: float, cpu0: float) -> int:
    check_destination(settings.out, settings.init_from)
    if not (settings.init_from / "model.safetensors").is_file():
        raise AdaptationError(f"--init-from {settings.init_from} holds no model.safetensors: name a weights folder")
    if settings.mlm_dir is not None:
        try:
            check_folder(settings.mlm_dir)
        except MaskedLMError as e:
            raise AdaptationError(f"--mlm-dir: {e} (nothing was written)") from None
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise AdaptationError(f"--device cuda: torch {torch.__version__} sees no usable CUDA GPU (use --device cpu, "
                              f"or make install-gpu)")
    items, files = read_files(list(settings.data))
    if len(items) < MIN_LISTS:
        raise AdaptationError(f"{len(items)} labelled lists read: adapt needs at least {MIN_LISTS} to learn from "
                              f"(nothing was written)")
    split = split_three(items, settings.dev_share, settings.test_share, settings.seed)
    print(f"split by id (seed {settings.seed}): {split.sizes()}")
    if not split.train or not split.dev or not split.test:
        raise AdaptationError(f"too few rows in a part of the split: {split.sizes()} (each needs at least one; "
                              f"nothing was written)")
    out: Path = settings.out
    with building(out) as build:
        ckpt = (settings.ckpt_dir or build / "checkpoints") / run_key(settings, files)
        learnt = adapt_into(build, settings, split, items, files, ckpt, wall0, cpu0)
        shutil.rmtree(ckpt, ignore_errors=True)  # the run is done: its checkpoints are not needed again
        shutil.rmtree(build / "checkpoints", ignore_errors=True)
    print(f"\nwrote {out} in {learnt['wall_s']:.0f} s ({learnt['cpu_s']:.0f} s of CPU); serve it with "
          f"WEIGHTS_DIR={out} make run, or swap it into servers started with WEIGHTS_DIR={out.parent / 'current'}, "
          f"without a restart (docs/deploy.md):\n{swap_command(out)}")
    return 0


def adapt_into(build: Path, settings: AdaptSettings, split: Split, items: list[Labelled],
               files: list[dict[str, Any]], ckpt: Path, wall0: float, cpu0: float) -> dict[str, Any]:
    """Every step, written into `build`; return the provenance recorded in its config.json."""
    device = torch.device("cuda" if settings.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")
    print("1/6 domain language model (IRSTLM) from the train truths; 2/6 the recogniser's confusions")
    lm = LanguageModel()  # the shipped word trigram: where it (and the domain's characters) prefer a rule's rewrite
    lm_counts, confusions = learn_lm_and_confusions(split.train, build, settings, lm)
    print(f"    {lm_counts}; {len(confusions)} confusion rules")

    print(f"3/6 fine-tuning the network on {len(split.train)} lists ({device})")
    network = fine_tune(settings, split.train, split.dev, device, build, ckpt) if settings.epochs > 0 else \
        _copy_network(settings, build)
    print(f"    kept: {network['network']}; {network.get('left_out', 0)} train lists left out of fine-tuning (TOP1 or "
          f"truth without Han characters: the service answers such a TOP1 as it is)")
    # The folder's config.json, carried through the run from here and written where a corrector reads the folder
    # (below and at the test split), and whole at the end; the network's step wrote it first, with the network.
    meta = WeightsMeta.load(build).replace(adaptation=adaptation_record(build))
    meta.save(build)

    adapted = Corrector(build, device=settings.device, stage="net")  # the stage is what is being fitted
    adapted.setup()
    assert adapted.adaptation is not None  # the folder names its parts: setup loaded them
    print(f"    conventions: {adapted.adaptation.conventions.describe() or 'none clear'}")
    masked_lm = None
    if settings.mlm_dir is not None:
        assert adapted.device is not None  # set up
        masked_lm = MaskedLM(settings.mlm_dir, adapted.device)
        print(f"    the masked LM {settings.mlm_dir}: {masked_lm.describe()}")
    print(f"4/6 refitting the second stage on {len(split.dev)} dev lists and, cross-fitted in {settings.folds} folds, "
          f"the {len(split.train)} train lists")
    stages, floor, floored = refit(settings, adapted, split, masked_lm)
    save_confusions(floored, build / CONFUSIONS_FILE)  # with the trust floor fitted
    meta = meta.replace(rerank=stages, adaptation=adaptation_record(build),
                        masked_lm=masked_lm_record(settings.mlm_dir) if stages["full"].weights.get("mlm") else None)
    meta.save(build)

    print(f"5/6 the held-out test split ({len(split.test)} lists)")
    figures = test_figures(settings, build, split)
    served = "adapted" if figures["adapted"]["answer_cer"] < figures["shipped"]["answer_cer"] else "shipped"
    if served == "shipped":
        print("the adapted model does not beat the shipped one on the test split: the folder serves the shipped "
              "model (its network and second stage; no rule offers a rewrite), the transcribers' conventions kept")
        for name in (NETWORK_FILE, VOCAB_FILE):
            shutil.copyfile(settings.init_from / name, build / name)
        meta = WeightsMeta.load(settings.init_from)
        floor = FLOOR_CLOSED

    print(f"6/6 the rules and the domain language model the folder serves, from all {len(items)} lists")
    lm_counts, confusions = learn_lm_and_confusions(items, build, settings, lm, floor)
    print(f"    {lm_counts}; {len(confusions)} confusion rules, {sum(map(confusions.acts, confusions.rules))} of "
          f"them trusted at the trust floor {floor:g} or more")
    print(trusted_rules(confusions))
    assert adapted.lm is not None
    conventions = Conventions.from_confusions(confusions, adapted.lm.to_simplified)
    cpu_s = time.process_time() - cpu0 + _children_cpu_s()
    provenance = {
        "data": files, "split": split.sizes() | {"seed": settings.seed, "dev_share": settings.dev_share,
                                                  "test_share": settings.test_share, "by": "sha256 of seed:id"},
        "domain_lm": lm_counts | {"order": DOMAIN_LM_ORDER, "smoothing": "Witten-Bell", "toolkit": "IRSTLM tlm",
                                  "lists": len(items)},
        "confusions": len(confusions), "confusions_lists": len(items), "conventions": conventions.describe(),
        "network": network, "test": figures, "served": served, "trust_floor": floor,
        "test_note": "the test figures are those of the rules and domain LM learned from the train split; the folder "
                     "serves them learned from every list",
        "dev_note": "rerank.*.dev are the dev lists the stage was fitted on",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "wall_s": round(time.monotonic() - wall0, 1),
        "cpu_s": round(cpu_s, 1), "device": str(device), "args": {k: portable(v) for k, v in asdict(settings).items()},
    }
    # the shipped model's evaluation figures are not this folder's
    meta.replace(adaptation=adaptation_record(build, provenance), evaluation=None).save(build)
    return provenance


def trusted_rules(confusions: Confusions, shown: int = 20) -> str:
    """The most trusted rules as a table: source -> target, count, out-of-fold counts and trust."""
    lines = ["", f"## the {shown} most trusted rules (trust: the out-of-fold rate shrunk toward its kind's)", "",
             "| rule | count / seen | out of fold | trust | acts |", "|---|---|---|---|---|"]
    for r in confusions.trusted()[:shown]:
        lines.append(f"| {r.source or '∅'} → {r.target or '∅'}{' (in context)' if r.in_context else ''} | "
                     f"{r.count} / {r.seen} | {r.held_count} / {r.held_seen} | {r.weight:.2f} | "
                     f"{'yes' if confusions.acts(r) else 'no'} |")
    return "\n".join(lines)


def test_figures(settings: AdaptSettings, build: Path, split: Split) -> dict[str, Any]:
    """Score TOP1, the shipped model, the adapted one and the reference rule memo (learned from the train split) on
    the held-out test split, with the candidates' ceiling; print the table."""
    test = split.test
    adapted = Corrector(build, device=settings.device, masked_lm_dir=settings.mlm_dir)
    adapted.setup()
    shipped = Corrector(settings.init_from, device=settings.device)
    shipped.setup()
    lists, truths = nbests(test), [han_chars(it.truth) for it in test]
    figures = {name: asdict(cer_score(lists, truths, served_answers(corrector, lists, Config().max_top1_chars)))
               for name, corrector in (("shipped", shipped), ("adapted", adapted))}
    assert shipped.lm is not None
    pairs = [(han_chars(it.nbest.top1), han_chars(it.truth)) for it in split.train]
    for margin in MEMO_MARGINS:
        memo = RuleMemo.learn(pairs, shipped.lm, margin)
        figures[f"memo (margin {margin:g})"] = asdict(cer_score(lists, truths, [memo.answer(nb.top1) for nb in lists]))
    described = described_lists(adapted, lists, truths, use_net=True, adaptation=adapted.adaptation)
    total = max(1, sum(len(t) for t in truths))
    best = sum(int(d.errors.min()) if d is not None else Levenshtein.distance(han_chars(nb.top1), t)
               for d, nb, t in zip(described, lists, truths, strict=True))
    top1 = figures["adapted"]["top1_cer"]
    ceiling = {"candidates_cer": best / total}
    for name in figures:
        gap = top1 - ceiling["candidates_cer"]
        figures[name] |= ceiling | {"candidates_gap_closed": (top1 - figures[name]["answer_cer"]) / gap
                                    if gap > 0 else None}
    print(f"\n## held-out test split ({len(test)} lists; TOP1 in the top1_cer row; candidates_cer: the best of the "
          f"adapted model's candidates, the ceiling of what it can choose)\n")
    print(table(figures, TEST_ROWS))
    shipped_cer, adapted_cer = figures["shipped"]["answer_cer"], figures["adapted"]["answer_cer"]
    change = (shipped_cer - adapted_cer) / max(shipped_cer, 1e-9)
    print(f"\nthe adapted model's CER is {abs(change):.1%} {'lower' if change >= 0 else 'higher'} than the shipped "
          f"model's ({shipped_cer:.2%} -> {adapted_cer:.2%})")
    return figures


def _copy_network(settings: AdaptSettings, out: Path) -> dict[str, Any]:
    """--epochs 0: the shipped network, vocabulary and config, as they are (the second stage is fitted again)."""
    for name in (NETWORK_FILE, VOCAB_FILE):
        shutil.copyfile(settings.init_from / name, out / name)
    WeightsMeta.load(settings.init_from).replace(rerank={}).save(out)
    return {"network": "shipped (--epochs 0)"}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    sys.exit(main())
