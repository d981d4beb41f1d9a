"""A response read with the core: the verdict is the core's, the rest is what the graders ask."""

from __future__ import annotations

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
