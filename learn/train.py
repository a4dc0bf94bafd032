"""Train the corrector: `python -m learn.train` from scratch on simulated lists, or on labelled lists with `--data`.

Recipe without --data (every setting is a flag; the defaults are the shipped model's):
1. build the corpus if missing (`learn.data.corpus`), the vocabulary from the training split;
2. simulate `--variants` n-best lists per training sentence: the first with the default recogniser, the
   others with rates drawn around it, so the network does not learn one simulator's exact habits;
3. train with AdamW, linear warm-up and cosine decay, length-bucketed batches, checkpointing every
   `--ckpt-every` steps to `--ckpt-dir/last.pt` (rerunning the command resumes from it);
4. choose the change threshold on the dev split for precision (largest CER gain with at most 0.5 % of
   sentences made worse), and write `model.safetensors`, `vocab.json`, `config.json` to `--out`.

With `--data FILE` (repeatable; the competition's labelled lists, read by `learn.data.labelled`):
1. read each file (its row count is printed; a malformed row stops the run with one line naming it), leave out
   every row whose truth an `--exclude` file holds (a test set's sentences), and hold out `--dev-share` of the
   rows by a stable hash of their ids (`learn.data.labelled.split_dev`);
2. featurize each row with its truth's Han characters (the judge's truths hold nothing else) and its first
   MAX_HYPOTHESES hypotheses (all the service reads); rows whose TOP1 or truth has no Han character are
   counted and left out (the service answers such a TOP1 as it is);
3. add `--sim-ratio` simulated lists per labelled training example, from the corpus training split, each
   with the default recogniser or rates drawn around it (0: labelled lists only, and no corpus needed);
4. `--init shipped` (the default with --data) starts from the weights in `--init-from` (model/weights) and
   keeps their vocabulary and network shape so the weights stay valid; `--init scratch` starts a new
   network, its vocabulary counted from the corpus training split plus the labelled training truths;
5. train as above (the learning rate defaults to 1e-4 from shipped weights, 5e-4 from scratch; `--steps N`
   stops after N optimizer steps), then choose the threshold on the labelled dev lists plus, when
   --sim-ratio > 0, as many simulated dev lists per labelled one (at most `--dev-sentences`). With no dev list
   at all the threshold of the initial weights is kept (DEFAULT_THRESHOLD from scratch).
A checkpoint records which run it belongs to; resuming another run's checkpoint stops with a message.
Seeded; uses CUDA when present. The settings and their command line: `learn.train_settings`; the training
loop and its checkpoints: `learn.fit`.
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from learn.data.labelled import Labelled, LabelledFormatError, split_dev
from learn.data.simulate import load_simulator
from learn.fit import dev_probs, fit
from learn.train_data import (
    Data,
    ensure_corpus,
    labelled_examples,
    make_examples,
    read_data,
    read_split,
    simulated_dev,
    simulated_examples,
)
from learn.train_settings import TrainSettings, parse_args
from learn.written import portable, wrote
from model.contract import check_features, feature_columns
from model.corrector import choose
from model.features import Example, Featurizer, Vocab
from model.network import CorrectorNet, NetConfig
from model.weights_meta import CONFIG_FILE, NETWORK_FILE, VOCAB_FILE, WEIGHTS_FILES, NetShape, WeightsMeta
from preprocess.text import han_chars

DEFAULT_THRESHOLD = 0.98


def pick_threshold(examples: list[Example], probs: list[np.ndarray], truths: list[str],
                   max_worse: float = 0.005, max_right_changed: float = 0.005) -> tuple[float, dict]:
    """Choose the lowest-CER change threshold that stays precise on dev.

    Precision first: at most `max_worse` of the sentences made worse than TOP1, and at most
    `max_right_changed` of the sentences whose TOP1 was right changed at all.
    """
    from rapidfuzz.distance import Levenshtein

    total = sum(len(t) for t in truths)
    base = [Levenshtein.distance(e.top1, t) for e, t in zip(examples, truths, strict=True)]
    n_right = max(1, sum(b == 0 for b in base))
    best = (1.01, {"cer": sum(base) / total, "worse": 0.0, "right_changed": 0.0, "top1_cer": sum(base) / total})
    for th in np.arange(0.30, 1.0, 0.01):
        outs = [choose(e, p, th) for e, p in zip(examples, probs, strict=True)]
        errs = [Levenshtein.distance(o, t) for o, t in zip(outs, truths, strict=True)]
        worse = sum(a > b for a, b in zip(errs, base, strict=True)) / len(truths)
        right_changed = sum(b == 0 and o != e.top1 for o, b, e in zip(outs, base, examples, strict=True)) / n_right
        cer = sum(errs) / total
        if worse <= max_worse and right_changed <= max_right_changed and cer < best[1]["cer"]:
            best = (round(float(th), 2), {"cer": cer, "worse": worse, "right_changed": right_changed,
                                          "top1_cer": sum(base) / total})
    return best


def tune(weights: Path, corpus: Path, n_dev: int, seed: int) -> tuple[float, dict]:
    """Re-choose the threshold of saved weights on the dev split and store it in their config.json."""
    from model.corrector import Corrector

    corrector = Corrector(weights, device="cpu")
    corrector.setup()
    sim = load_simulator(corpus)
    dev_sents = read_split(corpus, "dev")[:n_dev]
    dev, truths = simulated_dev(sim, corrector.featurizer, dev_sents, seed + 1)
    threshold, figures = pick_threshold(dev, dev_probs(corrector.net, dev, corrector.device), truths)
    meta = WeightsMeta.load(weights)
    meta.replace(threshold=threshold, trained=(meta.trained or {}) | {"dev": figures}).save(weights)
    return threshold, figures


@dataclass
class Start:
    """What training starts from: the vocabulary, the network's shape, and its weights and threshold if any."""

    vocab: Vocab
    net_cfg: NetConfig
    state: dict[str, torch.Tensor] | None = None
    threshold: float = DEFAULT_THRESHOLD


