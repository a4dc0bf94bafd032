"""Request and response schemas of the HTTP API, and the functions that read and write them.

The pydantic models here are both what the code validates with and what `/openapi.json` documents.
What is accepted follows the judge's contract (`docs/contract.md`) and the product rule: bad input
gets a clear 400 with a JSON error body, but anything readable gets a 200 answer, since a 400 scores zero for
that question while TOP1 (`sentence_list[0]`, spaces removed) is always a valid answer.

A request is refused (400) only when it holds no usable question:

- the body is not a JSON object (not UTF-8, not JSON, nested too deep for the parser, or not an object);
- `esun_uuid` is missing, not a string, empty, longer than `MAX_UUID_CHARS` or holds control characters or
  lone surrogates (it is echoed back in the answer, so it must be safe to echo);
- `sentence_list` is missing, not a list, or empty;
- TOP1 (`sentence_list[0]`) is not a string.

Everything else is read leniently:

- A TOP1's control characters and lone surrogates are read as a space (a tab, a line break) or dropped.
- An empty or blank TOP1 is a question whose TOP1 has no characters: answered 200 with TOP1 without its spaces, the
  empty answer (path `no_han`, as every TOP1 without a Han character, `api.answers`), never refused: a status other
  than 200 only earns the judge's retries, and docs/contract.md allows an empty answer for exactly this TOP1.
- Later hypotheses: only the first `max_hypotheses` entries of `sentence_list` are read (TOP1 first); among
  them, a later one that is not a string, is blank, is longer than `max_chars_per_hypothesis` or holds
  control characters or lone surrogates is dropped. The corrector never sees one.
- A TOP1 longer than `max_chars_per_hypothesis` is kept: the too-long rule (`api.answers`)
  answers it with TOP1 at once when it has more than `max_top1_chars` characters besides whitespace; one
  with fewer is mostly whitespace, and the model reads only its Han characters (at most 64, linear work).
  Only a TOP1 of more than `MAX_TOP1_KEPT_CHARS` characters besides whitespace is cut after that many, so
  that the answer (TOP1's characters besides whitespace, at most) keeps the whole response under the judge's
  10,240 characters; the judge sends nothing so long.
- `esun_timestamp` is optional, any value, never used: a float, or None when missing or not a finite number.
- `retry` is an int 0, 1 or 2, or a numeric string (`2`, `"2"`). Missing, unparseable, a boolean, or out of
  range it reads as 2, a first attempt (a model answer is bounded by the deadline and admission, api.answers), except
  a negative number, which reads as 0 (the last attempt).
- `phoneme_sequence_list` is optional and never a reason to refuse: missing, null, empty, shorter or longer
  than `sentence_list`, or holding odd strings, it is passed on as it is (truncated to `max_hypotheses`);
  when it is not a list of strings it is dropped.
- An integer too long for Python to read as an int (the body is valid JSON all the same) is read as a float,
  which is out of range wherever it appears.
- Unknown keys (the sender adds `"res_text": null`) are ignored.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any

import orjson
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)
from pydantic_core import PydanticCustomError

from api.errors import InvalidRequest
from config import Config
from preprocess.text import NBest

MAX_UUID_CHARS = 256
# A TOP1 is cut after this many characters besides whitespace: the answer then takes at most 2 * 4,096
# characters of JSON (a quote or backslash is escaped), which with an esun_uuid of MAX_UUID_CHARS (escaped, 512)
# keeps the response under the judge's 10,240.
MAX_TOP1_KEPT_CHARS = 4096
# `\s` is str.isspace(), the whitespace that str.split() (preprocess.text.strip_spaces) removes. `\s*\S` cannot
# backtrack, so matching is linear.
_TOP1_KEPT = re.compile(rf"(?:\s*\S){{{MAX_TOP1_KEPT_CHARS}}}")
_CONTROL_CHARS = r"\x00-\x1f\x7f-\x9f"
# C0/C1 control characters and lone surrogates (which `\ud800` escapes in JSON can produce).
_FORBIDDEN_CHARS = re.compile(rf"[{_CONTROL_CHARS}\ud800-\udfff]")
_RETRY_VALUES = (0, 1, 2)
FIRST_ATTEMPT = 2
LAST_ATTEMPT = 0
# Python refuses to read an int of more than 4,300 digits (sys.get_int_max_str_digits) and reading one is
# quadratic; no field the service uses needs more than a few digits, so a longer integer is read as a float.
_MAX_INT_DIGITS = 20


@dataclass(frozen=True)
class ReadLimits:
    """What reading a request needs of the config: how many hypotheses, and how long a later one may be."""

    max_hypotheses: int
    max_chars_per_hypothesis: int


# Config's defaults, read from its fields without building one (that reads the weights folder and the LM file).
_DEFAULT_LIMITS = ReadLimits(**{name: Config.__dataclass_fields__[name].default
                                for name in ("max_hypotheses", "max_chars_per_hypothesis")})
# The same rules as JSON Schema patterns, so that /openapi.json promises only what parse_request accepts
# (schemathesis sends requests the document allows and expects them answered). Lone surrogates are not
# Unicode text, so a JSON Schema string cannot hold one and the patterns need not (and cannot) name them.
_PLAIN_TEXT = rf"^[^{_CONTROL_CHARS}]*$"


def _as_retry(value: Any) -> int:
    """Read `retry` leniently: 0, 1 or 2 as sent; a negative number as 0; anything else as 2 (first attempt)."""
    number = value
    if isinstance(value, str):
        try:
            number = float(value)  # "2", " 2 ", "2.0"; float() is linear in the length, unlike int()
        except ValueError:
            return FIRST_ATTEMPT
    if isinstance(number, bool) or not isinstance(number, int | float):
        return FIRST_ATTEMPT
    if number < 0:
        return LAST_ATTEMPT
    if number in _RETRY_VALUES:  # NaN is in no range: a first attempt
        return int(number)
    return FIRST_ATTEMPT


def _as_timestamp(value: Any) -> float | None:
    """Read `esun_timestamp`, which is never used: a finite number of seconds, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past float range (only when validated from Python: parse_request reads floats)
        return None
    return number if math.isfinite(number) else None


