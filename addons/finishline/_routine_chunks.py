"""The fast path for the chunks almost every stream is made of: routine text deltas.

Theory of operation
-------------------
Nearly every event of a chat-completion stream is the one before it with only the text changed:

    data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null}]}

Parsing each one as JSON costs more than everything else finish_fix does per event, and a proxy in
front of a gateway sees every token of every user. So once the full path has parsed a chunk and
found it routine (`_routine_facts.chat_facts`: one choice, no finish_reason, no error, no usage, a text delta
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
(`RoutineMatch.steady`), the same match for plain ASCII text, one frame fewer; for a shape with more
gaps (a Responses sequence number, OpenAI's padding), `_steady.SteadyShape`. Anything else, or anything
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

The other dialects have routine events too, and the same machinery learns them from a `RoutineSpec`
(`SPECS`, one per dialect: which parsed event is routine, where its text lives):

    event: content_block_delta
    data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}

    event: response.output_text.delta
    data: {"type":"response.output_text.delta","sequence_number":7,"item_id":"msg_1",...,"delta":"Hel"}

An `event:` line before the data is a literal part of the shape. A Responses event's
`sequence_number` changes on every event: it is a gap of its own, matched as a JSON integer
(`_JSON_INT`) and handed back (`RoutineMatch.number`), since the machine must know the last one.

A Gemini chunk (`_routine_facts.gemini_facts`) repeats a `usageMetadata` whose token counts change on every chunk by
any amount: each is a gap (`GAP_COUNT`) handed back by key (`RoutineMatch.counts`), as the rules keep
the last counts (rule G7, the books); its steady path is `_steady.counted_steady`. Its JSON-array
form is learned from its elements (`,\r\n{…}`: the separator and the element are the shape).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import cache
from typing import Any, NamedTuple, Protocol

from ._dialect import Dialect
from ._routine_facts import (
    COUNT_KEYS,
    FREE_TOP_LEVEL_KEYS,
    MESSAGES_TEXT_KEYS,
    NUMBER_KEY,
    TEXT_DELTA_KEYS,
    chat_facts,
    gemini_facts,
    gemini_text_part,
    gemini_usage,
    messages_facts,
    responses_facts,
)
from ._steady import (
    ASCII_CHARS,
    GAP_COUNT,
    GAP_NUMBER,
    GAP_STRING,
    GAP_TEXT,
    Steady,
    SteadyShape,
    counted_steady,
    match_plain_text,
)

__all__ = [
    "DECLINE",
    "FREE_TOP_LEVEL_KEYS",
    "JSON_INT_MATCH",
    "JSON_STRING_MATCH",
    "MAY_STEADY",
    "NOT_STEADY",
    "PROBE_NUMBER",
    "PROBE_TOKEN",
    "SPECS",
    "TEXT_GAP_MATCH",
    "RoutineChunks",
    "RoutineFacts",
    "RoutineMatch",
    "RoutineSpec",
    "Shape",
    "ShapeSource",
    "TEXT_DELTA_KEYS",
    "key_value_spans",
]

# What a dialect's rules tell the machine about a piece the fast path matched (`on_routine`).
DECLINE = 0  # the full path must read it
NOT_STEADY = 1  # handled; the steady path must not take the next pieces
MAY_STEADY = 2  # handled; the steady path may take the next pieces of this shape

# Fields the repair remembers from every chunk for the finishing events it may inject.
_REMEMBERED_KEYS = ("id", "created", "model", "system_fingerprint")

_ESCAPE = rb'\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}'
_UTF8_SEQUENCE = (
    rb"[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]|[\xe1-\xec\xee\xef][\x80-\xbf]{2}"
    rb"|\xed[\x80-\x9f][\x80-\xbf]|\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}"
    rb"|\xf4[\x80-\x8f][\x80-\xbf]{2}"
)
_JSON_CHAR = rb"(?:" + ASCII_CHARS + rb"|" + _ESCAPE + rb"|" + _UTF8_SEQUENCE + rb")"
_JSON_STRING = rb'"' + _JSON_CHAR + rb'*+"'
# The text gap: the empty string, or a non-empty one as group 1 (so `lastindex` says which); plain
# ASCII text, the usual token, is tried first because it matches in a third less time.
_TEXT_GAP = rb'(?:""|("' + ASCII_CHARS + rb'"|"' + _JSON_CHAR + rb'++"))'
_TEXT_GAP_PATTERN = re.compile(_TEXT_GAP)
_TEXT_GAP_FULLMATCH = _TEXT_GAP_PATTERN.fullmatch
_JSON_STRING_PATTERN = re.compile(_JSON_STRING)
# A gap's token at a position, of each kind (`_shape_book` matches its templates' gaps with these).
TEXT_GAP_MATCH = _TEXT_GAP_PATTERN.match
JSON_STRING_MATCH = _JSON_STRING_PATTERN.match
# A sequence number: a non-negative JSON integer, no exponent or fraction (json.loads gives an int).
_JSON_INT = rb"(?:0|[1-9][0-9]{0,17})"
_JSON_INT_PATTERN = re.compile(_JSON_INT)
JSON_INT_MATCH = _JSON_INT_PATTERN.match
# Each kind of gap's match (a count is an integer, as a sequence number is).
_GAP_MATCH = {GAP_TEXT: TEXT_GAP_MATCH, GAP_NUMBER: JSON_INT_MATCH, GAP_COUNT: JSON_INT_MATCH, GAP_STRING: JSON_STRING_MATCH}
# What comes before a JSON-array element that is not the first: the comma, and whitespace around it.
_ARRAY_SEPARATOR = re.compile(rb"[ \t\r\n]*,[ \t\r\n]*")
PROBE_NUMBER = 987654321
_JSON_SPACE = rb"[ \t]*"  # no CR or LF: those would end the SSE line
_PROBE = "finishline probe \u00e9"
PROBE_TOKEN = json.dumps(_PROBE).encode()

# `"key": "value"` for each key whose string value may be a gap, the value as group 1.
_KEY_WITH_STRING_VALUE = {
    key: re.compile(re.escape(json.dumps(key).encode()) + _JSON_SPACE + b":" + _JSON_SPACE + b"(" + _JSON_STRING + b")")
    for key in (*TEXT_DELTA_KEYS, *FREE_TOP_LEVEL_KEYS, *MESSAGES_TEXT_KEYS.values(), "delta")
}
_KEY_WITH_INT_VALUE = re.compile(
    re.escape(json.dumps(NUMBER_KEY).encode()) + _JSON_SPACE + b":" + _JSON_SPACE + b"(" + _JSON_INT + b")"
)

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
            the suffix's length, `match_plain_text`): a piece is this shape with plain text when it
            starts with the prefix, ends with the suffix and `match_plain_text` finds the text
            between them; for a shape with counts, the same with one pattern for its text, counts
            and literals between the prefix and the suffix (`_steady.counted_steady`). None for a
            shape with other gaps.
        number: the matched piece's `sequence_number` (Responses), else None.
        gapped_steady: for a shape with more gaps than the text (a sequence number, an
            `obfuscation` padding, or both), its `SteadyShape`: the steady path of that shape.
            None for a one-gap shape (that has `steady`), and for a shape with counts.
        counts: the matched piece's counts (Gemini's `usageMetadata` token counts), by key; None for a
            shape without counts.
    """

    __slots__ = ("index", "remembered", "has_text", "steady", "number", "gapped_steady", "counts")

    def __init__(self, index: int, remembered: dict[str, Any]) -> None:
        self.index = index
        self.remembered = remembered
        self.has_text = False
        self.steady: Steady | None = None
        self.number: int | None = None
        self.gapped_steady: SteadyShape | None = None
        self.counts: dict[str, int] | None = None


