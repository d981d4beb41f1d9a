"""What one response said, read with finishline's repair core: the one definition of well-formed.

A stream is judged twice, by the same core the addon runs:

- `StreamRepair` is fed the body as it arrived and ended the way it ended (a clean end, or a
  transport failure). Its report is the verdict: `clean` means the stream ended as the spec says;
  `repaired` lists what the core would have had to fix (an empty reason, a missing finishing chunk,
  a missing `[DONE]`); `interrupted`, `upstream_error` say it did not finish at all.
- `EventFramer` frames the same bytes into events, which this module reads for what the grader
  asks beyond well-formedness: each choice's text, tool calls and finish reason, where the usage
  chunk and `[DONE]` sit, and whether anything came after an error event.

What an event is, which event is an error event and which is `[DONE]` is the core's decision, not
this module's: each framed event is shown to a fresh `StreamRepair` on its own (`_kind_by_the_core`),
so a data-less `event: error` block is no event here either (rule C5 as the core reads it), and
`[DONE]` is what the core stops at.

The same holds in every dialect (`dialect=`): Messages and Responses streams are judged by the core
speaking that dialect, and their data events are read by `labs.grade.dialect_reading` into choice 0
(neither has choices). There `done` is the dialect's terminator as the core stops at it:
`message_stop`, or a Responses terminal event (`response.completed`, `response.incomplete`).
Gemini has no terminator (a stream ends with its body; only a `finishReason` says it ended well):
its chunks are all data events, its error chunks (`{"error": ...}`, rule G4) error events, and its
JSON-array form (no `alt=sse`) is framed by the core's `GeminiFramer`, element by element, the
closing `]` no event. A whole Gemini body is judged by rule G6 (`repair_gemini_body`).

A body that came compressed (the graders ask for `accept-encoding: identity`, as finish_fix does) is
not read at all: its bytes are not events, and `StreamReading.compressed` says so for the evidence.

Pure: no sockets, no clock. The graders fetch the bytes; this reads them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from finishline import (
    ArrayPiece,
    Dialect,
    Event,
    EventFramer,
    GeminiFramer,
    InjectionKind,
    RepairPolicy,
    RequestFacts,
    StreamRepair,
    StreamReport,
    Verdict,
    repair_completion,
    repair_gemini_body,
)
from labs.grade.choice_reading import ChoiceReading
from labs.grade.dialect_reading import DIALECT_READINGS, event_type

__all__ = [
    "CLEAN_END",
    "TIMEOUT",
    "TRANSPORT_ERROR",
    "ChoiceReading",
    "CompletionReading",
    "StreamReading",
    "read_completion",
    "read_stream",
]

#: How a body ended, as the graders pass it: a clean end of the HTTP body.
CLEAN_END = "end"
#: The start of the ending for a transport failure: `transport error: <the transport's words>`.
TRANSPORT_ERROR = "transport error: "
#: The start of the ending for a body that did not end in time: `timeout: no end within 10 s`,
#: `timeout: no byte for 60 s` (the grader's words, `labs.grade.fetch`).
TIMEOUT = "timeout: "

#: The event kinds of `StreamReading.events`: Chat's chunks and usage chunks; a Messages or
#: Responses data event (`event`); and in every dialect error events, the terminator, unreadable data.
_CHUNK, _USAGE, _EVENT, _ERROR, _DONE, _UNREADABLE = "chunk", "usage", "event", "error", "done", "unreadable"
#: Terminators the core appends of its own when only they were missing (Chat rule C4, Messages M3).
_APPENDED_TERMINATORS = frozenset({InjectionKind.DONE, InjectionKind.MESSAGE_STOP})


@dataclass(slots=True, kw_only=True)
class StreamReading:
    """A streamed response, read."""

    status: int
    content_type: str
    #: The core's report on the stream as it arrived (verdict, repairs, interruption).
    report: StreamReport
    choices: dict[int, ChoiceReading]
    #: The events as the core counts them, in order, as `(kind, parsed)`: kind is `chunk`,
    #: `usage` (Chat), `event` (Messages, Responses), `error`, `done` or `unreadable`. A Chat `done`
    #: is `[DONE]` (parsed None); a Messages or Responses one is the parsed terminal event.
    events: list[tuple[str, Any]]
    #: `end` (CLEAN_END), `transport error: ...` (TRANSPORT_ERROR) or `timeout: ...` (TIMEOUT).
    ending: str
    body: bytes
    #: The response's `content-encoding` ("" for none).
    content_encoding: str = ""
    dialect: Dialect = Dialect.CHAT
    #: What happened to a first attempt the grader sent again (`labs.grade.fetch`: a kept-alive
    #: connection the target closed before any byte of this response), or None: a note, never a fault.
    retry_note: str | None = None

    def status_words(self) -> str:
        """`HTTP 200`, or, when no response head came, what happened instead, in words."""
        return f"HTTP {self.status}" if self.status else self.ending.removeprefix(TRANSPORT_ERROR)

    @property
    def compressed(self) -> str | None:
        """The content coding the body came in, when it is not the identity (then it was not read)."""
        encoding = self.content_encoding.strip().lower()
        return encoding if encoding not in ("", "identity") else None

    @property
    def timed_out(self) -> bool:
        return self.ending.startswith(TIMEOUT)

    def compression_note(self) -> str | None:
        """The evidence for a body that could not be read because it came compressed, or None."""
        if self.compressed is None:
            return None
        return f"the body came {self.compressed}-compressed although the grader asked for accept-encoding: identity, so its events were not read"

    @property
    def done_positions(self) -> list[int]:
        return [i for i, (kind, _) in enumerate(self.events) if kind == _DONE]

    @property
    def error_positions(self) -> list[int]:
        return [i for i, (kind, _) in enumerate(self.events) if kind == _ERROR]

    def data_events(self) -> list[Any]:
        """The parsed data of each Messages, Responses or Gemini data event, in order (not the
        error events, the terminator or unreadable data)."""
        return [value for kind, value in self.events if kind == _EVENT]

    @property
    def unreadable_positions(self) -> list[int]:
        """Positions of events whose data is not JSON, or not what the dialect's events are."""
        return [i for i, (kind, _) in enumerate(self.events) if kind == _UNREADABLE]

    @property
    def usage_positions(self) -> list[int]:
        return [i for i, (kind, _) in enumerate(self.events) if kind == _USAGE]

    def reason_positions(self) -> list[int]:
        """Positions of chunks that carry a non-empty finish_reason for some choice."""
        positions = []
        for i, (kind, value) in enumerate(self.events):
            if kind == _CHUNK and any(isinstance(c, dict) and c.get("finish_reason") for c in value.get("choices") or ()):
                positions.append(i)
        return positions

    @property
    def last_event(self) -> str | None:
        """The last event's kind (Chat), or its type (Messages, Responses: `message_stop`, `error`)."""
        if not self.events:
            return None
        kind, value = self.events[-1]
        if self.dialect is Dialect.CHAT:
            return kind
        return event_type(value) or ("data: [DONE]" if value == "[DONE]" else kind)

    def types(self) -> list[str | None]:
        """Each event's type (the data's `type`; None for Chat chunks and unreadable data)."""
        return [event_type(value) for _, value in self.events]

    @property
    def terminal_type(self) -> str | None:
        """The type of the first terminator the stream sent (`message_stop`, `response.completed`,
        `response.incomplete`), or None."""
        done = self.done_positions
        return event_type(self.events[done[0]][1]) if done else None

    def error_message(self) -> str | None:
        """The first error event's message (or its data), for evidence lines."""
        for kind, value in self.events:
            if kind == _ERROR:
                error = value.get("error") if isinstance(value, dict) else value
                if isinstance(error, dict):
                    return str(error.get("message") or error.get("code") or error)
                return str(error)
        return None

    def summary(self) -> str:
        """The stream in a few words: events, how it ended, the core's verdict and detail."""
        kinds = [kind for kind, _ in self.events]
        retried = f"; {self.retry_note}" if self.retry_note else ""
        if self.compressed is not None:
            return f"{self.compression_note()}; {self.ending}{retried}"
        return (
            f"{len(kinds)} events, last {self.last_event or 'none'}, {self.ending}; the core says {self.report.detail}{retried}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionReading:
    """A non-streamed response (`chat.completion` JSON), read."""

    status: int
    #: The parsed body, or None when it is not JSON.
    body: Any
    choices: dict[int, ChoiceReading]
    #: The core's rule C9 verdict: `clean`, or `repaired` with what it had to fill in.
    verdict: Verdict
    detail: str
    #: What happened instead of a response head (status 0), in words (`labs.grade.fetch`), or None.
    failure: str | None = None
    #: As `StreamReading.retry_note`.
    retry_note: str | None = None

    @property
    def error(self) -> Any:
        return self.body.get("error") if isinstance(self.body, dict) else None

    def status_words(self) -> str:
        """`HTTP 200`, or, when no response head came, what happened instead, in words."""
        return f"HTTP {self.status}" if self.failure is None else self.failure

    def summary(self) -> str:
        """The answer in a few words: its status (or what happened instead) and the core's detail."""
        retried = f"; {self.retry_note}" if self.retry_note else ""
        return f"{self.status_words()}; the core says {self.detail}{retried}"


def read_stream(
    body: bytes,
    *,
    status: int = 200,
    content_type: str = "text/event-stream",
    ending: str = CLEAN_END,
    request: dict[str, Any] | None = None,
    content_encoding: str = "",
    dialect: Dialect = Dialect.CHAT,
    retry_note: str | None = None,
) -> StreamReading:
    """Read a streamed body. `ending` is `end` for a clean end of the HTTP body, anything else (the
    transport's words) for a failure, which the core books as a cut unless the stream had finished.
    A compressed body (`content_encoding`) is not read: the core books it `skipped`, no events.
    `dialect` is the API the stream speaks; the core judges it in that dialect. `retry_note` says
    what happened to a first attempt the fetcher sent again."""
    facts = _facts(request)
    repair = StreamRepair(request=facts, policy=RepairPolicy(), content_encoding=content_encoding, dialect=dialect)
    repair.receive_data(body)
    if ending == CLEAN_END:
        repair.receive_end()
    else:
        repair.receive_failure(ending.removeprefix(TRANSPORT_ERROR))  # the core says "transport error: " itself
    choices: dict[int, ChoiceReading] = {}
    events: list[tuple[str, Any]] = []
    if not repair.repairing:
        framed: list[Event] = []  # compressed: the bytes are not events
    else:
        framer = GeminiFramer() if dialect is Dialect.GEMINI else EventFramer()
        framed = framer.receive_data(body)
        leftover = framer.receive_end()
        if leftover is not None:
            framed.append(leftover)  # the core decides whether a last event without its blank line counts
    for position, event in enumerate(framed):
        if isinstance(event, ArrayPiece) and event.closes:
            continue  # a JSON array's `]`: the end of the body's form, no event
        kind = _kind_by_the_core(event, first=position == 0, dialect=dialect)
        if kind is None:
            continue
        if kind == _DONE and dialect is Dialect.CHAT:
            events.append((_DONE, None))
            continue
        data = event.data or b""
        try:
            value = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            events.append((_ERROR if kind == _ERROR else _UNREADABLE, data.decode("utf-8", "replace")))
            continue
        if kind in (_ERROR, _DONE):
            events.append((kind, value))
            if kind == _DONE and isinstance(value, dict):
                DIALECT_READINGS[dialect].absorb_event(choices.setdefault(0, ChoiceReading(index=0)), value)
        elif dialect is not Dialect.CHAT:
            if isinstance(value, dict):
                events.append((_EVENT, value))
                DIALECT_READINGS[dialect].absorb_event(choices.setdefault(0, ChoiceReading(index=0)), value)
            else:
                events.append((_UNREADABLE, value))
        elif not isinstance(value, dict) or not isinstance(value.get("choices"), list):
            events.append((_UNREADABLE, value))
        elif not value["choices"] and isinstance(value.get("usage"), dict):
            events.append((_USAGE, value))
        else:
            events.append((_CHUNK, value))
            for choice in value["choices"]:
                if isinstance(choice, dict):
                    _add_delta(choices, choice)
    return StreamReading(
        status=status,
        content_type=content_type,
        report=repair.report,
        choices=choices,
        events=events,
        ending=ending,
        body=body,
        content_encoding=content_encoding,
        dialect=dialect,
        retry_note=retry_note,
    )


def _kind_by_the_core(event: Event, *, first: bool, dialect: Dialect = Dialect.CHAT) -> str | None:
    """What finishline's core makes of one event: None when it is no event at all, else `error`,
    `done` or `data`.

    The core is the only place that decides this (`StreamRepair._on_event`), so the event is shown
    to a fresh `StreamRepair` alone, then the end of the stream, and its report read back:

    - no event counted: no data field (a comment, a keep-alive, a data-less `event: error` block,
      which no client dispatches), or a last event without its blank line that the core drops;
    - verdict `upstream_error`: an error event (rule C5; M5; R4, a bare `{"error":...}` frame too,
      which in Messages is no error: the Anthropic SDKs skip it);
    - neither a cut nor a terminator the core appended of its own at that end: the terminator
      (`[DONE]`, `message_stop`, a Responses terminal event), the only event after which a stream of
      one event ends as the dialect says a stream ends (the core may add a finish before
      `message_stop`, never the terminator itself);
    - anything else is data (a chunk, a usage chunk, a Messages or Responses event, something
      unreadable).

    An event after the first gets a blank line in front, a data-less event the core ignores, so that
    the probe, like the stream, is past its start (a byte order mark counts only there). An element
    of Gemini's JSON-array form is shown as an array of that one element. Gemini has no terminator:
    a chunk that finishes the stream is data like the others (its `finishReason` is read).
    """
    probe = StreamRepair(dialect=dialect)
    if isinstance(event, ArrayPiece):
        probe.receive_data(b"[" + (event.data or b"") + b"]")
    else:
        probe.receive_data(event.raw if first else b"\n" + event.raw)
    probe.receive_end()
    report = probe.report
    if report.events == 0:
        return None
    if report.verdict is Verdict.UPSTREAM_ERROR:
        return _ERROR
    if dialect is Dialect.GEMINI:
        return "data"
    appended = any(injected["kind"] in _APPENDED_TERMINATORS for injected in report.injected)
    if report.interruption is None and not appended and report.verdict in (Verdict.CLEAN, Verdict.REPAIRED):
        return _DONE
    return "data"


def read_completion(
    body: bytes,
    *,
    status: int = 200,
    request: dict[str, Any] | None = None,
    dialect: Dialect = Dialect.CHAT,
    failure: str | None = None,
    retry_note: str | None = None,
) -> CompletionReading:
    """Read a non-streamed body: its choices, and the core's verdict on its reasons (rule C9 for a
    chat completion, M7 for a Messages `message`, and the limit rules C11, M8 and R6 when the request
    set a limit). A Messages or Responses answer is choice 0; an error body has no choice. `failure`
    is what happened instead of a response (then `status` is 0 and `body` empty), in words;
    `retry_note` what happened to a first attempt the fetcher sent again."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        value = None
    choices: dict[int, ChoiceReading] = {}
    if dialect is Dialect.GEMINI:
        return _read_gemini_body(body, value, status=status, request=request, failure=failure, retry_note=retry_note)
    if dialect is not Dialect.CHAT:
        choice = ChoiceReading(index=0)
        if DIALECT_READINGS[dialect].read_body(value, choice):
            choices[0] = choice
    elif isinstance(value, dict) and isinstance(value.get("choices"), list):
        for position, choice in enumerate(value["choices"]):
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", position)
            reading = choices.setdefault(index, ChoiceReading(index=index))
            message = choice.get("message")
            if not isinstance(message, dict):
                message = {}
            reading.content = message.get("content") or ""
            reading.reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
            for call in message.get("tool_calls") or ():
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    reading.tool_calls.append({"name": function.get("name") or "", "arguments": function.get("arguments") or ""})
            if choice.get("finish_reason") is not None:
                reading.reasons_seen.append(choice["finish_reason"])
    repaired = repair_completion(body, _facts(request), dialect=dialect)
    return CompletionReading(
        status=status,
        body=value,
        choices=choices,
        verdict=repaired.verdict,
        detail=repaired.detail,
        failure=failure,
        retry_note=retry_note,
    )


def _read_gemini_body(
    body: bytes, value: Any, *, status: int, request: dict[str, Any] | None, failure: str | None, retry_note: str | None
) -> CompletionReading:
    """A whole `:generateContent` body: its first candidate, and rule G6's verdict (a body that is
    JSON passes as it is, `clean`, whatever its reasons; a cut one is `interrupted`): whether each
    candidate has its `finishReason` is for the checks to read."""
    choices: dict[int, ChoiceReading] = {}
    choice = ChoiceReading(index=0)
    if DIALECT_READINGS[Dialect.GEMINI].read_body(value, choice):
        choices[0] = choice
    judged = repair_gemini_body(body, status=status, limit_reasons=False, max_tokens=_facts(request).max_tokens)
    return CompletionReading(
        status=status,
        body=value,
        choices=choices,
        verdict=judged.verdict,
        detail=judged.detail,
        failure=failure,
        retry_note=retry_note,
    )


def _facts(request: dict[str, Any] | None) -> RequestFacts:
    return RequestFacts.from_body(json.dumps(request).encode()) if request is not None else RequestFacts()


def _add_delta(choices: dict[int, ChoiceReading], choice: dict[str, Any]) -> None:
    index = choice.get("index", 0)
    if not isinstance(index, int):
        return
    reading = choices.setdefault(index, ChoiceReading(index=index))
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        delta = {}
    if isinstance(delta.get("content"), str):
        reading.content += delta["content"]
    for key in ("reasoning_content", "reasoning"):
        if isinstance(delta.get(key), str):
            reading.reasoning += delta[key]
    for call in delta.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        position = call.get("index", 0)
        if not isinstance(position, int) or isinstance(position, bool) or not 0 <= position < 128:
            continue  # not a tool-call index a client would accept; the core judges the rest
        while len(reading.tool_calls) <= position:
            reading.tool_calls.append({"name": "", "arguments": ""})
        function = call.get("function")
        if not isinstance(function, dict):
            function = {}
        if function.get("name"):
            reading.tool_calls[position]["name"] = function["name"]
        if isinstance(function.get("arguments"), str):
            reading.tool_calls[position]["arguments"] += function["arguments"]
    reason = choice.get("finish_reason")
    if reason is not None:
        reading.reasons_seen.append(reason)