def _as_phonemes(value: Any) -> list[str]:
    # Phones are an extra the corrector can do without: anything unusable is dropped, never refused.
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    return []


def _clean_top1(top1: str) -> str:
    """TOP1 without control characters or lone surrogates: a whitespace one becomes a space, any other goes."""
    return _FORBIDDEN_CHARS.sub(lambda m: " " if m.group().isspace() else "", top1)


def _cut_top1(top1: str) -> str:
    """Cut TOP1 after its MAX_TOP1_KEPT_CHARS-th character besides whitespace; most TOP1s are kept whole."""
    if len(top1) <= MAX_TOP1_KEPT_CHARS:
        return top1
    kept = _TOP1_KEPT.match(top1)
    return kept.group() if kept else top1


def _usable_later(value: Any, max_chars: int) -> bool:
    """Tell whether a hypothesis after TOP1 is kept: a string with characters, not too long, no control chars."""
    return (isinstance(value, str) and len(value) <= max_chars and bool(value.strip())
            and not _FORBIDDEN_CHARS.search(value))


def _hypotheses_schema(config: Config | ReadLimits) -> dict[str, Any]:
    """Document sentence_list as `_usable_hypotheses` reads it: only TOP1 can make a request refused."""
    return {
        "type": "array",
        "minItems": 1,
        "prefixItems": [{
            "type": "string",
            "description": "TOP1: a control character is read as a space (a whitespace one) or dropped; any length "
                           f"(cut after {MAX_TOP1_KEPT_CHARS} characters "
                           "besides whitespace); an empty or blank TOP1 gets an empty answer",
        }],
        "items": {
            "description": f"a later hypothesis, any value: one past the first {config.max_hypotheses} entries, "
                           f"or that is not a string, is blank, is longer than {config.max_chars_per_hypothesis} "
                           "characters or holds control characters, is dropped",
        },
        "description": "the ASR n-best, best first, words separated by spaces (limits shown are the defaults of "
                       "max_hypotheses and max_chars_per_hypothesis)",
    }


