"""Request and response schemas of the HTTP API, and the functions that read and write them.

The pydantic models here are both what the code validates with and what `/openapi.json` documents.
What is accepted follows the judge's contract (`shared/spec/api-contract.md`), erring towards a 200
answer for anything the judge can send:

- `retry` is an int or a numeric string (`2`, `"2"`); only 0, 1 and 2 are accepted.
- `esun_timestamp` is an int or a float; it is not used.
- `phoneme_sequence_list` is optional and never a reason to refuse: missing, null, empty, shorter or longer
  than `sentence_list`, or holding odd strings, it is passed on as it is (truncated to `max_hypotheses`);
  when it is not a list of strings it is dropped.
- `sentence_list[0]` (TOP1) must hold characters. A later hypothesis that is empty or only spaces is
  accepted and dropped, since it carries nothing to choose from; the corrector never sees one.
- Unknown keys (the sender adds `"res_text": null`) are ignored.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any

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
_CONTROL_CHARS = r"\x00-\x1f\x7f-\x9f"
# C0/C1 control characters and lone surrogates (which `\ud800` escapes in JSON can produce).
_FORBIDDEN_CHARS = re.compile(rf"[{_CONTROL_CHARS}\ud800-\udfff]")
_RETRY_VALUES = (0, 1, 2)
_DEFAULT_CONFIG = Config()
# The same rules as JSON Schema patterns, so that /openapi.json promises only what parse_request accepts
# (schemathesis sends requests the document allows and expects them answered). Lone surrogates are not
# Unicode text, so a JSON Schema string cannot hold one and the patterns need not (and cannot) name them.
_PLAIN_TEXT = rf"^[^{_CONTROL_CHARS}]*$"
_PLAIN_NOT_BLANK = rf"^[^{_CONTROL_CHARS}]*[^\s{_CONTROL_CHARS}][^{_CONTROL_CHARS}]*$"


def _as_retry(value: Any) -> int:
    number = value
    integral_float = isinstance(value, float) and value.is_integer()
    if integral_float or (isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d{1,3}\s*", value)):
        number = int(value)
    if isinstance(number, bool) or not isinstance(number, int) or number not in _RETRY_VALUES:
        raise PydanticCustomError("retry", "must be 0, 1 or 2, got {value}", {"value": repr(value)})
    return number


def _as_timestamp(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError(
            "esun_timestamp", "must be a number of seconds, got {kind}", {"kind": type(value).__name__}
        )
    try:
        return float(value)
    except OverflowError:  # a JSON integer of hundreds of digits: OverflowError is not turned into a 400 by pydantic
        raise PydanticCustomError("esun_timestamp", "must be a number of seconds, got an integer too large") from None


def _as_phonemes(value: Any) -> list[str]:
    # Phones are an extra the corrector can do without: anything unusable is dropped, never refused.
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    return []


def _hypotheses_schema(config: Config) -> dict[str, Any]:
    """Document sentence_list's limits as `_readable_hypotheses` checks them."""
    hypothesis = {"type": "string", "maxLength": config.max_chars_per_hypothesis}
    return {
        "minItems": 1,
        "maxItems": config.max_hypotheses,
        "prefixItems": [{**hypothesis, "pattern": _PLAIN_NOT_BLANK}],
        "items": {**hypothesis, "pattern": _PLAIN_TEXT},
    }


