"""Anthropic Messages, OpenAI Responses and Google Gemini SSE bodies for the scripted upstream, and a
reader for them.

Built by the same event builders the worker uses (`labs.worker.messages_events`,
`labs.worker.responses_events`, `labs.worker.gemini_events`), so a test's stream and the worker's
have the same frames. Each function returns one `bytes` per SSE event (per array element for
Gemini's JSON-array form), in order; `b"".join(...)` is the body.

    messages_stream(["Hel", "lo"])                                 # well formed, stop_reason end_turn
    messages_stream(["Hel"], stop_reason=None)                     # M2: null stop_reason, message_stop
    messages_stream(["Hel"], message_stop=False)                   # M3: the terminator lost
    messages_stream(["Hel"], closed=False)                         # M4: a clean end mid block
    messages_stream(["Hel"], error=anthropic_error(529, "m"))      # M5: event: error, nothing after
    messages_stream([], tool_use=True, stop_reason="tool_use")     # a tool_use block
    responses_stream(["Hel", "lo"])                                # well formed, response.completed
    responses_stream(["Hel"], terminal=None)                       # R3: no terminal event
    responses_stream(["Hel"], error=error_object(500, "m"))        # R4: error, then response.failed
    responses_stream(["Hel"], error=..., bare_error=True)          # R4: vLLM's bare {"error":...}
    responses_stream([], reasoning=["Hm"], closed=False)           # Ollama: closes after reasoning
    gemini_stream(["Hel", "lo"])                                   # well formed: a last chunk with STOP
    gemini_stream(["Hel"], closed=False)                           # G2: no finishReason anywhere
    gemini_stream(["Hel"], array=True)                             # the JSON-array form

`token_texts_of(dialect, body)` reads back one text per token event (the worker's definition: text,
reasoning and tool-argument deltas, and the event that opens a tool call, whose text is its id).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from finishline import Dialect, EventFramer
from labs.worker.answer import TOOL_ARGUMENT_PIECES, TOOL_NAME, Piece, tool_call_id
from labs.worker.gemini_events import array_frames, gemini_chunks, sse_frames
from labs.worker.messages_events import message_frames
from labs.worker.responses_events import AS_TERMINAL, response_frames
from tests.feeding import complete_events
from tests.fixtures_lab import token_texts

__all__ = ["AS_TERMINAL", "gemini_stream", "messages_stream", "pieces", "responses_stream", "token_texts_of"]

#: The scripted upstream's model name (as in `tests.chat_streams`).
MODEL = "e2e-model"


def pieces(
    texts: Sequence[str],
    *,
    reasoning: Sequence[str] = (),
    tool_call: bool = False,
    tool_arguments: Sequence[str] = TOOL_ARGUMENT_PIECES,
) -> list[Piece]:
    """The answer as the builders take it: reasoning, then `texts`, then one tool call (id
    `call_0_0`, name `get_weather`) whose arguments arrive in `tool_arguments` pieces."""
    result = [Piece(kind="reasoning", text=t) for t in reasoning]
    result += [Piece(kind="content", text=t) for t in texts]
    if tool_call:
        result.append(Piece(kind="tool_call", text=tool_call_id(0, 0)))
        result += [Piece(kind="tool_arguments", text=t) for t in tool_arguments]
    return result


def messages_stream(
    texts: Sequence[str],
    *,
    stop_reason: str | None = "end_turn",
    message_delta: bool = True,
    message_stop: bool = True,
    thinking: Sequence[str] = (),
    tool_use: bool = False,
    tool_arguments: Sequence[str] = TOOL_ARGUMENT_PIECES,
    error: Mapping[str, Any] | None = None,
    bare_error: bool = False,
    closed: bool = True,
    ping: bool = True,
    output_tokens: int | None = None,
    model: str = MODEL,
    line_ending: bytes = b"\n",
) -> list[bytes]:
    """SSE events of one Anthropic Messages stream.

    Args:
        texts: the `text_delta`s of one text block (none: no text block).
        stop_reason: `message_delta.stop_reason`, sent as given (None and `""` too); pass
            `"tool_use"` with `tool_use`, `"max_tokens"` for a cut answer.
        message_delta, message_stop: False leaves that event out.
        thinking: `thinking_delta`s of a thinking block before the text (closed by a
            `signature_delta`).
        tool_use: a `tool_use` block after the text, its input in `tool_arguments` pieces.
        error: an Anthropic error object (`labs.worker.answer.anthropic_error(status, model)`):
            `event: error` right after the deltas, nothing after it; `bare_error` sends
            `data: {"error": ...}` without `event:` instead.
        closed: False ends right after the last delta (no block stop, no message_delta/stop).
        ping: one `ping` right after `message_start`.
        output_tokens: `message_delta.usage.output_tokens` (default: one per delta).
    """
    frames = message_frames(
        pieces(texts, reasoning=thinking, tool_call=tool_use, tool_arguments=tool_arguments),
        model=model,
        output_tokens=output_tokens,
        stop_reason=stop_reason,
        send_message_delta=message_delta,
        send_message_stop=message_stop,
        error_object=error,
        bare=bare_error,
        closed=closed,
        send_ping=ping,
        line_ending=line_ending,
    )
    return [frame.event for frame in frames]


def responses_stream(
    texts: Sequence[str],
    *,
    terminal: str | None = "response.completed",
    status: Any = AS_TERMINAL,
    reasoning: Sequence[str] = (),
    function_call: bool = False,
    tool_arguments: Sequence[str] = TOOL_ARGUMENT_PIECES,
    error: Mapping[str, Any] | None = None,
    failed: bool = True,
    bare_error: bool = False,
    closed: bool = True,
    done_marker: bool = False,
    max_output_tokens: int | None = None,
    model: str = MODEL,
    line_ending: bytes = b"\n",
) -> list[bytes]:
    """SSE events of one OpenAI Responses stream, `sequence_number` from 0.

    Args:
        texts: the `response.output_text.delta`s of one message item (none: no message item).
        terminal: `response.completed`, `response.incomplete` (reason `max_output_tokens`) or None.
        status: the terminal response's `status`; default the terminal's own (`completed`, ...).
        reasoning: `response.reasoning_summary_text.delta`s of a reasoning item before the message.
        function_call: a `function_call` item after the message (id `call_0_0`, `get_weather`).
        error: an OpenAI error object (`labs.worker.answer.error_object(status, model)`): `event:
            error` (nested shape) right after the deltas, then `response.failed` when `failed`;
            `bare_error` sends one `data: {"error": ...}` frame instead, nothing after it.
        closed: False ends right after the last delta (no `.done` events, no terminal).
        done_marker: end with `data: [DONE]` (what some gateways add).
    """
    frames = response_frames(
        pieces(texts, reasoning=reasoning, tool_call=function_call, tool_arguments=tool_arguments),
        model=model,
        terminal=terminal,
        status=status,
        error_object=error,
        send_failed=failed,
        bare=bare_error,
        closed=closed,
        done_marker=done_marker,
        max_output_tokens=max_output_tokens,
        tool_name=TOOL_NAME,
        line_ending=line_ending,
    )
    return [frame.event for frame in frames]


def gemini_stream(
    texts: Sequence[str],
    *,
    thoughts: Sequence[str] = (),
    finish_reason: Any = "STOP",
    closed: bool = True,
    error: Mapping[str, Any] | None = None,
    array: bool = False,
    prompt_tokens: int = 4,
    model: str = MODEL,
) -> list[bytes]:
    """Chunks of one Gemini stream: one per thought and text piece (their `usageMetadata` counting
    on), then a last chunk with `finish_reason`; SSE frames with CRLF, as Google's, or with `array`
    the JSON-array form, one element per piece (`[{…}`, `,\r\n{…}`, …, `]`).

    Args:
        finish_reason: the last chunk's `finishReason` (`labs.worker.gemini_events.NO_REASON_KEY`:
            no last chunk).
        closed: False ends right after the last piece (no finishReason anywhere, rule G2).
        error: a Gemini error object (`labs.worker.gemini_events.gemini_error(status)`) right after
            the pieces, nothing after it (G4).
    """
    chunks = gemini_chunks(
        pieces(texts, reasoning=thoughts),
        model=model,
        prompt_tokens=prompt_tokens,
        finish_reason=finish_reason,
        error=error,
        closed=closed,
    )
    return [frame.event for frame in (array_frames(chunks) if array else sse_frames(chunks))]


# -- an independent reader ------------------------------------------------------------------------

_MESSAGES_DELTA_KEYS = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}
_RESPONSES_DELTAS = {
    "response.output_text.delta",
    "response.reasoning_summary_text.delta",
    "response.function_call_arguments.delta",
}


def token_texts_of(dialect: Dialect, body: bytes) -> list[str]:
    """One string per complete token event in an SSE `body` of `dialect` (Chat:
    `tests.fixtures_lab.token_texts`).

    Framed by the core's `EventFramer`, as a client would: an event without its blank line is
    incomplete and left out.
    """
    if dialect is Dialect.CHAT:
        return token_texts(complete_events(body))
    texts = []
    for event in EventFramer().receive_data(body):
        if event.data is None or event.data.startswith(b"[DONE]"):
            continue
        data = json.loads(event.data)
        text = _token_text(dialect, data)
        if text is not None:
            texts.append(text)
    return texts


def _token_text(dialect: Dialect, data: dict[str, Any]) -> str | None:
    if dialect is Dialect.GEMINI:
        # A chunk's parts: text (a thought or not), or a whole call, named by its function.
        parts = [p for c in data.get("candidates") or () for p in (c.get("content") or {}).get("parts") or ()]
        texts = [p["text"] if p.get("text") else p["functionCall"]["name"] for p in parts if p.get("text") or "functionCall" in p]
        return "".join(texts) if texts else None
    kind = data.get("type")
    if dialect is Dialect.MESSAGES:
        if kind == "content_block_delta" and data["delta"]["type"] in _MESSAGES_DELTA_KEYS:
            return data["delta"][_MESSAGES_DELTA_KEYS[data["delta"]["type"]]]
        if kind == "content_block_start" and data["content_block"]["type"] == "tool_use":
            return data["content_block"]["id"]
        return None
    if kind in _RESPONSES_DELTAS:
        return data["delta"]
    if kind == "response.output_item.added" and data["item"]["type"] == "function_call":
        return data["item"]["call_id"]
    return None