def shipped_start(weights: Path) -> Start:
    """Load the vocabulary, network shape, weights and threshold of saved weights to fine-tune them."""
    missing = [n for n in WEIGHTS_FILES if not (weights / n).is_file()]
    if missing:
        raise SystemExit(f"--init shipped: {weights} lacks {', '.join(missing)}")
    try:
        meta = WeightsMeta.load(weights)
        check_features(meta.features, source=f"the weights in {weights}")
    except ValueError as e:
        raise SystemExit(f"--init shipped: {e}") from None
    state = {k: v.float() for k, v in load_file(str(weights / NETWORK_FILE)).items()}
    return Start(Vocab.load(weights / VOCAB_FILE), NetConfig(**asdict(meta.net)), state, float(meta.threshold))


def scratch_start(vocab: Vocab, settings: TrainSettings) -> Start:
    """Shape a new network for a vocabulary from the command line's sizes."""
    return Start(vocab, NetConfig(n_chars=len(vocab.chars), n_syllables=len(vocab.syllables), hidden=settings.hidden,
                                  layers=settings.layers, heads=settings.hidden // 64, ffn=settings.hidden * 4))


def simulated_data(settings: TrainSettings) -> tuple[Start, Data]:
    """Today's recipe: vocabulary and examples from the corpus alone."""
    ensure_corpus(settings.corpus)
    sim = load_simulator(settings.corpus)
    train_sents = read_split(settings.corpus, "train")[: settings.train_sentences or None]
    start = (shipped_start(settings.init_from) if settings.init == "shipped"
             else scratch_start(Vocab.from_sentences(read_split(settings.corpus, "train")), settings))
    feat = Featurizer(start.vocab)
    train = make_examples(sim, feat, train_sents, settings.seed, settings.variants, "train")
    dev_sents = read_split(settings.corpus, "dev")[: settings.dev_sentences]
    dev, truths = simulated_dev(sim, feat, dev_sents, settings.seed + 1)
    return start, Data(train, dev, truths)


def labelled_data(settings: TrainSettings, items: list[Labelled]) -> tuple[Start, Data]:
    """Labelled lists (split into train and dev by id), mixed with --sim-ratio simulated ones per labelled one."""
    train_items, dev_items = split_dev(items, settings.dev_share)
    if settings.init == "scratch" or settings.sim_ratio > 0:
        ensure_corpus(settings.corpus)
    if settings.init == "shipped":
        start = shipped_start(settings.init_from)
    else:
        truths = [han_chars(i.truth) for i in train_items]
        start = scratch_start(Vocab.from_sentences(read_split(settings.corpus, "train") + truths), settings)
    feat = Featurizer(start.vocab)
    train, _, left_train = labelled_examples(feat, train_items)
    dev, dev_truth, left_dev = labelled_examples(feat, dev_items)
    made_of: dict[str, Any] = {"labelled_train": len(train), "labelled_dev": len(dev),
                               "left_out": left_train + left_dev}
    print(f"labelled: {len(train)} training and {len(dev)} dev lists, {left_train + left_dev} left out "
          f"(TOP1 or truth without Han characters)")
    if settings.sim_ratio > 0:
        sim = load_simulator(settings.corpus)
        train_sents = read_split(settings.corpus, "train")[: settings.train_sentences or None]
        simulated = simulated_examples(sim, feat, train_sents, round(settings.sim_ratio * len(train)),
                                       settings.seed, "simulated train")
        n_dev = min(settings.dev_sentences, round(settings.sim_ratio * len(dev)))
        dev_sents = read_split(settings.corpus, "dev")[:n_dev]
        sim_dev, sim_truth = simulated_dev(sim, feat, dev_sents, settings.seed + 1)
        made_of |= {"simulated_train": len(simulated), "simulated_dev": len(sim_dev)}
        dev += sim_dev
        dev_truth += sim_truth
        train += simulated
    if not train:
        raise SystemExit("no training example: every labelled TOP1 or truth lacks Han characters")
    return start, Data(train, dev, dev_truth, made_of)


def save(out: Path, net: CorrectorNet, start: Start, threshold: float, trained: dict[str, Any]) -> None:
    """Write model.safetensors, vocab.json and config.json (keeping the evaluation figures already there)."""
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}, str(out / NETWORK_FILE))
    start.vocab.save(out / VOCAB_FILE)
    # keep the evaluation figures written by learn.evaluate, if any
    evaluation = WeightsMeta.load(out).evaluation if (out / CONFIG_FILE).exists() else None
    WeightsMeta(net=NetShape(**start.net_cfg.to_dict()), features=feature_columns(), threshold=threshold,
                version=time.strftime("%Y.%m.%d"), trained=trained, evaluation=evaluation).save(out)


