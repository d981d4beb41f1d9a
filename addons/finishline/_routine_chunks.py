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

A Gemini chunk carries its text in a part, and `usageMetadata` counts that change on every chunk
by as many tokens as it holds, so they cannot be predicted as a sequence number is:

    data: {"candidates": [{"content": {"parts": [{"text": "Hel"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 4,"candidatesTokenCount": 9,"totalTokenCount": 13},"modelVersion": "gemini-2.5-flash","responseId": "IZI2"}

Every integer of its `usageMetadata` is a gap (a *count*, `GAP_COUNT`), matched as a JSON integer and
handed back by key (`RoutineMatch.counts`), since the rules keep the last prompt and output counts
(rule G7, the books). Its steady path is `_steady.counted_steady`. Gemini's JSON-array form is
learned the same way from its elements (`,\r\n{…}`, pretty-printed: the element's own bytes and
the separator before it are the shape).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, NamedTuple

from ._dialect import Dialect
from ._gemini_routine import gemini_facts, gemini_text_part, gemini_usage
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
    "MAY_STEADY",
    "NOT_STEADY",
    "SPECS",
    "RoutineChunks",
    "RoutineMatch",
    "RoutineSpec",
    "TEXT_DELTA_KEYS",
]

# What a dialect's rules tell the machine about a piece the fast path matched (`on_routine`).
DECLINE = 0  # the full path must read it
NOT_STEADY = 1  # handled; the steady path must not take the next pieces
MAY_STEADY = 2  # handled; the steady path may take the next pieces of this shape

# Delta keys whose string value is the model's text. One of them is the gap; every other delta key
# of a routine chunk must be falsy (so nothing else makes it a "token"), except `role`.
TEXT_DELTA_KEYS = ("content", "reasoning_content", "reasoning", "refusal")
# Top-level keys whose string value may change on every chunk and that the repair never reads.
# OpenAI pads every stream chunk with a random `obfuscation` string (stream_options.include_obfuscation).
_FREE_TOP_LEVEL_KEYS = ("obfuscation",)
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
# A sequence number: a non-negative JSON integer, no exponent or fraction (json.loads gives an int).
_JSON_INT = rb"(?:0|[1-9][0-9]{0,17})"
_JSON_INT_PATTERN = re.compile(_JSON_INT)
# What comes before a JSON-array element that is not the first: the comma, and whitespace around it.
_ARRAY_SEPARATOR = re.compile(rb"[ \t\r\n]*,[ \t\r\n]*")
_NUMBER_KEY = "sequence_number"
_PROBE_NUMBER = 987654321
_JSON_SPACE = rb"[ \t]*"  # no CR or LF: those would end the SSE line
_PROBE = "finishline probe \u00e9"
_PROBE_TOKEN = json.dumps(_PROBE).encode()

# The text keys of the Messages and Responses routine events.
_MESSAGES_TEXT_KEYS = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}
_RESPONSES_TEXT_EVENTS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.function_call_arguments.delta",
    }
)

# Those of them that name their content part by `content_index` (`_responses.CONTENT_INDEXED_EVENTS`).
_CONTENT_INDEXED = frozenset({"response.output_text.delta", "response.refusal.delta", "response.reasoning_text.delta"})

# `"key": "value"` for each key whose string value may be a gap, the value as group 1.
_KEY_WITH_STRING_VALUE = {
    key: re.compile(re.escape(json.dumps(key).encode()) + _JSON_SPACE + b":" + _JSON_SPACE + b"(" + _JSON_STRING + b")")
    for key in (*TEXT_DELTA_KEYS, *_FREE_TOP_LEVEL_KEYS, *_MESSAGES_TEXT_KEYS.values(), "delta")
}
# `"key": 123` for each count key met so far (Gemini's usage keys), the number as group 1; bounded,
# since the keys come from the upstream.
_KEY_WITH_COUNT: dict[str, re.Pattern[bytes]] = {}
_MAX_COUNT_KEYS = 64
_KEY_WITH_INT_VALUE = re.compile(
    re.escape(json.dumps(_NUMBER_KEY).encode()) + _JSON_SPACE + b":" + _JSON_SPACE + b"(" + _JSON_INT + b")"
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
        counts: the matched piece's counts (Gemini's `usageMetadata` integers), by key; None for a
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


