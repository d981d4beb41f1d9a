"""The error a failed stream ends with, in its dialect, for a writer other than the repair machine:
a relay that knows its upstream failed and must tell its client why (the lab's fixed hub).

The frames are the ones finish_fix writes for a cut (rules C6, M4, R3, G2: `_injected.error_event`,
`_messages.error_frame`, `_responses.failure_frames`, `_gemini.error_payload`), so there is one home for each dialect's
error ending; only the message and the code are the writer's:

    chat       data: {"error": {"message", "type": "server_error", "code"}}
    messages   event: error, {"type": "error", "error": {"type": "api_error", "message"}}
               (Anthropic's errors carry no code)
    responses  event: error (flat and nested, `code` in both), then event: response.failed
               with the stream's response id and `status: "failed"`
    gemini     data: {"error": {"code": 503, "message", "status": "UNAVAILABLE"}}, `error` first
               (the SSE form; Google's errors carry no string code)

A Responses ending continues the stream it ends (the id of its `response.created`, the next
`sequence_number`s: a changed id makes both OpenAI SDKs raise "Lifecycle response identity
changed"), and every ending is written in the stream's own line endings, so the writer reads the
body bytes that went out before it: feed them to `receive_data`, in any split.

A relay that passes bytes on as they come (a close-delimited body) may have sent half an event when
its upstream failed; the ending then starts with the line endings that close that event, so the
client reads the partial event and then the error, not the error's lines glued onto a `data:` line.
"""

from __future__ import annotations

from ._dialect import Dialect
from ._gemini import error_payload
from ._injected import error_event, sse_event
from ._json import json_or_unreadable
from ._messages import error_frame
from ._responses import ResponseSoFar, failure_frames
from ._sse import EventFramer

__all__ = ["StreamErrorWriter"]


class StreamErrorWriter:
    """Reads a stream as it goes to the client; `error_frames` is the error ending its dialect takes."""

    __slots__ = ("_dialect", "_framer", "_last_byte", "_so_far")

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = Dialect(dialect)
        self._framer = EventFramer()
        self._so_far = ResponseSoFar()
        # The last byte read: whether the event the framer holds stopped mid-line or after a line.
        self._last_byte = b""

    def receive_data(self, data: bytes) -> None:
        """Body bytes the client was sent. Never raises on what they hold."""
        if data:
            self._last_byte = data[-1:]
        for event in self._framer.receive_data(data):
            if self._dialect is not Dialect.RESPONSES:
                continue  # only Responses continues what came before; the framer notes the line ending
            message = json_or_unreadable(event.data)
            if isinstance(message, dict):
                kind = message.get("type")
                self._so_far.note(kind if isinstance(kind, str) else None, message)

    def error_frames(self, message: str, *, code: str) -> bytes:
        """The dialect's error ending, after the bytes read so far (see the module's table)."""
        line_ending = self._framer.line_ending or b"\n"
        if self._dialect is Dialect.MESSAGES:
            frames = error_frame(message, line_ending)
        elif self._dialect is Dialect.RESPONSES:
            frames = failure_frames(message, line_ending, so_far=self._so_far, code=code)
        elif self._dialect is Dialect.GEMINI:
            frames = sse_event(error_payload(message), line_ending)
        else:
            frames = error_event(message, line_ending, code=code)
        return self._partial_event_end(line_ending) + frames

    def _partial_event_end(self, line_ending: bytes) -> bytes:
        """The line endings that end the event the client got part of: none when it got whole
        events, one when the part stopped after a line (the blank line), two when mid-line."""
        if not self._framer.held_bytes:
            return b""
        return line_ending if self._last_byte in (b"\r", b"\n") else line_ending * 2
