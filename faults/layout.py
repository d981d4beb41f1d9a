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

A token event is, in each dialect (`finishline.Dialect`; the simulated worker's plans count the
same events, labs/worker/messages_events.py and responses_events.py):

- Chat Completions: an SSE event whose JSON data has a choice whose `delta` carries a non-empty
  `content`, `reasoning_content`, `reasoning`, `refusal`, `tool_calls` or `function_call`; the
  first chunk's `{"role": "assistant", "content": ""}` is not one;
- Anthropic Messages: a `content_block_delta` whose delta carries non-empty text (`text`,
  `thinking`, `partial_json`), and the `content_block_start` of a `tool_use` block (the call's
  name is its first token);
- OpenAI Responses: a `response.*.delta` event with a non-empty `delta` (output text, reasoning,
  function-call arguments), and the `response.output_item.added` of a `function_call` item.
- Google Gemini (`alt=sse`): a chunk with a candidate part carrying non-empty `text` (a thought or
  not) or a `functionCall`; Gemini has no preamble (labs/worker/gemini_events.py).

Before the first token event come the events that open the answer (the "preamble"): Chat's
role-only chunks; Messages' `message_start`, `content_block_start` of a text or thinking block and
`ping`; Responses' `response.created`, `response.in_progress`, `response.output_item.added` of a
message or reasoning item, `response.content_part.added` and `response.reasoning_summary_part.added`. A cut after 0 tokens keeps them.
Pure: no sockets, no clock.

Reading a capture
-----------------
Two parsers the project already has do the reading; this module adds only the offsets.

- **h11** reads the HTTP response: the head, then the body by its framing (chunked, Content-Length,
  or until the connection closes), and refuses anything that is not one complete HTTP/1.1 response.
  Its events carry the body's bytes but not where they lay on the wire, and a cut is a count of
  wire bytes. `Connection.trailing_data` (the bytes h11 holds unread) gives that: after each event,
  the bytes fed minus the bytes unread is where the event ended in the capture. h11 returns a
  chunk's data as soon as it has it and reads the chunk's closing CRLF with its next event; RFC 9112
  section 7.1 puts that CRLF, 2 bytes, right after the data (h11 checks it), so a piece that ends
  its chunk (`chunk_end`) ends, framing included, 2 bytes later. The capture goes to h11 in slices
  of `_FEED_SIZE` bytes because `trailing_data` copies what h11 holds: with small slices the copy
  stays small and a long capture reads in linear time.
- **The core's `EventFramer`** splits the decoded body into SSE events by the same WHATWG rules the
  repair reads with, and hands back each event's exact bytes, so an event's end in the body is the
  sum of their lengths; the pieces h11 returned map it back to the wire.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Protocol

import h11

from finishline import Dialect, EventFramer

__all__ = ["CapturedLayout", "LayoutError", "ResponseLayout", "is_token_event", "layout_from_capture"]

_DELTA_TOKEN_KEYS = ("content", "reasoning_content", "reasoning", "refusal", "tool_calls", "function_call")
#: Messages: the delta keys that carry a token (`text_delta`, `thinking_delta`, `input_json_delta`).
_MESSAGES_DELTA_KEYS = ("text", "thinking", "partial_json")
#: The events that open an answer before its first token (module docstring), by dialect.
_MESSAGES_PREAMBLE = frozenset({"message_start", "content_block_start", "ping"})
_RESPONSES_PREAMBLE = frozenset(
    {
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_summary_part.added",
    }
)
#: Bytes handed to h11 at a time (the module docstring says why: it keeps `trailing_data` cheap).
_FEED_SIZE = 4096


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


def _json_object(data: str) -> dict[str, Any] | None:
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def is_token_event(data: str, dialect: Dialect = Dialect.CHAT) -> bool:
    """Whether an SSE event's data (the joined `data:` lines) carries a token in `dialect`."""
    value = _json_object(data)
    if value is None:
        return False
    if dialect is Dialect.MESSAGES:
        kind = value.get("type")
        if kind == "content_block_start":
            block = value.get("content_block")
            return isinstance(block, dict) and block.get("type") in ("tool_use", "server_tool_use")
        delta = value.get("delta")
        return kind == "content_block_delta" and isinstance(delta, dict) and any(delta.get(key) for key in _MESSAGES_DELTA_KEYS)
    if dialect is Dialect.GEMINI:
        # Code Assist (the Gemini CLI's Google login) wraps the chunk in `response`.
        wrapped = value.get("response")
        chunk: dict[str, Any] = wrapped if isinstance(wrapped, dict) else value
        candidates = chunk.get("candidates")
        return isinstance(candidates, list) and any(_gemini_has_token(candidate) for candidate in candidates)
    if dialect is Dialect.RESPONSES:
        kind = value.get("type")
        if not isinstance(kind, str):
            return False
        if kind == "response.output_item.added":
            item = value.get("item")
            return isinstance(item, dict) and item.get("type") == "function_call"
        return kind.startswith("response.") and kind.endswith(".delta") and bool(value.get("delta"))
    choices = value.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and any(delta.get(key) for key in _DELTA_TOKEN_KEYS):
            return True
    return False


