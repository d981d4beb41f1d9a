"""What the simulated worker does for one request: every knob, its text encoding, and the answer.

Theory of operation
-------------------
A `WorkerSettings` value decides every byte the worker sends for a request: same settings, same
bytes. Settings come from three layers, later layers win for the keys they name:

1. the worker's command-line defaults (`python -m labs.worker --tokens 7 ...`);
2. the request's model name: `finishline-worker;tokens=7;finish=omitted` (for clients and gateways
   that cannot set headers: LiteLLM and the Vercel AI SDK pass the model name through unchanged);
3. the request header `x-finishline-worker: tokens=7; finish=omitted`.

Both encodings use the same `key=value` items separated by `;`; keys are the field names below,
booleans are `1`/`0` (also `true`/`false`), `none` clears an optional field. A model name's first item,
the one without `=`, is only a name and is ignored. `to_header()` and `to_model_name()` encode a value
back; `parse_settings(text, base=...)` decodes one.

A few fields default to `None`, meaning "as the request asks" (`n`, `max_tokens`,
`stream_options.include_usage`, the model name echoed in chunks). The worker fills them with
`for_request(body, dialect)` before answering. To know a response's bytes in advance (to cut after exactly n
tokens), either resolve with the body the worker will receive or pin those fields in the settings:
a gateway in between may add `stream_options` or change the model name on its own.

The answer is a pure function of resolved settings (`expected_answer`, in `labs.worker.answer`); the
bytes of a response are in `labs.worker.wire`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from finishline import Dialect
from labs.worker.request_reading import REQUEST_READINGS

__all__ = [
    "DEFAULT_MODEL_NAME",
    "SETTINGS_HEADER",
    "Finish",
    "Framing",
    "SettingsError",
    "WorkerSettings",
    "parse_settings",
]

#: Request header that carries per-request settings; the worker echoes the effective settings in a
#: response header of the same name, so a capture or mitmweb shows which scenario ran.
SETTINGS_HEADER = "x-finishline-worker"
#: Model name reported when neither the settings nor the request name one, and listed by /v1/models.
DEFAULT_MODEL_NAME = "finishline-worker"


class SettingsError(ValueError):
    """A settings text or value is invalid; the message names the key and what is allowed."""


class Framing(enum.StrEnum):
    """How the response body is delimited on the wire (RFC 9112 section 6.3)."""

    #: `Transfer-Encoding: chunked`, one chunk per SSE event, `0\r\n\r\n` at the end.
    CHUNKED = "chunked"
    #: `Content-Length` of the whole body, computed in advance (the worker is deterministic).
    CONTENT_LENGTH = "content-length"
    #: No length at all: the body ends when the worker closes the connection.
    CLOSE = "close"


class Finish(enum.StrEnum):
    """How the worker reports why a choice ended (the defects seen in the wild)."""

    #: Like OpenAI: one final chunk per choice with `delta: {}` and a non-empty `finish_reason`.
    SENT = "sent"
    #: No final chunk; every chunk has `"finish_reason": null` (a reasoning model behind a gateway
    #: does this on every natural stop, and strict clients fail "Stream ended without finish_reason").
    OMITTED = "omitted"
    #: `"finish_reason": ""` on every chunk and no final chunk.
    EMPTY = "empty"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    """Every knob of the simulated worker. Immutable; use `dataclasses.replace` to derive.

    Token events: each streamed delta that carries one piece of the answer (a reasoning piece, a
    content piece, the opening of a tool call with its name, or a piece of a tool call's arguments)
    is one "token event". A choice's token events are reasoning first, then content, then tool calls.
    In Messages they are `thinking_delta`, `text_delta`, a `tool_use` block's `content_block_start`
    and `input_json_delta`; in Responses `response.reasoning_summary_text.delta`,
    `response.output_text.delta`, a `function_call`'s `response.output_item.added` and
    `response.function_call_arguments.delta`. What each knob does, in each dialect, is its help in
    `labs.worker.knob_help.KNOB_HELP` (what `python -m labs.worker --help` prints).
    """

    tokens: int = 16
    reasoning_tokens: int = 0
    tool_calls: int = 0
    n: int | None = None
    max_tokens: int | None = None
    include_usage: bool | None = None
    prefill_delay: float = 0.0
    token_delay: float = 0.0
    framing: Framing = Framing.CHUNKED
    connection_close: bool = False
    finish: Finish = Finish.SENT
    done: bool = True
    error_after: int | None = None
    error_status: int = 429
    http_error: int | None = None
    model: str | None = None
    prompt_tokens: int = 12
    null_reason: bool = False
    bare_error: bool = False
    hide_limit: bool = False
    responses_indexes: bool = True
    close_after_reasoning: bool = False

    # -- conduct faults (issue 14): HTTP-level failures that failover suites use. "Once" means the
    # first attempt of a cell at this worker (the cell id in the model name, `labs.worker.attempts`;
    # a request without one: the first such request ever); later attempts are healthy. The server
    # decides "first" (`labs.worker.server`); `after_first_attempt()` is what later attempts get.
    http_429_retry_after: int | None = None
    http_500_once: bool = False
    reset_before_head: bool = False
    no_response: bool = False
    malformed_chunk: bool = False
    http_400_context_length: bool = False

    # -- failover faults (issue 28): what the primary does wrong while the spare (a worker opened
    # with `spare=True`, the lab's second worker) does not. The spare's view is `for_attempt(...,
    # spare=True)`: the `primary_*` faults cleared, `spare_model` and `spare_prompt_tokens` applied.
    primary_429_persistent: bool = False
    primary_503_persistent: bool = False
    primary_503_first: int | None = None
    http_400_content_policy: bool = False
    reject_prefill: bool = False
    http_400_prefill: bool = False
    spare_model: str | None = None
    spare_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        # Values may arrive from the command line or a header as strings already converted; check
        # ranges here so every entry point refuses the same things with the same words.
        for name in ("tokens", "reasoning_tokens", "tool_calls", "prompt_tokens"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.n is not None and self.n < 1:
            raise SettingsError(f"n must be >= 1, got {self.n}")
        for name in ("max_tokens", "error_after"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise SettingsError(f"{name} must be >= 0 or none, got {value}")
        for name in ("prefill_delay", "token_delay"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} must be >= 0 seconds, got {getattr(self, name)}")
        if self.http_429_retry_after is not None and self.http_429_retry_after < 0:
            raise SettingsError(f"http_429_retry_after must be >= 0 seconds or none, got {self.http_429_retry_after}")
        for name in ("error_status", "http_error"):
            value = getattr(self, name)
            if value is not None and not 400 <= value <= 599:
                raise SettingsError(f"{name} must be an HTTP error status 400-599, got {value}")
        bad_requests = [name for name in _BAD_REQUEST_KNOBS if getattr(self, name)]
        if len(bad_requests) > 1:
            raise SettingsError(f"{' and '.join(bad_requests)} are each a 400 with its own body; set one")
        for name in bad_requests:
            # It is an `http_error` of 400 with its own body: the lab's expected answer, the plan and
            # every reader of `http_error` then treat it as the error it is.
            if self.http_error not in (None, 400):
                raise SettingsError(f"{name} is a 400; it cannot go with http_error={self.http_error}")
            object.__setattr__(self, "http_error", 400)
        for name in ("primary_503_first", "spare_prompt_tokens"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise SettingsError(f"{name} must be >= 0 or none, got {value}")
        if self.spare_model is not None and (not self.spare_model.strip() or any(c in self.spare_model for c in ";= ")):
            # It travels in the model name (`to_model_name`), whose items are `;`-separated `key=value`.
            raise SettingsError(f"spare_model must be a non-empty name without ';', '=' or spaces, got {self.spare_model!r}")
        if self.model is not None and not self.model.strip():
            raise SettingsError("model must be a non-empty name or none")
        # Normalise types: `prefill_delay=30` and `30.0` are equal but would be echoed (and so
        # framed) differently, and equal settings must give equal bytes.
        for name in ("prefill_delay", "token_delay"):
            object.__setattr__(self, name, float(getattr(self, name)))
        for name in (
            "include_usage",
            "connection_close",
            "done",
            "null_reason",
            "bare_error",
            "close_after_reasoning",
            "hide_limit",
            "responses_indexes",
            "http_500_once",
            "reset_before_head",
            "no_response",
            "malformed_chunk",
            "http_400_context_length",
            "primary_429_persistent",
            "primary_503_persistent",
            "http_400_content_policy",
            "reject_prefill",
            "http_400_prefill",
        ):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, bool(getattr(self, name)))
        # Coerce plain strings (e.g. from dataclasses.replace(framing="close")) to the enums.
        object.__setattr__(self, "framing", _enum_value(Framing, "framing", self.framing))
        object.__setattr__(self, "finish", _enum_value(Finish, "finish", self.finish))

    # -- resolution ---------------------------------------------------------------------------

    def for_request(self, body: Mapping[str, Any], dialect: Dialect = Dialect.CHAT) -> WorkerSettings:
        """Fill the "as the request asks" fields from a request body in `dialect`.

        Fields already set win over the request. Returns fully resolved settings: `n`,
        `include_usage` and `model` are never `None` afterwards (`max_tokens` stays `None` when
        neither side limits). A request that declares `tools` and forces a call gets one tool call
        when `tool_calls` is 0. What each dialect's body says is in `REQUEST_READINGS`: Chat
        `max_completion_tokens`/`max_tokens`, `n`, `tool_choice: "required"` or a function; Messages
        `max_tokens`, `tool_choice` `{"type": "any"}` or `{"type": "tool", ...}`; Responses
        `max_output_tokens`, `tool_choice: "required"` or a function. Messages and Responses have
        no `n`: it resolves to 1 whatever the settings say (the worker answers with choice 0).
        """
        reading = REQUEST_READINGS[dialect]
        if dialect is Dialect.GEMINI:
            self.check_gemini()
        stream_options = body.get("stream_options") or {}
        requested_max = reading.requested_max(body)
        model = body.get("model")
        if reading.has_choices:
            n = self.n if self.n is not None else _int_or(body.get("n"), 1)
        else:
            n = 1
        # `reject_prefill`: a request that asks to continue the assistant's partial answer.
        prefill = self.reject_prefill and reading.ends_with_assistant(body)
        return dataclasses.replace(
            self,
            http_400_prefill=self.http_400_prefill or prefill,
            http_error=400 if prefill else self.http_error,
            # A real server that is told it must call a tool does (`tool_choice: "required"`, or a
            # named function): one call, unless the settings ask for more.
            tool_calls=self.tool_calls if self.tool_calls or not reading.forces_tool_call(body) else 1,
            n=n,
            max_tokens=self.max_tokens if self.max_tokens is not None else _int_or(requested_max, None),
            include_usage=(
                self.include_usage
                if self.include_usage is not None
                else bool(isinstance(stream_options, Mapping) and stream_options.get("include_usage"))
            ),
            model=self.model if self.model is not None else _model_or_default(model),
        )

    def check_gemini(self) -> None:
        """Refuse the knobs that have no meaning in Gemini, with one line saying why.

        Raises:
            SettingsError: `done=0` (a Gemini stream has no terminator to lose: its `finishReason`
                is its only end sign, so the defect is `finish=omitted`) or `responses_indexes=0`
                (OpenAI Responses' event numbers; Gemini's chunks have none).
        """
        if not self.done:
            raise SettingsError(
                "done=0 has no meaning in Gemini: its streams have no terminator (the finishReason is the only end sign); "
                "use finish=omitted"
            )
        if not self.responses_indexes:
            raise SettingsError("responses_indexes=0 has no meaning in Gemini: its chunks carry no sequence numbers or indexes")

    def after_first_attempt(self) -> WorkerSettings:
        """These settings for a later attempt of the same cell: the once-only conduct faults
        (`http_429_retry_after`, `http_500_once`, `reset_before_head`) cleared."""
        return dataclasses.replace(self, http_429_retry_after=None, http_500_once=False, reset_before_head=False)

    def for_attempt(self, earlier: int, *, spare: bool = False) -> WorkerSettings:
        """These settings for a cell's attempt at one worker after `earlier` attempts of the same
        cell there: the once-only faults cleared after the first (`after_first_attempt`), a
        flapping primary healthy from attempt `primary_503_first + 1` on, and at the spare
        (`spare`) the primary's faults cleared and its own model name and usage applied."""
        settings = self.after_first_attempt() if earlier else self
        if settings.primary_503_first is not None and earlier >= settings.primary_503_first:
            settings = dataclasses.replace(settings, primary_503_first=None)
        if spare:
            settings = dataclasses.replace(
                settings,
                primary_429_persistent=False,
                primary_503_persistent=False,
                primary_503_first=None,
                model=settings.spare_model if settings.spare_model is not None else settings.model,
                prompt_tokens=settings.spare_prompt_tokens
                if settings.spare_prompt_tokens is not None
                else settings.prompt_tokens,
            )
        return settings

    @property
    def primary_failure(self) -> int | None:
        """The status the primary answers this attempt with (`primary_429_persistent`: 429,
        `primary_503_persistent` or a flapping primary still failing: 503), None: no such fault."""
        if self.primary_429_persistent:
            return 429
        if self.primary_503_persistent or self.primary_503_first:
            return 503
        return None

    @property
    def answers_at_all(self) -> bool:
        """False when the server itself fails this attempt before any byte (`reset_before_head`,
        `no_response`): the plan's bytes are then never sent."""
        return not (self.reset_before_head or self.no_response)

    @property
    def choices(self) -> int:
        """Number of choices (`n`, 1 when unresolved)."""
        return self.n if self.n is not None else 1

    @property
    def model_name(self) -> str:
        """Model name echoed in chunks (`model`, the default name when unresolved)."""
        return self.model if self.model is not None else DEFAULT_MODEL_NAME

    # -- encoding -----------------------------------------------------------------------------

    def to_header(self) -> str:
        """Encode the knobs that differ from the defaults, e.g. `tokens=7; finish=omitted`.

        Empty string when every knob has its default. The `model` field is not encoded (it is
        the name a request's model resolves to, and may itself hold `;`):
        `parse_settings(s.to_header()) == dataclasses.replace(s, model=None)`.
        """
        return "; ".join(self._items())

    def to_model_name(self, name: str = DEFAULT_MODEL_NAME) -> str:
        """Encode as a model name, e.g. `finishline-worker;tokens=7;finish=omitted`.

        `parse_settings(s.to_model_name()) == dataclasses.replace(s, model=None)`.
        """
        if ";" in name or "=" in name:
            raise SettingsError(f"a model base name cannot contain ';' or '=', got {name!r}")
        return ";".join([name, *self._items()])

    def _items(self) -> list[str]:
        items = []
        for knob in dataclasses.fields(self):
            value = getattr(self, knob.name)
            if value == knob.default or knob.name == "model":
                continue
            items.append(f"{knob.name}={_format_value(value)}")
        return items


def parse_settings(text: str, *, base: WorkerSettings | None = None) -> WorkerSettings:
    """Decode `key=value` items separated by `;` (a header value or a model name) over `base`.

    Items without `=` (a model name's name part) and empty items are ignored. Keys are the
    `WorkerSettings` field names; `-` may stand for `_` (`error-after=3`).

    Raises:
        SettingsError: unknown key, or a value of the wrong type or range; the message names it.
    """
    base = base if base is not None else WorkerSettings()
    changes: dict[str, Any] = {}
    for item in text.split(";"):
        item = item.strip()
        if "=" not in item:
            continue
        key, _, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if key not in _FIELD_TYPES:
            known = ", ".join(_FIELD_TYPES)
            raise SettingsError(f"unknown worker setting {key!r}; known settings: {known}")
        changes[key] = _parse_value(key, raw.strip())
    return dataclasses.replace(base, **changes)


#: The knobs that are each a 400 with a body of its own (`labs.worker.answer.bad_request_object`).
_BAD_REQUEST_KNOBS = ("http_400_context_length", "http_400_content_policy", "http_400_prefill")


# -- value parsing ----------------------------------------------------------------------------

_FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(WorkerSettings)}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _enum_value(enum_type: type[enum.StrEnum], name: str, value: Any) -> Any:
    try:
        return enum_type(value)
    except ValueError:
        allowed = ", ".join(m.value for m in enum_type)
        raise SettingsError(f"{name} must be one of {allowed}; got {value!r}") from None


def _parse_value(key: str, raw: str) -> Any:
    kind = _FIELD_TYPES[key]
    optional = "None" in kind
    if optional and raw.lower() == "none":
        return None
    try:
        if kind.startswith("bool"):
            if raw.lower() in _TRUE:
                return True
            if raw.lower() in _FALSE:
                return False
            raise ValueError
        if kind.startswith("int"):
            return int(raw)
        if kind.startswith("float"):
            return float(raw)
    except ValueError:
        expected = kind.replace(" | None", " or none")
        raise SettingsError(f"worker setting {key} must be {expected}; got {raw!r}") from None
    return raw  # str and enums; enums are checked in __post_init__


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if value is None:
        return "none"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _int_or(value: Any, default: int | None) -> int | None:
    # A request's n/max_tokens are client input: ignore what is not a non-negative integer rather
    # than crash the worker (the lab tests clients, not the worker's validation).
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return default


def _model_or_default(model: Any) -> str:
    if isinstance(model, str) and model.strip():
        return model
    return DEFAULT_MODEL_NAME
