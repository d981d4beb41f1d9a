"""The fast path for the chunks almost every stream is made of: routine text deltas.

Theory of operation
-------------------
Nearly every event of a chat-completion stream is the one before it with only the text changed:

    data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null}]}

Parsing each one as JSON costs more than everything else finish_fix does per event, and a proxy in
front of a gateway sees every token of every user. So once the full path has parsed a chunk and
found it routine (`_routine_facts`: one choice, no finish_reason, no error, no usage, a text delta
and nothing else that counts), `RoutineChunks.learn` takes its *shape*: the event's exact bytes with
the text value cut out (and OpenAI's per-chunk `obfuscation` padding, which changes on every chunk):
the literal byte segments between the gaps. A piece matches when it is those segments, in order, with
one JSON string (`_JSON_STRING`, compiled once for all streams) in each gap. Nothing is compiled per
stream: every stream has its own `id`, and compiling a pattern for each would cost a millisecond.

A piece of the body that matches a shape whole is, byte for byte, the learned event with other JSON
strings in the gaps. A JSON string is one token: putting another one in its place changes the parsed
value there and nothing else. So the full path would treat the piece exactly as it treated the
learned chunk, except for what depends on the text, which is only whether it is empty (the first
token). That, and the choice index, is what `maybe_match` gives back; the repair machine applies the
same bookkeeping its full path would (`StreamRepair._on_routine_piece`). Once a match leaves that
bookkeeping nothing to record but the counts (the first token seen, no finish injected before it),
the machine checks the next pieces against the shape in `receive_data` itself: its steady path
(`RoutineMatch.steady`), the same match for plain ASCII text, one frame fewer. Anything else, or anything
unusual (another shape, a finish_reason, a tool call, `\\r` inside, a split event, a piece holding two
events), goes the full path, which is always right; the fast path only has to be right when it says
yes. `tests/test_core_fast_path.py` checks that both paths give the same bytes and report for
generated streams, realistic and adversarial.

Where the gaps are is read from the parse, never guessed from the bytes: each candidate place (a
`"content"` key followed by a string, say) is checked by parsing the event once more with a probe
string put there and comparing with the chunk as it should then be. A candidate inside another
string, or a value the parser drops because its key comes twice, fails that check.

`_JSON_STRING` accepts a subset of what `json.loads` accepts: escapes as JSON has them, no control
characters, strictly valid UTF-8 (no encoded surrogates). A string outside that subset is simply not
matched and goes the full path.

Learning costs a few parses; a stream whose chunks never repeat a shape (an `id` that changes on
every chunk) would pay that on every chunk, so learning stops once attempts outrun hits
(`_LEARN_FREE`, `_EVENTS_PER_LEARN`).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["RoutineChunks", "RoutineMatch", "TEXT_DELTA_KEYS", "match_plain_text"]

# Delta keys whose string value is the model's text. One of them is the gap; every other delta key
# of a routine chunk must be falsy (so nothing else makes it a "token"), except `role`.
TEXT_DELTA_KEYS = ("content", "reasoning_content", "reasoning", "refusal")
# Top-level keys whose string value may change on every chunk and that the repair never reads.
# OpenAI pads every stream chunk with a random `obfuscation` string (stream_options.include_obfuscation).
_FREE_TOP_LEVEL_KEYS = ("obfuscation",)
# Fields the repair remembers from every chunk for the finishing events it may inject.
_REMEMBERED_KEYS = ("id", "created", "model", "system_fingerprint")

_ASCII_CHARS = rb"[\x20\x21\x23-\x5b\x5d-\x7f]++"
_ESCAPE = rb'\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}'
_UTF8_SEQUENCE = (
    rb"[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]|[\xe1-\xec\xee\xef][\x80-\xbf]{2}"
    rb"|\xed[\x80-\x9f][\x80-\xbf]|\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}"
    rb"|\xf4[\x80-\x8f][\x80-\xbf]{2}"
)
_JSON_CHAR = rb"(?:" + _ASCII_CHARS + rb"|" + _ESCAPE + rb"|" + _UTF8_SEQUENCE + rb")"
_JSON_STRING = rb'"' + _JSON_CHAR + rb'*+"'
# The text gap: the empty string, or a non-empty one as group 1 (so `lastindex` says which); plain
# ASCII text, the usual token, is tried first because it matches in a third less time.
_TEXT_GAP = rb'(?:""|("' + _ASCII_CHARS + rb'"|"' + _JSON_CHAR + rb'++"))'
_TEXT_GAP_PATTERN = re.compile(_TEXT_GAP)
_TEXT_GAP_FULLMATCH = _TEXT_GAP_PATTERN.fullmatch
# The usual token alone: `match_plain_text(piece, start, end)` is not None when piece[start:end] is one
# non-empty JSON string of plain ASCII text. The hottest line of finish_fix in a profiled mitmdump is
# this check (here and on the repair machine's steady path, `RoutineMatch.steady`), and a pattern
# without alternation or group runs it in less time and needs no `lastindex`; anything else is left
# to `_TEXT_GAP`.
match_plain_text = re.compile(rb'"' + _ASCII_CHARS + rb'"').fullmatch
_JSON_STRING_PATTERN = re.compile(_JSON_STRING)
_JSON_SPACE = rb"[ \t]*"  # no CR or LF: those would end the SSE line
_PROBE = "finishline probe \u00e9"
_PROBE_TOKEN = json.dumps(_PROBE).encode()

# `"key": "value"` for each key whose string value may be a gap, the value as group 1.
_KEY_WITH_STRING_VALUE = {
    key: re.compile(re.escape(json.dumps(key).encode()) + _JSON_SPACE + b":" + _JSON_SPACE + b"(" + _JSON_STRING + b")")
    for key in TEXT_DELTA_KEYS + _FREE_TOP_LEVEL_KEYS
}

# At most this many shapes per stream (the role chunk's and the text chunks', one per choice of n>1).
_MAX_SHAPES = 4
# Learning attempts allowed at once, and then at most one per this many events of the stream.
_LEARN_FREE = 8
_EVENTS_PER_LEARN = 16


class RoutineMatch:
    """What the full path would have learned from a matched piece.

    Attributes:
        index: the choice index.
        remembered: the chunk's `id`, `created`, `model`, `system_fingerprint` (those present).
        has_text: whether the text is non-empty (the delta then counts as a token).
        steady: for a shape with the text as its only gap, (prefix, suffix, where the text starts,
            the suffix's length): a piece is this shape with plain text when it starts with the
            prefix, ends with the suffix and `match_plain_text` finds the text between them. None for
            a shape with more gaps.
    """

    __slots__ = ("index", "remembered", "has_text", "steady")

    def __init__(self, index: int, remembered: dict[str, Any]) -> None:
        self.index = index
        self.remembered = remembered
        self.has_text = False
        self.steady: tuple[bytes, bytes, int, int] | None = None


class _Shape:
    """The literal segments of a learned event around its gaps, and what a match of it means.

    With one gap (the text), `prefix` + text + `suffix`; with more, `segments` (one more than the
    gaps) and which gap is the text."""

    __slots__ = ("prefix", "suffix", "text_start", "suffix_length", "segments", "text_gap", "result")

    def __init__(self, segments: list[bytes], text_gap: int, result: RoutineMatch) -> None:
        self.segments = segments if len(segments) > 2 else None
        self.prefix = segments[0]
        self.suffix = segments[-1]
        self.text_start = len(self.prefix)
        self.suffix_length = len(self.suffix)
        self.text_gap = text_gap
        self.result = result
        if self.segments is None:
            result.steady = (self.prefix, self.suffix, self.text_start, self.suffix_length)

    def maybe_has_text(self, piece: bytes) -> bool | None:
        """None if `piece` is not this shape; else whether its text is non-empty."""
        if not (piece.startswith(self.prefix) and piece.endswith(self.suffix)):
            return None
        if self.segments is None:
            match = _TEXT_GAP_PATTERN.fullmatch(piece, self.text_start, len(piece) - self.suffix_length)
            return None if match is None else match.lastindex is not None
        return self._maybe_has_text_in_gaps(piece)

    def _maybe_has_text_in_gaps(self, piece: bytes) -> bool | None:
        segments = self.segments
        position = self.text_start
        has_text = None
        last_gap = len(segments) - 2
        for gap in range(last_gap + 1):
            if gap == self.text_gap:
                match = _TEXT_GAP_PATTERN.match(piece, position)
                if match is None:
                    return None
                has_text = match.lastindex is not None
            else:
                match = _JSON_STRING_PATTERN.match(piece, position)
                if match is None:
                    return None
            position = match.end()
            if gap == last_gap:
                break
            segment = segments[gap + 1]
            if not piece.startswith(segment, position):
                return None
            position += len(segment)
        return has_text if position == len(piece) - self.suffix_length else None


class RoutineChunks:
    """The routine chunk shapes of one stream: learned from fully parsed events, matched on pieces."""

    __slots__ = ("_shapes", "_attempts", "_enabled")

    def __init__(self, *, enabled: bool = True) -> None:
        """`enabled=False` never learns, so nothing ever matches (the full path for every event)."""
        self._shapes: list[_Shape] = []
        self._attempts = 0
        self._enabled = enabled

    @property
    def learned(self) -> bool:
        return bool(self._shapes)

    def maybe_match(self, piece: bytes) -> RoutineMatch | None:
        """The match, if `piece` is exactly one event of a learned shape; else None. The returned
        object is reused by the next match of the same shape."""
        shapes = self._shapes
        if not shapes:
            return None
        shape = shapes[0]
        if shape.segments is None:  # the usual shape, checked here without another call
            if piece.startswith(shape.prefix) and piece.endswith(shape.suffix):
                end = len(piece) - shape.suffix_length
                if match_plain_text(piece, shape.text_start, end) is not None:
                    has_text = True
                else:
                    match = _TEXT_GAP_FULLMATCH(piece, shape.text_start, end)
                    has_text = None if match is None else match.lastindex is not None
            else:
                has_text = None
        else:
            has_text = shape.maybe_has_text(piece)
        if has_text is None:
            for position in range(1, len(shapes)):
                has_text = shapes[position].maybe_has_text(piece)
                if has_text is not None:  # the shape seen last is tried first next time
                    shape = shapes.pop(position)
                    shapes.insert(0, shape)
                    break
            else:
                return None
        result = shape.result
        result.has_text = has_text
        return result

    def learn(self, raw: bytes, data: bytes, chunk: Any, events: int) -> None:
        """Called by the full path with an event it read (`raw`, its `data` field), the parsed
        chunk and the stream's event count so far, after handling it. Learns its shape if it is
        routine and new, within the learning budget. Never raises."""
        attempts = self._attempts
        if not self._enabled or (attempts >= _LEARN_FREE and events < _EVENTS_PER_LEARN * attempts):
            return
        facts = _routine_facts(chunk)
        if facts is None:
            return
        ending = raw[len(b"data: ") + len(data) :]
        if (
            not raw.startswith(b"data: ")
            or raw[len(b"data: ") : len(b"data: ") + len(data)] != data
            or ending not in (b"\n\n", b"\r\n\r\n")
            or b"\n" in data
            or b"\r" in data
        ):
            return
        if any(shape.maybe_has_text(raw) is not None for shape in self._shapes):
            return
        self._attempts += 1
        try:
            shape = _maybe_shape(raw, data, chunk, facts)
        except (ValueError, RecursionError, TypeError, KeyError, IndexError):
            shape = None
        if shape is None:
            return
        self._shapes.insert(0, shape)
        del self._shapes[_MAX_SHAPES:]


def _routine_facts(chunk: Any) -> tuple[int, str, str | None] | None:
    """(choice index, the text key, the free top-level key or None) if the full path's handling of
    `chunk` depends on nothing but whether its text is empty; else None."""
    if type(chunk) is not dict or chunk.get("error") is not None or isinstance(chunk.get("usage"), dict):
        return None
    choices = chunk.get("choices")
    if type(choices) is not list or len(choices) != 1 or type(choices[0]) is not dict:
        return None
    choice = choices[0]
    index = choice.get("index", 0)
    if type(index) is not int or choice.get("finish_reason") is not None:
        return None
    delta = choice.get("delta")
    if type(delta) is not dict:
        return None
    text_key = next((key for key in TEXT_DELTA_KEYS if type(delta.get(key)) is str), None)
    if text_key is None:
        return None
    if any(value for key, value in delta.items() if key != text_key and key != "role"):
        return None
    free_key = next((key for key in _FREE_TOP_LEVEL_KEYS if type(chunk.get(key)) is str), None)
    return index, text_key, free_key


def _maybe_shape(raw: bytes, data: bytes, chunk: dict, facts: tuple[int, str, str | None]) -> _Shape | None:
    index, text_key, free_key = facts
    delta = chunk["choices"][0]["delta"]
    text_gap = _maybe_gap(data, chunk, text_key, delta)
    if text_gap is None:
        return None
    gaps = [(text_gap, True)]
    if free_key is not None:
        free_gap = _maybe_gap(data, chunk, free_key, chunk)
        if free_gap is None:
            return None
        gaps.append((free_gap, False))
    gaps.sort()
    segments = []
    position = -len(b"data: ")  # offsets in `data`; the first segment starts with the field name
    text_gap = 0
    for number, ((start, end), is_text) in enumerate(gaps):
        segments.append(raw[len(b"data: ") + position : len(b"data: ") + start])
        if is_text:
            text_gap = number
        position = end
    segments.append(raw[len(b"data: ") + position :])
    remembered = {key: chunk[key] for key in _REMEMBERED_KEYS if key in chunk}
    shape = _Shape(segments, text_gap, RoutineMatch(index, remembered))
    if shape.maybe_has_text(raw) is None:  # the learned event itself must match its shape
        return None
    return shape


def _maybe_gap(data: bytes, chunk: dict, key: str, holder: dict) -> tuple[int, int] | None:
    """The byte span of `holder[key]`'s string token in `data`, proven by a probe parse."""
    candidates = _KEY_WITH_STRING_VALUE[key].finditer(data)
    original = holder[key]
    for candidate in candidates:
        start, end = candidate.span(1)
        probed = json.loads(data[:start] + _PROBE_TOKEN + data[end:])
        probed_holder = probed["choices"][0]["delta"] if holder is not chunk else probed
        if type(probed_holder) is not dict or probed_holder.get(key) != _PROBE:
            continue
        probed_holder[key] = original
        if probed == chunk:
            return start, end
    return None