def _gemini_has_token(candidate: object) -> bool:
    """Whether a Gemini candidate's content has a part with text or a whole function call."""
    content = candidate.get("content") if isinstance(candidate, dict) else None
    parts = content.get("parts") if isinstance(content, dict) else None
    return isinstance(parts, list) and any(isinstance(p, dict) and (bool(p.get("text")) or "functionCall" in p) for p in parts)


def layout_from_capture(raw: bytes, dialect: Dialect = Dialect.CHAT) -> CapturedLayout:
    """Find the head and the token events in one complete raw HTTP/1.1 response in `dialect`.

    Raises:
        LayoutError: no complete head, or a body that is malformed or incomplete for its framing.
    """
    head_length, pieces = _read_response(raw)
    body_ends = list(accumulate(len(piece.data) for piece in pieces))

    def wire_offset(body_offset: int) -> int:
        # Map an offset in the decoded body back to the wire. An event that ends exactly at a
        # chunk's end is counted with that chunk's trailing CRLF, so the cut keeps chunks whole.
        index = bisect_left(body_ends, body_offset)
        piece = pieces[index]
        if body_ends[index] == body_offset:
            return piece.framed_end
        return piece.data_end - (body_ends[index] - body_offset)

    # Before the first token: the head and the events that open the answer ("preamble"). A cut
    # after 0 tokens keeps those, and stops before the first token or whatever else comes first.
    preamble_end = head_length
    in_preamble = True
    ends = []
    body_offset = 0
    # The whole body at once, not piece by piece: the framer decides a CR that ends its input at
    # once, so a CRLF split across two pieces would end an event between the CR and the LF. What
    # follows the last blank line (an event cut short) stays in the framer: it is no event.
    for event in EventFramer().receive_data(b"".join(piece.data for piece in pieces)):
        body_offset += len(event.raw)
        data = (event.data or b"").decode("utf-8", "replace")
        if is_token_event(data, dialect):
            in_preamble = False
            ends.append(wire_offset(body_offset))
        elif in_preamble and _opens_answer(data, dialect):
            preamble_end = wire_offset(body_offset)
        else:
            in_preamble = False
    return CapturedLayout(
        head_length=head_length,
        preamble_end=preamble_end,
        token_event_ends=tuple(ends),
        total_length=len(raw),
    )


def _opens_answer(data: str, dialect: Dialect) -> bool:
    """Whether a non-token event is one of the preamble's (module docstring)."""
    value = _json_object(data)
    if value is None:
        return False
    if dialect is Dialect.GEMINI:
        return False  # every Gemini chunk that opens the answer carries its first token
    kind = value.get("type")
    if dialect is not Dialect.CHAT:
        # A list or an object is unhashable: `in` a frozenset would raise TypeError.
        return isinstance(kind, str) and kind in (_MESSAGES_PREAMBLE if dialect is Dialect.MESSAGES else _RESPONSES_PREAMBLE)
    choices = value.get("choices")
    if not isinstance(choices, list) or not choices or value.get("error"):
        return False
    return all(isinstance(c, dict) and not c.get("finish_reason") for c in choices)


@dataclass(frozen=True, slots=True, kw_only=True)
class _BodyPiece:
    """The bytes of one h11 `Data` event and where they lay in the capture."""

    data: bytes
    #: Where the piece's last byte ends in the capture.
    data_end: int
    #: Where it ends with its framing: after the chunk's CRLF if it ends a chunk, else `data_end`.
    framed_end: int


def _read_response(raw: bytes) -> tuple[int, list[_BodyPiece]]:
    """The head's length and the body's pieces, as h11 reads `raw` for a client that sent a request."""
    connection = h11.Connection(our_role=h11.CLIENT)
    # h11 reads a response only to a request it has seen sent, and the method says whether that
    # response may have a body (a HEAD's has none): POST, as the probe sends.
    connection.send(h11.Request(method="POST", target="/", headers=[("host", "capture")]))
    fed = 0
    read = 0  # where the last event h11 returned ends in the capture
    head_length: int | None = None
    pieces: list[_BodyPiece] = []
    while True:
        try:
            event = connection.next_event()
        except h11.RemoteProtocolError as exc:
            if head_length is None:
                raise LayoutError(f"the capture has no complete response head: {exc}") from None
            raise LayoutError(
                f"the capture's body is not a complete HTTP/1.1 body: h11 read {read} of its {len(raw)} bytes, then: {exc}"
            ) from None
        if event is h11.NEED_DATA:
            data = raw[fed : fed + _FEED_SIZE]
            fed += len(data)
            connection.receive_data(data)  # b"" once all is fed: the capture ends as the connection did
            continue
        read = fed - len(connection.trailing_data[0])
        if isinstance(event, h11.Response):
            head_length = read
        elif isinstance(event, h11.Data):
            framed_end = read + 2 if event.chunk_end else read
            pieces.append(_BodyPiece(data=event.data, data_end=read, framed_end=framed_end))
        elif isinstance(event, h11.EndOfMessage):
            assert head_length is not None  # h11 ends a message only after its head
            return head_length, pieces
        # An InformationalResponse (a 1xx before the response) is kept by any cut: the head that
        # counts is the final response's, which h11 returns next.
