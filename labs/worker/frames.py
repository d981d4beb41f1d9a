"""The SSE bytes every dialect's event builder shares: compact JSON and one frame.

`sse_frame(data, event=...)` is how the worker (and the tests' scripted upstream, through
`labs.worker.messages_events`, `labs.worker.responses_events` and `labs.worker.gemini_events`)
writes an SSE frame: the core's own writer (`finishline.sse_event`, the one finish_fix injects
with), so the worker's frames and finish_fix's are framed alike and the dialects differ only in the
event they name, the JSON they carry and (Gemini) the line ending. A `Frame` is one built event
with the `ResponsePlan` segment kind it plays (see `labs.worker.wire.Segment`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from finishline import sse_event

__all__ = ["DONE_MARKER", "Frame", "compact_json", "sse_frame"]


@dataclass(frozen=True, slots=True)
class Frame:
    """One SSE event's exact bytes and its segment kind.

    kind: `role` (opens the answer, a block or an item; carries no token), `token` (carries one
    token event), `finish` (closes a block or item, or says why the answer ended), `usage`, `error`
    or `done` (the dialect's terminator).
    """

    kind: str
    event: bytes


def compact_json(value: Any) -> bytes:
    """JSON as the providers send it: no spaces, key order as inserted (so bytes are stable)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def sse_frame(data: Any, *, event: str | None = None, line_ending: bytes = b"\n") -> bytes:
    """`event: <event>` (when given), `data: <json>`, and the blank line, with `line_ending`.

    `data` is JSON-encoded unless it already is bytes (the `[DONE]` marker).
    """
    # Non-ASCII text as UTF-8, as providers send it (`compact_json`), not as `\u` escapes.
    return sse_event(data, line_ending, event=event, ascii_only=False)


#: `data: [DONE]`, Chat's terminator; some gateways append it to other dialects' streams too.
DONE_MARKER = b"[DONE]"
