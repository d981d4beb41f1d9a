"""What a server check is: the requests a suite sends, the readings of the answers, a check and a
suite, and why an answer cannot be judged. Every dialect's suite is made of these
(`server_checks`, `server_checks_messages`, `server_checks_responses`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from finishline import Dialect
from labs.grade.card import CheckResult, Finding, Mark
from labs.grade.reading import CompletionReading, StreamReading

__all__ = [
    "TOOL_CALL_TOKENS",
    "Problem",
    "Readings",
    "ServerCheck",
    "ServerRequest",
    "ServerSuite",
    "BodyMaker",
    "completion_problem_for",
    "request_body",
    "stream_problem_for",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerRequest:
    """One request the grader sends, streamed and not."""

    name: str
    #: In the evidence: what this request asks for.
    label: str
    fields: dict[str, Any]
    #: Only streamed (`stream_options` means nothing to a non-streamed request).
    stream_only: bool = False


#: The forced tool call's budget, in every dialect: room for a `get_weather` call (about 30 tokens
#: as Hermes-style `<tool_call>` JSON) and a few words before it, and a bound on what a model that
#: writes prose instead costs (without one, llama.cpp let SmolLM2 write until its context was full:
#: minutes on a CPU). A call that does not fit is `not tested`, never a fail (`tool_call_check`).
TOOL_CALL_TOKENS = 64


def request_body(request: ServerRequest, *, model: str, stream: bool) -> dict[str, Any]:
    """The JSON body for one request; temperature 0 so the streamed and the JSON answer can agree."""
    return {"model": model, **request.fields, "stream": stream, "temperature": 0}


#: `(request, model, stream)` -> the JSON body to send (`request_body` for the OpenAI-shaped APIs).
BodyMaker = Callable[..., dict[str, Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Readings:
    """Every answer, by request name, and what was asked (the requests' labels for the evidence)."""

    streams: dict[str, StreamReading]
    completions: dict[str, CompletionReading]
    requests: tuple[ServerRequest, ...]
    dialect: Dialect
    #: The answer to the suite's deliberately bad request (`ServerSuite.bad_request`), or None.
    bad_request: CompletionReading | None = None

    def label(self, name: str) -> str:
        """The evidence's words for request `name` (`a natural stop`, `max_tokens=5`)."""
        return next(r.label for r in self.requests if r.name == name)

    def retry_notes(self, *, streams: bool) -> list[str]:
        """The notes of the streamed (or the JSON) answers whose first attempt was sent again."""
        side, answers = ("stream", self.streams) if streams else ("JSON", self.completions)
        return [f"{side} {self.label(name)}: {reading.retry_note}" for name, reading in answers.items() if reading.retry_note]


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerCheck:
    rule: str
    check: str
    title: str
    judge: Callable[[Readings], Finding]
    #: It reads the streamed answers (every check but the JSON-only ones).
    reads_streams: bool = True
    #: Its evidence also notes every answer (streamed, or JSON for a JSON-only check) the grader had
    #: to ask again on a fresh connection (`labs.grade.fetch.open_response`): the dialect's
    #: no-error checks, whose subject is how the exchange went. A note, never a fail.
    notes_retries: bool = False

    def run(self, readings: Readings) -> CheckResult:
        unread = _unread_stream(readings) if self.reads_streams else None
        mark, evidence = unread or self.judge(readings)
        if self.notes_retries:
            evidence = "; ".join([evidence, *readings.retry_notes(streams=self.reads_streams)])
        return CheckResult(rule=self.rule, check=self.check, title=self.title, mark=mark, evidence=evidence)


def _unread_stream(readings: Readings) -> Finding | None:
    """`not tested` when a stream came compressed: its bytes are not SSE, and judging them as if
    they were would fail a server for the grader's own blindness."""
    for name, reading in readings.streams.items():
        if reading.compressed is not None:
            return Mark.NOT_TESTED, f"stream {readings.label(name)}: {reading.compression_note()}"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSuite:
    """One dialect's checks: where to ask, what, and how each answer is judged."""

    dialect: Dialect
    #: The path under the base URL the requests go to (`/chat/completions`, `/messages`, `/responses`);
    #: `{model}` in it is the model (Gemini names it in the path, `/models/{model}:generateContent`).
    path: str
    requests: tuple[ServerRequest, ...]
    checks: tuple[ServerCheck, ...]
    #: Chat checks that mean nothing in this dialect, and why: the card says so instead of a row.
    not_run: dict[str, str] = field(default_factory=dict)
    #: Headers every request carries (Anthropic's `anthropic-version`).
    headers: dict[str, str] = field(default_factory=dict)
    #: A header that carries `--api-key` besides the bearer token (Anthropic's `x-api-key`).
    api_key_header: str | None = None
    #: The path of the streamed requests, when it is not `path` (Gemini's
    #: `/models/{model}:streamGenerateContent?alt=sse`).
    stream_path: str | None = None
    #: How a request's JSON body is made (`request_body`; Gemini's names neither model nor stream).
    body: BodyMaker = request_body
    #: Bytes sent once, not streamed, to `path` as a request the server must refuse (Gemini's error
    #: shape is graded on its answer, `Readings.bad_request`), or None.
    bad_request: bytes | None = None

    def url(self, base_url: str, *, model: str, stream: bool) -> str:
        """Where a request for `model` goes, streamed or not (the model quoted for a path)."""
        path = (self.stream_path or self.path) if stream else self.path
        return base_url + path.replace("{model}", quote(model, safe=";=,"))


#: Why a stream (or a JSON answer) cannot be judged beyond its dialect's no-error check, or None:
#: `(readings, request name, reading)`.
Problem = Callable[[Readings, str, Any], str | None]


def stream_problem_for(no_error_check: str) -> Problem:
    """Why a stream cannot be judged beyond `no_error_check` (the dialect's), or None: an error
    status, an error event, a cut (the core's interruption)."""

    def problem(readings: Readings, name: str, reading: StreamReading) -> str | None:
        label = readings.label(name)
        if reading.status != 200:
            return f"stream {label}: {reading.status_words()}"
        if reading.error_positions:
            return f"stream {label} ended in an error event (see {no_error_check})"
        if reading.report.interruption is not None:
            return f"stream {label} was cut: {reading.report.interruption.how} (see {no_error_check})"
        return None

    return problem


def completion_problem_for(no_error_check: str, answer: str = "a completion") -> Problem:
    """Why a JSON answer cannot be judged beyond `no_error_check`, or None."""

    def problem(readings: Readings, name: str, reading: CompletionReading) -> str | None:
        if reading.failure is not None or reading.status != 200:
            return f"JSON {readings.label(name)}: {reading.status_words()}"
        if reading.error is not None or not reading.choices:
            return f"JSON {readings.label(name)} is an error, not {answer} (see {no_error_check})"
        return None

    return problem