class Shape:
    """The literal segments of a learned event around its gaps, and what a match of it means.

    With one gap (the text), `prefix` + text + `suffix`; with more, `segments` (one more than the
    gaps), which gap is the text, and the key of each count gap (`count_keys`, by gap)."""

    __slots__ = ("prefix", "suffix", "text_start", "suffix_length", "segments", "text_gap", "number_gap", "result", "_gaps")

    def __init__(
        self, segments: list[bytes], kinds: list[str], result: RoutineMatch, count_keys: dict[int, str] | None = None
    ) -> None:
        count_keys = count_keys or {}
        self.segments = segments if len(segments) > 2 else None
        self.prefix = segments[0]
        self.suffix = segments[-1]
        self.text_start = len(self.prefix)
        self.suffix_length = len(self.suffix)
        self.text_gap = kinds.index(GAP_TEXT)
        self.number_gap = kinds.index(GAP_NUMBER) if GAP_NUMBER in kinds else -1
        self.result = result
        # Per gap, in order: its pattern's `match`, its kind (GAP_TEXT, GAP_NUMBER, GAP_STRING,
        # GAP_COUNT), the literal segment after it (None after the last gap) with its length, and a
        # count's key: read per piece.
        self._gaps = tuple(
            (
                _GAP_MATCH[kind],
                kind,
                segments[gap + 1] if gap + 2 < len(segments) else None,
                len(segments[gap + 1]),
                count_keys.get(gap),
            )
            for gap, kind in enumerate(kinds)
        )
        if self.segments is None:
            result.steady = (self.prefix, self.suffix, self.text_start, self.suffix_length, match_plain_text)
        elif count_keys:
            result.steady = counted_steady(segments, kinds)
        else:
            result.gapped_steady = SteadyShape.of(segments, kinds)

    @classmethod
    def of(
        cls,
        segments: list[bytes],
        kinds: list[str],
        chunk: dict[str, Any],
        facts: RoutineFacts,
        spec: RoutineSpec,
        count_keys: dict[int, str] | None = None,
    ) -> Shape:
        """The shape of literal `segments` around gaps of `kinds` (`_steady`'s GAP_*, one the
        text), learned from an event parsed to `chunk` whose routine `facts` are given (and, for
        its GAP_COUNT gaps, the key of each, by gap)."""
        remembered = {key: chunk[key] for key in _REMEMBERED_KEYS if key in chunk} if spec is SPECS[Dialect.CHAT] else {}
        return cls(segments, kinds, RoutineMatch(facts[0], remembered), count_keys)

    @property
    def kinds(self) -> list[str]:
        """The kinds of its gaps, in order (`_steady`'s GAP_*)."""
        return [kind for _, kind, _, _, _ in self._gaps]

    def gap_spans(self, piece: bytes) -> list[tuple[int, int]] | None:
        """Where each gap's token is in `piece`, in order, if `piece` is this shape; else None."""
        if not (piece.startswith(self.prefix) and piece.endswith(self.suffix)):
            return None
        spans = []
        position = self.text_start
        for match_gap, _, segment, segment_length, _ in self._gaps:
            match = match_gap(piece, position)
            if match is None:
                return None
            spans.append(match.span())
            position = match.end()
            if segment is not None:
                if not piece.startswith(segment, position):
                    return None
                position += segment_length
        return spans if position == len(piece) - self.suffix_length else None

    def maybe_has_text(self, piece: bytes) -> bool | None:
        """None if `piece` is not this shape; else whether its text is non-empty."""
        if not (piece.startswith(self.prefix) and piece.endswith(self.suffix)):
            return None
        if self.segments is None:
            match = _TEXT_GAP_PATTERN.fullmatch(piece, self.text_start, len(piece) - self.suffix_length)
            return None if match is None else match.lastindex is not None
        return self._maybe_has_text_in_gaps(piece)

    def _maybe_has_text_in_gaps(self, piece: bytes) -> bool | None:
        # Runs for every routine piece of a Responses stream: locals and one tuple per gap.
        position = self.text_start
        has_text = None
        number = None
        counts: dict[str, int] | None = None
        for match_gap, kind, segment, segment_length, count_key in self._gaps:
            match = match_gap(piece, position)
            if match is None:
                return None
            if kind is GAP_TEXT:
                has_text = match.lastindex is not None
            elif kind is GAP_NUMBER:
                number = match.group()
            elif count_key is not None:
                if counts is None:
                    counts = {}
                counts[count_key] = int(match.group())
            position = match.end()
            if segment is not None:
                if not piece.startswith(segment, position):
                    return None
                position += segment_length
        if position != len(piece) - self.suffix_length:
            return None
        if number is not None:
            self.result.number = int(number)
        if counts is not None:
            self.result.counts = counts
        return has_text


