"""What one response said, read with finishline's repair core: the one definition of well-formed.

A stream is judged twice, by the same core the addon runs:

- `StreamRepair` is fed the body as it arrived and ended the way it ended (a clean end, or a
  transport failure). Its report is the verdict: `clean` means the stream ended as the spec says;
  `repaired` lists what the core would have had to fix (an empty reason, a missing finishing chunk,
  a missing `[DONE]`); `interrupted`, `upstream_error` say it did not finish at all.
- `EventFramer` frames the same bytes into events, which this module reads for what the grader
  asks beyond well-formedness: each choice's text, tool calls and finish reason, where the usage
  chunk and `[DONE]` sit, and whether anything came after an error event.

Pure: no sockets, no clock. The graders fetch the bytes; this reads them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from finishline import EventFramer, RepairPolicy, RequestFacts, StreamRepair, StreamReport, Verdict, repair_completion

__all__ = ["CLEAN_END", "ChoiceReading", "CompletionReading", "StreamReading", "read_completion", "read_stream"]

#: How a body ended, as the graders pass it: a clean end of the HTTP body.
CLEAN_END = "end"


@dataclass(slots=True, kw_only=True)
class ChoiceReading:
    """One choice as the stream (or the JSON completion) carried it."""

    index: int
    content: str = ""
    reasoning: str = ""
    #: Each tool call's name and arguments, by the call's `index`, in order of first appearance.
    tool_calls: list[dict[str, str]] = field(default_factory=list)
    #: Every `finish_reason` value that was not null, in order (`""` included: the defect).
    reasons_seen: list[str] = field(default_factory=list)

    @property
    def finish_reason(self) -> str | None:
        """The last non-empty reason the choice got, or None."""
        real = [r for r in self.reasons_seen if r]
        return real[-1] if real else None


@dataclass(slots=True, kw_only=True)
class StreamReading:
    """A streamed response, read."""

    status: int
    content_type: str
    #: The core's report on the stream as it arrived (verdict, repairs, interruption).
    report: StreamReport
    choices: dict[int, ChoiceReading]
    #: Events with a data field, in order, as `(kind, parsed)`: kind is `chunk`, `usage`,
    #: `error`, `done` or `unreadable`.
    events: list[tuple[str, Any]]
    #: `end`, `transport error: ...`, or `timeout after N s` (the grader's words).
    ending: str
    body: bytes

    @property
    def done_positions(self) -> list[int]:
        return [i for i, (kind, _) in enumerate(self.events) if kind == "done"]

    @property
    def error_positions(self) -> list[int]:
        return [i for i, (kind, _) in enumerate(self.events) if kind == "error"]

    @property
    def usage_positions(self) -> list[int]:
        return [i for i, (kind, _) in enumerate(self.events) if kind == "usage"]

    def reason_positions(self) -> list[int]:
        """Positions of chunks that carry a non-empty finish_reason for some choice."""
        positions = []
        for i, (kind, value) in enumerate(self.events):
            if kind == "chunk" and any(isinstance(c, dict) and c.get("finish_reason") for c in value.get("choices") or ()):
                positions.append(i)
        return positions

    @property
    def last_event(self) -> str | None:
        return self.events[-1][0] if self.events else None

    def error_message(self) -> str | None:
        """The first error event's message (or its data), for evidence lines."""
        for kind, value in self.events:
            if kind == "error":
                error = value.get("error") if isinstance(value, dict) else value
                if isinstance(error, dict):
                    return str(error.get("message") or error.get("code") or error)
                return str(error)
        return None

    def summary(self) -> str:
        """The stream in a few words: events, how it ended, the core's verdict and detail."""
        kinds = [kind for kind, _ in self.events]
        return f"{len(kinds)} events, last {self.last_event or 'none'}, {self.ending}; the core says {self.report.detail}"


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionReading:
    """A non-streamed response (`chat.completion` JSON), read."""

    status: int
    #: The parsed body, or None when it is not JSON.
    body: Any
    choices: dict[int, ChoiceReading]
    #: The core's rule 9 verdict: `clean`, or `repaired` with what it had to fill in.
    verdict: Verdict
    detail: str

    @property
    def error(self) -> Any:
        return self.body.get("error") if isinstance(self.body, dict) else None