def main(argv: list[str] | None = None) -> None:
    """Train (or with --tune-only re-choose the threshold) as the command line says; Ctrl-C stops it in one line."""
    settings = parse_args(argv)
    try:
        run(settings)
    except KeyboardInterrupt:
        resume = "" if settings.tune_only else (f"; rerun the same command to resume from the last checkpoint in "
                                                f"{settings.ckpt_dir}")
        print(f"train: interrupted; {settings.out} was not written{resume}", file=sys.stderr)
        raise SystemExit(130) from None


def run(settings: TrainSettings) -> None:
    """Train, or re-choose the threshold, and write the weights."""
    if settings.tune_only:
        threshold, figures = tune(settings.out, settings.corpus, settings.dev_sentences, settings.seed)
        print(f"threshold {threshold:.2f} on dev: {json.dumps(figures)}")
        print(wrote(settings.out / CONFIG_FILE))
        return
    try:
        items = read_data(list(settings.data), settings.exclude)
    except (LabelledFormatError, OSError) as e:
        raise SystemExit(str(e)) from None

    random.seed(settings.seed)
    np.random.seed(settings.seed)
    torch.manual_seed(settings.seed)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    start, data = labelled_data(settings, items) if items else simulated_data(settings)

    net = CorrectorNet(start.net_cfg)
    if start.state is not None:
        net.load_state_dict(start.state)
    net = net.to(device)
    step = fit(net, data.train, settings, device)

    if data.dev:
        threshold, dev_figures = pick_threshold(data.dev, dev_probs(net, data.dev, device), data.dev_truth)
        print(f"threshold {threshold:.2f} chosen on dev; dev figures (tuned on, not held out: score held-out lists "
              f"with python -m learn.evaluate --data FILE): {json.dumps(dev_figures)}")
    else:
        threshold, dev_figures = start.threshold, None
        print(f"no dev list: keeping threshold {threshold:.2f}")
    trained: dict[str, Any] = {"steps": step, "examples": len(data.train),
                               "args": {k: portable(v) for k, v in asdict(settings).items()}, "dev": dev_figures}
    if items:
        trained["data"] = data.made_of
    save(settings.out, net, start, threshold, trained)
    for name in WEIGHTS_FILES:
        print(wrote(settings.out / name))


if __name__ == "__main__":
    main()
