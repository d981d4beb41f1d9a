"""The exact bytes of a worker response, as a pure function of resolved settings.

The server writes `ResponsePlan.head`, then each `ResponsePlan.segments[i].framed` (sleeping where
the settings say), then `ResponsePlan.end`. Because the server sends nothing else, the lab can know
in advance where in the byte stream the n-th token event ends: `ResponsePlan.offset_after_tokens(n)`
is the count a `limit_data` toxic needs to deliver exactly n token events, and `head_length` the count
that delivers only the head (a cut during prefill).

Chat event order (OpenAI's, see openai-python `_streaming.py` for the reader side): one role chunk
per choice; token events, step by step across choices; one finish chunk per choice (`finish=sent`,
or `null_reason` with a null reason); a usage-only chunk (`include_usage`); `data: [DONE]` (`done`). An error event after N
token events replaces everything after it except `[DONE]`; `close_after_reasoning` ends the stream
after the last reasoning token event, with nothing after it.

Messages, Responses and Gemini (`dialect=`): the frames of `labs.worker.messages_events` /
`labs.worker.responses_events` / `labs.worker.gemini_events`, chosen by `labs.worker.dialect_wire`,
framed here the same way; Gemini's JSON-array stream form (`json_array=`, a request without
`alt=sse`) is its chunks as array elements, the closing `]` its `done`.
Their segment kinds are Chat's words, so `offset_after_tokens(n)` cuts after n token events in every
dialect: `role` for what opens the message, a block or an item (everything before the first token
is `role`), `token`, `finish` for what closes a block or item or carries the reason, `error`, and
`done` for the terminator (`message_stop`; the terminal event; `[DONE]`).
"""

from __future__ import annotations

import dataclasses
import http
from dataclasses import dataclass
from typing import Any

from finishline import Dialect
from labs.worker.answer import (
    TOOL_NAME,
    ExpectedAnswer,
    Piece,
    bad_request_body,
    expected_answer,
    interleaved_pieces,
    sent_reason,
)
from labs.worker.dialect_wire import DIALECT_WIRES, single_choice
from labs.worker.frames import DONE_MARKER, compact_json, sse_frame
from labs.worker.gemini_events import MALFORMED_ELEMENT, SSE_LINE_ENDING
from labs.worker.settings import SETTINGS_HEADER, Finish, Framing, WorkerSettings

__all__ = [
    "CHUNK_ID",
    "CREATED",
    "MALFORMED_DATA",
    "MALFORMED_EVENTS",
    "malformed_event",
    "ResponsePlan",
    "Segment",
    "completion_plan",
    "error_plan",
    "json_plan",
    "response_plan",
    "stream_plan",
]

