"""Where token events end in a raw HTTP response: the byte counts that make cuts exact.

A cut after exactly n token events is a `limit_data` toxic whose byte count ends right after the
n-th token event. Two ways to know that count, behind one small protocol (`ResponseLayout`):

- **computed** (the simulated worker): `labs.worker.wire.ResponsePlan` knows every byte in advance
  from the settings. Exact for any settings, no extra request.
- **captured** (any upstream, e.g. a real model server): `layout_from_capture(raw)` reads one
  complete raw response (head, framing, SSE events) and finds where each token event ends;
  `faults.probe` captures it through the proxy before the fault is applied. Exact when the upstream
  answers the same request with the same layout (lengths, not content: ids may differ as long as
  their length does not); `faults.probe.probe_layout` checks that on two captures and refuses
  otherwise, so a cut is exact or refused, never approximate.

A token event is an SSE event whose JSON data has a choice whose `delta` carries a non-empty
`content`, `reasoning_content`, `reasoning`, `refusal`, `tool_calls` or `function_call`; the first
chunk's `{"role": "assistant", "content": ""}` is not one. Pure: no sockets, no clock.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Protocol

__all__ = ["CapturedLayout", "LayoutError", "ResponseLayout", "is_token_event", "layout_from_capture"]

_DELTA_TOKEN_KEYS = ("content", "reasoning_content", "reasoning", "refusal", "tool_calls", "function_call")
# An SSE event ends at a blank line; lines end in CRLF, LF or CR (WHATWG event-stream rules).
_EVENT_END = re.compile(rb"(?:\r\n|\n|\r)(?:\r\n|\n|\r)")


class LayoutError(ValueError):
    """A capture is not a complete HTTP response with the token events asked for."""


class ResponseLayout(Protocol):
    """What a fault needs to know about a response: the head's length and where token n ends."""

    @property
    def head_length(self) -> int: ...

    def offset_after_tokens(self, n: int) -> int: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class CapturedLayout:
    """Byte offsets read from one captured response (offsets count from the response's first byte)."""

    head_length: int
    #: End of the head and the leading role-only chunks: where a cut after 0 tokens goes.
    preamble_end: int
    #: Where each token event ends, framing included (chunked: after the chunk's CRLF).
    token_event_ends: tuple[int, ...]
    total_length: int

    @property
    def token_events(self) -> int:
        return len(self.token_event_ends)

    def offset_after_tokens(self, n: int) -> int:
        """Bytes from the start of the response to the end of the n-th token event (n=0: before the first).

        Raises:
            ValueError: n is negative or the capture has fewer token events.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if n > self.token_events:
            raise ValueError(f"the captured stream has {self.token_events} token events, cannot cut after {n}")
        if n == 0:
            return self.preamble_end
        return self.token_event_ends[n - 1]


def is_token_event(data: str) -> bool:
    """Whether an SSE event's data (the joined `data:` lines) carries a token."""
    try:
        value = json.loads(data)
    except ValueError:
        return False
    choices = value.get("choices") if isinstance(value, dict) else None
    if not isinstance(choices, list):
        return False
    for choice in choices:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and any(delta.get(key) for key in _DELTA_TOKEN_KEYS):
            return True
    return False


def layout_from_capture(raw: bytes) -> CapturedLayout:
    """Find the head and the token events in one complete raw HTTP/1.1 response.

    Raises:
        LayoutError: no complete head, or a malformed chunked body.
    """
    head_end = raw.find(b"\r\n\r\n")
    if head_end < 0:
        raise LayoutError("the capture has no complete response head")
    head_length = head_end + 4
    pieces = _body_pieces(raw, head_length)  # (raw offset of piece, piece bytes, raw end incl. framing)
    body = b"".join(piece for _, piece, _ in pieces)

    def raw_offset(body_offset: int) -> int:
        # Map an offset in the decoded body back to the wire. An event that ends exactly at a
        # chunk's end is counted with that chunk's trailing CRLF, so the cut keeps chunks whole.
        position = 0
        for raw_start, piece, raw_end in pieces:
            if body_offset <= position + len(piece):
                if body_offset == position + len(piece):
                    return raw_end
                return raw_start + (body_offset - position)
            position += len(piece)
        return len(raw)

    # Before the first token: the head and the leading role-only chunks ("preamble"). A cut after
    # 0 tokens keeps those, and stops before the first token or whatever else comes first.
    preamble_end = head_length
    in_preamble = True
    ends = []
    start = 0
    for match in _EVENT_END.finditer(body):
        data = _event_data(body[start : match.end()])
        if is_token_event(data):
            in_preamble = False
            ends.append(raw_offset(match.end()))
        elif in_preamble and _is_role_chunk(data):
            preamble_end = raw_offset(match.end())
        else:
            in_preamble = False
        start = match.end()
    return CapturedLayout(
        head_length=head_length,
        preamble_end=preamble_end,
        token_event_ends=tuple(ends),
        total_length=len(raw),
    )


def _is_role_chunk(data: str) -> bool:
    try:
        value = json.loads(data)
    except ValueError:
        return False
    choices = value.get("choices") if isinstance(value, dict) else None
    if not isinstance(choices, list) or not choices or value.get("error"):
        return False
    return all(isinstance(c, dict) and not c.get("finish_reason") for c in choices)


def _event_data(event: bytes) -> str:
    lines = re.split(rb"\r\n|\n|\r", event)
    data = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
    return b"\n".join(data).decode("utf-8", "replace")


def _body_pieces(raw: bytes, head_length: int) -> list[tuple[int, bytes, int]]:
    head = raw[:head_length].decode("latin-1").lower()
    if re.search(r"^transfer-encoding:.*chunked", head, re.MULTILINE):
        return _chunks(raw, head_length)
    return [(head_length, raw[head_length:], len(raw))]


def _chunks(raw: bytes, position: int) -> list[tuple[int, bytes, int]]:
    pieces = []
    while True:
        line_end = raw.find(b"\r\n", position)
        if line_end < 0:
            raise LayoutError(f"chunked body: no chunk-size line at byte {position}")
        size_text = raw[position:line_end].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise LayoutError(f"chunked body: bad chunk size {size_text!r} at byte {position}") from None
        data_start = line_end + 2
        if size == 0:
            return pieces
        data_end = data_start + size
        if raw[data_end : data_end + 2] != b"\r\n":
            raise LayoutError(f"chunked body: chunk at byte {position} is not followed by CRLF")
        pieces.append((data_start, raw[data_start:data_end], data_end + 2))
        position = data_end + 2
