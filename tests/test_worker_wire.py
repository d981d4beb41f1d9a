"""The worker's response bytes: deterministic, well framed (read back with h11), events in order."""

from __future__ import annotations

import json

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labs.worker.answer import expected_answer
from labs.worker.settings import Finish, Framing, WorkerSettings
from labs.worker.wire import response_plan
from tests.feeding import complete_events
from tests.fixtures_lab import split_response, token_texts


def resolved(**knobs) -> WorkerSettings:
    return WorkerSettings(**knobs).for_request({"model": "m"})


def read_with_h11(raw: bytes) -> tuple[h11.Response, bytes]:
    """Parse a response as a real HTTP/1.1 client would (h11), returning the head and the body."""
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="POST", target="/v1/chat/completions", headers=[("host", "x"), ("content-length", "0")]))
    client.send(h11.EndOfMessage())
    client.receive_data(raw)
    client.receive_data(b"")  # EOF: ends a close-delimited body
    response, body = None, bytearray()
    while True:
        event = client.next_event()
        if isinstance(event, h11.Response):
            response = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert response is not None, "a body without a response head"
            return response, bytes(body)
        else:
            raise AssertionError(f"unexpected h11 event {event!r}")


def events_of(plan) -> list[str]:
    return complete_events(split_response(plan.to_bytes())[1])


@pytest.mark.parametrize("framing", list(Framing))
@pytest.mark.parametrize("stream", [True, False])
def test_every_framing_parses_as_http_and_carries_the_events(framing, stream):
    plan = response_plan(resolved(tokens=5, include_usage=True, framing=framing), stream=stream)
    response, body = read_with_h11(plan.to_bytes())
    assert response.status_code == 200
    assert body == b"".join(s.event for s in plan.segments)
    headers = dict(response.headers)
    if framing is Framing.CHUNKED:
        assert headers[b"transfer-encoding"] == b"chunked"
    elif framing is Framing.CONTENT_LENGTH:
        assert int(headers[b"content-length"]) == len(body)
    else:
        assert b"transfer-encoding" not in headers and b"content-length" not in headers


@settings(max_examples=60)
@given(
    tokens=st.integers(0, 30),
    reasoning_tokens=st.integers(0, 3),
    tool_calls=st.integers(0, 2),
    n=st.integers(1, 3),
    include_usage=st.booleans(),
    framing=st.sampled_from(Framing),
)
def test_offsets_mark_exactly_n_token_events(tokens, reasoning_tokens, tool_calls, n, include_usage, framing):
    knobs = dict(tokens=tokens, reasoning_tokens=reasoning_tokens, tool_calls=tool_calls, n=n)
    plan = response_plan(resolved(**knobs, include_usage=include_usage, framing=framing))
    raw = plan.to_bytes()
    assert plan.head_length == raw.index(b"\r\n\r\n") + 4
    offsets = [plan.offset_after_tokens(k) for k in range(plan.token_events + 1)]
    assert offsets == sorted(set(offsets))
    for k, offset in enumerate(offsets):
        assert len(token_texts(complete_events(split_response(raw[:offset])[1]))) == k
    assert plan.token_events == expected_answer(resolved(**knobs, include_usage=include_usage)).token_events


def test_same_settings_same_bytes():
    knobs = dict(tokens=20, reasoning_tokens=3, tool_calls=1, n=2, include_usage=True)
    assert response_plan(resolved(**knobs)).to_bytes() == response_plan(resolved(**knobs)).to_bytes()


def test_event_order_role_tokens_finish_usage_done():
    plan = response_plan(resolved(tokens=2, reasoning_tokens=1, n=2, include_usage=True))
    assert [(s.kind, s.choice) for s in plan.segments] == [
        ("role", 0), ("role", 1),
        ("token", 0), ("token", 1), ("token", 0), ("token", 1), ("token", 0), ("token", 1),
        ("finish", 0), ("finish", 1),
        ("usage", None),
        ("done", None),
    ]  # fmt: skip
    first_token = json.loads(events_of(plan)[2])
    assert first_token["choices"][0]["delta"] == {"reasoning_content": "Let"}


def test_usage_null_on_every_chunk_and_a_usage_only_chunk_at_the_end():
    chunks = [json.loads(e) for e in events_of(response_plan(resolved(tokens=3, include_usage=True)))[:-1]]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}


def test_no_usage_key_without_include_usage():
    chunks = [json.loads(e) for e in events_of(response_plan(resolved(tokens=3)))[:-1]]
    assert all("usage" not in c for c in chunks)


