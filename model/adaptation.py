"""What `model.adapt` learns from a team's labelled lists, beside the network: saved, loaded and checked whole.

- **The domain language model**: a character 4-gram of the training truths (traditional characters, as the
  transcribers write them), estimated by IRSTLM (`tlm`, modified shift-beta smoothing, written as ARPA) and
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
import math
import shutil
import subprocess
import tempfile
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
DOMAIN_LM_ORDER = 4
CONVENTION_MIN_COUNT = 3
CONVENTION_MIN_RATE = 0.5
IRSTLM_DIRS = (Path("/usr/lib/irstlm/bin"), Path("/usr/bin"))


class AdaptationError(RuntimeError):
    """An adaptation part cannot be built or loaded; the message is one line saying what to do."""


def _tlm() -> str:
    found = next((str(d / "tlm") for d in IRSTLM_DIRS if (d / "tlm").is_file()), None) or shutil.which("tlm")
    if found is None:
        raise AdaptationError("IRSTLM's tlm is not installed: apt-get install irstlm (make adapt installs it)")
    return found


def build_domain_lm(truths: list[str], out: Path, order: int = DOMAIN_LM_ORDER) -> dict[str, int]:
    """Estimate a character n-gram of the truths with IRSTLM into `out` (ARPA) and check that KenLM loads it;
    return its n-gram counts.

    Modified shift-beta first; where the text is too small for its count-of-counts statistics (tlm exits asking
    for "another smoothing method"), Witten-Bell, which needs none. Either way the ARPA is repaired before it is
    loaded (`repair_arpa`): IRSTLM writes a backoff of -inf where every continuation of a context was seen, which
    KenLM refuses.
    """
    lines = [" ".join(t) for t in truths if t]
    if not lines:
        raise AdaptationError("no training truth to build the domain language model from")
    failure = ""
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "truths.txt"
        text.write_text("".join(f"<s> {line} </s>\n" for line in lines), encoding="utf-8")
        # msb: modified shift-beta (IRSTLM's modified Kneser-Ney); -ps=no keeps singletons: a team's file is small
        # and a domain word seen once is still evidence
        for smoothing in ("msb", "wb"):
            cmd = [_tlm(), f"-tr={text}", f"-n={order}", f"-lm={smoothing}", "-ps=no", f"-o={out}"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode == 0 and out.is_file():
                break
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            failure = f"IRSTLM's tlm failed (exit {done.returncode}, -lm={smoothing}): {tail[0]}"
            out.unlink(missing_ok=True)
        else:
            raise AdaptationError(failure)
    counts = repair_arpa(out)
    try:
        DomainLM(out)
    except (OSError, RuntimeError) as e:  # KenLM raises OSError; anything it says goes in one line
        raise AdaptationError(f"the domain language model IRSTLM wrote does not load: {str(e).splitlines()[0]}") \
            from None
    return counts


def repair_arpa(path: Path) -> dict[str, int]:
    """Rewrite an ARPA file's -inf backoffs as finite ones, in place; return its n-gram counts.

    A backoff of -inf says an n-gram context leaves no probability to continuations it was not seen with: IRSTLM
    writes it where a small file saw every continuation of a context (下雨 always followed by 了), and after a
    context ending in </s>. KenLM refuses such a file ("Bad backoff -inf"). Each is replaced by the lowest finite
    backoff of the same order: the least mass any other context of that order leaves, which keeps unseen
    continuations possible without favouring them (0 where the order has no finite backoff).
    """
    lines = path.read_text(encoding="utf-8").split("\n")
    counts: dict[str, int] = {}
    lowest: dict[int, float] = {}
    order = 0
    for line in lines:
        if line.startswith("ngram "):
            key, value = line[6:].split("=")
            counts[f"{key.strip()}-grams"] = int(value)
        elif line.startswith("\\") and line.endswith("-grams:"):
            order = int(line[1:].split("-")[0])
        elif order and line.count("\t") == 2:
            backoff = line.rsplit("\t", 1)[1]
            if backoff and math.isfinite(float(backoff)):
                lowest[order] = min(lowest.get(order, 0.0), float(backoff))
    repaired = 0
    order = 0
    for k, line in enumerate(lines):
        if line.startswith("\\") and line.endswith("-grams:"):
            order = int(line[1:].split("-")[0])
        elif order and line.count("\t") == 2:
            head, backoff = line.rsplit("\t", 1)
            if backoff and not math.isfinite(float(backoff)):
                lines[k] = f"{head}\t{lowest.get(order, 0.0):g}"
                repaired += 1
    if repaired:
        path.write_text("\n".join(lines), encoding="utf-8")
    return counts


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
                raise AdaptationError(f"{weights_dir}: {entry['name']} is missing (re-run python -m model.adapt)")
            paths[part] = path
        confusions = Confusions.from_dict(json.loads(paths["confusions"].read_text(encoding="utf-8")))
        return cls(DomainLM(paths["domain_lm"]), confusions, Conventions.from_confusions(confusions, to_simplified))

    @staticmethod
    def files_record(weights_dir: Path) -> dict:
        """Describe the saved parts for config.json: file names and sha256."""
        return {part: {"name": name, "sha256": sha256(weights_dir / name)}
                for part, name in (("domain_lm", DOMAIN_LM_FILE), ("confusions", CONFUSIONS_FILE))}


def save_confusions(confusions: Confusions, path: Path) -> None:
    """Write the rules with their counts as JSON."""
    path.write_text(json.dumps(confusions.to_dict(), ensure_ascii=False), encoding="utf-8")
