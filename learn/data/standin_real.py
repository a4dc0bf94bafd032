"""The stand-in calibrated to real competition lists (`python -m learn.data.standin --profile real`): its truths
(corpus clauses about money first, cut into utterances: `pick_truths`) and its lists (`build_real`), made by
`learn.data.real_recogniser`'s `RealRecogniser`. How it is made: `learn.data.standin`'s docstring.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from learn.data.decode_sim import REVIEW_HOLDOUT
from learn.data.labelled import Labelled
from learn.data.real_profile import RealConfig
from learn.data.real_recogniser import RealRecogniser
from preprocess.phones import text_phones
from preprocess.text import NBest

FINANCE_WORDS = ("銀行", "金融", "經濟", "貸款", "信用", "卡", "帳", "存款", "利率", "利息", "股",
    "投資", "資金", "市場", "價格", "稅", "錢", "元", "費", "付", "繳", "券", "保險", "證券", "匯",
    "財政", "收入", "消費", "購買", "優惠", "密碼", "刷", "債", "儲蓄", "額度", "分期", "退款", "現金",
    "基金", "貨幣", "企業", "銷售", "成本", "利潤", "旅遊", "客服", "服務", "帳單", "申請")
_FINANCE = re.compile("|".join(FINANCE_WORDS))
START_FILLERS = {"呃": 0.4, "欸": 0.3, "嗯": 0.2, "痾": 0.1}


def finance_clause(clause: str) -> bool:
    """Tell whether a clause is about money (holds one of FINANCE_WORDS)."""
    return _FINANCE.search(clause.replace(" ", "")) is not None


def cut_utterances(clause: str, rng: random.Random, mean_chars: float) -> list[str]:
    """Cut a clause (words separated by spaces) at word boundaries into utterances of drawn lengths (>= 4)."""
    out: list[str] = []
    cur: list[str] = []
    target = _utterance_length(rng, mean_chars)
    for word in clause.split():
        cur.append(word)
        if sum(map(len, cur)) >= target:
            out.append(" ".join(cur))
            cur, target = [], _utterance_length(rng, mean_chars)
    if cur and sum(map(len, cur)) >= 4:
        out.append(" ".join(cur))
    return out


def _utterance_length(rng: random.Random, mean_chars: float) -> int:
    return 3 + round(rng.gammavariate(3.0, (mean_chars - 3) / 3.0))


@dataclass(frozen=True)
class Truths:
    """The stand-in's truths (words separated by spaces), test first, and how many came from finance clauses."""

    train: list[str]
    test: list[str]
    finance_share: float


def pick_truths(corpus_dir: Path, n_train: int, n_test: int, config: RealConfig, seed: int) -> Truths:
    """Cut utterances from the corpus, finance clauses first; test's from text the shipped model never saw."""
    rng = random.Random(seed)

    def lines(name: str, skip: int = 0) -> list[str]:
        return [s for s in (corpus_dir / f"{name}.txt").read_text(encoding="utf-8").split("\n")[skip:] if s]

    unseen = lines("dev") + lines("reviews", REVIEW_HOLDOUT)
    seen = lines("train")
    rng.shuffle(unseen)
    rng.shuffle(seen)
    fin_unseen, fin_seen, rest = [], [], []
    for pool, fin in ((unseen, fin_unseen), (seen, fin_seen)):
        for clause in pool:
            (fin if finance_clause(clause) else rest).append(clause)
    rng.shuffle(rest)
    test: list[str] = []
    used: set[str] = set()
    k = 0
    while len(test) < n_test and k < len(fin_unseen):
        for u in cut_utterances(fin_unseen[k], rng, config.utterance_chars):
            if u.replace(" ", "") not in used:
                used.add(u.replace(" ", ""))
                test.append(u)
        k += 1
    train: list[str] = []
    n_fin = 0
    for pool, is_fin in ((fin_unseen[k:] + fin_seen, True), (rest, False)):
        for clause in pool:
            if len(train) >= n_train:
                break
            for u in cut_utterances(clause, rng, config.utterance_chars):
                if u.replace(" ", "") not in used and len(train) < n_train:
                    used.add(u.replace(" ", ""))
                    train.append(u)
                    n_fin += is_fin
    test = test[:n_test]
    fillers, weights = list(START_FILLERS), list(START_FILLERS.values())
    said = random.Random(seed + 7)  # its own stream, test first: the test truths do not depend on n_train

    def speak(u: str) -> str:
        return f"{said.choices(fillers, weights)[0]} {u}" if said.random() < config.p_start_filler else u

    test = [speak(u) for u in test]
    return Truths([speak(u) for u in train], test,
                  (n_fin + len(test)) / max(len(train) + len(test), 1))


def shipped_trigram_cost() -> Callable[[str], float]:
    """-ln P of a sentence (Han characters) under the shipped word trigram: the hard profile's recogniser's LM."""
    from model.lm import LanguageModel  # only for fluent errors: the other profiles need no model

    lm = LanguageModel()
    return lambda text: -lm.score(text).logp * math.log(10)


def make_real_lists(recogniser: RealRecogniser, truths: list[str], seed: int, prefix: str) -> list[Labelled]:
    """Make a labelled 10-best list (with phones) for each truth (words separated by spaces)."""
    rng = random.Random(seed)
    out = []
    for k, truth in enumerate(truths):
        words = truth.split()
        hyps, _ = recogniser.nbest(words, rng)
        out.append(Labelled(f"{prefix}-{k}", "".join(words), NBest(tuple(hyps), tuple(map(text_phones, hyps)))))
    return out


def build_real(corpus_dir: Path, n_train: int, n_test: int, seed: int,
               config: RealConfig | None = None) -> tuple[list[Labelled], list[Labelled], RealRecogniser, Truths]:
    """Make the calibrated stand-in's train and test lists (test first, so its lists do not depend on N), with
    `RealConfig()`'s knobs unless `config` is given."""
    config = config if config is not None else RealConfig()
    truths = pick_truths(corpus_dir, n_train, n_test, config, seed)
    char_counts: Counter[str] = Counter()
    word_counts: Counter[str] = Counter()
    for name in ("train", "reviews"):
        for line in (corpus_dir / f"{name}.txt").read_text(encoding="utf-8").split("\n"):
            char_counts.update(line.replace(" ", ""))
            word_counts.update(line.split())
    # how often a rewrite's spoken side occurs is estimated on corpus clauses, not on the truths, so that the
    # recogniser (and with it the test file) is the same whatever n_train
    sample = [line for name in ("train", "reviews")
              for line in (corpus_dir / f"{name}.txt").read_text(encoding="utf-8").split("\n")[::40] if line]
    # the recogniser's own language model: a character bigram of all the corpus text (not the corrector's LM)
    lm_text = [line for name in ("train", "reviews")
               for line in (corpus_dir / f"{name}.txt").read_text(encoding="utf-8").split("\n") if line] \
        if config.p_decoded else None
    recogniser = RealRecogniser(char_counts, word_counts, sample, config, seed, lm_text,
                                shipped_trigram_cost() if config.p_fluent else None)
    test = make_real_lists(recogniser, truths.test, seed + 1, "standin-test")
    train = make_real_lists(recogniser, truths.train, seed, "standin-train")
    return train, test, recogniser, truths
