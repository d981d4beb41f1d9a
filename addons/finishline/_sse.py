"""Incremental Server-Sent Events framer: bytes in, whole events (with their exact bytes) out.

Theory of operation
-------------------
An SSE stream is a sequence of lines ended by CRLF, LF or a lone CR (WHATWG HTML, "Parsing an event
stream"); an event ends at a blank line. The framer never changes a byte: every `Event` carries the
exact `raw` bytes it was framed from, so concatenating the `raw` of every event, in order, gives back
the input. The parsed fields (`data`, `event_type`) are there for the repair machine to read.

Two details make this exact under any chunking:

* A CR at the very end of the input so far may be the first half of a CRLF. The framer decides the
  line at the CR (so an event ending in CR leaves at once) and remembers it; if the next byte is LF,
  that LF is the rest of the line ending. When the CR closed an event, the LF has no event to join, so
  it leaves alone as a field-less `Event` (raw `b"\\n"`); passing it on keeps the bytes identical.
* The buffer holds only the current, incomplete event. Line ends are searched only in bytes not yet
  searched, and consumed bytes are dropped once per `receive_data` call, so an 8 MB chunk of 100k
  events or a 10 MB event fed a byte at a time are both linear.

Like openai-python's and httpx-sse's decoders, `data:` with or without the space after the colon is
the same field, lines starting with `:` are comments, several `data:` lines join with LF, and a UTF-8
byte order mark at the start of the stream is ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._errors import LocalProtocolError

__all__ = ["Event", "EventFramer", "split_lines"]

_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


def split_lines(raw: bytes) -> list[bytes]:
    """The lines of an event's bytes, without their line endings (empty lines included)."""
    return _LINE_END.split(raw.removeprefix(_BOM))


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One SSE event as it arrived.

    Attributes:
        raw: the exact bytes of the event, from its first byte through its blank line.
        data: the `data` field lines joined with LF, or None when the event has no data field
            (a comment, a keep-alive, an `id:`-only event, a lone line-ending byte).
        event_type: the value of the last `event:` field, or None.
        complete: False only for bytes left over at the end of a stream without their blank line.
    """

    raw: bytes
    data: bytes | None
    event_type: bytes | None = None
    complete: bool = True


class EventFramer:
    """Splits a byte stream into SSE events.

    Feed bytes with `receive_data`; it returns the events completed by those bytes. Call
    `receive_end` once when the stream ends; it returns the incomplete event left over, if any.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        # Where the current (incomplete) line starts, and where the search for line ends resumes.
        self._line_start = 0
        self._scan_from = 0
        # The last byte seen was a CR that ended a line: an LF arriving next belongs to it.
        self._after_cr = False
        # The CR that ended a line also ended an event, which has already left.
        self._after_cr_closed_event = False
        self._at_stream_start = True
        self._ended = False
        self.idle = False
        """True when nothing is held and an event went by: the next byte starts a new event (and no
        CR before it left an LF pending), so a piece that is one whole event frames as exactly
        itself. An attribute, not a property: the repair's fast path reads it for every piece."""
        self.line_ending: bytes | None = None
        """The first line ending the stream used (b"\\n", b"\\r\\n" or b"\\r"); None until known."""

    def receive_data(self, data: bytes) -> list[Event]:
        """Frame more bytes. Returns the events they complete, in order (often none)."""
        if self._ended:
            raise LocalProtocolError(f"receive_data() got {len(data)} bytes after receive_end(); the stream already ended")
        events: list[Event] = []
        if not data:
            return events
        buffer = self._buffer
        if not buffer and not self._after_cr and data.endswith(b"\n\n") and data.find(b"\n\n") == len(data) - 2:
            if b"\r" not in data and data[:1] != b"\n":
                # The usual piece: one whole event, LF only, nothing held before it. Framed as the
                # loop below would frame it (its lines end at each LF, its blank line is its last),
                # without a search per line.
                self._note_line_ending(b"\n")
                event = self._parse(data, complete=True)
                self.idle = True  # (`_parse` read the stream's start)
                return [event]
        if self._after_cr:
            self._after_cr = False
            if data[:1] == b"\n":
                self._note_line_ending(b"\r\n")
                if self._after_cr_closed_event:
                    events.append(Event(raw=b"\n", data=None))
                else:
                    buffer += b"\n"
                    self._line_start = self._scan_from = len(buffer)
                data = data[1:]
            else:
                self._note_line_ending(b"\r")
            self._after_cr_closed_event = False
        buffer += data
        event_start = 0
        position = self._scan_from
        size = len(buffer)
        while True:
            # The next line end: two `find`s (memchr) rather than a pattern with alternation, which
            # reads every byte in Python's regex engine: a Responses stream's `*.done` and
            # `response.completed` events repeat the whole text, hundreds of KB each.
            line_feed = buffer.find(b"\n", position)
            carriage_return = buffer.find(b"\r", position, size if line_feed < 0 else line_feed)
            if carriage_return >= 0:
                line_start = carriage_return
                line_end = carriage_return + 2 if line_feed == carriage_return + 1 else carriage_return + 1
            elif line_feed >= 0:
                line_start, line_end = line_feed, line_feed + 1
            else:
                break
            if line_end == size and buffer[line_end - 1] == 0x0D:
                # A CR last in the input: CRLF or lone CR is decided by the next byte.
                self._after_cr = True
            else:
                self._note_line_ending(bytes(buffer[line_start:line_end]))
            blank = line_start == self._line_start
            self._line_start = position = line_end
            if blank:
                events.append(self._parse(bytes(buffer[event_start:line_end]), complete=True))
                event_start = line_end
                if self._after_cr:
                    self._after_cr_closed_event = True
        if event_start:
            del buffer[:event_start]
            position -= event_start
            self._line_start -= event_start
        self._scan_from = len(buffer) if position < len(buffer) else position
        self.idle = not buffer and not self._after_cr and not self._at_stream_start
        return events

    def receive_end(self) -> Event | None:
        """Mark the end of the stream. Returns the incomplete event left over, or None."""
        if self._ended:
            raise LocalProtocolError("receive_end() called twice; the stream already ended")
        self._ended = True
        self.idle = False
        if not self._buffer:
            return None
        leftover = self._parse(bytes(self._buffer), complete=False)
        self._buffer.clear()
        return leftover

    def split_events(self, data: bytes) -> list[bytes] | None:
        """`data` cut after each blank line in the stream's line ending (LF or CRLF), when that
        makes more than one part; else None (one event or less, the ending not known yet, a
        stream of lone CRs, a JSON array). A guess that needs no framing, for the repair's fast
        path, which takes a piece that is one whole event: whatever a part really is, the framer
        frames the same events however its input is split."""
        ending = self.line_ending
        if ending != b"\n" and ending != b"\r\n":
            return None
        blank = ending + ending
        first = data.find(blank)
        if first < 0 or first + len(blank) == len(data):  # (found first: no copy of a long event)
            return None
        parts = data.split(blank)
        last = parts.pop()
        return [part + blank for part in parts] + ([last] if last else [])

    @property
    def held_bytes(self) -> int:
        """How many bytes of the current, incomplete event are held."""
        return len(self._buffer)

    def take_buffered(self) -> bytes:
        """Ends framing and returns the bytes held for the incomplete event (for a caller that
        gives up on framing and passes everything on unchanged from here)."""
        self._ended = True
        self.idle = False
        held = bytes(self._buffer)
        self._buffer.clear()
        return held

    def _note_line_ending(self, ending: bytes) -> None:
        if self.line_ending is None:
            self.line_ending = ending

    def _parse(self, raw: bytes, *, complete: bool) -> Event:
        text = raw
        if self._at_stream_start:
            self._at_stream_start = False
            if text.startswith(_BOM):
                text = text[len(_BOM) :]
        data_lines: list[bytes] = []
        event_type: bytes | None = None
        for line in text.splitlines():  # CRLF, CR and LF, as `_LINE_END` (faster on a long event)
            if not line or line[:1] == b":":
                continue
            name, colon, value = line.partition(b":")
            if colon and value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                data_lines.append(value)
            elif name == b"event":
                event_type = value
        data = b"\n".join(data_lines) if data_lines else None
        return Event(raw=raw, data=data, event_type=event_type, complete=complete)
