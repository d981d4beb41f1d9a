"""Rule C9 (non-streaming bodies), the transcript behind the mitmweb view, and the books helpers."""

from __future__ import annotations

import json

import pytest

from finishline import RequestFacts, Verdict, infer_finish_reason, repair_completion, transcribe_chat_stream
from finishline.addon.books import BodyCopy, parse_size
from tests.feeding import chunk, sse


def completion(**choice) -> dict:
    return {"id": "c", "object": "chat.completion", "choices": [{"index": 0, **choice}], "usage": {"completion_tokens": 7}}


def test_rule_9_null_reason_is_filled_in_place():
    body = json.dumps(completion(message={"content": "hi"}, finish_reason=None), indent=2).encode()
    result = repair_completion(body)
    assert result.verdict is Verdict.REPAIRED
    assert result.body == body.replace(b'"finish_reason": null', b'"finish_reason": "stop"')
    assert result.repairs == ["set finish_reason 'stop' for choice 0"]


def test_rule_9_missing_key_is_added_and_nothing_else_moves():
    body = (
        b'{"object": "chat.completion", "choices": [{"index": 0, "message": {"content": "caf\\u00e9 \\"}\\""}},'
        b' {"index": 1, "message": {}, "finish_reason": ""}, {}], "usage": {"completion_tokens": 2}}'
    )
    result = repair_completion(body)
    assert result.body == (
        b'{"object": "chat.completion", "choices": [{"index": 0, "message": {"content": "caf\\u00e9 \\"}\\""}, "finish_reason": "stop"},'
        b' {"index": 1, "message": {}, "finish_reason": "stop"}, {"finish_reason": "stop"}], "usage": {"completion_tokens": 2}}'
    )


@pytest.mark.parametrize(
    ("message", "request_facts", "expected"),
    [
        (
            {"content": None, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            RequestFacts(),
            "tool_calls",
        ),
        ({"content": None, "function_call": {"name": "f", "arguments": "{}"}}, RequestFacts(), "function_call"),
        ({"content": "cut"}, RequestFacts(max_tokens=7), "length"),
        ({"content": "fine"}, RequestFacts(max_tokens=8), "stop"),
    ],
)
def test_rule_9_missing_reason_is_inferred(message, request_facts, expected):
    result = repair_completion(json.dumps(completion(message=message)).encode(), request_facts)
    assert json.loads(result.body)["choices"][0]["finish_reason"] == expected


@pytest.mark.parametrize(
    ("body", "verdict"),
    [
        (b"not json", Verdict.SKIPPED),
        (b"[]", Verdict.SKIPPED),
        (b'{"object": "list", "data": []}', Verdict.SKIPPED),
        (b"[" * 100_000, Verdict.SKIPPED),
        (json.dumps(completion(message={}, finish_reason="stop")).encode(), Verdict.CLEAN),
    ],
)
def test_rule_9_leaves_other_bodies_alone(body, verdict):
    result = repair_completion(body)
    assert result.verdict is verdict and result.body == body


def test_inference_order():
    assert infer_finish_reason(tool_calls=True, function_call=True, completion_tokens=9, max_tokens=1) == "tool_calls"
    assert infer_finish_reason(tool_calls=False, function_call=False, completion_tokens=None, max_tokens=1) == "stop"


def test_transcript_reassembles_the_answer():
    stream = sse(chunk(delta={"reasoning_content": "hmm"}), chunk("Hel"), chunk("lo"), chunk(finish_reason="stop"), b"[DONE]")
    text = transcribe_chat_stream(stream + b'data: {"cut')
    assert "reasoning: hmm" in text and "content: Hello" in text and "finish_reason='stop'" in text
    assert "(incomplete: the stream ended inside this event)" in text
    assert "ERROR" in transcribe_chat_stream(sse({"error": {"message": "x"}}))
    assert "not JSON" in transcribe_chat_stream(b"data: \xff\xfe\n\n")
    odd = sse(
        {"choices": [{"index": [0], "delta": {"tool_calls": [{"function": "f"}]}}, {"index": "a"}, 7]}, {"choices": {"a": 1}}
    )
    assert "(no deltas)" in transcribe_chat_stream(odd)
    assert "not JSON" in transcribe_chat_stream(b"data: " + b"[" * 100_000 + b"\n\n")


@pytest.mark.parametrize(
    ("text", "size"), [("0", 0), ("1048576", 1048576), ("4MB", 4 << 20), ("512 kb", 512 << 10), ("2g", 2 << 30)]
)
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "-1", "4 MiB", "lots", "1.5MB"])
def test_bad_sizes_say_what_is_valid(text):
    with pytest.raises(ValueError, match="is not a size; use a number of bytes or e.g. 512KB, 4MB, 0 for none"):
        parse_size(text)


def test_body_copy_is_bounded_and_keeps_both_ends():
    copy = BodyCopy(100)
    for i in range(1000):
        copy.add(b"%04d," % i)
    value = copy.value()
    assert value.startswith(b"0000,0001,") and value.endswith(b"0998,0999,")
    assert b": finish_fix: 4900 bytes of this stream are not kept here" in value
    assert len(value) < 200
    small = BodyCopy(100)
    small.add(b"abc")
    assert small.value() == b"abc"
    off = BodyCopy(0)
    off.add(b"abc")
    assert off.value() == b""
