"""Request bodies like the judge's (the real samples, then variations of them) and the one answer check."""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from config import REPO_ROOT, Config
from preprocess.phones import text_phones
from preprocess.text import has_han, strip_spaces
from testing import cli

REAL_REQUESTS = REPO_ROOT / "testing" / "data" / "real_requests.jsonl"
RESPONSE_KEYS = frozenset({"esun_uuid", "server_uuid", "server_timestamp", "answer"})

Body = dict[str, Any]


def real_bodies(path: Path = REAL_REQUESTS) -> list[Body]:
    """Read the real request bodies of the competition, one JSON object per line; a ToolError says what is wrong."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise cli.ToolError(f"cannot read the request bodies in {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise cli.ToolError(f"{path} is not UTF-8 text: {exc.reason}") from None
    bodies = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            body = json.loads(line)
        except ValueError as exc:
            raise cli.ToolError(f"{path}:{number}: not JSON ({exc})") from None
        if not isinstance(body, dict) or not isinstance(body.get("sentence_list"), list) or not body["sentence_list"]:
            raise cli.ToolError(f"{path}:{number}: not a request body (a JSON object with a sentence_list)")
        bodies.append(body)
    if not bodies:
        raise cli.ToolError(f"{path} holds no request body")
    return bodies


def request_bodies(n: int, seed: int = 0, path: Path = REAL_REQUESTS) -> list[Body]:
    """Return n different bodies: the real ones first, then variations of them, each with its own esun_uuid."""
    real = real_bodies(path)
    bodies = [dict(body) for body in real[:n]]
    rng = random.Random(seed)
    for index in range(n - len(bodies)):
        base = real[index % len(real)]
        vary = _VARIATIONS[(index // len(real)) % len(_VARIATIONS)]
        sentences = [s for s in vary(list(base["sentence_list"]), rng) if s.strip()] or [base["sentence_list"][0]]
        body = {**base, "sentence_list": sentences, "phoneme_sequence_list": [text_phones(s) for s in sentences],
                "retry": 2}  # the phones written the judge's way
        body["esun_uuid"] = uuid_of(f"{seed}-{index}-{json.dumps(body, ensure_ascii=False)}")
        bodies.append(body)
    return bodies


def simulated_bodies(n: int, splits: tuple[str, ...] = ("test",), seed: int = 0, distinct: bool = False,
                     start: list[Body] | None = None, max_chars: int | None = None) -> list[Body]:
    """Return n bodies the model takes: `start`'s, then lists simulated from `splits` (seeded; `distinct`: no twins;
    TOP1s at most `max_chars` characters when given)."""
    from learn.data.simulate import load_simulator

    limit = min(Config().max_top1_chars, max_chars or sys.maxsize)

    def model_takes(top1: str) -> bool:
        return has_han(top1) and len(strip_spaces(top1)) <= limit

    bodies = [body for body in start or [] if model_takes(body["sentence_list"][0])][:n]
    corpus = REPO_ROOT / "data" / "corpus"
    if not ((corpus / "lexicon.json").is_file() and all((corpus / f"{split}.txt").is_file() for split in splits)):
        print(f"{corpus} is missing: building it (python -m learn.data.corpus)", flush=True)
        subprocess.run([sys.executable, "-m", "learn.data.corpus", "--out", str(corpus)], cwd=REPO_ROOT, check=True)
    simulator = load_simulator(corpus)
    sentences = [s for split in splits for s in (corpus / f"{split}.txt").read_text(encoding="utf-8").splitlines()
                 if s.strip()]
    rng = random.Random(seed)
    rng.shuffle(sentences)
    seen: set[tuple[str, ...]] = set()
    for sentence in sentences:
        if len(bodies) >= n:
            break
        nbest = simulator.simulate(sentence, rng, phones=True)
        if model_takes(nbest.top1) and not (distinct and nbest.sentences in seen):
            seen.add(nbest.sentences)
            bodies.append({"esun_uuid": "", "esun_timestamp": 1656000000.5, "sentence_list": list(nbest.sentences),
                           "phoneme_sequence_list": list(nbest.phonemes), "retry": 2})
    if distinct and len(bodies) < n:
        raise cli.ToolError(f"the corpus gave {len(bodies)} distinct lists, fewer than the {n} asked")
    return bodies


def pool_shape(bodies: list[Body]) -> dict[str, float]:
    """Describe a pool of bodies: how many, their TOP1's mean length (characters, spaces left out), mean hypotheses."""
    return {"bodies": len(bodies),
            "mean_top1_chars": round(sum(len(strip_spaces(b["sentence_list"][0])) for b in bodies) / len(bodies), 1),
            "mean_hypotheses": round(sum(len(b["sentence_list"]) for b in bodies) / len(bodies), 1)}