class ShapeSource(Protocol):
    """Shapes learned by other streams of the same server (`_shape_book.ShapeBook`)."""

    def maybe_shape(self, raw: bytes, chunk: Any, facts: RoutineFacts, spec: RoutineSpec) -> Shape | None:
        """The shape of the routine event `raw` (parsed to `chunk`), if known, without a probe."""

    def keep(
        self, raw: bytes, data: bytes, data_at: int, chunk: dict[str, Any], facts: RoutineFacts, spec: RoutineSpec, shape: Shape
    ) -> None:
        """A shape this stream learned by probing, for the streams after it. Never raises."""


class RoutineChunks:
    """The routine chunk shapes of one stream: learned from fully parsed events, matched on pieces."""

    __slots__ = ("_shapes", "_attempts", "_enabled", "_spec", "_book")

    def __init__(self, *, enabled: bool = True, dialect: Dialect = Dialect.CHAT, book: ShapeSource | None = None) -> None:
        """`enabled=False` never learns, so nothing ever matches (the full path for every event).
        `book`: shapes other streams learned, asked before probing and told what was probed."""
        self._shapes: list[Shape] = []
        self._attempts = 0
        self._enabled = enabled
        self._spec = SPECS[dialect]
        self._book = book

    @property
    def learned(self) -> bool:
        return bool(self._shapes)

    @property
    def counted(self) -> bool:
        """Whether the shape matched last has counts (the steady path runs on that shape: when it
        leaves, the machine hands its last piece's counts to the rules, and no other shape's)."""
        return bool(self._shapes) and self._shapes[0].result.counts is not None

    def maybe_match(self, piece: bytes) -> RoutineMatch | None:
        """The match, if `piece` is exactly one event of a learned shape; else None. The returned
        object is reused by the next match of the same shape."""
        shapes = self._shapes
        if not shapes:
            return None
        shape = shapes[0]
        has_text: bool | None
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
        spec = self._spec
        facts = spec.facts(chunk)
        if facts is None:
            return
        data_at = _data_offset(raw)
        if data_at < 0 and spec.array_elements:
            # An element of a JSON-array stream (`_json_array.ArrayPiece`): the comma and whitespace
            # before it, then the element, pretty-printed or not. The first (after the `[`) is not
            # learned: no other element comes after a `[`.
            data_at = len(raw) - len(data)
            if not (raw.endswith(data) and _ARRAY_SEPARATOR.fullmatch(raw, 0, data_at)):
                return
        else:
            ending = raw[data_at + len(data) :]
            if (
                data_at < 0
                or raw[data_at : data_at + len(data)] != data
                or ending not in (b"\n\n", b"\r\n\r\n")
                or b"\n" in data
                or b"\r" in data
                or (data_at > len(b"data: ") and not raw.startswith(b"event: "))
            ):
                return
        if any(shape.maybe_has_text(raw) is not None for shape in self._shapes):
            return
        self._attempts += 1
        book = self._book
        shape = None if book is None else book.maybe_shape(raw, chunk, facts, spec)
        if shape is None:
            try:
                shape = _maybe_shape(raw, data, data_at, chunk, facts, spec)
            except (ValueError, RecursionError, TypeError, KeyError, IndexError):
                shape = None
            if shape is None:
                return
            if book is not None:
                book.keep(raw, data, data_at, chunk, facts, spec, shape)
        self._shapes.insert(0, shape)
        del self._shapes[_MAX_SHAPES:]


