"""Framing for Gemini's two stream forms: Server-Sent Events (`alt=sse`) or one JSON array streamed
element by element (no `alt`, `application/json`).

Theory of operation
-------------------
Without `alt=sse` Gemini streams one JSON array, `[{…}` then `,\\r\\n{…}` per chunk, then `]`
(docs/repair-rules.md, G-rules; shared/notes/gemini.md §1). The first byte that is not whitespace
(or a UTF-8 byte order mark) decides the form: `[` is the array, anything else is SSE, framed by
`EventFramer` itself. So one framer serves the one repair machine for both forms, and the rules read
each piece as an `Event` either way:

* an element -> `ArrayPiece(raw, data)`: `raw` is every byte since the previous piece (the `[` or
  the `,` and whitespace before the element, then the element), `data` the element's own bytes;
* the closing `]` -> `ArrayPiece(raw, data=b"]", closes=True)` (with the whitespace before it);
* anything after the `]`, or a value at the top of the array that is not an object or an array
  (never Gemini's), -> passed on: after the `]` as field-less events (`data=None`); a value that is
  not an element as one event whose data is its bytes as they came (not JSON: the stream is booked
  `malformed`, rule C8), and everything after it likewise.

Concatenating the `raw` of every piece, in order, gives back the input, as with `EventFramer`. An
element is found by counting brackets outside strings (a string's escapes skipped), with a regex
jumping to the next byte that matters, so a 10 MB element fed a byte at a time stays linear.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._errors import LocalProtocolError
from ._sse import Event, EventFramer

__all__ = ["ArrayPiece", "GeminiFramer"]

_BOM = b"\xef\xbb\xbf"
_WHITESPACE = b" \t\r\n"
# Outside a string: the bytes that open or close a value or start a string.
_STRUCTURE = re.compile(rb'[][{}"]')
# Inside a string: its end, or an escape (whose next byte is skipped).
_STRING = re.compile(rb'["\\]')


@dataclass(frozen=True, slots=True, kw_only=True)
class ArrayPiece(Event):
    """One element of a JSON-array stream (or its closing `]`, `closes`), as it arrived."""

    closes: bool = False


class GeminiFramer(EventFramer):
    """Frames a Gemini stream in whichever form its first byte shows (see the module's header)."""

    def __init__(self) -> None:
        super().__init__()
        # None until the first byte that is not whitespace: "sse" or "array".
        self._form: str | None = None
        # Array form: the bytes not yet sent as a piece, and how far they were scanned.
        self._held = bytearray()
        self._scan = 0
        self._opened = False  # the `[` was read
        self._closed = False  # the `]` was read: what follows passes as it comes
        self._opaque = False  # a value that is not an element: everything from it passes as data
        self._depth = 0
        self._in_string = False
        self._value_start = 0
        self._array_ended = False

    @property
    def json_array(self) -> bool:
        """Whether the stream showed itself as a JSON array."""
        return self._form == "array"

    def receive_data(self, data: bytes) -> list[Event]:
        if self._form == "sse":
            return super().receive_data(data)
        if self._array_ended:
            raise LocalProtocolError(f"receive_data() got {len(data)} bytes after receive_end(); the stream already ended")
        if self._form is None:
            self._held += data
            start = _start_of_content(self._held)
            if start is None:
                return []
            if self._held[start : start + 1] != b"[":
                self._form = "sse"
                held = bytes(self._held)
                self._held.clear()
                return super().receive_data(held)
            self._form = "array"
            return self._frame_array()
        self._held += data
        return self._frame_array()

    def receive_end(self) -> Event | None:
        if self._form != "array":
            if self._form is None:
                self._form = "sse"
                held = bytes(self._held)
                self._held.clear()
                if held:
                    # Only whitespace came: SSE, whose framer notes its line ending (for what the
                    # machine appends). Its blank lines are no event and a line of spaces an
                    # incomplete one: all of it is the leftover, as it came (the fuzz contracts
                    # found a body of one LF: framed as a field-less event, it was lost here).
                    super().receive_data(held)
                    super().receive_end()
                    return Event(raw=held, data=None, complete=False)
            return super().receive_end()
        if self._array_ended:
            raise LocalProtocolError("receive_end() called twice; the stream already ended")
        self._array_ended = True
        self.idle = False
        if not self._held:
            return None
        # An element cut short: never JSON, so the machine drops it before what it appends.
        leftover = ArrayPiece(raw=bytes(self._held), data=None, complete=False)
        self._held.clear()
        return leftover

    @property
    def held_bytes(self) -> int:
        if self._form == "sse":
            return super().held_bytes
        return len(self._held)

    def take_buffered(self) -> bytes:
        if self._form == "sse":
            return super().take_buffered()
        self._array_ended = True
        self.idle = False
        held = bytes(self._held)
        self._held.clear()
        return held

    # -- the array form -------------------------------------------------------------------------

    def _frame_array(self) -> list[Event]:
        held = self._held
        pieces: list[Event] = []
        if self._closed or self._opaque:
            if held:
                raw = bytes(held)
                held.clear()
                pieces.append(ArrayPiece(raw=raw, data=raw if self._opaque else None))
            return pieces
        position = self._scan
        cut = 0  # where the next piece starts
        size = len(held)
        while position < size:
            if self._depth:
                if self._in_string:
                    match = _STRING.search(held, position)
                    if match is None:
                        position = size
                        break
                    if match.group() == b"\\":
                        if match.end() >= size:  # the escaped byte is still to come
                            position = match.start()
                            break
                        position = match.end() + 1
                        continue
                    self._in_string = False
                    position = match.end()
                    continue
                match = _STRUCTURE.search(held, position)
                if match is None:
                    position = size
                    break
                byte = match.group()
                position = match.end()
                if byte == b'"':
                    self._in_string = True
                elif byte in (b"{", b"["):
                    self._depth += 1
                else:
                    self._depth -= 1
                    if not self._depth:
                        pieces.append(ArrayPiece(raw=bytes(held[cut:position]), data=bytes(held[self._value_start : position])))
                        cut = position
                continue
            here = bytes(held[position : position + 1])
            if here in (b" ", b"\t", b"\r", b"\n", b","):
                position += 1
            elif not self._opened:
                if held.startswith(_BOM, position):
                    position += len(_BOM)
                    continue
                self._opened = True  # (the form was chosen on this `[`)
                position += 1
            elif here in (b"{", b"["):
                self._depth = 1
                self._value_start = position
                position += 1
            elif here == b"]":
                position += 1
                pieces.append(ArrayPiece(raw=bytes(held[cut:position]), data=b"]", closes=True))
                cut = position
                self._closed = True
                break
            else:
                self._opaque = True
                break
        del held[:cut]
        self._scan = position - cut
        self._value_start -= cut  # (an element still open started after the last piece's end)
        if (self._closed or self._opaque) and held:
            pieces.extend(self._frame_array())
        # Between two elements with nothing held: a piece that is a comma and one whole element
        # frames as exactly itself, and leaves the framer as it was (the repair's fast path).
        self.idle = not held and self._opened and not self._depth and not (self._closed or self._opaque)
        return pieces


def _start_of_content(data: bytearray) -> int | None:
    """Where the first byte that is not whitespace (nor the byte order mark) is, or None yet."""
    position = 3 if data.startswith(_BOM) else 0
    if len(data) < 3 and _BOM.startswith(bytes(data)) and data:
        return None  # maybe the start of a byte order mark
    while position < len(data):
        if data[position] not in _WHITESPACE:
            return position
        position += 1
    return None
