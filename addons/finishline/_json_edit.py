"""The core's one JSON editor: change a few values of a JSON text and leave every other byte as it came.

Theory of operation
-------------------
A repair that corrects a value (a finish reason, a status, a missing index) should change that value
and nothing else: the client, a cache or a diff then sees the upstream's own bytes around it. So the
editor walks the text's tokens (`_TOKEN`: strings with their escapes, structure, bare literals),
keeps the path of the value it is at (object keys and array positions from the top), and splices:

* a path the text has: its value's bytes are replaced (a whole object or array too);
* a path the text lacks, whose parent object is there: the member is added at the end of that
  object, in the object's own spacing (`": "` or `":"`).

The editor never decides whether its result is right: every caller parses the result back and
compares it with the value it meant (`rewrite_event` does that for an SSE event), and where the edit
cannot be made in place (a text the walk cannot follow, a parent that is not there, an event whose
data spans several `data:` lines) the value is written anew, its other fields kept. Used by rules
C2, C9, C11, M7, M8, R6, R7 and R8 (docs/repair-rules.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ._injected import sse_event
from ._json import json_or_unreadable
from ._sse import Event, EventFramer

__all__ = ["JsonPath", "edit_json", "rewrite_event"]

#: A value's place in a JSON text: object keys and array positions, from the top.
JsonPath = tuple[str | int, ...]

# JSON tokens: strings (with escapes), structure, and bare literals (numbers, true/false/null).
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')
_LINE = re.compile(rb"(\r\n|\r|\n)")


class _Container:
    """An object or array the walk is inside."""

    __slots__ = ("is_object", "path", "key", "count", "keys", "replace_from")

    def __init__(self, is_object: bool, path: JsonPath, replace_from: int | None) -> None:
        self.is_object = is_object
        self.path = path
        self.key: str | None = None  # the member key just read (objects)
        self.count = 0  # the position of the next element (arrays), members so far (objects)
        self.keys: set[str] = set()
        # Where this container starts, when an edit replaces all of it (its end is where it closes).
        self.replace_from = replace_from

    def path_of_next(self) -> JsonPath:
        """The path of the value the walk reads next in this container."""
        step: str | int = self.count if not self.is_object or self.key is None else self.key
        return (*self.path, step)


def edit_json(text: bytes, edits: Mapping[JsonPath, bytes]) -> bytes | None:
    """`text` with each path's value set to the given JSON text (replaced where it is, else added
    at the end of its parent object), or None when the walk cannot follow `text` or an edit's
    parent object is not in it. The caller checks the result by parsing it back."""
    pending = dict(edits)
    splices: list[tuple[int, int, bytes]] = []
    stack: list[_Container] = []
    expect = "value"  # "value", "key", "colon" or "separator"
    spaced = b'": ' in text
    for match in _TOKEN.finditer(text):
        token = match.group()
        top = stack[-1] if stack else None
        if expect == "key":
            if token == b"}" and top is not None and top.is_object and top.count == 0:
                _close(text, match, stack, pending, splices, spaced)
                expect = "separator"
                continue
            if not token.startswith(b'"') or top is None:
                return None
            key = json_or_unreadable(token)
            if not isinstance(key, str):
                return None
            top.key = key
            top.keys.add(key)
            expect = "colon"
        elif expect == "colon":
            if token != b":":
                return None
            expect = "value"
        elif expect == "value":
            if token == b"]" and top is not None and not top.is_object and top.count == 0:
                _close(text, match, stack, pending, splices, spaced)
                expect = "separator"
                continue
            if token in (b"}", b"]", b":", b","):
                return None
            path = () if top is None else top.path_of_next()
            replacement = pending.pop(path, None)
            if token in (b"{", b"["):
                stack.append(_Container(token == b"{", path, match.start() if replacement is not None else None))
                if replacement is not None:
                    pending[path] = replacement  # spliced when the container closes
                expect = "key" if token == b"{" else "value"
                continue
            if replacement is not None:
                splices.append((match.start(), match.end(), replacement))
            expect = "separator"
        else:  # separator: after a value, a comma or the container's close
            if top is None:
                return None  # a second value at the top
            if token == b",":
                top.count += 1
                expect = "key" if top.is_object else "value"
            elif token == (b"}" if top.is_object else b"]"):
                if top.is_object:
                    top.count += 1
                _close(text, match, stack, pending, splices, spaced)
            else:
                return None
    if stack or expect != "separator" or pending:
        return None
    for start, end, replacement in sorted(splices, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _close(
    text: bytes,
    match: re.Match[bytes],
    stack: list[_Container],
    pending: dict[JsonPath, bytes],
    splices: list[tuple[int, int, bytes]],
    spaced: bool,
) -> None:
    """The container on top of `stack` closes at `match`: add its missing members, or replace it whole."""
    container = stack.pop()
    if container.replace_from is not None:
        # Edits inside a container that is replaced whole are moot: the replacement is the value.
        for path in [path for path in pending if path[: len(container.path)] == container.path and path != container.path]:
            del pending[path]
        splices[:] = [splice for splice in splices if not container.replace_from <= splice[0] < match.end()]
        splices.append((container.replace_from, match.end(), pending.pop(container.path)))
        return
    if not container.is_object:
        return
    depth = len(container.path) + 1
    added = [
        (path[-1], value)
        for path, value in pending.items()
        if len(path) == depth and path[:-1] == container.path and isinstance(path[-1], str) and path[-1] not in container.keys
    ]
    if not added:
        return
    colon = b": " if spaced else b":"
    comma = b", " if spaced else b","
    members = comma.join(json.dumps(key).encode() + colon + value for key, value in added)
    for key, _ in added:
        del pending[(*container.path, key)]
    # A member goes right after the last value, before any whitespace ahead of the close.
    at = match.start()
    while at > 0 and text[at - 1 : at] in (b" ", b"\t", b"\n", b"\r"):
        at -= 1
    splices.append((at, at, (comma if container.count else b"") + members))


# A UTF-8 byte order mark, which may open a stream (WHATWG: ignored; `_sse`).
_BOM = b"\xef\xbb\xbf"


def rewrite_event(
    event: Event, edits: Mapping[JsonPath, bytes], expected: Any, line_ending: bytes, *, event_type: str | None = None
) -> bytes:
    """`event` with its JSON data edited by `edit_json` and, with `event_type`, its `event:` field
    renamed, every other byte as it came. `expected` is the data as it must parse afterwards: the
    edited event is framed and parsed back, and where it does not read so (or the edit cannot be
    made in place) the event is written anew (`sse_event`) with its other fields kept. A byte order
    mark that opens the stream stays in front, outside the fields (else the first field's name
    would not read as one, and the event would be written with its old data line kept as another
    field: two data lines, whose join is not JSON)."""
    bom = _BOM if event.raw.startswith(_BOM) else b""
    pieces = _LINE.split(event.raw[len(bom) :])
    lines, endings = pieces[0::2], pieces[1::2]
    data_at = [number for number, line in enumerate(lines) if line == b"data" or line.startswith(b"data:")]
    if len(data_at) == 1:
        line = lines[data_at[0]]
        start = 6 if line.startswith(b"data: ") else 5
        edited = edit_json(line[start:], edits)
        if edited is not None:
            lines[data_at[0]] = line[:start] + edited
            if event_type is not None:
                lines = [b"event: " + event_type.encode() if _is_field(line, b"event") else line for line in lines]
            raw = bom + b"".join(line + ending for line, ending in zip(lines, [*endings, b""], strict=True))
            again = EventFramer().receive_data(raw)
            wanted_type = event_type.encode() if event_type is not None else event.event_type
            if len(again) == 1 and again[0].event_type == wanted_type and json_or_unreadable(again[0].data) == expected:
                return raw
    other_fields = tuple(
        line
        for line in lines
        if line and not _is_field(line, b"data") and not (event_type is not None and _is_field(line, b"event"))
    )
    return bom + sse_event(expected, line_ending, event=event_type, extra_lines=other_fields)


def _is_field(line: bytes, name: bytes) -> bool:
    return line == name or line.startswith(name + b":")
