"""The Anthropic Messages rules M1-M7 (docs/repair-rules.md, "Anthropic Messages"), one test per rule, every stream fed whole,
byte by byte and at random splits. Frames are written by the worker's one SSE frame writer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from finishline import (
    Dialect,
    OnCut,
    RepairPolicy,
    RequestFacts,
    StreamRepair,
    Verdict,
    repair_completion,
    stream_dialect,
    transcribe_stream,
)
from labs.worker.frames import sse_frame
from tests.feeding import CHUNKINGS, complete_events, run

MESSAGES = Dialect.MESSAGES


def frame(kind: str, ending: bytes = b"\n", **fields) -> bytes:
    """One Messages frame: `event: <kind>` and `{"type": kind, **fields}`."""
    return sse_frame({"type": kind, **fields}, event=kind, line_ending=ending)


def start(ending: bytes = b"\n", output_tokens: int = 1) -> bytes:
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-lab",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": output_tokens},
    }
    return frame("message_start", ending, message=message)


def text_block(texts: list[str], index: int = 0, ending: bytes = b"\n", stop: bool = True) -> bytes:
    out = frame("content_block_start", ending, index=index, content_block={"type": "text", "text": ""})
    for text in texts:
        out += frame("content_block_delta", ending, index=index, delta={"type": "text_delta", "text": text})
    return out + (frame("content_block_stop", ending, index=index) if stop else b"")


def tool_block(index: int = 1, stop: bool = True) -> bytes:
    out = frame(
        "content_block_start",
        index=index,
        content_block={"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
    )
    for piece in ('{"city', '": "Paris"}'):
        out += frame("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": piece})
    return out + (frame("content_block_stop", index=index) if stop else b"")


def delta(reason, output_tokens: int = 3, ending: bytes = b"\n") -> bytes:
    return frame(
        "message_delta", ending, delta={"stop_reason": reason, "stop_sequence": None}, usage={"output_tokens": output_tokens}
    )


def stop(ending: bytes = b"\n") -> bytes:
    return frame("message_stop", ending)


def events_of(stream: bytes) -> list[dict]:
    return [json.loads(data) for data in complete_events(stream)]


def feed(upstream: bytes, chunking: str, **kwargs) -> tuple[bytes, StreamRepair]:
    return run(upstream, chunking, dialect=MESSAGES, **kwargs)


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_m1_a_well_formed_stream_is_byte_identical(chunking, ending):
    upstream = (
        start(ending)
        + frame("ping", ending)
        + frame("content_block_start", ending, index=0, content_block={"type": "thinking", "thinking": ""})
        + frame("content_block_delta", ending, index=0, delta={"type": "thinking_delta", "thinking": "Let me think"})
        + frame("content_block_delta", ending, index=0, delta={"type": "signature_delta", "signature": "c2ln"})
        + frame("content_block_stop", ending, index=0)
        + text_block(["Hello", " world"], index=1, ending=ending)
        + frame("content_block_delta", ending, index=1, delta={"type": "citations_delta", "citation": {"type": "char_location"}})
        + frame("some_future_event", ending, detail="unknown types pass")
        + delta("end_turn", ending=ending)
        + stop(ending)
    )
    out, repair = feed(upstream, chunking)
    assert out == upstream
    assert repair.report.verdict is Verdict.CLEAN and repair.report.dialect is MESSAGES


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_m1_a_tool_use_turn_is_byte_identical(chunking):
    upstream = start() + text_block(["Checking"]) + tool_block() + delta("tool_use") + stop()
    out, repair = feed(upstream, chunking)
    assert out == upstream and repair.report.verdict is Verdict.CLEAN


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("reason", [None, ""])
def test_m2_message_stop_without_a_stop_reason_gets_end_turn_before_it(chunking, reason):
    # vLLM's abort: stop_reason null, then message_stop.
    upstream = start() + text_block(["Hi"]) + delta(reason, output_tokens=4) + stop()
    out, repair = feed(upstream, chunking)
    events = events_of(out)
    assert events[-2] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 4},
    }
    assert events[-1] == {"type": "message_stop"}
    assert out.startswith(upstream[: -len(stop())])
    assert b"event: message_delta\ndata: " in out[len(upstream) - len(stop()) :]
    assert repair.report.verdict is Verdict.REPAIRED
    assert repair.report.detail == "repaired: injected stop_reason 'end_turn' before message_stop"


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_m2_no_message_delta_at_all_and_an_open_block_is_closed_first(chunking):
    upstream = start(output_tokens=2) + text_block(["Hi"], stop=False) + stop()
    out, repair = feed(upstream, chunking)
    kinds = [event["type"] for event in events_of(out)]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert events_of(out)[-3] == {"type": "content_block_stop", "index": 0}
    assert events_of(out)[-2]["usage"] == {"output_tokens": 2}
    assert repair.report.injected[:2] == [
        {"kind": "content_block_stop", "index": 0},
        {"kind": "finish", "stop_reason": "end_turn"},
    ]


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_m2_a_tool_use_block_gives_tool_use(chunking):
    upstream = start() + tool_block() + delta(None) + stop()
    out, _ = feed(upstream, chunking)
    assert events_of(out)[-2]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize(("output_tokens", "reason"), [(8, "max_tokens"), (9, "max_tokens"), (7, "end_turn")])
def test_m2_max_tokens_when_the_output_reached_the_requests_limit(chunking, output_tokens, reason):
    upstream = start() + text_block(["a"]) + delta(None, output_tokens=output_tokens) + stop()
    out, _ = feed(upstream, chunking, request=RequestFacts.from_body(b'{"max_tokens": 8}'))
    assert events_of(out)[-2]["delta"]["stop_reason"] == reason


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_m2_uses_the_streams_line_endings_and_names_every_frame(chunking):
    upstream = start(b"\r\n") + text_block(["Hi"], ending=b"\r\n") + stop(b"\r\n")
    out, _ = feed(upstream, chunking)
    injected = out[len(upstream) - len(stop(b"\r\n")) :]
    assert injected.startswith(b"event: message_delta\r\ndata: ")
    assert b"\n\n" not in injected.replace(b"\r\n", b"")


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("end", ["clean", "failure"])
def test_m3_a_lost_message_stop_is_appended(chunking, end):
    upstream = start() + text_block(["Hi"]) + delta("end_turn")
    out, repair = feed(upstream, chunking, end=end)
    assert out == upstream + stop()
    assert repair.report.verdict is Verdict.REPAIRED
    assert "terminator lost" in repair.report.detail and "appended message_stop" in repair.report.detail


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("end", ["clean", "failure"])
def test_m4_a_cut_before_the_stop_reason_ends_in_one_error_event(chunking, end):
    upstream = start() + text_block(["Hi", " there"], stop=False)
    out, repair = feed(upstream, chunking, end=end)
    assert out.startswith(upstream)
    injected = out[len(upstream) :]
    assert injected.startswith(b"event: error\ndata: ")
    (error,) = events_of(injected)
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    message = error["error"]["message"]
    assert message.startswith("stream was interrupted: ") and message.endswith("(finish_fix)")
    assert "after 4 events" in message and "after the first token" in message and "without a stop_reason" in message
    assert repair.report.verdict is Verdict.INTERRUPTED
    how = "clean end without message_stop" if end == "clean" else "transport error: peer reset"
    assert how in repair.report.detail


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_m4_a_cut_before_the_first_token_says_so(chunking):
    upstream = start() + frame("ping")
    out, repair = feed(upstream, chunking)
    assert "before the first token" in events_of(out[len(upstream) :])[0]["error"]["message"]
    assert repair.report.interruption.before_first_token


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_m4_an_incomplete_last_frame_is_dropped_not_merged(chunking):
    upstream = start() + text_block(["Hi"], stop=False)
    out, repair = feed(upstream + b'event: content_block_delta\ndata: {"type":"content_bl', chunking)
    assert out.startswith(upstream) and out[len(upstream) :].startswith(b"event: error\n")
    assert repair.report.dropped_incomplete_bytes > 0


def test_m4_on_cut_stop_finishes_the_turn_and_the_books_say_interrupted():
    upstream = start() + text_block(["Hi"], stop=False)
    out, repair = feed(upstream, "whole", policy=RepairPolicy(on_cut=OnCut.STOP))
    assert [event["type"] for event in events_of(out[len(upstream) :])] == ["content_block_stop", "message_delta", "message_stop"]
    assert repair.report.verdict is Verdict.INTERRUPTED


def test_m4_on_cut_pass_changes_nothing():
    upstream = start() + text_block(["Hi"], stop=False)
    out, repair = feed(upstream, "whole", policy=RepairPolicy(on_cut=OnCut.PASS), end="failure")
    assert out == upstream and repair.report.verdict is Verdict.INTERRUPTED


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("end", ["clean", "failure"])
def test_m5_an_upstream_error_passes_and_nothing_follows(chunking, end):
    error = frame("error", error={"type": "overloaded_error", "message": "Overloaded"})
    upstream = start() + text_block(["Hi"], stop=False) + error
    out, repair = feed(upstream, chunking, end=end)
    assert out == upstream
    assert repair.report.verdict is Verdict.UPSTREAM_ERROR
    assert repair.report.detail == "upstream_error: error event (overloaded_error)"
    assert repair.report.upstream_error_message == "Overloaded"


def test_m6_ping_is_a_keepalive_and_the_first_token_is_a_delta():
    repair = StreamRepair(
        dialect=MESSAGES, policy=RepairPolicy(idle_timeout=5, first_token_timeout=10), started_at=0.0, sent_at=0.0
    )
    repair.receive_data(start() + frame("content_block_start", index=0, content_block={"type": "text", "text": ""}), now=1.0)
    assert repair.report.events == 2
    for second in range(2, 10):
        repair.receive_data(frame("ping"), now=float(second))
    assert repair.report.events == 2  # pings are no events
    assert repair.receive_timer(9.5) is None
    ending = repair.receive_timer(10.0)  # the first-token deadline: pings kept nothing alive
    assert ending is not None and b"no token within 10 s" in ending.client_bytes


@pytest.mark.parametrize(
    "delta_value",
    [
        {"type": "text_delta", "text": "a"},
        {"type": "thinking_delta", "thinking": "b"},
        {"type": "input_json_delta", "partial_json": "{"},
    ],
)
def test_m6_text_thinking_and_tool_input_deltas_are_tokens(delta_value):
    upstream = start() + frame("content_block_delta", index=0, delta=delta_value)
    _, repair = feed(upstream, "whole")
    assert repair.report.interruption.before_first_token is False


def test_m6_a_signature_delta_is_no_token():
    upstream = start() + frame("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "x"})
    _, repair = feed(upstream, "whole")
    assert repair.report.interruption.before_first_token is True


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (
            {"type": "message", "content": [{"type": "text", "text": "Hi"}], "stop_reason": None, "usage": {"output_tokens": 2}},
            "end_turn",
        ),
        (
            {"type": "message", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}], "stop_reason": None},
            "tool_use",
        ),
        ({"type": "message", "content": [], "usage": {"output_tokens": 8}}, "max_tokens"),
    ],
)
def test_m7_a_whole_message_without_a_stop_reason_gets_the_inferred_one(message, reason):
    body = json.dumps(message).encode()
    result = repair_completion(body, RequestFacts(max_tokens=8), dialect=MESSAGES)
    assert result.verdict is Verdict.REPAIRED
    assert json.loads(result.body) == {**message, "stop_reason": reason}
    if "stop_reason" in message:  # only the value changed, byte for byte
        assert result.body == body.replace(b'"stop_reason": null', b'"stop_reason": ' + json.dumps(reason).encode())


def test_m7_a_whole_message_with_its_reason_is_clean():
    body = b'{"type": "message", "content": [], "stop_reason": "end_turn"}'
    assert repair_completion(body, dialect=MESSAGES).verdict is Verdict.CLEAN


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("odd_type", [["tool_use"], {"type": "text_delta"}])
def test_a_block_or_delta_type_that_is_a_list_or_an_object_is_data(chunking, odd_type):
    # Unhashable: looked up in a table of types it raised TypeError, and the stream was passed
    # through as an internal error instead of being repaired.
    upstream = (
        start()
        + frame("content_block_start", index=0, content_block={"type": odd_type})
        + frame("content_block_delta", index=0, delta={"type": odd_type, "text": "Hi"})
        + delta(None)
        + stop()
    )
    out, repair = feed(upstream, chunking)
    assert repair.report.internal_error is None
    assert events_of(out)[-2]["delta"]["stop_reason"] == "end_turn"
    body = json.dumps({"type": "message", "content": [{"type": odd_type}], "stop_reason": None}).encode()
    assert json.loads(repair_completion(body, dialect=MESSAGES).body)["stop_reason"] == "end_turn"


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_a_chat_stream_on_a_messages_path_passes_untouched(chunking):
    chunk = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    upstream = chunk + chunk + b"data: [DONE]\n\n"
    out, repair = feed(upstream, chunking)
    # Split inside the second event: the bytes the framer held when it stopped reading go on too.
    split = len(chunk) + 5
    repair = StreamRepair(dialect=MESSAGES)
    assert repair.receive_data(upstream[:split]) + repair.receive_data(upstream[split:]) + repair.receive_end() == upstream
    assert out == upstream
    assert repair.report.verdict is Verdict.SKIPPED
    assert repair.report.detail.startswith("skipped: the first event is Chat Completions, not Anthropic Messages")


def test_the_report_and_the_ledger_record_carry_the_dialect():
    _, repair = feed(start() + text_block(["a"]) + delta("end_turn") + stop(), "whole")
    assert repair.report.as_json()["dialect"] == "messages"


def test_the_transcript_numbers_the_events_and_reassembles_each_block():
    stream = (
        start()
        + text_block(["Hel", "lo"])
        + tool_block()
        + delta("tool_use")
        + stop()
        + b'event: content_block_delta\ndata: {"ty'
    )
    assert stream_dialect(stream) is MESSAGES
    text = transcribe_stream(stream, MESSAGES)
    assert "    3 [content_block_delta] #0 text='Hel'" in text
    assert "--- block 0: text\nHello" in text
    assert '--- block 1: tool_use get_weather\n{"city": "Paris"}' in text
    assert text.splitlines()[11].endswith("(incomplete: the stream ended inside this event)")
