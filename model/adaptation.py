"""What `learn.adapt` learns from a team's labelled lists, beside the network, as the service loads it (built by
`learn.domain_lm` and `learn.adapt`).

- **The domain language model**: a character trigram of the training truths (traditional characters, as the
  transcribers write them), estimated by IRSTLM (`tlm`, Witten-Bell smoothing, written as ARPA) and
  queried with KenLM. The second stage uses its log10 probability against TOP1's as one more feature beside the
  shipped word trigram's: a log-linear interpolation whose weight is fitted on the dev split with the others.
  Characters, not words: the domain's words are what the shipped segmenter does not know.
- **The recogniser's confusions** (`preprocess.rules.Confusions`): rewrite rules with their counts; they offer
  candidate sentences and weigh every candidate's edits (the `confusion` feature).
- **The transcribers' conventions**: the rules that swap a character for its orthographic variant, or a spoken
  filler for another filler or for nothing. The shipped rules (never bring in a variant form; keep a filler the
  list agrees on) give way to a convention only where the file shows it clearly: at least
  `CONVENTION_MIN_COUNT` times, in at least `CONVENTION_MIN_RATE` of the places the recogniser wrote its source.

The folder's `config.json` names each file with its sha256 under `adaptation.files`; `model.contract` checks
them before anything is served, so a folder missing a part, or holding another run's part, stops start-up.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import kenlm

from model.contract import sha256
from preprocess.rules import Confusions, Rule
from preprocess.text import SPOKEN_FILLERS

DOMAIN_LM_FILE = "domain_lm.arpa"
CONFUSIONS_FILE = "confusions.json"
CONVENTION_MIN_COUNT = 3
CONVENTION_MIN_RATE = 0.5


class AdaptationError(RuntimeError):
    """An adaptation part cannot be built or loaded; the message is one line saying what to do."""


class DomainLM:
    """Score traditional sentences, character by character, with the domain n-gram (log10, cached)."""

    def __init__(self, path: Path) -> None:
        config = kenlm.Config()
        config.show_progress = False  # KenLM otherwise draws a progress bar on stderr while it reads ARPA
        config.arpa_complain = kenlm.ARPALoadComplain.NONE
        self.path = path
        self.model = kenlm.Model(str(path), config)
        self.score: Callable[[str], float] = lru_cache(maxsize=200_000)(self._score)

    def _score(self, text: str) -> float:
        return self.model.score(" ".join(text), bos=True, eos=True)


class Conventions:
    """The transcribers' clear conventions: single-character rewrites between variant forms or fillers."""

    def __init__(self, pairs: dict[tuple[str, str], Rule]) -> None:
        self.pairs = pairs

    @classmethod
    def from_confusions(cls, confusions: Confusions, to_simplified: Callable[[str], str]) -> Conventions:
        """Keep the bare rules that are a variant or filler swap, seen clearly enough."""
        pairs = {}
        for rule in confusions.rules:
            if rule.in_context or rule.count < CONVENTION_MIN_COUNT or rule.rate < CONVENTION_MIN_RATE:
                continue
            src, tgt = rule.source, rule.target
            variant = len(src) == len(tgt) == 1 and to_simplified(src) == to_simplified(tgt)
            filler = src in SPOKEN_FILLERS and (tgt == "" or tgt in SPOKEN_FILLERS)
            if variant or filler:
                pairs[(src, tgt)] = rule
        return cls(pairs)

    def allows(self, source: str, target: str) -> bool:
        """Tell whether the file shows clearly that the transcribers write `target` where TOP1 has `source`."""
        return (source, target) in self.pairs

    def describe(self) -> list[dict]:
        return [{"source": s, "target": t, "count": r.count, "seen": r.seen, "rate": round(r.rate, 3)}
                for (s, t), r in self.pairs.items()]


@dataclass
class Adaptation:
    """The domain LM, the confusions and the conventions of one adapted weights folder."""

    domain_lm: DomainLM
    confusions: Confusions
    conventions: Conventions

    @classmethod
    def load(cls, weights_dir: Path, record: dict, to_simplified: Callable[[str], str]) -> Adaptation:
        """Load the parts `record` (config.json's `adaptation`) names; raise AdaptationError on any gap."""
        files = record.get("files", {})
        paths = {}
        for part in ("domain_lm", "confusions"):
            entry = files.get(part)
            if not entry:
                raise AdaptationError(f"{weights_dir}: config.json's adaptation names no {part} file")
            path = weights_dir / entry["name"]
            if not path.is_file():
                raise AdaptationError(f"{weights_dir}: {entry['name']} is missing (re-run python -m learn.adapt)")
            paths[part] = path
        confusions = Confusions.from_dict(json.loads(paths["confusions"].read_text(encoding="utf-8")))
        return cls(DomainLM(paths["domain_lm"]), confusions, Conventions.from_confusions(confusions, to_simplified))

    @staticmethod
    def files_record(weights_dir: Path) -> dict:
        """Describe the saved parts for config.json: file names and sha256."""
        return {part: {"name": name, "sha256": sha256(weights_dir / name)}
                for part, name in (("domain_lm", DOMAIN_LM_FILE), ("confusions", CONFUSIONS_FILE))}