def check_answer(status: int, body: bytes | str | object, sent_uuid: str) -> str | None:
    """Say what is wrong with an answer (`body` raw or parsed) for the judge, or None (testing/README.md's check)."""
    if status != 200:
        return f"HTTP {status}, want 200"
    data = body
    if isinstance(body, bytes | str):
        try:
            data = json.loads(body)
        except ValueError:
            return f"body is not JSON: {body[:80]!r}"
    if not isinstance(data, dict):
        return f"body is not a JSON object: {data!r}"
    if set(data) != RESPONSE_KEYS:
        return f"keys {sorted(data)}, want exactly {sorted(RESPONSE_KEYS)}"
    answer = data["answer"]
    if not isinstance(answer, str) or not answer or " " in answer:
        return f"answer must be a non-empty string without spaces, got {answer!r}"
    if data["esun_uuid"] != sent_uuid:
        return f"esun_uuid {data['esun_uuid']!r} is not the one sent ({sent_uuid!r})"
    if not isinstance(data["server_timestamp"], int | float) or isinstance(data["server_timestamp"], bool):
        return f"server_timestamp must be a number, got {data['server_timestamp']!r}"
    if not isinstance(data["server_uuid"], str):
        return f"server_uuid must be a string, got {data['server_uuid']!r}"
    return None


def uuid_of(text: str) -> str:
    """Derive an esun_uuid from a text: 64 hex characters (sha256), as in the judge's examples."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _rotated(hyps: list[str], rng: random.Random) -> list[str]:
    k = rng.randrange(1, len(hyps)) if len(hyps) > 1 else 0
    return hyps[k:] + hyps[:k]


def _tail_shuffled(hyps: list[str], rng: random.Random) -> list[str]:
    first, *rest = hyps
    rng.shuffle(rest)
    return [first, *rest[: rng.randint(1, max(1, len(rest)))]]


# How request_bodies varies the real bodies' hypotheses, in turn:
_VARIATIONS: list[Callable[[list[str], random.Random], list[str]]] = [
    _rotated,  # another hypothesis becomes TOP1
    lambda hyps, _: [" ".join(s.split()[1:]) or s for s in hyps],  # the utterance starts one word later
    lambda hyps, _: [" ".join(s.split()[:-1]) or s for s in hyps],  # it ends one word earlier
    _tail_shuffled,  # TOP1 stays; the other hypotheses come in another order, and fewer of them
    lambda hyps, _: [f"{s} {' '.join(hyps[0].split()[-2:])}" for s in hyps],  # longer: TOP1's last two words after each
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testing.samples", description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, help="write JMeter's request file here")
    parser.add_argument("-n", type=int, default=10, help="how many bodies (default 10)")
    parser.add_argument("--samples", type=Path, default=REAL_REQUESTS, help="JSONL bodies to start from")
    args = parser.parse_args(argv)
    bodies = request_bodies(args.n, path=args.samples)
    if args.csv:  # one compact JSON object per line, for JMeter's CSV Data Set (tab-delimited, unquoted)
        args.csv.write_text("".join(json.dumps(b, ensure_ascii=False, separators=(",", ":")) + "\n" for b in bodies),
                            encoding="utf-8")
        print(f"wrote {args.n} bodies to {args.csv}")
    else:
        for body in bodies:
            print(json.dumps(body, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    cli.run(main, "testing.samples")
