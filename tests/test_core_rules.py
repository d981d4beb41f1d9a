"""The repair contract (issue 2, "Repair rules"), one test per rule, each input fed whole, a byte at a
time and at random split points."""

from __future__ import annotations

import json

import pytest

from finishline import LocalProtocolError, OnCut, RepairPolicy, RequestFacts, StreamRepair, Verdict
from tests.feeding import CHUNKINGS, chunk, data_events, run, sse

pytestmark = pytest.mark.parametrize("chunking", CHUNKINGS)

HEALTHY = sse(
    chunk(delta={"role": "assistant", "content": ""}), chunk("Hel"), chunk("lo"), chunk(finish_reason="stop"), b"[DONE]"
)


def finishes(stream: bytes) -> list[tuple[int, str]]:
    return [
        (choice["index"], choice["finish_reason"])
        for event in data_events(stream)
        if isinstance(event, dict)
        for choice in event.get("choices", [])
        if choice.get("finish_reason")
    ]


# -- rule C1: passthrough -----------------------------------------------------------------------


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_rule_1_well_formed_stream_is_byte_identical(chunking, ending):
    upstream = sse(chunk("Hel"), chunk("lo"), chunk(finish_reason="stop"), b"[DONE]", ending=ending)
    out, repair = run(upstream, chunking)
    assert out == upstream
    assert repair.report.verdict is Verdict.CLEAN


def test_rule_1_each_complete_event_leaves_at_once(chunking):
    repair = StreamRepair()
    first = sse(chunk("Hel"))
    assert repair.receive_data(first + b'data: {"partial') == first
    assert repair.receive_data(b'": 1}\n\n') == b'data: {"partial": 1}\n\n'


# -- rule C2: empty reasons ---------------------------------------------------------------------


def test_rule_2_empty_finish_reason_becomes_null(chunking):
    upstream = sse(chunk("Hi", finish_reason=""), chunk(" there", finish_reason=""), b"[DONE]")
    out, repair = run(upstream, chunking)
    events = data_events(out)
    assert events[0]["choices"][0]["finish_reason"] is None
    assert events[0]["choices"][0]["delta"] == {"content": "Hi"}
    assert events[1]["choices"][0]["finish_reason"] is None
    assert finishes(out) == [(0, "stop")]
    assert events[-1] == "[DONE]"
    assert "rewrote 2 empty finish_reason values to null" in repair.report.repairs
    # Only the value changed: the rest of the event is the upstream's own bytes.
    assert out.startswith(sse(chunk("Hi", finish_reason="")).replace(b'"finish_reason": ""', b'"finish_reason": null'))


def test_rule_2_can_be_turned_off(chunking):
    upstream = sse(chunk("Hi", finish_reason=""), b"[DONE]")
    out, _ = run(upstream, chunking, policy=RepairPolicy(empty_to_null=False))
    assert data_events(out)[0]["choices"][0]["finish_reason"] == ""
    assert finishes(out) == [(0, "stop")]


def test_rule_2_does_not_touch_the_words_in_content(chunking):
    tricky = chunk('say "finish_reason": "" please', finish_reason="")
    out, _ = run(sse(tricky, b"[DONE]"), chunking)
    assert data_events(out)[0]["choices"][0]["delta"]["content"] == 'say "finish_reason": "" please'


# -- rule C3: missing terminal reason -----------------------------------------------------------


def test_rule_3_missing_reason_gets_stop_before_done(chunking):
    upstream = sse(chunk("Hel", system_fingerprint="fp1"), chunk("lo"), b"[DONE]")
    out, repair = run(upstream, chunking)
    events = data_events(out)
    assert events[-1] == "[DONE]"
    injected = events[-2]
    assert injected == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m1",
        "system_fingerprint": "fp1",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
    }
    assert out.startswith(sse(chunk("Hel", system_fingerprint="fp1"), chunk("lo")))
    assert repair.report.verdict is Verdict.REPAIRED
    assert repair.report.injected == [{"kind": "finish", "choice": 0, "finish_reason": "stop"}]


def test_rule_3_one_event_per_unfinished_choice(chunking):
    upstream = sse(chunk("a", index=0), chunk("b", index=1), chunk(index=1, finish_reason="stop"), chunk("c", index=2), b"[DONE]")
    out, _ = run(upstream, chunking)
    assert finishes(out) == [(1, "stop"), (0, "stop"), (2, "stop")]


def test_rule_3_tool_calls_get_tool_calls(chunking):
    call = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    out, _ = run(sse(chunk(delta=call), b"[DONE]"), chunking)
    assert finishes(out) == [(0, "tool_calls")]