Hypotheses = Annotated[list[StrictStr], WithJsonSchema(_hypotheses_schema(_DEFAULT_LIMITS))]
Retry = Annotated[
    int,
    BeforeValidator(_as_retry),
    # Any value is accepted (_as_retry reads what it cannot use as a first attempt), so the document says so.
    WithJsonSchema({"anyOf": [{"type": "integer", "enum": [0, 1, 2]}, {"type": "string", "enum": ["0", "1", "2"]},
                              {"description": "any other value: a negative number reads as 0, anything else "
                                              "(missing included) as 2"}],
                    "description": "attempts left: 2 on the first attempt, then 1, then 0; optional"}),
]
Timestamp = Annotated[
    float | None,
    BeforeValidator(_as_timestamp),
    # Never used, so never a reason to refuse: any value is accepted.
    WithJsonSchema({"anyOf": [{"type": "number"}, {"description": "any other value, ignored"}],
                    "description": "when this attempt was sent, seconds since the epoch; optional and not used"}),
]
Phonemes = Annotated[
    list[str],
    BeforeValidator(_as_phonemes),
    # Any value is accepted (_as_phonemes drops what it cannot use), so the document says so: a list of
    # strings, or anything else, which is ignored.
    WithJsonSchema({"anyOf": [{"type": "array", "items": {"type": "string"}},
                              {"description": "any other value, ignored"}],
                    "description": "phone strings, its own ranked list (not always aligned); optional; "
                                   "a value that is not a list of strings is ignored"}),
]


class InferenceRequest(BaseModel):
    """A question from the judge: the ASR n-best of one utterance."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    esun_uuid: StrictStr = Field(min_length=1, max_length=MAX_UUID_CHARS,
                                 description="id of the question, identical on every retry",
                                 json_schema_extra={"pattern": _PLAIN_TEXT})
    esun_timestamp: Timestamp = None
    sentence_list: Hypotheses
    phoneme_sequence_list: Phonemes = Field(default_factory=list)
    retry: Retry = FIRST_ATTEMPT

    @field_validator("esun_uuid")
    @classmethod
    def _plain_uuid(cls, value: str) -> str:
        if _FORBIDDEN_CHARS.search(value):
            raise PydanticCustomError("control_char", "must not hold control characters")
        return value

    @field_validator("sentence_list", mode="before")
    @classmethod
    def _usable_hypotheses(cls, value: Any, info: ValidationInfo) -> Any:
        """Refuse a list without a usable TOP1; keep TOP1 and the usable hypotheses among the first max_hypotheses."""
        if not isinstance(value, list):
            return value  # pydantic names the type: "Input should be a valid list"
        if not value:
            raise PydanticCustomError("no_hypothesis", "must hold at least one hypothesis (TOP1)")
        top1 = value[0]
        if not isinstance(top1, str):
            raise PydanticCustomError("top1_type", "the first hypothesis (TOP1) must be a string, got {kind}",
                                      {"kind": _json_kind(top1)})
        config = _config_of(info)
        later = [s for s in value[1 : config.max_hypotheses] if _usable_later(s, config.max_chars_per_hypothesis)]
        return [_cut_top1(_clean_top1(top1)), *later]

    @field_validator("phoneme_sequence_list")
    @classmethod
    def _at_most_max_hypotheses(cls, value: list[str], info: ValidationInfo) -> list[str]:
        return value[: _config_of(info).max_hypotheses]

    def question(self) -> Question:
        """What the answer policy reads of the request."""
        return Question(self.esun_uuid, self.retry, tuple(self.sentence_list), tuple(self.phoneme_sequence_list))


@dataclass(frozen=True, slots=True)
class Question:
    """A readable request as the answer policy (api.answers) reads it: from `parse_request` (the view) or
    `read_at_door` (the event loop, which reads TOP1 alone)."""

    esun_uuid: str
    retry: int
    # TOP1 (cut after MAX_TOP1_KEPT_CHARS characters besides whitespace), then the usable later hypotheses.
    sentence_list: tuple[str, ...]
    phonemes: tuple[str, ...] = ()

    @property
    def is_retry(self) -> bool:
        """Tell whether an earlier attempt at this question already failed on the judge's side."""
        return self.retry < FIRST_ATTEMPT

    def to_nbest(self) -> NBest:
        """Give the corrector's view of the question: TOP1 and the usable hypotheses after it."""
        return NBest(sentences=self.sentence_list, phonemes=self.phonemes)


class InferenceResponse(BaseModel):
    """The answer: exactly these four keys, any other makes the judge store a failure."""

    model_config = ConfigDict(extra="forbid")

    esun_uuid: str = Field(description="echoed from the request")
    server_uuid: str = Field(description="sha256(captain_email + str(int(utc_now)) + salt), hex")
    server_timestamp: float = Field(description="time.time() when the answer was made")
    answer: str = Field(description="the corrected sentence: characters only, no spaces")