class _Shape:
    """The literal segments of a learned event around its gaps, and what a match of it means.

    With one gap (the text), `prefix` + text + `suffix`; with more, `segments` (one more than the
    gaps), which gap is the text, and the key of each count gap (`count_keys`, by gap)."""

    __slots__ = ("prefix", "suffix", "text_start", "suffix_length", "segments", "text_gap", "number_gap", "result", "_gaps")

    def __init__(
        self,
        segments: list[bytes],
        text_gap: int,
        result: RoutineMatch,
        number_gap: int = -1,
        count_keys: dict[int, str] | None = None,
    ) -> None:
        count_keys = count_keys or {}
        self.segments = segments if len(segments) > 2 else None
        self.prefix = segments[0]
        self.suffix = segments[-1]
        self.text_start = len(self.prefix)
        self.suffix_length = len(self.suffix)
        self.text_gap = text_gap
        self.number_gap = number_gap
        self.result = result
        # Per gap, in order: its pattern's `match`, its kind (GAP_TEXT, GAP_NUMBER, GAP_STRING,
        # GAP_COUNT), the literal segment after it (None after the last gap) with its length, and a
        # count's key: read per piece.
        self._gaps = tuple(
            (
                (
                    _TEXT_GAP_PATTERN
                    if gap == text_gap
                    else _JSON_INT_PATTERN
                    if gap == number_gap or gap in count_keys
                    else _JSON_STRING_PATTERN
                ).match,
                GAP_TEXT
                if gap == text_gap
                else GAP_NUMBER
                if gap == number_gap
                else GAP_COUNT
                if gap in count_keys
                else GAP_STRING,
                segments[gap + 1] if gap + 2 < len(segments) else None,
                len(segments[gap + 1]),
                count_keys.get(gap),
            )
            for gap in range(len(segments) - 1)
        )
        kinds = [kind for _, kind, _, _, _ in self._gaps]
        if self.segments is None:
            result.steady = (self.prefix, self.suffix, self.text_start, self.suffix_length, match_plain_text)
        elif count_keys:
            result.steady = counted_steady(segments, kinds)
        else:
            result.gapped_steady = SteadyShape.of(segments, kinds)

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


class RoutineChunks:
    """The routine chunk shapes of one stream: learned from fully parsed events, matched on pieces."""

    __slots__ = ("_shapes", "_attempts", "_enabled", "_spec")

    def __init__(self, *, enabled: bool = True, dialect: Dialect = Dialect.CHAT) -> None:
        """`enabled=False` never learns, so nothing ever matches (the full path for every event)."""
        self._shapes: list[_Shape] = []
        self._attempts = 0
        self._enabled = enabled
        self._spec = SPECS[dialect]

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
        try:
            shape = _maybe_shape(raw, data, data_at, chunk, facts, spec)
        except (ValueError, RecursionError, TypeError, KeyError, IndexError):
            shape = None
        if shape is None:
            return
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


def _messages_facts(event: Any) -> tuple[int, str, str | None] | None:
    """A Messages `content_block_delta` of text, thinking or tool input, and nothing else."""
    if type(event) is not dict or event.get("type") != "content_block_delta" or len(event) != 3:
        return None
    delta = event.get("delta")
    if type(delta) is not dict or len(delta) != 2 or type(event.get("index")) is not int:
        return None
    delta_type = delta.get("type")  # looked up only if a string: a list or object is unhashable
    text_key = _MESSAGES_TEXT_KEYS.get(delta_type) if type(delta_type) is str else None
    if text_key is None or type(delta.get(text_key)) is not str:
        return None
    return 0, text_key, None


