"""finish_fix's books: the ledger file and the bounded copy of what each client was sent.

Plain Python, no mitmproxy types beyond reading a flow's request line and response status."""

from __future__ import annotations

import json
import logging
import re
import time
from collections import deque
from typing import IO

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

    `add` runs for every piece sent to a client, so it never touches the kept tail: pieces are
    appended to a small buffer, which becomes one block of the tail every `_BLOCK` bytes, and whole
    blocks leave the front of the tail while the rest still fills its half of the limit (only
    `value` cuts into a block). Keeping the pieces themselves instead would hold thousands of small
    objects per stream, which measurably slows the whole proxy. So up to the limit plus two blocks
    may be held for a moment."""

    _BLOCK = 64 * 1024

    def __init__(self, limit: int, *, plain: bool = True) -> None:
        self.limit = limit
        self.plain = plain
        self._head = bytearray()
        self._head_limit = limit // 2 if plain else limit
        self._head_full = limit == 0
        self._keeps_tail = limit > 0 and plain
        self._recent = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self._tail_limit = limit - self._head_limit
        self._omitted = 0

    def add(self, data: bytes) -> None:
        if self._head_full:
            if self._keeps_tail:
                recent = self._recent
                recent += data
                if len(recent) >= self._BLOCK:
                    self._seal_block()
            return
        room = self._head_limit - len(self._head)
        self._head += data[:room]
        if len(data) < room:
            return
        self._head_full = True
        if len(data) > room:
            self.add(data[room:])

    def _seal_block(self) -> None:
        """Moves the recent pieces into the tail as one block; drops the blocks no longer needed."""
        if self._recent:
            self._tail.append(bytes(self._recent))
            self._tail_bytes += len(self._recent)
            self._recent.clear()
        tail = self._tail
        while tail and self._tail_bytes - len(tail[0]) >= self._tail_limit:
            dropped = len(tail.popleft())
            self._tail_bytes -= dropped
            self._omitted += dropped

    def value(self) -> bytes:
        self._seal_block()
        tail = b"".join(self._tail)
        excess = len(tail) - self._tail_limit
        if excess > 0:  # the rest of the tail's first block is left out too
            tail = tail[excess:]
            self._omitted += excess
        self._tail = deque([tail])
        self._tail_bytes = len(tail)
        if not self._omitted:
            return bytes(self._head) + tail
        note = f"\n\n: finish_fix: {self._omitted} bytes of this stream are not kept here\n\n".encode()
        return bytes(self._head) + note + tail


class Ledger:
    """Appends one JSON line per flow. Holds the file open and flushes each line, so a crash loses
    at most the flow being written."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[str] = open(path, "a", encoding="utf-8")
        self._failed = False

    def write(self, flow, record: dict) -> None:
        """Appends the flow's line. A failing disk is logged once and never breaks the flow."""
        try:
            self._file.write(json.dumps(self._line(flow, record)) + "\n")
            self._file.flush()
        except (OSError, ValueError) as error:
            if not self._failed:
                self._failed = True
                logger.error(f"finish_fix: cannot write the ledger {self.path!r} ({error}); flows go unbooked")

    def _line(self, flow, record: dict) -> dict:
        request = flow.request
        return {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(request.timestamp_start)),
            "method": request.method,
            "url": url_without_query(flow),
            "status": flow.response.status_code if flow.response is not None else None,
            "model": record.get("model"),
            "verdict": record["verdict"],
            "detail": record["detail"],
            "events": record.get("events"),
            "upstream_bytes": record.get("upstream_bytes"),
            "client_bytes": record.get("client_bytes", record.get("bytes")),
            "time_to_first_event": _seconds(record.get("time_to_first_event")),
            "duration": _seconds(record.get("duration")),
            "injected": record.get("injected", []),
            "repairs": record.get("repairs", []),
        }

    def close(self) -> None:
        self._file.close()


def url_without_query(flow) -> str:
    return flow.request.pretty_url.partition("?")[0]


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
