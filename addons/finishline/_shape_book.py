"""Routine shapes learned once for all the streams of one server: the stream's own ids as gaps.

Theory of operation
-------------------
Every stream learns the shape of its routine text deltas from its first one (`_routine_chunks`):
the event's bytes with the text cut out, proven by parsing the event again with a probe string in
the gap. That costs a few parses, 10 to 17 µs a stream, which is most of what a short stream's
learning costs. Yet the deltas of one server repeat their shape from stream to stream, except for
the stream's own ids: a Chat chunk's `id` and `created` (and `system_fingerprint`), a Responses
delta's `item_id`. So the shape a stream learned is also kept here with those as gaps, a *template*
(proven the same way, by a probe parse per id), and the next stream's first routine event that is
such a template with any JSON strings (or integers) in its gaps gets its own shape from it, without
a probe parse: the template with that event's ids filled in as literals.

Why that is the shape the probe parses would prove: a template's event was parsed in full, and each
gap of it proven to hold one whole JSON token (a string, or a non-negative integer) at a known place.
An event that is the template's literal bytes with other tokens of the same kind in the gaps
tokenizes as the same sequence of JSON tokens, only those values differ: it parses to the template
event's value with those values replaced, so its text (and padding, and sequence number) sits in
the same gap of the same key. The machine parsed the new event in full too (this is the full path's
`learn`), and its routine facts (`RoutineSpec.facts`: which key holds the text) must be the
template's. From there the stream's shape is held to the full parse exactly as a shape learned by
probing is (`tests/test_core_fast_path*.py`: the same bytes and the same report as the full path,
with a book shared by many generated and adversarial streams).

The book is the caller's (finish_fix keeps one for the addon's life, `FinishFix.shapes`) and
passed to each `StreamRepair`: the core keeps no state across streams of its own. It holds at most
`MAX_TEMPLATES` templates per dialect, the one used last first; a server whose delta shapes change
from stream to stream in other places than its ids only costs a template's learning (two parses more)
when a stream finds none that fits.
"""

from __future__ import annotations

import json
from typing import Any

from ._routine_chunks import (
    FREE_TOP_LEVEL_KEYS,
    JSON_INT_MATCH,
    JSON_STRING_MATCH,
    PROBE_NUMBER,
    PROBE_TOKEN,
    TEXT_GAP_MATCH,
    RoutineFacts,
    RoutineSpec,
    Shape,
    key_value_spans,
)
from ._steady import GAP_COUNT, GAP_NUMBER, GAP_STRING, GAP_TEXT

__all__ = ["MAX_TEMPLATES", "ShapeBook"]

#: At most this many templates per dialect (the least recently used goes first).
MAX_TEMPLATES = 8
# The stream's own ids at the top level of a routine event: a string or a non-negative integer that
# differs from stream to stream while the rest of the delta stays the same. (`model` stays: a
# stream of another model is another template.)
_ID_STRINGS = ("id", "item_id", "system_fingerprint")
_ID_INTEGERS = ("created",)
# A template's gap kinds besides the shape's own (`_steady`'s GAP_*): an id, filled in per stream.
_GAP_ID = "id"

_Gap = tuple[str, Any]  # (its kind, its pattern's `match`)
_MATCHERS = {GAP_TEXT: TEXT_GAP_MATCH, GAP_NUMBER: JSON_INT_MATCH, GAP_STRING: JSON_STRING_MATCH}


class _Template:
    """A routine event's literal segments around its gaps: the shape's (text, padding, number) and
    the stream's ids (`_GAP_ID`, each matched as a JSON string or integer)."""

    __slots__ = ("segments", "gaps", "facts")

    def __init__(self, segments: list[bytes], gaps: list[tuple[str, Any]], facts: RoutineFacts) -> None:
        self.segments = segments
        self.gaps = gaps
        self.facts = facts

    def maybe_fill(self, raw: bytes) -> tuple[list[bytes], list[str]] | None:
        """If `raw` is this template with tokens of the right kind in its gaps: the stream's shape,
        its segments (the ids filled in) and the kinds of its gaps; else None."""
        segments = self.segments
        if not raw.startswith(segments[0]):
            return None
        position = len(segments[0])
        filled = [segments[0]]
        kinds: list[str] = []
        for (kind, match_gap), segment in zip(self.gaps, segments[1:]):
            match = match_gap(raw, position)
            if match is None:
                return None
            end = match.end()
            if not raw.startswith(segment, end):
                return None
            if kind is _GAP_ID:
                filled[-1] += raw[position:end] + segment
            else:
                kinds.append(kind)
                filled.append(segment)
            position = end + len(segment)
        if position != len(raw):
            return None
        return filled, kinds