def _data_offset(raw: bytes) -> int:
    """Where the data starts in an event that is `data: <data>` with at most an `event:` line
    before it; -1 for any other event (more fields, `data:` without the space)."""
    if raw.startswith(b"data: "):
        return len(b"data: ")
    if not raw.startswith(b"event: "):
        return -1
    line_end = raw.find(b"\n")
    if line_end < 0:
        return -1
    if raw.startswith(b"data: ", line_end + 1):
        return line_end + 1 + len(b"data: ")
    return -1


#: What makes an event routine (`RoutineSpec.facts`): (the index, the text key, the free key or None).
RoutineFacts = tuple[int, str, str | None]


@cache
def _key_with_value(key: str, integer: bool) -> re.Pattern[bytes]:
    value = _JSON_INT if integer else _JSON_STRING
    return re.compile(re.escape(json.dumps(key).encode()) + _JSON_SPACE + b":" + _JSON_SPACE + b"(" + value + b")")


def key_value_spans(data: bytes, key: str, *, integer: bool = False) -> list[tuple[int, int]]:
    """Where `"key": <a JSON string>` (or a non-negative integer) has its value in `data`: the
    candidates a probe parse proves or not (a candidate may be inside another string)."""
    return [match.span(1) for match in _key_with_value(key, integer).finditer(data)]


class RoutineSpec(NamedTuple):
    """What a dialect's routine event is, for the one learning machinery."""

    # (index, text key, free key) if the event is routine, else None.
    facts: Callable[[Any], tuple[int, str, str | None] | None]
    # The object in the parsed event that holds the text key.
    text_holder: Callable[[dict[str, Any]], Any]
    # Whether the event's `sequence_number` is a gap (it changes on every event).
    numbered: bool = False
    # The object in the parsed event whose integer values are counts, each a gap (None: no counts).
    counts: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # Whether the stream may be a JSON array whose elements are the events (Gemini's).
    array_elements: bool = False