def _responses_facts(event: Any) -> tuple[int, str, str | None] | None:
    """A Responses text, reasoning, refusal or arguments delta with its sequence number."""
    if type(event) is not dict or type(event.get("type")) is not str or event.get("error") is not None:
        return None
    if event["type"] not in _RESPONSES_TEXT_EVENTS:  # (after the check above: a list is unhashable)
        return None
    if type(event.get("delta")) is not str or type(event.get(_NUMBER_KEY)) is not int or event[_NUMBER_KEY] < 0:
        return None
    # An event without its indexes is one rule R7 may fill in: never a shape the fast path passes as it came.
    if type(event.get("output_index")) is not int or (
        event["type"] in _CONTENT_INDEXED and type(event.get("content_index")) is not int
    ):
        return None
    free_key = next((key for key in _FREE_TOP_LEVEL_KEYS if type(event.get(key)) is str), None)
    return 0, "delta", free_key


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
    Dialect.CHAT: RoutineSpec(_routine_facts, lambda chunk: chunk["choices"][0]["delta"]),
    Dialect.MESSAGES: RoutineSpec(_messages_facts, lambda event: event["delta"]),
    Dialect.RESPONSES: RoutineSpec(_responses_facts, lambda event: event, numbered=True),
    Dialect.GEMINI: RoutineSpec(gemini_facts, gemini_text_part, counts=gemini_usage, array_elements=True),
}


def _maybe_shape(
    raw: bytes, data: bytes, data_at: int, chunk: dict[str, Any], facts: tuple[int, str, str | None], spec: RoutineSpec
) -> _Shape | None:
    index, text_key, free_key = facts
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
            if type(value) is not int:
                continue  # (a bool, a float, a string: read by no rule, kept as a literal)
            count_gap = _maybe_count_gap(data, chunk, key, counts) if value >= 0 else None
            if count_gap is None:
                return None
            gaps.append((count_gap, "count", key))
    gaps.sort()
    segments = []
    position = -data_at  # offsets in `data`; the first segment starts at the event's first byte
    text_gap_index = number_gap_index = -1
    count_keys: dict[int, str] = {}
    for number, ((start, end), kind, key) in enumerate(gaps):
        segments.append(raw[data_at + position : data_at + start])
        if kind == "text":
            text_gap_index = number
        elif kind == "number":
            number_gap_index = number
        elif kind == "count":
            count_keys[number] = key
        position = end
    segments.append(raw[data_at + position :])
    remembered = {key: chunk[key] for key in _REMEMBERED_KEYS if key in chunk} if spec is SPECS[Dialect.CHAT] else {}
    shape = _Shape(segments, text_gap_index, RoutineMatch(index, remembered), number_gap_index, count_keys)
    if shape.maybe_has_text(raw) is None:  # the learned event itself must match its shape
        return None
    return shape


def _maybe_gap(data: bytes, chunk: dict[str, Any], key: str, holder: Callable[[dict[str, Any]], Any]) -> tuple[int, int] | None:
    """The byte span of `holder(chunk)[key]`'s string token in `data`, proven by a probe parse."""
    candidates = _KEY_WITH_STRING_VALUE[key].finditer(data)
    original = holder(chunk)[key]
    for candidate in candidates:
        start, end = candidate.span(1)
        probed = json.loads(data[:start] + _PROBE_TOKEN + data[end:])
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
        probed = json.loads(data[:start] + str(_PROBE_NUMBER).encode() + data[end:])
        if type(probed) is not dict or probed.get(_NUMBER_KEY) != _PROBE_NUMBER:
            continue
        probed[_NUMBER_KEY] = event[_NUMBER_KEY]
        if probed == event:
            return start, end
    return None


def _maybe_count_gap(
    data: bytes, chunk: dict[str, Any], key: str, holder: Callable[[dict[str, Any]], dict[str, Any]]
) -> tuple[int, int] | None:
    """The byte span of the integer `holder(chunk)[key]` in `data`, proven by a probe parse."""
    original = holder(chunk)[key]
    pattern = _KEY_WITH_COUNT.get(key)
    if pattern is None:  # a stream's usage keys are a few, the same in every stream: compiled once
        if len(_KEY_WITH_COUNT) >= _MAX_COUNT_KEYS:
            _KEY_WITH_COUNT.clear()
        pattern = _KEY_WITH_COUNT[key] = re.compile(
            re.escape(json.dumps(key).encode()) + _JSON_SPACE + b":" + _JSON_SPACE + b"(" + _JSON_INT + b")"
        )
    for candidate in pattern.finditer(data):
        start, end = candidate.span(1)
        probed = json.loads(data[:start] + str(_PROBE_NUMBER).encode() + data[end:])
        probed_holder = holder(probed) if type(probed) is dict else None
        if type(probed_holder) is not dict or probed_holder.get(key) != _PROBE_NUMBER:
            continue
        probed_holder[key] = original
        if probed == chunk:
            return start, end
    return None
