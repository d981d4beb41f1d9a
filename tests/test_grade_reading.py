"""A response read with the core: the verdict is the core's, the rest is what the graders ask."""

from __future__ import annotations

import gzip

from labs.grade.reading import read_completion, read_stream
from labs.worker.settings import WorkerSettings
from labs.worker.wire import response_plan


def body_of(settings: WorkerSettings, *, stream: bool = True) -> bytes:
    plan = response_plan(settings.for_request({}), stream=stream)
    return b"".join(segment.event for segment in plan.segments)


def test_a_healthy_stream_is_clean_with_its_reason_usage_and_done_in_order():
    reading = read_stream(body_of(WorkerSettings(tokens=3, include_usage=True)))
    assert reading.report.verdict == "clean"
    assert (reading.choices[0].content, reading.choices[0].finish_reason) == ("The quick brown", "stop")
    assert [kind for kind, _ in reading.events] == ["chunk", "chunk", "chunk", "chunk", "chunk", "usage", "done"]
    assert reading.reason_positions() == [4] and reading.usage_positions == [5] and reading.done_positions == [6]


def test_the_defects_are_the_cores_repairs():
    omitted = read_stream(body_of(WorkerSettings(tokens=2, finish="omitted")))
    assert omitted.report.repairs == ["injected finish_reason 'stop' for choice 0 before [DONE]"]
    assert omitted.choices[0].finish_reason is None
    empty = read_stream(body_of(WorkerSettings(tokens=2, finish="empty")))
    assert empty.choices[0].reasons_seen == ["", "", ""] and empty.choices[0].finish_reason is None


def test_a_cut_is_interrupted_and_an_error_event_is_an_upstream_error():
    cut = read_stream(body_of(WorkerSettings(tokens=4))[:300], ending="transport error: reset")
    assert cut.report.verdict == "interrupted" and cut.report.interruption.how == "transport error: reset"
    errored = read_stream(body_of(WorkerSettings(tokens=4, error_after=2)))
    assert errored.report.verdict == "upstream_error" and errored.error_positions == [3]
    assert errored.error_message().startswith("Rate limit reached")


def test_a_last_event_without_its_blank_line_still_counts():
    reading = read_stream(body_of(WorkerSettings(tokens=1)).removesuffix(b"\n\n"))
    assert reading.done_positions == [len(reading.events) - 1]


def test_a_completion_reads_its_reasons_and_the_cores_rule_9_verdict():
    clean = read_completion(body_of(WorkerSettings(tokens=3, tool_calls=1), stream=False))
    assert clean.verdict == "clean" and clean.choices[0].finish_reason == "tool_calls"
    assert clean.choices[0].tool_calls == [{"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}]
    missing = read_completion(body_of(WorkerSettings(tokens=3, finish="omitted"), stream=False))
    assert missing.verdict == "repaired" and missing.choices[0].finish_reason is None


# -- what an event, an error event and [DONE] are: the core's words, not the reader's -------------

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}\n\n'


def kinds(body: bytes) -> list[str]:
    return [kind for kind, _ in read_stream(body).events]


def test_a_data_less_error_block_is_no_event_as_the_core_reads_rule_5():
    # No data field: no client dispatches it, and the core neither counts it nor calls it an error.
    reading = read_stream(b"event: error\n\n" + CHUNK + b"data: [DONE]\n\n")
    assert [kind for kind, _ in reading.events] == ["chunk", "done"]
    assert reading.error_positions == [] and reading.report.verdict == "clean"


def test_error_events_are_the_cores_both_ways_and_done_after_one_is_seen():
    named = read_stream(b'event: error\ndata: {"message": "m"}\n\n' + b"data: [DONE]\n\n")
    assert (named.error_positions, named.done_positions) == ([0], [1])
    inline = read_stream(CHUNK + b'data: {"error": {"message": "overloaded"}}\n\n' + b"data: [DONE]\n\n")
    assert (inline.error_positions, inline.done_positions, inline.error_message()) == ([1], [2], "overloaded")
    assert inline.report.verdict == "upstream_error"


def test_done_is_what_the_core_stops_at():
    # `data:` drops one space: with two, the data is " [DONE]", which the core does not stop at.
    assert kinds(CHUNK + b"data:  [DONE]\n\n") == ["chunk", "unreadable"]
    assert kinds(CHUNK + b"data:[DONE]\r\r") == ["chunk", "done"]
    assert kinds(b": keep-alive\n\n" + CHUNK + b"data: [DONE]\n\n") == ["chunk", "done"]


def test_a_last_event_the_core_drops_is_no_event():
    assert kinds(CHUNK + b'data: {"choi') == ["chunk"]


def test_a_compressed_body_is_not_read_and_says_so():
    body = gzip.compress(body_of(WorkerSettings(tokens=2)))
    reading = read_stream(body, content_encoding="gzip")
    assert (reading.compressed, reading.events, reading.choices, reading.report.verdict) == ("gzip", [], {}, "skipped")
    assert reading.summary().startswith("the body came gzip-compressed although the grader asked for accept-encoding: identity")
    assert read_stream(body_of(WorkerSettings(tokens=2)), content_encoding="identity").compressed is None
