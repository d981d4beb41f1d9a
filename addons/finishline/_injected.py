"""The events finish_fix writes into a stream: finishing chunks (rule 3), `[DONE]` (rule 4), the error
event of a cut (rule 6), and the rewrite of an empty finish_reason (rule 2); and the framing of the
Messages and Responses frames (`dialect_event`), whose payloads `_messages` and `_responses` build.

Each is written in the stream's own line endings (`line_ending`, LF until the stream showed another)
so that it reads like its neighbours to any SSE client. The finishing chunk carries the upstream's
own `id`, `created`, `model` and `system_fingerprint` (the fields the stream had so far).
"""

from __future__ import annotations

import json
import re

from ._json import json_or_unreadable
from ._sse import Event, EventFramer, split_lines

__all__ = [
    "DONE", "ERROR_CODE", "dialect_event", "done_event", "error_event", "finishing_event", "rewrite_empty_reasons",
    "sse_event",
]

DONE = b"[DONE]"
# The error event's code: clients and gateways match it (README rule 6).
ERROR_CODE = "stream_interrupted"
# `"finish_reason": ""` as JSON text. Inside a JSON string the quotes would be escaped, so this
# cannot match message content; the rewrite is still checked by parsing it back.
_EMPTY_REASON = re.compile(rb'("finish_reason"\s*:\s*)""')


def sse_event(payload: dict | bytes, line_ending: bytes, *, extra_lines: tuple[bytes, ...] = ()) -> bytes:
    """One event: `extra_lines` (other fields, as they came), then `data: ` and the payload (bytes as
    they are, a dict as compact JSON), then the blank line."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload, separators=(",", ":")).encode()
    return b"".join(line + line_ending for line in extra_lines) + b"data: " + data + line_ending + line_ending


def dialect_event(event_type: str, payload: dict, line_ending: bytes) -> bytes:
    """A Messages or Responses frame: `event: <type>`, then the data. Both Anthropic SDKs skip a
    frame without the `event:` line, and openai-node raises on `event: error` by that name."""
    return sse_event(payload, line_ending, extra_lines=(b"event: " + event_type.encode(),))


def done_event(line_ending: bytes) -> bytes:
    return sse_event(DONE, line_ending)


def error_event(message: str, line_ending: bytes) -> bytes:
    """The one error event a cut or a stall ends with (OpenAI's error shape)."""
    return sse_event({"error": {"message": message, "type": "server_error", "code": ERROR_CODE}}, line_ending)


def finishing_event(index: int, reason: str, *, chunk_fields: dict, model: str, line_ending: bytes) -> bytes:
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


def rewrite_empty_reasons(event: Event, chunk: dict, line_ending: bytes) -> bytes:
    """Rule 2: `"finish_reason": ""` -> null in `event` (whose parsed data is `chunk`, which this
    updates), touching nothing else. The textual rewrite is accepted only if it parses back to the
    intended JSON; else the data is re-serialized, its other fields kept."""
    for choice in chunk["choices"]:
        if isinstance(choice, dict) and choice.get("finish_reason") == "":
            choice["finish_reason"] = None
    rewritten = _EMPTY_REASON.sub(rb"\1null", event.raw)
    again = EventFramer().receive_data(rewritten)
    if len(again) == 1 and json_or_unreadable(again[0].data) == chunk:
        return rewritten
    lines = [line for line in split_lines(event.raw) if line]
    other_fields = tuple(line for line in lines if not (line == b"data" or line.startswith(b"data:")))
    return sse_event(chunk, line_ending, extra_lines=other_fields)
