"""Building what `learn.adapt` adds to a weights folder: the domain language model (IRSTLM, checked with KenLM)
and the confusions' file. Loading them to serve is `model.adaptation`'s."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import tempfile
from pathlib import Path

from model.adaptation import AdaptationError, DomainLM
from preprocess.rules import Confusions

DOMAIN_LM_ORDER = 3
IRSTLM_DIRS = (Path("/usr/lib/irstlm/bin"), Path("/usr/bin"))


def _tlm() -> str:
    found = next((str(d / "tlm") for d in IRSTLM_DIRS if (d / "tlm").is_file()), None) or shutil.which("tlm")
    if found is None:
        raise AdaptationError("IRSTLM's tlm is not installed: apt-get install irstlm (make adapt installs it)")
    return found


def build_domain_lm(truths: list[str], out: Path, order: int = DOMAIN_LM_ORDER) -> dict[str, int]:
    """Estimate a character n-gram of the truths with IRSTLM into `out` (ARPA) and check that KenLM loads it;
    return its n-gram counts.

    Witten-Bell smoothing, a character trigram: the rule memo's scorer (`learn.memo_baseline.CharTrigram`), which
    scored the truths' rewrites better than the modified shift-beta 4-gram used before (docs/model.md, "What the memo
    finds that adapt misses"); it also needs no count-of-counts statistics, so a small file builds too. The ARPA is
    repaired before it is loaded (`repair_arpa`): IRSTLM writes a backoff of -inf where every continuation of a
    context was seen, which KenLM refuses.
    """
    lines = [" ".join(t) for t in truths if t]
    if not lines:
        raise AdaptationError("no training truth to build the domain language model from")
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "truths.txt"
        text.write_text("".join(f"<s> {line} </s>\n" for line in lines), encoding="utf-8")
        # -ps=no keeps singletons: a team's file is small and a domain word seen once is still evidence
        cmd = [_tlm(), f"-tr={text}", f"-n={order}", "-lm=wb", "-ps=no", f"-o={out}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not out.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            out.unlink(missing_ok=True)
            raise AdaptationError(f"IRSTLM's tlm failed (exit {done.returncode}, -lm=wb): {tail[0]}")
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



def save_confusions(confusions: Confusions, path: Path) -> None:
    """Write the rules with their counts as JSON."""
    path.write_text(json.dumps(confusions.to_dict(), ensure_ascii=False), encoding="utf-8")