#: Every response has the same id and creation time: same request, same bytes.
CHUNK_ID = "chatcmpl-finishline"
CREATED = 1764000000


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """One SSE event as sent: `kind` is role, token, finish, usage, error or done (`body` for a
    non-streaming body). See the module docstring for what each kind covers per dialect."""

    kind: str
    #: Chat: the choice index for role, token and finish events, None otherwise. Messages and
    #: Responses: 0 for token events, None otherwise.
    choice: int | None
    #: The SSE event itself: `data: ...\\n\\n`.
    event: bytes
    #: The event with its body framing (a chunk header and CRLF for chunked framing).
    framed: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponsePlan:
    """Everything the worker sends for one request, in order."""

    head: bytes
    segments: tuple[Segment, ...]
    #: Bytes after the last segment (the chunked terminator `0\\r\\n\\r\\n`, else empty).
    end: bytes
    #: Whether the worker closes the connection after `end` (close framing or `Connection: close`).
    closes: bool
    answer: ExpectedAnswer

    @property
    def head_length(self) -> int:
        """Bytes in the status line and headers, blank line included."""
        return len(self.head)

    @property
    def framed_lengths(self) -> tuple[int, ...]:
        """Wire length of each segment, in order."""
        return tuple(len(s.framed) for s in self.segments)

    @property
    def token_events(self) -> int:
        return sum(1 for s in self.segments if s.kind == "token")

    def offset_after_tokens(self, n: int) -> int:
        """Bytes from the start of the response to the end of the n-th token event.

        For n = 0: the head and the role chunks (everything sent before the first token).
        The events that follow token n (the next token, a finish chunk, ...) start right after.

        Raises:
            ValueError: n is negative or larger than the stream's token events.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        offset, seen = len(self.head), 0
        for segment in self.segments:
            if segment.kind == "token":
                if seen == n:
                    return offset
                seen += 1
            elif seen == n and segment.kind != "role":
                return offset
            offset += len(segment.framed)
        if seen == n:
            return offset
        raise ValueError(f"the stream has {seen} token events, cannot cut after {n}")

    def to_bytes(self) -> bytes:
        """The whole response as sent on a healthy connection."""
        return self.head + b"".join(s.framed for s in self.segments) + self.end


def response_plan(
    settings: WorkerSettings, *, stream: bool = True, dialect: Dialect = Dialect.CHAT, json_array: bool = False
) -> ResponsePlan:
    """The plan for resolved settings in `dialect`: an HTTP error, a stream, or a non-streaming body.

    Messages, Responses and Gemini answer with choice 0 only (`n` is taken as 1; `plan.answer` has
    one choice). `json_array`: a Gemini stream in its JSON-array form (a request without
    `alt=sse`), not SSE.
    """
    if dialect is not Dialect.CHAT:
        settings = single_choice(settings)
    # The once-only conduct faults come first: the server clears them for later attempts
    # (`WorkerSettings.after_first_attempt`), so a plan with them set is a first attempt's.
    if settings.http_429_retry_after is not None:
        return error_plan(settings, dialect=dialect, status=429, retry_after=settings.http_429_retry_after)
    if settings.http_500_once:
        return error_plan(settings, dialect=dialect, status=500)
    # The primary's failover faults (issue 28); the server clears them at the spare and once a
    # flapping primary has failed its share (`WorkerSettings.for_attempt`).
    if (status := settings.primary_failure) is not None:
        return error_plan(settings, dialect=dialect, status=status)
    if settings.http_error is not None:
        return error_plan(settings, dialect=dialect)
    if stream:
        return stream_plan(settings, dialect=dialect, json_array=json_array)
    return completion_plan(settings, dialect=dialect)


def stream_plan(settings: WorkerSettings, *, dialect: Dialect = Dialect.CHAT, json_array: bool = False) -> ResponsePlan:
    """The SSE response (`stream: true`) for resolved settings; `json_array`: Gemini's JSON-array
    stream form instead (`application/json`)."""
    wire = DIALECT_WIRES.get(dialect)
    content_type = "text/event-stream"
    if dialect is Dialect.CHAT:
        events = _chat_events(settings)
    elif json_array and wire is not None and wire.array_frames is not None:
        settings = single_choice(settings)
        # The malformed element goes where `_with_malformed_event` puts an SSE one: the index of
        # the frame it would precede, counted in the SSE form (the same chunks, one frame each).
        malformed_at = _malformed_index(wire.stream_frames(settings)) if settings.malformed_chunk else None
        events = [
            (frame.kind, 0 if frame.kind == "token" else None, frame.event) for frame in wire.array_frames(settings, malformed_at)
        ]
        content_type = "application/json"
    else:
        if json_array:
            raise ValueError(f"the JSON-array stream form is Gemini's, not {dialect.value}'s")
        settings = single_choice(settings)
        assert wire is not None
        events = [(frame.kind, 0 if frame.kind == "token" else None, frame.event) for frame in wire.stream_frames(settings)]
    if settings.malformed_chunk and content_type == "text/event-stream":
        events = _with_malformed_event(events, dialect)
    segments = tuple(
        Segment(kind=kind, choice=c, event=event, framed=_frame(settings.framing, event)) for kind, c, event in events
    )
    body_length = sum(len(s.framed) for s in segments)
    head = _head(settings, 200, content_type, body_length)
    return ResponsePlan(
        head=head,
        segments=segments,
        end=_end(settings.framing),
        closes=_closes(settings),
        answer=expected_answer(settings),
    )


#: `malformed_chunk`: per dialect, the `event:` line (a token event's name, so a reader that
#: dispatches on it reaches its JSON parser) and data that is not JSON: the dialect's own token event
#: cut in half, as a broken upstream or a proxy that split a line sends it (failoverbench S10).
MALFORMED_EVENTS: dict[Dialect, tuple[str | None, bytes]] = {
    Dialect.CHAT: (None, b'{"id":"chatcmpl-finishline","choices":[{"delta":{"content":'),
    Dialect.MESSAGES: ("content_block_delta", b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":'),
    Dialect.RESPONSES: (
        "response.output_text.delta",
        b'{"type":"response.output_text.delta","item_id":"msg_finishline","output_index":0,"content_index":0,"delta":',
    ),
    # Gemini has no event names: a bare `data:` frame with half a chunk (CRLF, as its frames end).
    Dialect.GEMINI: (None, MALFORMED_ELEMENT),
}
#: Chat's malformed data.
MALFORMED_DATA = MALFORMED_EVENTS[Dialect.CHAT][1]


def _malformed_index(events: list[Any]) -> int:
    """Where `malformed_chunk`'s event goes among `events` (tuples or `Frame`s, each with a `kind`):
    after half the token events (after the first when there is one token, before the end when there
    are none)."""
    kinds = [event[0] if isinstance(event, tuple) else event.kind for event in events]
    tokens = [i for i, kind in enumerate(kinds) if kind == "token"]
    return tokens[(len(tokens) - 1) // 2] + 1 if tokens else len(events) - 1 if events else 0


def _with_malformed_event(events: list[tuple[str, int | None, bytes]], dialect: Dialect) -> list[tuple[str, int | None, bytes]]:
    """`events` with one `malformed` event (`_malformed_index` says where)."""
    at = _malformed_index(events)
    line_ending = SSE_LINE_ENDING if dialect is Dialect.GEMINI else b"\n"
    return [*events[:at], ("malformed", None, malformed_event(dialect, line_ending)), *events[at:]]


def malformed_event(dialect: Dialect, line_ending: bytes = b"\n") -> bytes:
    """The one event `malformed_chunk` adds, framed in `dialect` (the tests build theirs with it)."""
    name, data = MALFORMED_EVENTS[dialect]
    return sse_frame(data, event=name, line_ending=line_ending)


def _chat_events(settings: WorkerSettings) -> list[tuple[str, int | None, bytes]]:
    answer = expected_answer(settings)
    events: list[tuple[str, int | None, bytes]] = []
    usage_null = {"usage": None} if settings.include_usage else {}

    def chunk(choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> bytes:
        body = {
            "id": CHUNK_ID,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": settings.model_name,
            "choices": choices,
            **(extra if extra is not None else usage_null),
        }
        return sse_frame(body)

    def choice(index: int, delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        if settings.finish is Finish.EMPTY:
            reason = ""  # the defect: "" on every chunk, and no final chunk
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}

    for c in range(settings.choices):
        events.append(("role", c, chunk([choice(c, {"role": "assistant", "content": ""})])))
    # The answer's token events: all of them, or those before an error event or a close.
    for c, piece in interleaved_pieces(settings)[: answer.token_events]:
        events.append(("token", c, chunk([choice(c, _delta(piece))])))
    cut_by_error = answer.error is not None
    if cut_by_error:
        events.append(("error", None, sse_frame({"error": answer.error})))
    elif settings.close_after_reasoning:
        return events  # Ollama's defect: a clean close right after the reasoning, nothing else
    else:
        if settings.null_reason:
            for ch in answer.choices:  # the final chunk, with a null reason
                events.append(
                    ("finish", ch.index, chunk([{"index": ch.index, "delta": {}, "logprobs": None, "finish_reason": None}]))
                )
        elif settings.finish is Finish.SENT:
            for ch in answer.choices:
                reason = sent_reason(ch.finish_reason, hide_limit=settings.hide_limit)
                events.append(("finish", ch.index, chunk([choice(ch.index, {}, reason)])))
        if settings.include_usage:
            events.append(("usage", None, chunk([], {"usage": _usage(settings, answer)})))
    if settings.done:
        events.append(("done", None, sse_frame(DONE_MARKER)))
    return events


def completion_plan(settings: WorkerSettings, *, dialect: Dialect = Dialect.CHAT) -> ResponsePlan:
    """The JSON response (`stream` false) for resolved settings: a `chat.completion`, a Messages
    `message` or a Responses `response` (`labs.worker.dialect_wire`).

    The same answer as the stream; `finish=omitted` (and `null_reason`) gives `"finish_reason": null`,
    `finish=empty` gives `""`. An `error_after` within the answer gives a 200 with a top-level
    `error` instead (some gateways do that), so the defect is visible without streaming too
    (Messages: Anthropic's error body; Responses: a `response` with status `failed`).

    It always closes the connection after it (`Connection: close`): a lab fault is a toxiproxy
    `limit_data` budget, counted per TCP connection and laid out for one streamed answer
    (faults/layout.py), and a whole answer is shorter than that budget. Kept alive in a router's
    pool, the connection would hand the next cell's stream a budget this answer had partly spent:
    in an `--all` run of smg+finish_fix, claude-code's non-streamed request left one behind and
    pi-coding-agent's retry got `message_start` and a ping, then silence, where the fault promised
    5 tokens (issue 25). The probes close for the same reason (`server._probe_answer`). A streamed
    answer keeps the connection: under a budget fault it never completes, and `Connection: close`
    on a stream is what makes undici 6.24 take a cut for a whole body (shared/notes/clients.md).
    """
    if dialect is not Dialect.CHAT:
        settings = single_choice(settings)
        body = _json(DIALECT_WIRES[dialect].body(settings))
        return _single_body_plan(settings, 200, body, expected_answer(settings), close=True)
    answer = expected_answer(settings)
    if answer.error is not None:
        body = _json({"error": answer.error})
    else:
        choices = []
        for ch in answer.choices:
            message: dict[str, Any] = {"role": "assistant", "content": ch.content}
            if ch.reasoning_content:
                message["reasoning_content"] = ch.reasoning_content
            if ch.tool_calls:
                message["tool_calls"] = [
                    {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
                    for t in ch.tool_calls
                ]
            sent = sent_reason(ch.finish_reason, hide_limit=settings.hide_limit)
            reason = {Finish.SENT: sent, Finish.OMITTED: None, Finish.EMPTY: ""}[settings.finish]
            if settings.null_reason:
                reason = None
            choices.append({"index": ch.index, "message": message, "logprobs": None, "finish_reason": reason})
        body = _json(
            {
                "id": CHUNK_ID,
                "object": "chat.completion",
                "created": CREATED,
                "model": settings.model_name,
                "choices": choices,
                "usage": _usage(settings, answer),
            }
        )
    return _single_body_plan(settings, 200, body, answer, close=True)


def error_plan(
    settings: WorkerSettings,
    *,
    dialect: Dialect = Dialect.CHAT,
    status: int | None = None,
    retry_after: int | None = None,
) -> ResponsePlan:
    """The HTTP error response: `status` (default `http_error`) and the dialect's JSON error body
    (OpenAI's `{"error": {...}}`; Messages: `{"type": "error", "error": {...}}`); with
    a 400 knob (`http_400_context_length`, `http_400_content_policy`, `http_400_prefill`) the body
    says why (`bad_request_body`). `retry_after` adds a `retry-after` header (seconds)."""
    status = status if status is not None else settings.http_error
    assert status is not None
    answer = expected_answer(dataclasses.replace(settings, http_error=status))
    if status == 400 and (special := bad_request_body(settings, dialect)) is not None:
        body = special
    elif dialect is Dialect.CHAT:
        body = {"error": answer.error}
    else:
        body = DIALECT_WIRES[dialect].error_body(status, settings.model_name)
    extra = (f"retry-after: {retry_after}",) if retry_after is not None else ()
    return _single_body_plan(settings, status, _json(body), answer, extra_headers=extra)


def json_plan(status: int, value: Any, *, connection_close: bool = False) -> ResponsePlan:
    """A JSON response with Content-Length framing (model list, 404, 400)."""
    settings = WorkerSettings(framing=Framing.CONTENT_LENGTH, connection_close=connection_close)
    answer = ExpectedAnswer(choices=(), error=None, token_events=0)
    return _single_body_plan(settings, status, _json(value), answer, echo_settings=False)


def _single_body_plan(
    settings: WorkerSettings,
    status: int,
    body: bytes,
    answer: ExpectedAnswer,
    *,
    echo_settings: bool = True,
    extra_headers: tuple[str, ...] = (),
    close: bool = False,
) -> ResponsePlan:
    """One JSON body; `close` sends `Connection: close` and ends the connection after it, whatever
    the settings say."""
    framed = _frame(settings.framing, body)
    segment = Segment(kind="body", choice=None, event=body, framed=framed)
    if close and not settings.connection_close:
        extra_headers = (*extra_headers, "connection: close")
    return ResponsePlan(
        head=_head(settings, status, "application/json", len(framed), echo_settings=echo_settings, extra_headers=extra_headers),
        segments=(segment,),
        end=_end(settings.framing),
        closes=close or _closes(settings),
        answer=answer,
    )


def _delta(piece: Piece) -> dict[str, Any]:
    if piece.kind == "reasoning":
        return {"reasoning_content": piece.text}
    if piece.kind == "content":
        return {"content": piece.text}
    if piece.kind == "tool_call":
        function = {"name": TOOL_NAME, "arguments": ""}
        call = {"index": piece.tool_index, "id": piece.text, "type": "function", "function": function}
        return {"tool_calls": [call]}
    return {"tool_calls": [{"index": piece.tool_index, "function": {"arguments": piece.text}}]}


def _usage(settings: WorkerSettings, answer: ExpectedAnswer) -> dict[str, int]:
    completion = sum(ch.completion_tokens for ch in answer.choices)
    return {
        "prompt_tokens": settings.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": settings.prompt_tokens + completion,
    }


def _json(value: Any) -> bytes:
    # Compact, like OpenAI's own chunks; key order is insertion order, so bytes are stable.
    return compact_json(value)


def _frame(framing: Framing, payload: bytes) -> bytes:
    if framing is Framing.CHUNKED:
        return b"%x\r\n%s\r\n" % (len(payload), payload)
    return payload


def _end(framing: Framing) -> bytes:
    return b"0\r\n\r\n" if framing is Framing.CHUNKED else b""


def _closes(settings: WorkerSettings) -> bool:
    return settings.framing is Framing.CLOSE or settings.connection_close


def _reason_phrase(status: int) -> str:
    # 529 is Anthropic's "overloaded", which http.HTTPStatus does not know.
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Overloaded" if status == 529 else "Error"


def _head(
    settings: WorkerSettings,
    status: int,
    content_type: str,
    body_length: int,
    *,
    echo_settings: bool = True,
    extra_headers: tuple[str, ...] = (),
) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {_reason_phrase(status)}",
        f"content-type: {content_type}",
        "cache-control: no-cache",
        *extra_headers,
    ]
    if echo_settings:
        # The effective knobs, so a capture (or mitmweb) shows which scenario produced it.
        lines.append(f"{SETTINGS_HEADER}: {settings.to_header() or 'defaults'}")
    if settings.framing is Framing.CHUNKED:
        lines.append("transfer-encoding: chunked")
    elif settings.framing is Framing.CONTENT_LENGTH:
        lines.append(f"content-length: {body_length}")
    if settings.connection_close:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
