"""`layout_from_capture` in Messages and Responses: real token events counted in each dialect.

The oracle is the simulated worker's `ResponsePlan` in that dialect (labs/worker/messages_events.py,
responses_events.py), which says where each token event ends from its settings and shares no code
with the capture reader; hand-built events cover what the worker never sends (llama.cpp's
Responses stream without indexes, a Messages `ping`). Pure: no sockets, no processes.
"""

from __future__ import annotations

import json

import pytest

from faults.layout import is_token_event, layout_from_capture
from faults.probe import UnstableUpstream, same_layout
from finishline import Dialect
from labs.worker import WorkerSettings
from labs.worker.settings import Framing
from labs.worker.wire import response_plan

DIALECTS = (Dialect.MESSAGES, Dialect.RESPONSES, Dialect.GEMINI)


def settings_cases():
    for framing in Framing:
        for tokens in (0, 1, 7):
            yield WorkerSettings(tokens=tokens, framing=framing)
    yield WorkerSettings(tokens=5, reasoning_tokens=3)
    yield WorkerSettings(tokens=4, tool_calls=2)
    yield WorkerSettings(tokens=6, max_tokens=3, include_usage=True)


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.value)
@pytest.mark.parametrize("settings", list(settings_cases()), ids=lambda s: s.to_model_name())
def test_a_captured_stream_ends_its_token_events_where_the_worker_says(dialect, settings):
    plan = response_plan(settings.for_request({"stream": True}, dialect), stream=True, dialect=dialect)

    layout = layout_from_capture(plan.to_bytes(), dialect)

    assert layout.head_length == plan.head_length
    assert layout.token_events == plan.token_events
    assert [layout.offset_after_tokens(n) for n in range(plan.token_events + 1)] == [
        plan.offset_after_tokens(n) for n in range(plan.token_events + 1)
    ]


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.value)
def test_chat_counting_finds_no_token_in_another_dialects_stream(dialect):
    # Why the dialect must be passed: counted as Chat, a Messages or Responses stream has no token.
    plan = response_plan(WorkerSettings(tokens=5).for_request({"stream": True}, dialect), stream=True, dialect=dialect)
    assert layout_from_capture(plan.to_bytes()).token_events == 0


def data(value: dict) -> str:
    return json.dumps(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "The"}}, True),
        ({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ""}}, False),
        ({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}}, True),
        ({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"'}}, True),
        ({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t", "name": "f"}}, True),
        ({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}, False),
        ({"type": "message_start", "message": {"content": []}}, False),
        ({"type": "ping"}, False),
        ({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}, False),
    ],
)
def test_messages_token_events(value, expected):
    assert is_token_event(data(value), Dialect.MESSAGES) is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # llama.cpp's events: no sequence_number, output_index or content_index.
        ({"type": "response.output_text.delta", "item_id": "msg_1", "delta": " fox"}, True),
        ({"type": "response.output_text.delta", "item_id": "msg_1", "delta": ""}, False),
        ({"type": "response.reasoning_text.delta", "delta": "hm"}, True),
        ({"type": "response.function_call_arguments.delta", "delta": "{"}, True),
        ({"type": "response.output_item.added", "item": {"type": "function_call", "name": "f"}}, True),
        ({"type": "response.output_item.added", "item": {"type": "message", "content": []}}, False),
        ({"type": "response.output_text.done", "text": "The fox"}, False),
        ({"type": "response.completed", "response": {"status": "completed"}}, False),
    ],
)
def test_responses_token_events(value, expected):
    assert is_token_event(data(value), Dialect.RESPONSES) is expected


def test_messages_preamble_keeps_ping_and_the_block_start_before_the_first_token():
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
    opening = [
        b'event: message_start\ndata: {"type":"message_start","message":{"content":[]}}\n\n',
        b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n',
        b'event: ping\ndata: {"type":"ping"}\n\n',
    ]
    token = (
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"A"}}\n\n'
    )
    stop = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    raw = head + b"".join(opening) + token + stop
    layout = layout_from_capture(raw, Dialect.MESSAGES)
    assert layout.offset_after_tokens(0) == len(head + b"".join(opening))
    assert layout.offset_after_tokens(1) == len(raw) - len(stop)


@pytest.mark.parametrize("odd_type", [["message_start"], {"a": 1}], ids=["list", "object"])
@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.value)
def test_an_event_whose_type_is_no_string_is_no_preamble_and_no_crash(dialect, odd_type):
    """A `type` that is a list or an object is read as no preamble event, not a TypeError (review C3)."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
    odd = b"data: " + json.dumps({"type": odd_type}).encode() + b"\n\n"
    token = {
        Dialect.MESSAGES: b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"A"}}\n\n',
        Dialect.RESPONSES: b'data: {"type":"response.output_text.delta","output_index":0,"content_index":0,"delta":"A"}\n\n',
        Dialect.GEMINI: b'data: {"candidates":[{"content":{"parts":[{"text":"A"}],"role":"model"},"index":0}]}\n\n',
    }[dialect]
    layout = layout_from_capture(head + odd + token, dialect)
    assert layout.offset_after_tokens(0) == len(head)  # the odd event opens no answer
    assert layout.offset_after_tokens(1) == len(head + odd + token)


def test_two_captures_with_a_token_of_another_length_are_refused():
    def capture(first: str) -> bytes:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
        events = [{"type": "response.output_text.delta", "delta": text} for text in (first, " fox")]
        return head + b"".join(b"event: %s\ndata: %s\n\n" % (e["type"].encode(), json.dumps(e).encode()) for e in events)

    same = [layout_from_capture(capture("The"), Dialect.RESPONSES), layout_from_capture(capture("The"), Dialect.RESPONSES)]
    assert same_layout(same).token_events == 2
    with pytest.raises(UnstableUpstream, match="token event 1 ended at byte"):
        same_layout(
            [layout_from_capture(capture("The"), Dialect.RESPONSES), layout_from_capture(capture("A"), Dialect.RESPONSES)]
        )


@pytest.mark.parametrize(
    ("path", "dialect"),
    [
        ("/v1/chat/completions", Dialect.CHAT),
        ("/v1/messages", Dialect.MESSAGES),
        ("/anthropic/v1/messages/", Dialect.MESSAGES),
        ("/v1/responses?x=1", Dialect.RESPONSES),
        ("/v1/completions", Dialect.CHAT),
        ("/v1beta/models/finishline-worker;tokens=3:streamGenerateContent?alt=sse", Dialect.GEMINI),
    ],
)
def test_the_fault_cli_probes_count_the_token_events_of_the_dialect_its_path_names(path, dialect):
    from faults.cli import _dialect_of_path

    assert _dialect_of_path(path) is dialect