class ErrorBody(BaseModel):
    """Every non-200 answer."""

    error: str = Field(description="a short code: bad_request, payload_too_large, not_found, ...")
    detail: str = Field(description="what was wrong, for a human")


class HealthBody(BaseModel):
    status: str


class ReadyBody(BaseModel):
    ready: bool
    reasons: list[str] = Field(description="why the service is not ready; empty when it is")


class InfoBody(BaseModel):
    name: str
    version: str
    model: dict[str, Any]
    serving: dict[str, Any] | None = None  # the weights folder this worker serves, since when (hosting.swap)
    config: dict[str, Any]


def parse_request(body: bytes, config: Config) -> Question:
    """Read an inference request from raw body bytes, whatever the Content-Type; raise InvalidRequest."""
    try:
        text = _without_bom(body).decode()
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"body is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        data = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # an integer of thousands of digits, arrays nested too deep
        raise InvalidRequest(f"body is not readable JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"body must be a JSON object, got {_json_kind(data)}")
    try:
        return InferenceRequest.model_validate(data, context={"config": config}).question()
    except ValidationError as exc:
        uuid = data.get("esun_uuid")
        raise InvalidRequest(_describe(exc), esun_uuid=uuid if isinstance(uuid, str) else None) from None


def read_at_door(body: bytes) -> Question | None:
    """Read a request the worker's event loop may answer without the model (TOP1 or an answer already computed): its
    esun_uuid, retry and TOP1, or None where `parse_request` could refuse it or read it otherwise (a thread then
    parses it whole). What it returns, `parse_request` returns too, as far as these three go; it skips pydantic and
    the later hypotheses (which never make a request refused), a third of a door answer's CPU.
    """
    try:  # orjson refuses what json reads otherwise (a lone surrogate, NaN, an integer past 64 bits): left to a thread
        data = orjson.loads(_without_bom(body))
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    uuid, hypotheses = data.get("esun_uuid"), data.get("sentence_list")
    if not (type(uuid) is str and 0 < len(uuid) <= MAX_UUID_CHARS and type(hypotheses) is list and hypotheses
            and type(hypotheses[0]) is str):
        return None
    top1 = hypotheses[0]
    if _FORBIDDEN_CHARS.search(uuid):
        return None
    retry = _as_retry(data["retry"]) if "retry" in data else FIRST_ATTEMPT
    return Question(uuid, retry, (_cut_top1(_clean_top1(top1)),))


def build_response(esun_uuid: str, answer: str, config: Config, now: float) -> dict[str, Any]:
    """Build the judge's four-key answer (`InferenceResponse`'s keys); `now` is time.time() at answering."""
    return {"esun_uuid": esun_uuid, "server_uuid": server_uuid(config.captain_email, int(now), config.server_uuid_salt),
            "server_timestamp": now, "answer": answer}


@lru_cache(maxsize=4)
def server_uuid(captain_email: str, now: int, salt: str) -> str:
    """Make the id of an answer the way the organiser's template did (the same for every answer of a second)."""
    return hashlib.sha256((captain_email + str(int(now)) + salt).encode("utf-8")).hexdigest()


def _read_int(digits: str) -> int | float:
    """Read a JSON integer: as an int, or as a float (maybe infinite) when it is too long to matter as an int."""
    return int(digits) if len(digits) <= _MAX_INT_DIGITS else float(digits)


_DECODER = json.JSONDecoder(parse_int=_read_int)  # json.loads would build one for each body


def _without_bom(body: bytes) -> bytes:
    """The body without a UTF-8 byte order mark (read as the codec utf-8-sig reads, which is in Python)."""
    return body[3:] if body[:3] == codecs.BOM_UTF8 else body


def _config_of(info: ValidationInfo) -> Config | ReadLimits:
    context = info.context or {}
    return context.get("config", _DEFAULT_LIMITS)


def _describe(exc: ValidationError) -> str:
    """Name the first problem of a validation error, e.g. 'sentence_list[2]: Input should be a valid string'."""
    error = exc.errors(include_url=False)[0]
    where = ""
    for part in error["loc"]:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    return f"{where}: {error['msg']}" if where else error["msg"]


def _json_kind(value: Any) -> str:
    kinds = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)