def test_rule_3_legacy_function_call_gets_function_call(chunking):
    out, _ = run(sse(chunk(delta={"function_call": {"name": "f", "arguments": ""}}), b"[DONE]"), chunking)
    assert finishes(out) == [(0, "function_call")]


def test_rule_3_length_when_usage_reaches_the_limit(chunking):
    usage = {"prompt_tokens": 3, "completion_tokens": 16, "total_tokens": 19}
    upstream = sse(chunk("x"), chunk(choices=[], usage=usage), b"[DONE]")
    out, _ = run(upstream, chunking, request=RequestFacts(max_tokens=16))
    assert finishes(out) == [(0, "length")]
    # OpenAI sends the finish chunk before the trailing usage-only chunk.
    events = data_events(out)
    assert events[1]["choices"][0]["finish_reason"] == "length"
    assert events[2]["choices"] == [] and events[2]["usage"] == usage


def test_rule_3_stop_when_usage_is_under_the_limit(chunking):
    upstream = sse(chunk("x"), chunk(choices=[], usage={"completion_tokens": 15}), b"[DONE]")
    out, _ = run(upstream, chunking, request=RequestFacts(max_tokens=16))
    assert finishes(out) == [(0, "stop")]


def test_rule_3_uses_the_streams_line_endings(chunking):
    upstream = sse(chunk("x"), b"[DONE]", ending=b"\r\n")
    out, _ = run(upstream, chunking)
    assert b"\n" not in out.replace(b"\r\n", b"")
    assert out.endswith(b'"finish_reason":"stop"}]}\r\n\r\ndata: [DONE]\r\n\r\n')


def test_rule_3_reasoning_model_without_reason(chunking):
    # The motivating bug: reasoning deltas, then content, then [DONE] and no finish_reason at all.
    upstream = sse(chunk(delta={"reasoning_content": "think"}), chunk("answer"), b"[DONE]")
    out, _ = run(upstream, chunking)
    assert finishes(out) == [(0, "stop")]


# -- rule C4: finished but no [DONE] ------------------------------------------------------------


def test_rule_4_done_appended_after_a_clean_end(chunking):
    upstream = sse(chunk("x"), chunk(finish_reason="stop"))
    out, repair = run(upstream, chunking)
    assert out == upstream + b"data: [DONE]\n\n"
    assert repair.report.verdict is Verdict.REPAIRED


def test_rule_4_last_event_without_its_blank_line_is_completed(chunking):
    upstream = sse(chunk("x"), chunk(finish_reason="stop")) + b"data: [DONE]\n"
    out, repair = run(upstream, chunking)
    assert out == upstream + b"\n"
    assert data_events(out)[-1] == "[DONE]"
    assert repair.report.verdict is Verdict.REPAIRED


# -- rule C5: error events pass through ---------------------------------------------------------


def test_rule_5_error_event_passes_and_nothing_is_injected(chunking):
    error = {"error": {"message": "Rate limit reached", "type": "rate_limit_error", "code": "rate_limit_exceeded"}}
    upstream = sse(chunk("x"), error, b"[DONE]")
    out, repair = run(upstream, chunking)
    assert out == upstream
    assert repair.report.verdict is Verdict.UPSTREAM_ERROR
    # The books name the error; its message (which may quote content) stays out of the detail.
    assert repair.report.detail == "upstream_error: error event (rate_limit_exceeded)"
    assert repair.report.upstream_error_message == "Rate limit reached"


def test_rule_5_event_type_error_counts_too(chunking):
    upstream = sse(chunk("x")) + b"event: error\ndata: worker lost\n\n"
    out, repair = run(upstream, chunking)
    assert out == upstream
    assert repair.report.verdict is Verdict.UPSTREAM_ERROR


def test_rule_5_an_error_type_without_data_is_no_event(chunking):
    # No client dispatches an event with no data (WHATWG), so it cannot tell the client anything:
    # the stream still needs its end (found by the fuzz contracts, tests/test_core_fuzz.py).
    upstream = sse(chunk("x")) + b"event: error\n\n"
    out, repair = run(upstream, chunking)
    assert out.startswith(upstream)
    assert data_events(out)[-1]["error"]["code"] == "stream_interrupted"
    assert repair.report.verdict is Verdict.INTERRUPTED


@pytest.mark.parametrize("message", [None, {"nested": True}, 42, ["a"]])
def test_rule_5_error_event_of_any_shape(chunking, message):
    upstream = sse(chunk("x"), {"error": {"message": message}}, b"[DONE]")
    out, repair = run(upstream, chunking)
    assert out == upstream
    assert repair.report.verdict is Verdict.UPSTREAM_ERROR


