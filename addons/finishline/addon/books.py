"""finish_fix's books: the ledger file and the bounded copy of what each client was sent.

Plain Python, no mitmproxy types beyond reading a flow's request line and response status."""

from __future__ import annotations

import json
import logging
import re
import time
from collections import deque
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from finishline import Booking

__all__ = ["BodyCopy", "Ledger", "parse_size", "url_without_query"]

logger = logging.getLogger(__name__)

_SIZE = re.compile(r"^\s*(\d+)\s*(b|kb|k|mb|m|gb|g)?\s*$", re.IGNORECASE)
_UNITS = {None: 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3}


def parse_size(text: str) -> int:
    """'4MB' -> 4194304. Raises ValueError naming the valid forms."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size; use a number of bytes or e.g. 512KB, 4MB, 0 for none")
    unit = match.group(2).lower() if match.group(2) else None
    return int(match.group(1)) * _UNITS[unit]


class BodyCopy:
    """Keeps at most `limit` bytes of a stream: all of it when it fits, else its first and last
    halves with an SSE comment in between saying how much was left out (so the copy still reads as
    an event stream, and the end, where streams go wrong, is always kept). A body that is not plain
    text (`plain=False`, e.g. gzip) cannot take a comment in its middle: only its start is kept.

    Adding runs for every piece sent to a client, so it only appends the piece to `pending` and
    counts its bytes in `held`; every `block` bytes `seal` joins what is pending into one block for
    the head while it has room and for the tail after that, and whole blocks leave the front of the
    tail while the rest still fills its half of the limit (only `value` cuts into a block). So each
    byte is copied once into a block and once into the value: a growing buffer would be copied
    again each time it outgrew its allocation (about eight times over, for a bytearray appended to
    piece by piece). Up to the limit plus two blocks may be held for a moment.

    `add(data)` is `pending.append(data)`, `held += len(data)`, then `seal()` once `held` reaches
    `block`: the stream callable does just that inline, since even one method call per piece shows
    in mitmdump's profile (`pending` stays the same list for the copy's whole life, so a reference
    to it stays good).
    """

    BLOCK = 64 * 1024

    __slots__ = (
        "limit",
        "plain",
        "block",
        "pending",
        "held",
        "_head",
        "_head_bytes",
        "_head_limit",
        "_keeps_tail",
        "_tail",
        "_tail_bytes",
        "_tail_limit",
        "_omitted",
    )

    def __init__(self, limit: int, *, plain: bool = True, block: int = BLOCK) -> None:
        self.limit = limit
        self.plain = plain
        self.block = block
        self.pending: list[bytes] = []
        self.held = 0  # the bytes in `pending`
        self._head: list[bytes] = []
        self._head_bytes = 0
        self._head_limit = limit // 2 if plain else limit
        self._keeps_tail = limit > 0 and plain
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self._tail_limit = limit - self._head_limit
        self._omitted = 0

    def add(self, data: bytes) -> None:
        self.pending.append(data)
        self.held += len(data)
        if self.held >= self.block:
            self.seal()

    def seal(self) -> None:
        """Moves the pending bytes into the head and the tail; drops the tail blocks no longer needed."""
        pending = self.pending
        self.held = 0
        if not pending:
            return
        block = b"".join(pending)
        pending.clear()
        room = self._head_limit - self._head_bytes
        if room >= len(block):  # the usual case, a short stream: all of it, without a slice's copy
            self._head.append(block)
            self._head_bytes += len(block)
            return
        if room > 0:
            self._head.append(block[:room])
            self._head_bytes += room
            block = block[room:]
        if block and self._keeps_tail:
            self._tail.append(block)
            self._tail_bytes += len(block)
        tail = self._tail
        while tail and self._tail_bytes - len(tail[0]) >= self._tail_limit:
            dropped = len(tail.popleft())
            self._tail_bytes -= dropped
            self._omitted += dropped

    def value(self) -> bytes:
        if not self._head and not self._tail and self.held <= self._head_limit:
            # The usual short stream, still all pending: one copy of it.
            return b"".join(self.pending)
        self.seal()
        head = b"".join(self._head)
        self._head = [head]
        tail = b"".join(self._tail)
        excess = len(tail) - self._tail_limit
        if excess > 0:  # the rest of the tail's first block is left out too
            tail = tail[excess:]
            self._omitted += excess
        self._tail = deque([tail])
        self._tail_bytes = len(tail)
        if not self._omitted:
            return head + tail
        note = f"\n\n: finish_fix: {self._omitted} bytes of this stream are not kept here\n\n".encode()
        return head + note + tail


class Ledger:
    """Appends one JSON line per flow. Holds the file open and flushes each line, so a crash loses
    at most the flow being written."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[str] = open(path, "a", encoding="utf-8")
        self._failed = False

    def write(self, flow, booking: Booking) -> None:
        """Appends the flow's line. A failing disk is logged once and never breaks the flow."""
        try:
            self._file.write(json.dumps(self._line(flow, booking)) + "\n")
            self._file.flush()
        except (OSError, ValueError) as error:
            if not self._failed:
                self._failed = True
                logger.error(f"finish_fix: cannot write the ledger {self.path!r} ({error}); flows go unbooked")

    def _line(self, flow, booking: Booking) -> dict[str, Any]:
        # The request line and status are the flow's; every other key is the booking's own
        # (`Booking.to_json`), whichever path booked it.
        request = flow.request
        return {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(request.timestamp_start)),
            "method": request.method,
            "url": url_without_query(flow),
            "status": flow.response.status_code if flow.response is not None else None,
            **booking.to_json(),
        }

    def close(self) -> None:
        self._file.close()


def url_without_query(flow) -> str:
    return flow.request.pretty_url.partition("?")[0]