SPECS = {
    Dialect.CHAT: RoutineSpec(chat_facts, lambda chunk: chunk["choices"][0]["delta"]),
    Dialect.MESSAGES: RoutineSpec(messages_facts, lambda event: event["delta"]),
    Dialect.RESPONSES: RoutineSpec(responses_facts, lambda event: event, numbered=True),
    Dialect.GEMINI: RoutineSpec(gemini_facts, gemini_text_part, counts=gemini_usage, array_elements=True),
}


# The gaps `_maybe_shape` finds, by their kind in a shape (`_steady`'s GAP_*).
_KINDS = {"text": GAP_TEXT, "free": GAP_STRING, "number": GAP_NUMBER, "count": GAP_COUNT}


def _maybe_shape(
    raw: bytes, data: bytes, data_at: int, chunk: dict[str, Any], facts: tuple[int, str, str | None], spec: RoutineSpec
) -> Shape | None:
    _, text_key, free_key = facts
    holder = spec.text_holder
    text_gap = _maybe_gap(data, chunk, text_key, holder)
    if text_gap is None:
        return None
    gaps: list[tuple[tuple[int, int], str, str]] = [(text_gap, "text", "")]
    if free_key is not None:
        free_gap = _maybe_gap(data, chunk, free_key, lambda event: event)
        if free_gap is None:
            return None
        gaps.append((free_gap, "free", ""))
    if spec.numbered:
        number_gap = _maybe_number_gap(data, chunk)
        if number_gap is None:
            return None
        gaps.append((number_gap, "number", ""))
    if spec.counts is not None:
        counts = spec.counts
        for key, value in counts(chunk).items():
            # (A bool, a float, a string, another key's integer: kept as a literal. Only the usage's
            # token counts are gaps: each costs a probe parse and a pattern compiled once per key.)
            if type(value) is not int or key not in COUNT_KEYS:
                continue
            count_gap = _maybe_count_gap(data, chunk, key, counts) if value >= 0 else None
            if count_gap is None:
                return None
            gaps.append((count_gap, "count", key))
    gaps.sort()
    segments = []
    position = -data_at  # offsets in `data`; the first segment starts at the event's first byte
    kinds = []
    count_keys: dict[int, str] = {}
    for number, ((start, end), kind, key) in enumerate(gaps):
        segments.append(raw[data_at + position : data_at + start])
        kinds.append(_KINDS[kind])
        if kind == "count":
            count_keys[number] = key
        position = end
    segments.append(raw[data_at + position :])
    shape = Shape.of(segments, kinds, chunk, facts, spec, count_keys)
    if shape.maybe_has_text(raw) is None:  # the learned event itself must match its shape
        return None
    return shape


def _maybe_gap(data: bytes, chunk: dict[str, Any], key: str, holder: Callable[[dict[str, Any]], Any]) -> tuple[int, int] | None:
    """The byte span of `holder(chunk)[key]`'s string token in `data`, proven by a probe parse."""
    candidates = _KEY_WITH_STRING_VALUE[key].finditer(data)
    original = holder(chunk)[key]
    for candidate in candidates:
        start, end = candidate.span(1)
        probed = json.loads(data[:start] + PROBE_TOKEN + data[end:])
        probed_holder = holder(probed)
        if type(probed_holder) is not dict or probed_holder.get(key) != _PROBE:
            continue
        probed_holder[key] = original
        if probed == chunk:
            return start, end
    return None


def _maybe_number_gap(data: bytes, event: dict[str, Any]) -> tuple[int, int] | None:
    """The byte span of the event's top-level `sequence_number` in `data`, proven by a probe parse."""
    for candidate in _KEY_WITH_INT_VALUE.finditer(data):
        start, end = candidate.span(1)
        probed = json.loads(data[:start] + str(PROBE_NUMBER).encode() + data[end:])
        if type(probed) is not dict or probed.get(NUMBER_KEY) != PROBE_NUMBER:
            continue
        probed[NUMBER_KEY] = event[NUMBER_KEY]
        if probed == event:
            return start, end
    return None


def _maybe_count_gap(
    data: bytes, chunk: dict[str, Any], key: str, holder: Callable[[dict[str, Any]], dict[str, Any]]
) -> tuple[int, int] | None:
    """The byte span of the integer `holder(chunk)[key]` in `data`, proven by a probe parse."""
    original = holder(chunk)[key]
    for start, end in key_value_spans(data, key, integer=True):
        probed = json.loads(data[:start] + str(PROBE_NUMBER).encode() + data[end:])
        probed_holder = holder(probed) if type(probed) is dict else None
        if type(probed_holder) is not dict or probed_holder.get(key) != PROBE_NUMBER:
            continue
        probed_holder[key] = original
        if probed == chunk:
            return start, end
    return None