class ShapeBook:
    """The templates of routine shapes seen so far, per dialect (`RoutineSpec`), for any number of
    streams: `StreamRepair(shapes=...)`. Not thread-safe: one event loop's streams share one."""

    def __init__(self) -> None:
        self._templates: dict[RoutineSpec, list[_Template]] = {}
        #: Shapes given to streams from a template (for tests and the curious).
        self.hits = 0

    def maybe_shape(self, raw: bytes, chunk: Any, facts: RoutineFacts, spec: RoutineSpec) -> Shape | None:
        """The shape of `raw` (one event, `data: ` after at most an `event:` line, parsed to `chunk`
        whose routine `facts` are given) from a template, or None when none fits."""
        templates = self._templates.get(spec)
        if not templates:
            return None
        for position, template in enumerate(templates):
            if template.facts != facts:
                continue
            found = template.maybe_fill(raw)
            if found is None:
                continue
            segments, kinds = found
            shape = Shape.of(segments, kinds, chunk, facts, spec)
            if shape.maybe_has_text(raw) is None:  # (it is: `raw` is the shape's own event)
                continue
            if position:
                templates.insert(0, templates.pop(position))
            self.hits += 1
            return shape
        return None

    def keep(
        self, raw: bytes, data: bytes, data_at: int, chunk: dict[str, Any], facts: RoutineFacts, spec: RoutineSpec, shape: Shape
    ) -> None:
        """Keeps the template of a shape just learned by probing from `raw` (its `data` at `data_at`,
        parsed to `chunk`): its ids found and proven by a probe parse each. Never raises."""
        spans = shape.gap_spans(raw)
        if spans is None or GAP_COUNT in shape.kinds:
            # (A shape with counts, Gemini's, is not kept: a template carries no count's key, and
            # Gemini's stream id is its `responseId`, not one of `_ID_STRINGS`.)
            return
        gaps = [(start, end, kind) for (start, end), kind in zip(spans, shape.kinds)]
        try:
            for key in _ID_STRINGS + _ID_INTEGERS:
                span = _proven_id(data, chunk, key)
                if span is not None:
                    gaps.append((data_at + span[0], data_at + span[1], _GAP_ID))
        except (ValueError, RecursionError, TypeError):
            return
        gaps.sort()
        segments = []
        position = 0
        template_gaps = []
        for start, end, kind in gaps:
            if start < position:  # overlapping spans cannot be two values: not kept
                return
            segments.append(raw[position:start])
            if kind is _GAP_ID:
                template_gaps.append((_GAP_ID, JSON_INT_MATCH if raw[start] != 0x22 else JSON_STRING_MATCH))
            else:
                template_gaps.append((kind, _MATCHERS[kind]))
            position = end
        segments.append(raw[position:])
        templates = self._templates.setdefault(spec, [])
        templates.insert(0, _Template(segments, template_gaps, facts))
        del templates[MAX_TEMPLATES:]


def _proven_id(data: bytes, chunk: dict[str, Any], key: str) -> tuple[int, int] | None:
    """The byte span in `data` of the top-level `key`'s value (a string, or for `created` a
    non-negative integer), proven by parsing `data` again with a probe value there."""
    value = chunk.get(key)
    integer = key in _ID_INTEGERS
    if integer:
        if type(value) is not int or value < 0:
            return None
        probe, probe_value = str(PROBE_NUMBER).encode(), PROBE_NUMBER
    else:
        if type(value) is not str or key in FREE_TOP_LEVEL_KEYS:
            return None
        probe, probe_value = PROBE_TOKEN, json.loads(PROBE_TOKEN)
    for start, end in key_value_spans(data, key, integer=integer):
        probed = json.loads(data[:start] + probe + data[end:])
        if type(probed) is not dict or probed.get(key) != probe_value:
            continue
        probed[key] = value
        if probed == chunk:
            return start, end
    return None