def test_rule_5_error_null_is_not_an_error(chunking):
    out, repair = run(sse(chunk("x", error=None), b"[DONE]"), chunking)
    assert repair.report.verdict is Verdict.REPAIRED


# -- rules C6 and C7: cut streams are errors, never successes ------------------------------------


def error_event(stream: bytes) -> dict:
    last = data_events(stream)[-1]
    assert isinstance(last, dict) and "error" in last, stream
    return last["error"]


@pytest.mark.parametrize("end", ["clean", "failure"])
def test_rule_6_cut_after_tokens_ends_in_an_error_event(chunking, end):
    upstream = sse(chunk("Hel"), chunk("lo"))
    out, repair = run(upstream, chunking, end=end)
    assert out.startswith(upstream)
    error = error_event(out)
    assert error["type"] == "server_error" and error["code"] == "stream_interrupted"
    assert "stream was interrupted" in error["message"] and "after 2 events" in error["message"]
    assert b"[DONE]" not in out
    report = repair.report
    assert report.verdict is Verdict.INTERRUPTED
    assert report.interruption is not None and not report.interruption.before_first_token
    expected_how = "clean end without [DONE]" if end == "clean" else "transport error: peer reset"
    assert report.interruption.how == expected_how
    assert report.interruption.cause == ("clean_end" if end == "clean" else "transport_error")


def test_rule_6_incomplete_event_is_dropped_not_merged(chunking):
    partial = b'data: {"id": "chatcmpl-1", "TRUNCATED'
    out, repair = run(sse(chunk("Hel")) + partial, chunking, end="failure")
    assert b"TRUNCATED" not in out
    assert error_event(out)["code"] == "stream_interrupted"
    assert repair.report.dropped_incomplete_bytes == len(partial)


def test_rule_6_on_cut_stop_lies_only_when_asked(chunking):
    out, repair = run(sse(chunk("Hel")), chunking, end="failure", policy=RepairPolicy(on_cut=OnCut.STOP))
    assert finishes(out) == [(0, "stop")] and data_events(out)[-1] == "[DONE]"
    assert repair.report.verdict is Verdict.INTERRUPTED  # the books stay true


def test_rule_6_on_cut_pass_changes_nothing(chunking):
    upstream = sse(chunk("Hel")) + b'data: {"trunc'
    out, repair = run(upstream, chunking, end="failure", policy=RepairPolicy(on_cut=OnCut.PASS))
    assert out == upstream
    assert repair.report.verdict is Verdict.INTERRUPTED


def test_rule_6_failure_output_says_how_to_end(chunking):
    for policy, end_response in ((OnCut.ERROR, True), (OnCut.STOP, True), (OnCut.PASS, False)):
        repair = StreamRepair(policy=RepairPolicy(on_cut=policy))
        repair.receive_data(sse(chunk("x")))
        assert repair.receive_failure("reset").end_response is end_response
    finished = StreamRepair(policy=RepairPolicy(on_cut=OnCut.PASS))
    finished.receive_data(sse(chunk("x"), chunk(finish_reason="stop")))
    assert finished.receive_failure("reset") == (b"data: [DONE]\n\n", True)


def test_rule_6_usage_chunk_mid_stream_never_makes_a_cut_a_success(chunking):
    # A usage-only chunk is taken as the end (rule C3), but content after it proves otherwise: a
    # stream that then stops is a cut, not a stream that only lacked [DONE].
    upstream = sse(chunk("Hel"), chunk(choices=[], usage={"completion_tokens": 1}), chunk("lo, wor"))
    for end in ("clean", "failure"):
        out, repair = run(upstream, chunking, end=end)
        assert b"[DONE]" not in out
        assert error_event(out)["code"] == "stream_interrupted"
        assert repair.report.verdict is Verdict.INTERRUPTED


def test_rule_4_usage_chunk_as_the_real_end_still_gets_done(chunking):
    upstream = sse(chunk("Hello"), chunk(choices=[], usage={"completion_tokens": 1}))
    out, repair = run(upstream, chunking)
    assert finishes(out) == [(0, "stop")] and data_events(out)[-1] == "[DONE]"
    assert repair.report.verdict is Verdict.REPAIRED


def test_rule_6_transport_error_after_the_finish_only_adds_done(chunking):
    upstream = sse(chunk("x"), chunk(finish_reason="stop"))
    out, repair = run(upstream, chunking, end="failure")
    assert out == upstream + b"data: [DONE]\n\n"
    assert repair.report.verdict is Verdict.REPAIRED


def test_rule_6_cut_after_done_is_not_an_interruption(chunking):
    out, repair = run(HEALTHY, chunking, end="failure")
    assert out == HEALTHY
    assert repair.report.verdict is Verdict.CLEAN


