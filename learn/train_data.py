"""What training learns from: simulated and labelled n-best lists, featurized with their truths, and dev splits.

Simulated lists come from the corpus (`learn.data.corpus`) by our recogniser (`learn.data.simulate`), each with
the default rates or rates drawn around them so the network does not learn one simulator's exact habits;
labelled lists from the competition's files (`learn.data.labelled`). `learn.train` assembles them.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from config import Config
from learn.data.labelled import Labelled, read_labelled
from learn.data.simulate import DEFAULT, SimConfig, Simulator
from model.features import Example, Featurizer
from preprocess.text import NBest, han_chars

MAX_HYPOTHESES = Config.max_hypotheses  # the service reads no more


def jittered(rng: random.Random) -> SimConfig:
    """Draw a recogniser configuration around the default one."""
    return replace(
        DEFAULT,
        p_uncertain=rng.uniform(0.25, 0.45),
        p_top1_wrong=rng.uniform(0.3, 0.5),
        p_certain_error=rng.uniform(0.005, 0.03),
        p_filler=rng.uniform(0.0, 0.02),
        p_spoken_filler=rng.uniform(0.03, 0.15),
        p_filler_dropped=rng.uniform(0.2, 0.5),
        mix=tuple(m * rng.uniform(0.6, 1.4) for m in DEFAULT.mix),
        score_spread=rng.uniform(0.7, 1.5),
    )


def read_split(corpus: Path, name: str) -> list[str]:
    return [s for s in (corpus / f"{name}.txt").read_text(encoding="utf-8").split("\n") if s]


def make_examples(sim: Simulator, feat: Featurizer, sentences: list[str], seed: int, variants: int,
                  desc: str) -> list[Example]:
    """Simulate and featurize `variants` n-best lists per sentence."""
    rng = random.Random(seed)
    base = sim.config
    out: list[Example] = []
    for v in range(variants):
        sim.config = base if v == 0 else jittered(rng)
        for sent in tqdm(sentences, desc=f"{desc} {v + 1}/{variants}", mininterval=5,
                         disable=not sys.stderr.isatty()):
            if v > 0 and rng.random() < 0.3:
                sim.config = jittered(rng)
            ex = feat.featurize(*sim.sample(sent, rng))
            if ex is not None:
                out.append(ex)
    sim.config = base
    return out


@dataclass
class Data:
    """Training examples, dev examples with their truths, and what they were made of (for config.json)."""

    train: list[Example]
    dev: list[Example]
    dev_truth: list[str]
    made_of: dict[str, Any] = field(default_factory=dict)


def read_data(paths: list[Path], exclude: tuple[Path, ...] = ()) -> list[Labelled]:
    """Read every labelled file, printing how many rows each held; leave out every row whose truth (its Han
    characters) is a truth of an `exclude` file: a test set's sentences kept out of training, whatever the list."""
    items: list[Labelled] = []
    for path in paths:
        rows = read_labelled(path)
        print(f"{path}: {len(rows)} labelled rows")
        items += rows
    if exclude:
        held = {han_chars(item.truth) for path in exclude for item in read_labelled(path)}
        kept = [item for item in items if han_chars(item.truth) not in held]
        print(f"--exclude: {len(items) - len(kept)} rows left out, their truth among the {len(held)} of "
              f"{', '.join(map(str, exclude))}")
        items = kept
    return items


def labelled_examples(feat: Featurizer, items: list[Labelled]) -> tuple[list[Example], list[str], int]:
    """Featurize labelled lists against their truths' Han characters; return examples, truths and rows left out."""
    examples: list[Example] = []
    truths: list[str] = []
    for item in items:
        truth = han_chars(item.truth)  # the judge scores Han characters only
        nbest = NBest(item.nbest.sentences[:MAX_HYPOTHESES], item.nbest.phonemes[:MAX_HYPOTHESES])
        example = feat.featurize(nbest, truth) if truth else None
        if example is not None:
            examples.append(example)
            truths.append(truth)
    return examples, truths, len(items) - len(examples)


def simulated_examples(sim: Simulator, feat: Featurizer, sentences: list[str], n: int, seed: int,
                       desc: str) -> list[Example]:
    """Simulate and featurize n lists from sentences taken in a shuffled cycle; a third with the default
    recogniser, the rest with rates drawn around it (as `make_examples` mixes them)."""
    rng = random.Random(seed)
    order = list(sentences)
    rng.shuffle(order)
    base = sim.config
    out: list[Example] = []
    for k in tqdm(range(n), desc=desc, mininterval=5, disable=not sys.stderr.isatty()):
        sim.config = base if k % 3 == 0 else jittered(rng)
        sent = order[k % len(order)]
        example = feat.featurize(*sim.sample(sent, rng))
        if example is not None:
            out.append(example)
    sim.config = base
    return out


def simulated_dev(sim: Simulator, feat: Featurizer, sentences: list[str],
                  seed: int) -> tuple[list[Example], list[str]]:
    """Simulate one list per dev sentence with the default recogniser; return examples and their truths."""
    rng = random.Random(seed)
    examples: list[Example] = []
    truths: list[str] = []
    for sent in sentences:
        nbest, truth = sim.sample(sent, rng)
        example = feat.featurize(nbest, truth)
        if example is not None:
            examples.append(example)
            truths.append(truth)
    return examples, truths


def ensure_corpus(corpus: Path) -> None:
    """Build the corpus if it is missing."""
    if not (corpus / "train.txt").exists():
        from learn.data.corpus import build, write

        write(build(), corpus)
