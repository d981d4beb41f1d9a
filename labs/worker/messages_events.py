"""Anthropic Messages stream events, byte for byte: one builder per frame, and whole streams.

The worker (`labs.worker.wire.response_plan(..., dialect=Dialect.MESSAGES)`) and the tests' scripted
upstream (`tests/dialect_streams.py`) both build their Messages streams here, so there is one set of
frames. Every frame is `event: <type>` + `data: {"type":"<type>",...}` (both Anthropic SDKs skip a
frame without `event:`: anthropic-python `_streaming.py`, @anthropic-ai/sdk `core/streaming.ts`),
compact JSON in Anthropic's key order.

Grammar of a well-formed stream (platform.claude.com "Streaming messages"; the shapes checked against
@anthropic-ai/sdk's `resources/messages/messages.d.ts`)::

    message_start (a Message: empty content, stop_reason null, usage)
    ping
    per block: content_block_start, content_block_delta+, content_block_stop
        text:      text_delta
        thinking:  thinking_delta, then one signature_delta before its stop
        tool_use:  the start carries id and name; input_json_delta pieces of the input JSON
    message_delta (delta.stop_reason, stop_sequence null, usage.output_tokens)
    message_stop

An `event: error` ends a stream: nothing follows it.

`message_frames` assembles a stream from `labs.worker.answer.Piece`s; each frame carries the
`ResponsePlan` segment kind it plays: `role` for what opens the message or a block without a token
(`message_start`, `ping`, a text or thinking block's start), `token` for each token event
(`text_delta`, `thinking_delta`, `input_json_delta`, and a `tool_use` block's start, which opens the
call with its name as Chat's first tool-call delta does), `finish` for what closes a block or carries
the stop reason (`signature_delta`, `content_block_stop`, `message_delta`), `error`, and `done`
(`message_stop`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from labs.worker.answer import TOOL_NAME, Block, Piece, blocks_of
from labs.worker.frames import Frame, sse_frame

__all__ = [
    "MESSAGE_ID",
    "THINKING_SIGNATURE",
    "bare_error",
    "content_block_delta",
    "content_block_start",
    "content_block_stop",
    "error",
    "input_json_delta",
    "message_delta",
    "message_frames",
    "message_object",
    "message_start",
    "message_stop",
    "ping",
    "signature_delta",
    "text_block",
    "text_delta",
    "thinking_block",
    "thinking_delta",
    "tool_use_block",
]

#: Every message has the same id: same settings, same bytes.
MESSAGE_ID = "msg_finishline"
#: The opaque signature a thinking block ends with (base64 of "finishline").
THINKING_SIGNATURE = "ZmluaXNobGluZQ=="


def _event(data: dict[str, Any], line_ending: bytes) -> bytes:
    return sse_frame(data, event=data["type"], line_ending=line_ending)


# -- one frame each -------------------------------------------------------------------------------


def message_start(
    *,
    model: str,
    message_id: str = MESSAGE_ID,
    input_tokens: int = 0,
    output_tokens: int = 0,
    line_ending: bytes = b"\n",
) -> bytes:
    """`message_start`: the Message with empty content, `stop_reason` null and the usage so far."""
    message: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }
    return _event({"type": "message_start", "message": message}, line_ending)


def ping(*, line_ending: bytes = b"\n") -> bytes:
    """`ping`: a keep-alive the SDKs skip."""
    return _event({"type": "ping"}, line_ending)


def text_block() -> dict[str, Any]:
    return {"type": "text", "text": ""}


def thinking_block() -> dict[str, Any]:
    return {"type": "thinking", "thinking": "", "signature": ""}


def tool_use_block(tool_id: str, name: str = TOOL_NAME) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": {}}


def content_block_start(index: int, block: Mapping[str, Any], *, line_ending: bytes = b"\n") -> bytes:
    """`content_block_start` of block `index` (`text_block()`, `thinking_block()`, `tool_use_block(...)`)."""
    return _event({"type": "content_block_start", "index": index, "content_block": dict(block)}, line_ending)


def text_delta(text: str) -> dict[str, Any]:
    return {"type": "text_delta", "text": text}


def thinking_delta(thinking: str) -> dict[str, Any]:
    return {"type": "thinking_delta", "thinking": thinking}


def signature_delta(signature: str = THINKING_SIGNATURE) -> dict[str, Any]:
    return {"type": "signature_delta", "signature": signature}


def input_json_delta(partial_json: str) -> dict[str, Any]:
    return {"type": "input_json_delta", "partial_json": partial_json}


def content_block_delta(index: int, delta: Mapping[str, Any], *, line_ending: bytes = b"\n") -> bytes:
    """`content_block_delta` of block `index` (`text_delta(...)`, `thinking_delta(...)`, ...)."""
    return _event({"type": "content_block_delta", "index": index, "delta": dict(delta)}, line_ending)


def content_block_stop(index: int, *, line_ending: bytes = b"\n") -> bytes:
    return _event({"type": "content_block_stop", "index": index}, line_ending)


def message_delta(
    stop_reason: str | None, *, output_tokens: int, stop_sequence: str | None = None, line_ending: bytes = b"\n"
) -> bytes:
    """`message_delta` with `delta.stop_reason` (any value, null and `""` included) and the
    cumulative `usage.output_tokens`; the same shape finish_fix injects (rule M2)."""
    data = {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
        "usage": {"output_tokens": output_tokens},
    }
    return _event(data, line_ending)


def message_stop(*, line_ending: bytes = b"\n") -> bytes:
    return _event({"type": "message_stop"}, line_ending)


def error(error_object: Mapping[str, Any], *, line_ending: bytes = b"\n") -> bytes:
    """`event: error` / `{"type":"error","error":{...}}` (`labs.worker.answer.anthropic_error`)."""
    return _event({"type": "error", "error": dict(error_object)}, line_ending)


def bare_error(error_object: Mapping[str, Any], *, line_ending: bytes = b"\n") -> bytes:
    """`data: {"error":{...}}` with no `event:` line: what a Chat-minded server sends (the
    Anthropic SDKs skip it, dialects.md section 1, "Framing trap")."""
    return sse_frame({"error": dict(error_object)}, line_ending=line_ending)


# -- whole streams --------------------------------------------------------------------------------


def message_frames(
    pieces: Sequence[Piece],
    *,
    model: str,
    message_id: str = MESSAGE_ID,
    input_tokens: int = 0,
    output_tokens: int | None = None,
    stop_reason: str | None = "end_turn",
    send_message_delta: bool = True,
    send_message_stop: bool = True,
    error_object: Mapping[str, Any] | None = None,
    bare: bool = False,
    closed: bool = True,
    send_ping: bool = True,
    tool_name: str = TOOL_NAME,
    line_ending: bytes = b"\n",
) -> list[Frame]:
    """A Messages stream carrying `pieces` (one choice's, in order), then its ending.

    Args:
        output_tokens: `message_delta`'s `usage.output_tokens`; default: one per piece.
        stop_reason: what `message_delta` says (None and `""` are sent as they are).
        send_message_delta, send_message_stop: leave either out (the M2 / M3 defects).
        error_object: end with an error event carrying it right after the pieces, nothing after it
            (no block stop, no `message_delta`, no `message_stop`); `bare` sends it as a bare
            `data: {"error":...}` frame instead of `event: error`.
        closed: False ends right after the last piece, without closing anything (a clean close
            mid block).
    """
    frames = [
        Frame("role", message_start(model=model, message_id=message_id, input_tokens=input_tokens, line_ending=line_ending)),
    ]
    if send_ping:
        frames.append(Frame("role", ping(line_ending=line_ending)))
    blocks = blocks_of(list(pieces))
    for index, block in enumerate(blocks):
        frames += _block_frames(index, block, tool_name, line_ending)
        if index < len(blocks) - 1:
            frames += _block_closing(index, block, line_ending)
    if error_object is not None:
        build = bare_error if bare else error
        frames.append(Frame("error", build(error_object, line_ending=line_ending)))
        return frames
    if not closed:
        return frames
    if blocks:
        frames += _block_closing(len(blocks) - 1, blocks[-1], line_ending)
    if send_message_delta:
        used = len(pieces) if output_tokens is None else output_tokens
        frames.append(Frame("finish", message_delta(stop_reason, output_tokens=used, line_ending=line_ending)))
    if send_message_stop:
        frames.append(Frame("done", message_stop(line_ending=line_ending)))
    return frames


def _block_frames(index: int, block: Block, tool_name: str, line_ending: bytes) -> list[Frame]:
    if block.kind == "tool_call":
        frames = [Frame("token", content_block_start(index, tool_use_block(block.tool_id, tool_name), line_ending=line_ending))]
        return frames + [
            Frame("token", content_block_delta(index, input_json_delta(p.text), line_ending=line_ending))
            for p in block.pieces[1:]
        ]
    opening, delta = (thinking_block, thinking_delta) if block.kind == "reasoning" else (text_block, text_delta)
    frames = [Frame("role", content_block_start(index, opening(), line_ending=line_ending))]
    return frames + [Frame("token", content_block_delta(index, delta(p.text), line_ending=line_ending)) for p in block.pieces]


def _block_closing(index: int, block: Block, line_ending: bytes) -> list[Frame]:
    frames = []
    if block.kind == "reasoning":
        frames.append(Frame("finish", content_block_delta(index, signature_delta(), line_ending=line_ending)))
    frames.append(Frame("finish", content_block_stop(index, line_ending=line_ending)))
    return frames


# -- the non-streaming Message --------------------------------------------------------------------


def message_object(
    pieces: Sequence[Piece],
    *,
    model: str,
    stop_reason: str | None,
    message_id: str = MESSAGE_ID,
    input_tokens: int = 0,
    output_tokens: int | None = None,
    tool_name: str = TOOL_NAME,
) -> dict[str, Any]:
    """The JSON `message` (`stream` false) carrying `pieces`: the same blocks as the stream.

    A tool call's `input` is its arguments parsed; arguments that `max_tokens` cut are not JSON and
    give `{}` (Anthropic never returns a partial input object).
    """
    content: list[dict[str, Any]] = []
    for block in blocks_of(list(pieces)):
        if block.kind == "reasoning":
            content.append({"type": "thinking", "thinking": block.text, "signature": THINKING_SIGNATURE})
        elif block.kind == "content":
            content.append({"type": "text", "text": block.text})
        else:
            content.append({**tool_use_block(block.tool_id, tool_name), "input": _parsed_or_empty(block.text)})
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": len(pieces) if output_tokens is None else output_tokens},
    }


def _parsed_or_empty(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return {}