@pytest.mark.parametrize("end", ["clean", "failure"])
def test_rule_7_cut_before_the_first_token(chunking, end):
    out, repair = run(b": keep-alive\n\n", chunking, end=end)
    assert "before the first token" in error_event(out)["message"]
    assert repair.report.interruption.before_first_token


def test_rule_7_role_only_chunk_is_not_a_token(chunking):
    out, repair = run(sse(chunk(delta={"role": "assistant", "content": ""})), chunking, end="failure")
    assert repair.report.interruption.before_first_token


# -- rule C8: malformed input is data -----------------------------------------------------------

MALFORMED = [
    b"data: not json\n\n",
    b'data: {"choices": [\xff\xfe]}\n\n',
    b": ping\n\n",
    b'event: message\nid: 7\nretry: 1000\ndata: {"unknown": true}\n\n',
    b'data:{"choices":[]}\n\n',
    b'data: {"a":\ndata: 1}\n\n',
    b"data: [1, 2]\n\n",
    b'data: {"choices": [{"index": "zero"}]}\n\n',
    b"data\n\n",
    b"\n\n\n",
]


@pytest.mark.parametrize("event", MALFORMED)
def test_rule_8_malformed_events_pass_through_unchanged(chunking, event):
    upstream = sse(chunk("x")) + event + sse(chunk(finish_reason="stop"), b"[DONE]")
    out, _ = run(upstream, chunking)
    assert out == upstream


def test_rule_8_feeding_after_the_end_is_misuse(chunking):
    repair = StreamRepair()
    repair.receive_end()
    with pytest.raises(LocalProtocolError, match=r"receive_data\(\) called after the stream ended \(receive_end"):
        repair.receive_data(b"data: x\n\n")


class BuggyRepair(StreamRepair):
    """A repair with a bug of its own: it fails on any event whose content is "BUG"."""

    def _on_event(self, event, now):
        if b'"content": "BUG"' in (event.data or b""):
            raise RuntimeError("a bug")
        return super()._on_event(event, now)


def test_rule_8_an_internal_error_passes_the_rest_through_exactly(chunking):
    from tests.feeding import split

    upstream = sse(chunk("a"), chunk("BUG"), chunk("b")) + b'data: {"half'
    rest = b'": 1}\n\n' + sse(b"[DONE]")
    repair = BuggyRepair()
    out = b"".join(repair.receive_data(piece) for piece in split(upstream, chunking))
    out += b"".join(repair.receive_data(piece) for piece in split(rest, chunking))
    out += repair.receive_end()
    assert out == upstream + rest
    assert repair.report.verdict is Verdict.SKIPPED
    assert repair.report.internal_error == "internal error (RuntimeError: a bug)"
    assert "passed through unchanged from event 2" in repair.report.detail


def test_rule_8_an_event_that_never_ends_is_passed_through_not_held(chunking):
    from finishline import MAX_HELD_BYTES

    repair = StreamRepair()
    sent = repair.receive_data(sse(chunk("x")) + b"data: " + b"y" * (MAX_HELD_BYTES + 1))
    assert sent.endswith(b"y" * 1000)
    assert repair.receive_data(b"more") == b"more"
    assert repair.report.verdict is Verdict.SKIPPED


@pytest.mark.parametrize(
    "data", [b"[" * 100_000, b'{"choices": ' + b"[" * 100_000, b'{"error": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"]
)
def test_rule_8_deeply_nested_json_is_data(chunking, data):
    if chunking == "bytewise":
        chunking = "random"
    upstream = sse(chunk("x")) + b"data: " + data + b"\n\n" + sse(chunk(finish_reason="stop"), b"[DONE]")
    out, repair = run(upstream, chunking)
    assert out == upstream
    assert repair.report.internal_error is None


def test_rule_8_client_gone_closes_the_books_only(chunking):
    repair = StreamRepair()
    repair.receive_data(sse(chunk("x")))
    repair.receive_client_gone("Client disconnected.")
    assert repair.report.verdict is Verdict.INTERRUPTED
    assert repair.report.interruption.how == "client gone: Client disconnected."
    assert repair.report.injected == []


def test_request_facts_read_the_limit(chunking):
    assert RequestFacts.from_body(json.dumps({"max_completion_tokens": 5, "max_tokens": 9}).encode()).max_tokens == 5
    assert RequestFacts.from_body(b'{"max_tokens": 9, "model": "m"}') == RequestFacts(max_tokens=9, model="m")
    assert RequestFacts.from_body(b"not json") == RequestFacts()
    assert RequestFacts.from_body(b'{"max_tokens": true}').max_tokens is None