def read_stream(
    body: bytes, *, status: int = 200, content_type: str = "text/event-stream", ending: str = CLEAN_END,
    request: dict[str, Any] | None = None,
) -> StreamReading:
    """Read a streamed body. `ending` is `end` for a clean end of the HTTP body, anything else (the
    transport's words) for a failure, which the core books as a cut unless the stream had finished."""
    repair = StreamRepair(request=_facts(request), policy=RepairPolicy())
    repair.receive_data(body)
    if ending == CLEAN_END:
        repair.receive_end()
    else:
        repair.receive_failure(ending.removeprefix("transport error: "))  # the core says "transport error: " itself
    framer = EventFramer()
    framed = framer.receive_data(body)
    leftover = framer.receive_end()
    if leftover is not None and leftover.data is not None:
        framed.append(leftover)  # a last event without its blank line still said something
    choices: dict[int, ChoiceReading] = {}
    events: list[tuple[str, Any]] = []
    for event in framed:
        if event.data is None and event.event_type != b"error":
            continue
        data = event.data or b""
        if data.strip() == b"[DONE]":
            events.append(("done", None))
            continue
        try:
            value = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            events.append(("error" if event.event_type == b"error" else "unreadable", data.decode("utf-8", "replace")))
            continue
        if event.event_type == b"error" or (isinstance(value, dict) and value.get("error") is not None):
            events.append(("error", value))
            continue
        if not isinstance(value, dict) or not isinstance(value.get("choices"), list):
            events.append(("unreadable", value))
            continue
        if not value["choices"] and isinstance(value.get("usage"), dict):
            events.append(("usage", value))
            continue
        events.append(("chunk", value))
        for choice in value["choices"]:
            if isinstance(choice, dict):
                _add_delta(choices, choice)
    return StreamReading(
        status=status, content_type=content_type, report=repair.report, choices=choices, events=events,
        ending=ending, body=body,
    )


def read_completion(body: bytes, *, status: int = 200, request: dict[str, Any] | None = None) -> CompletionReading:
    """Read a non-streamed body: its choices, and the core's rule 9 verdict on its reasons."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        value = None
    choices: dict[int, ChoiceReading] = {}
    if isinstance(value, dict) and isinstance(value.get("choices"), list):
        for position, choice in enumerate(value["choices"]):
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", position)
            reading = choices.setdefault(index, ChoiceReading(index=index))
            message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
            reading.content = message.get("content") or ""
            reading.reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
            for call in message.get("tool_calls") or ():
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    reading.tool_calls.append({"name": function.get("name") or "", "arguments": function.get("arguments") or ""})
            if choice.get("finish_reason") is not None:
                reading.reasons_seen.append(choice["finish_reason"])
    repaired = repair_completion(body, _facts(request))
    return CompletionReading(
        status=status, body=value, choices=choices, verdict=repaired.verdict, detail=repaired.detail
    )


def _facts(request: dict[str, Any] | None) -> RequestFacts:
    return RequestFacts.from_body(json.dumps(request).encode()) if request is not None else RequestFacts()


def _add_delta(choices: dict[int, ChoiceReading], choice: dict[str, Any]) -> None:
    index = choice.get("index", 0)
    if not isinstance(index, int):
        return
    reading = choices.setdefault(index, ChoiceReading(index=index))
    delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
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
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        if function.get("name"):
            reading.tool_calls[position]["name"] = function["name"]
        if isinstance(function.get("arguments"), str):
            reading.tool_calls[position]["arguments"] += function["arguments"]
    reason = choice.get("finish_reason")
    if reason is not None:
        reading.reasons_seen.append(reason)
