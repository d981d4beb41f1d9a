"""The events finish_fix writes into a stream: finishing chunks (rule C3), `[DONE]` (rule C4), the error
event of a cut (rule C6); and the framing of the Messages and Responses frames (`dialect_event`),
whose payloads `_messages` and `_responses` build. What a rule changes in an upstream event (C2, C11,
M8, R6, R7) goes through the JSON editor, `_json_edit`.

Each is written in the stream's own line endings (`line_ending`, LF until the stream showed another)
so that it reads like its neighbours to any SSE client. The finishing chunk carries the upstream's
own `id`, `created`, `model` and `system_fingerprint` (the fields the stream had so far).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "DONE",
    "ERROR_CODE",
    "dialect_event",
    "done_event",
    "error_event",
    "finishing_event",
    "sse_event",
]

DONE = b"[DONE]"
# The error event's code: clients and gateways match it (docs/repair-rules.md, rule C6).
ERROR_CODE = "stream_interrupted"


def sse_event(
    payload: Any,
    line_ending: bytes = b"\n",
    *,
    event: str | None = None,
    extra_lines: tuple[bytes, ...] = (),
    ascii_only: bool = True,
) -> bytes:
    """One event, the project's one SSE writer (the core's injections, the lab's worker, the tests):
    `event: <event>` when given (Messages and Responses frames), then `extra_lines` (other fields, as
    they came), then `data: ` and the payload, then the blank line.

    The payload goes out as it is when it is bytes (`[DONE]`, JSON already encoded), as UTF-8 when
    it is text, and as compact JSON otherwise, key order as inserted so the bytes are stable; with
    `ascii_only` False, non-ASCII characters stay UTF-8 rather than `\\u` escapes (the worker's text,
    which the tests split inside a character on purpose)."""
    if isinstance(payload, bytes):
        data = payload
    elif isinstance(payload, str):
        data = payload.encode()
    else:
        data = json.dumps(payload, separators=(",", ":"), ensure_ascii=ascii_only).encode()
    head = b"event: " + event.encode() + line_ending if event is not None else b""
    return head + b"".join(line + line_ending for line in extra_lines) + b"data: " + data + line_ending + line_ending


def dialect_event(event_type: str, payload: dict[str, Any], line_ending: bytes) -> bytes:
    """A Messages or Responses frame: `event: <type>`, then the data. Both Anthropic SDKs skip a
    frame without the `event:` line, and openai-node raises on `event: error` by that name."""
    return sse_event(payload, line_ending, event=event_type)


def done_event(line_ending: bytes) -> bytes:
    return sse_event(DONE, line_ending)


def error_event(message: str, line_ending: bytes, *, code: str = ERROR_CODE) -> bytes:
    """The one error event a cut or a stall ends with (OpenAI's error shape); `code` is the
    writer's (finish_fix's `stream_interrupted`, the lab's hub its own)."""
    return sse_event({"error": {"message": message, "type": "server_error", "code": code}}, line_ending)


def finishing_event(index: int, reason: str, *, chunk_fields: dict[str, Any], model: str, line_ending: bytes) -> bytes:
    """An empty-delta chunk that finishes choice `index` with `reason`; `model` when the stream
    named none."""
    chunk = {
        "id": chunk_fields.get("id", ""),
        "object": "chat.completion.chunk",
        "created": chunk_fields.get("created", 0),
        "model": chunk_fields.get("model", model),
    }
    if "system_fingerprint" in chunk_fields:
        chunk["system_fingerprint"] = chunk_fields["system_fingerprint"]
    chunk["choices"] = [{"index": index, "delta": {}, "finish_reason": reason}]
    return sse_event(chunk, line_ending)
