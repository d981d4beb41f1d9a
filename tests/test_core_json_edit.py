"""The core's one JSON editor (`finishline._json_edit`): a value changed in place, every other byte
kept; an edit it cannot make in place is None (the caller writes the value anew), never a wrong text."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from finishline import EventFramer
from finishline._json_edit import edit_json, rewrite_event


def test_a_value_is_replaced_and_nothing_else_moves():
    text = b'{"id": "x", "choices": [{"index": 0, "finish_reason": "stop"}], "usage": {"n": 4}}'
    assert edit_json(text, {("choices", 0, "finish_reason"): b'"length"'}) == text.replace(b'"stop"', b'"length"')


def test_a_missing_member_is_added_at_the_end_of_its_object_in_its_spacing():
    assert edit_json(b'{"a": 1}', {("b",): b"2"}) == b'{"a": 1, "b": 2}'
    assert edit_json(b'{"a":1}', {("b",): b"2"}) == b'{"a":1,"b":2}'
    assert edit_json(b"{}", {("b",): b"2"}) == b'{"b":2}'
    assert edit_json(b'{"r":{"s":"completed"} }', {("r", "d"): b'{"x":1}'}) == b'{"r":{"s":"completed","d":{"x":1}} }'


def test_a_container_is_replaced_whole():
    text = b'{"d": {"reason": null, "x": [1, 2]}, "z": 0}'
    assert edit_json(text, {("d",): b'{"reason":"max_output_tokens"}'}) == b'{"d": {"reason":"max_output_tokens"}, "z": 0}'


def test_keys_with_escapes_are_read_as_json_reads_them():
    assert edit_json(b'{"a\\u0062": 1}', {("ab",): b"2"}) == b'{"a\\u0062": 2}'


@pytest.mark.parametrize(
    ("text", "edits"),
    [
        (b'{"a": 1', {("a",): b"2"}),  # unfinished
        (b'{"a": 1} {"b": 2}', {("a",): b"2"}),  # two values
        (b'["a"]', {(0, "b"): b"1"}),  # the parent is not an object there
        (b'{"a": 1}', {("x", "y"): b"1"}),  # no parent at all
        (b'{"a" 1}', {("a",): b"2"}),  # no colon
    ],
)
def test_what_it_cannot_edit_in_place_is_none(text, edits):
    assert edit_json(text, edits) is None


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    paths = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            paths += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for position, child in enumerate(value):
            paths += _paths(child, (*prefix, position))
    return paths


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_an_edit_made_in_place_reads_back_as_the_value_meant(data: st.DataObject) -> None:
    document = data.draw(st.dictionaries(st.text(max_size=4), _JSON, max_size=4))
    separators = data.draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    text = json.dumps(document, separators=separators, ensure_ascii=data.draw(st.booleans())).encode()
    paths = _paths(document)
    chosen = data.draw(st.lists(st.sampled_from(paths), max_size=3, unique=True)) if paths else []
    # A new member of the top object too, now and then.
    new_key = data.draw(st.text(max_size=4))
    if new_key not in document and data.draw(st.booleans()):
        chosen.append((new_key,))
    # No path inside another chosen one (the outer replacement would make the inner moot).
    chosen = [path for path in chosen if not any(other != path and path[: len(other)] == other for other in chosen)]
    values = {path: data.draw(_JSON) for path in chosen}
    expected = copy.deepcopy(document)
    for path, value in values.items():
        holder: Any = expected
        for step in path[:-1]:
            holder = holder[step]
        holder[path[-1]] = value
    edited = edit_json(text, {path: json.dumps(value).encode() for path, value in values.items()})
    assert edited is not None
    assert json.loads(edited) == expected


def test_rewrite_event_renames_the_event_and_keeps_its_other_lines():
    event = EventFramer().receive_data(b'event: response.completed\r\nid: 7\r\ndata: {"type":"response.completed"}\r\n\r\n')[0]
    out = rewrite_event(
        event, {("type",): b'"response.incomplete"'}, {"type": "response.incomplete"}, b"\r\n", event_type="response.incomplete"
    )
    assert out == b'event: response.incomplete\r\nid: 7\r\ndata: {"type":"response.incomplete"}\r\n\r\n'


def test_rewrite_event_writes_data_on_several_lines_anew_with_its_other_fields():
    event = EventFramer().receive_data(b'event: message_delta\nid: 3\ndata: {"delta":\ndata: {"stop_reason":"end_turn"}}\n\n')[0]
    expected = {"delta": {"stop_reason": "max_tokens"}}
    out = rewrite_event(event, {("delta", "stop_reason"): b'"max_tokens"'}, expected, b"\n")
    [again] = EventFramer().receive_data(out)
    assert json.loads(again.data or b"") == expected and again.event_type == b"message_delta"
    assert b"id: 3\n" in out


def test_rewrite_event_keeps_a_byte_order_mark_in_front_and_edits_in_place():
    # The stream's first event, after a BOM: its data line is still the one edited (the fuzz found
    # it written anew with the old data line kept as a field: two data lines, not JSON).
    raw = b'\xef\xbb\xbfdata: {"choices": [{"index": 0, "finish_reason": ""}]}\n\n'
    (event,) = EventFramer().receive_data(raw)
    expected = {"choices": [{"index": 0, "finish_reason": None}]}
    out = rewrite_event(event, {("choices", 0, "finish_reason"): b"null"}, expected, b"\n")
    assert out == raw.replace(b'""', b"null")
    (again,) = EventFramer().receive_data(out)
    assert json.loads(again.data) == expected
