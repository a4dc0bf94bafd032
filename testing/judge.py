"""Put labelled questions to a running service as the judge does, and score its answers (testing/README.md)."""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import requests

from learn.data.labelled import Labelled, LabelledFormatError, read_labelled
from testing.load import percentile
from testing.samples import check_answer, uuid_of

Outcome = Literal["answered", "late", "non_200", "connection_error", "malformed"]
MAX_RESPONSE_CHARS = 10_240  # the judge's sender truncates longer bodies, which then fail to parse
RETRIES = (2, 1, 0)


@dataclass(frozen=True)
class JudgedAnswer:
    """One question as the judge saw it: the counted answer (None: none valid) and each attempt's outcome."""

    id: str
    esun_uuid: str
    answer: str | None
    outcomes: tuple[Outcome, ...]
    latency_s: float | None  # of the counted attempt

    @property
    def attempts(self) -> int:
        return len(self.outcomes)

    @property
    def scored(self) -> str:
        """Return what the judge scores: the answer, or nothing when there was none."""
        return self.answer if self.answer is not None else ""


@dataclass(frozen=True)
class JudgeRun:
    """A whole run: the answers in input order; the failed attempts by kind and the counted answers' latency."""

    answers: list[JudgedAnswer]
    wall_s: float

    def failed(self, outcome: Outcome) -> int:
        """Count the attempts that ended so (late, non_200, connection_error, malformed)."""
        return sum(a.outcomes.count(outcome) for a in self.answers)

    @property
    def unanswered(self) -> int:
        return sum(a.answer is None for a in self.answers)

    @property
    def never_connected(self) -> int:
        """Count the questions none of whose attempts could connect (a question, not its retries)."""
        return sum(all(o == "connection_error" for o in a.outcomes) for a in self.answers)

    def latency_s(self) -> dict[str, float | None]:
        """Nearest-rank p50/p90/p99/max of the counted answers' latencies, in seconds (None: no answer at all)."""
        latencies = [a.latency_s for a in self.answers if a.latency_s is not None]
        return {name: percentile(latencies, q) for name, q in (("p50_s", 50), ("p90_s", 90), ("p99_s", 99),
                                                                ("max_s", 100))}

    def summary(self) -> dict[str, Any]:
        """Return the counts and latencies (not the answers) as a JSON-ready dict."""
        return {"questions": len(self.answers), "unanswered": self.unanswered, "late": self.failed("late"),
                "non_200": self.failed("non_200"), "connection_errors": self.failed("connection_error"),
                "malformed": self.failed("malformed"), "attempts": sum(a.attempts for a in self.answers),
                "latency_s": self.latency_s(), "wall_s": round(self.wall_s, 3)}


def valid_answer(text: str, esun_uuid: str) -> str | None:
    """Return the answer of a 200's body when the judge can read it, else None."""
    if len(text) > MAX_RESPONSE_CHARS or check_answer(200, text, esun_uuid) is not None:
        return None
    return json.loads(text)["answer"]


def ask(session: requests.Session, url: str, item: Labelled, esun_uuid: str, timeout_s: float) -> JudgedAnswer:
    """Put one question with the judge's retries; return the earliest valid answer (a malformed 200 is not re-sent)."""
    outcomes: list[Outcome] = []
    for retry in RETRIES:
        body = {"esun_uuid": esun_uuid, "esun_timestamp": int(time.time()), "retry": retry,
                "sentence_list": list(item.nbest.sentences), "phoneme_sequence_list": list(item.nbest.phonemes)}
        started = time.perf_counter()
        try:
            response = session.post(url, json=body, timeout=timeout_s)
            content, elapsed = response.content, time.perf_counter() - started
        except requests.Timeout:
            outcomes.append("late")
            continue
        except requests.RequestException:  # refused, reset, broken transfer: the judge's "connection error"
            outcomes.append("connection_error")
            continue
        if response.status_code != 200:
            outcomes.append("non_200")
            continue
        try:
            answer = valid_answer(content.decode("utf-8"), esun_uuid)
        except UnicodeDecodeError:
            answer = None
        if answer is None:
            outcomes.append("malformed")
            break
        return JudgedAnswer(item.id, esun_uuid, answer, (*outcomes, "answered"), elapsed)
    return JudgedAnswer(item.id, esun_uuid, None, tuple(outcomes), None)


def judge(url: str, items: list[Labelled], timeout_s: float = 1.0, concurrency: int = 10) -> JudgeRun:
    """Put every item to the service at `url` as the judge does; return the answers in input order."""
    endpoint = url.rstrip("/") + "/inference"
    salt = secrets.token_hex(8)
    local, sessions = threading.local(), []

    def open_session() -> None:  # one per thread, all closed at the end
        local.session = requests.Session()
        local.session.trust_env = False  # aim at the URL given, never through a proxy from the environment
        sessions.append(local.session)

    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(concurrency, thread_name_prefix="judge", initializer=open_session) as pool:
            answers = list(pool.map(lambda item: ask(local.session, endpoint, item, uuid_of(f"{salt}:{item.id}"),
                                                     timeout_s), items))
    finally:
        for each in sessions:
            each.close()
    return JudgeRun(answers, time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    """Run the judge over labelled files and simulated sets; print each set's counts, latencies and CER as JSON."""
    from learn.evaluate import SIM_SETS, cer_score, simulated_set

    ap = argparse.ArgumentParser(description="Put labelled questions to a running service as the judge does.")
    ap.add_argument("--data", type=Path, action="append", default=[], help="a labelled file, JSON or JSONL (repeated)")
    ap.add_argument("--sets", default="", help=f"learn.evaluate's simulated sets ({','.join(SIM_SETS)})")
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--timeout", type=float, default=1.0, help="the judge's HTTP timeout in seconds")
    ap.add_argument("--concurrency", type=int, default=10, help="questions outstanding at once")
    ap.add_argument("--limit", type=int, default=0, help="the first N questions of each set (0: all, 3,000 simulated)")
    args = ap.parse_args(argv)
    names = [n for n in args.sets.split(",") if n]
    if not args.data and not names:
        ap.error("give --data FILE or --sets NAMES")
    if not args.url.startswith(("http://", "https://")) or args.timeout <= 0 or args.concurrency < 1:
        ap.error("--url must start with http:// or https://, --timeout be > 0 and --concurrency >= 1")
    try:
        sets = {path.name: read_labelled(path)[: args.limit or None] for path in args.data}
        for name in names:
            data = simulated_set(Path("data/corpus"), name, args.limit or 3000)
            sets[name] = [Labelled(f"{name}-{k}", t, nb) for k, (nb, t) in enumerate(zip(data.nbests, data.truths,
                                                                                         strict=True))]
    except OSError as e:  # str(e) is "[Errno 2] ..." where the error names no file: say which one
        ap.exit(2, f"{ap.prog}: error: cannot read {e.filename or 'a labelled file'}: {e.strerror or e}\n")
    except (LabelledFormatError, ValueError) as e:
        ap.exit(2, f"{e}\n")
    results, unanswered, never_connected, asked = {}, 0, 0, 0
    for name, items in sets.items():
        run = judge(args.url, items, args.timeout, args.concurrency)
        score = cer_score([it.nbest for it in items], [it.truth for it in items], [a.scored for a in run.answers])
        results[name] = run.summary() | asdict(score)
        unanswered += run.unanswered
        never_connected += run.never_connected
        asked += len(items)
    print(json.dumps(results, indent=1))
    if never_connected > asked / 2:
        print(f"error: {never_connected} of {asked} questions could not connect to {args.url}: is the service "
              f"running?", file=sys.stderr)
    return 0 if unanswered == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