Retry = Annotated[
    int,
    BeforeValidator(_as_retry),
    WithJsonSchema({"anyOf": [{"type": "integer", "enum": [0, 1, 2]}, {"type": "string", "enum": ["0", "1", "2"]}],
                    "description": "attempts left: 2 on the first attempt, then 1, then 0"}),
]
Timestamp = Annotated[
    float,
    BeforeValidator(_as_timestamp),
    WithJsonSchema({"type": "number", "description": "when this attempt was sent, seconds since the epoch"}),
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
    esun_timestamp: Timestamp
    sentence_list: list[StrictStr] = Field(
        description="the ASR n-best, best first, words separated by spaces; TOP1 must hold characters, a later "
                    "blank hypothesis is dropped (limits shown are the defaults of max_hypotheses and "
                    "max_chars_per_hypothesis)",
        json_schema_extra=_hypotheses_schema(_DEFAULT_CONFIG),
    )
    phoneme_sequence_list: Phonemes = Field(default_factory=list)
    retry: Retry

    @field_validator("esun_uuid")
    @classmethod
    def _plain_uuid(cls, value: str) -> str:
        if _FORBIDDEN_CHARS.search(value):
            raise PydanticCustomError("control_char", "must not hold control characters")
        return value

    @field_validator("sentence_list")
    @classmethod
    def _readable_hypotheses(cls, value: list[str], info: ValidationInfo) -> list[str]:
        config = _config_of(info)
        if not 1 <= len(value) <= config.max_hypotheses:
            raise PydanticCustomError(
                "hypothesis_count", "must hold 1 to {max} hypotheses, got {n}",
                {"max": config.max_hypotheses, "n": len(value)},
            )
        if not value[0].strip():
            raise PydanticCustomError("empty_top1", "the first hypothesis (TOP1) must hold characters")
        for index, sentence in enumerate(value):
            if len(sentence) > config.max_chars_per_hypothesis:
                raise PydanticCustomError(
                    "hypothesis_too_long", "hypothesis {index} has {n} characters, more than {max}",
                    {"index": index, "n": len(sentence), "max": config.max_chars_per_hypothesis},
                )
            if _FORBIDDEN_CHARS.search(sentence):
                raise PydanticCustomError(
                    "control_char", "hypothesis {index} holds control characters", {"index": index}
                )
        return value

    @field_validator("phoneme_sequence_list")
    @classmethod
    def _at_most_max_hypotheses(cls, value: list[str], info: ValidationInfo) -> list[str]:
        return value[: _config_of(info).max_hypotheses]

    @property
    def is_retry(self) -> bool:
        """Tell whether an earlier attempt at this question already failed on the judge's side."""
        return self.retry < 2

    def to_nbest(self) -> NBest:
        """Give the corrector's view of the question: TOP1 and the non-blank hypotheses after it."""
        first, *rest = self.sentence_list
        return NBest(
            sentences=(first, *(s for s in rest if s.strip())),
            phonemes=tuple(self.phoneme_sequence_list),
        )


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
    config: dict[str, Any]


def parse_request(body: bytes, config: Config) -> InferenceRequest:
    """Read an inference request from raw body bytes, whatever the Content-Type; raise InvalidRequest."""
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"body is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # an integer of thousands of digits, arrays nested too deep
        raise InvalidRequest(f"body is not readable JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"body must be a JSON object, got {_json_kind(data)}")
    try:
        return InferenceRequest.model_validate(data, context={"config": config})
    except ValidationError as exc:
        uuid = data.get("esun_uuid")
        raise InvalidRequest(_describe(exc), esun_uuid=uuid if isinstance(uuid, str) else None) from None


def build_response(esun_uuid: str, answer: str, config: Config, now: float) -> dict[str, Any]:
    """Build the judge's four-key answer; `now` is time.time() at answering."""
    return InferenceResponse(
        esun_uuid=esun_uuid,
        server_uuid=server_uuid(config.captain_email, now, config.server_uuid_salt),
        server_timestamp=now,
        answer=answer,
    ).model_dump()


def server_uuid(captain_email: str, now: float, salt: str) -> str:
    """Make the id of an answer the way the organiser's template did."""
    return hashlib.sha256((captain_email + str(int(now)) + salt).encode("utf-8")).hexdigest()


def _config_of(info: ValidationInfo) -> Config:
    context = info.context or {}
    return context.get("config", _DEFAULT_CONFIG)


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