def test_healthy_stream_ends_with_a_finish_chunk_and_done():
    events = events_of(response_plan(resolved(tokens=3)))
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "stop"
    assert events[-1] == "[DONE]"


def test_finish_omitted_has_no_finish_chunk_and_null_reasons():
    events = events_of(response_plan(resolved(tokens=3, finish=Finish.OMITTED)))
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 4  # role + 3 tokens
    assert events[-1] == "[DONE]"


def test_finish_empty_has_empty_reasons_on_every_chunk_and_no_finish_chunk():
    chunks = [json.loads(e) for e in events_of(response_plan(resolved(tokens=3, finish=Finish.EMPTY)))[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [""] * 4


def test_no_done_defect():
    events = events_of(response_plan(resolved(tokens=3, done=False)))
    assert "[DONE]" not in events
    assert json.loads(events[-1])["choices"][0]["finish_reason"] == "stop"


def test_max_tokens_truncates_with_length():
    events = events_of(response_plan(resolved(tokens=10, max_tokens=4)))
    assert token_texts(events) == ["The", " quick", " brown", " fox"]
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"


def test_hide_limit_says_stop_where_max_tokens_cut_it():
    events = events_of(response_plan(resolved(tokens=10, max_tokens=4, hide_limit=True)))
    assert token_texts(events) == ["The", " quick", " brown", " fox"]
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "stop"


def test_tool_call_deltas_open_with_id_and_name_then_stream_arguments():
    chunks = [json.loads(e) for e in events_of(response_plan(resolved(tokens=0, tool_calls=1)))[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[1]["tool_calls"][0] == {
        "index": 0, "id": "call_0_0", "type": "function", "function": {"name": "get_weather", "arguments": ""},
    }  # fmt: skip
    arguments = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[1:-1])
    assert json.loads(arguments) == {"city": "Paris", "unit": "celsius"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(("status", "code"), [(429, "rate_limit_exceeded"), (500, "server_error")])
def test_error_event_after_n_tokens(status, code):
    events = events_of(response_plan(resolved(tokens=10, error_after=4, error_status=status)))
    assert len(token_texts(events[:-2])) == 4
    assert json.loads(events[-2])["error"]["code"] == code
    assert events[-1] == "[DONE]"
    assert not any('"finish_reason":"' in e for e in events)


def test_error_event_without_done():
    events = events_of(response_plan(resolved(tokens=10, error_after=0, done=False)))
    assert "error" in json.loads(events[-1])


@pytest.mark.parametrize("status", [429, 500])
def test_http_error_before_streaming(status):
    response, body = read_with_h11(response_plan(resolved(http_error=status)).to_bytes())
    assert response.status_code == status
    assert dict(response.headers)[b"content-type"] == b"application/json"
    assert json.loads(body)["error"]["message"]


def test_non_streaming_completion_carries_the_same_answer():
    plan = response_plan(resolved(tokens=4, reasoning_tokens=2, tool_calls=1, n=2), stream=False)
    completion = json.loads(read_with_h11(plan.to_bytes())[1])
    assert completion["object"] == "chat.completion"
    message = completion["choices"][1]["message"]
    assert (message["content"], message["reasoning_content"]) == ("The quick brown fox", "Let me")
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert [c["finish_reason"] for c in completion["choices"]] == ["tool_calls", "tool_calls"]
    assert completion["usage"]["completion_tokens"] == 2 * (4 + 2 + 6)


@pytest.mark.parametrize(("finish", "reason"), [(Finish.OMITTED, None), (Finish.EMPTY, "")])
def test_non_streaming_defects(finish, reason):
    plan = response_plan(resolved(tokens=2, finish=finish), stream=False)
    assert json.loads(read_with_h11(plan.to_bytes())[1])["choices"][0]["finish_reason"] == reason


def test_connection_close_header_only_when_asked():
    assert b"\r\nconnection: close\r\n" in response_plan(resolved(connection_close=True)).head
    assert b"connection:" not in response_plan(resolved()).head
    assert response_plan(resolved(connection_close=True)).closes
    assert response_plan(resolved(framing=Framing.CLOSE)).closes
    assert not response_plan(resolved()).closes


def test_the_head_echoes_the_effective_settings():
    head = response_plan(resolved(tokens=7, finish=Finish.OMITTED)).head.decode()
    assert "\r\nx-finishline-worker: tokens=7; n=1; include_usage=0; finish=omitted\r\n" in head
