"""The outcome rules (labs/outcome.py), one test per rule."""

from __future__ import annotations

import pytest

from finishline import Dialect
from labs.dialects import LAB_DIALECTS
from labs.outcome import BOOKS_ERROR, BOOKS_OK, ClientReport, Expected, Outcome, books_mismatch, canonical_reason, judge

ANSWER = "The quick brown fox jumps over"
STOP = Expected(text=ANSWER, finish_reason="stop")
LENGTH = Expected(text=ANSWER, finish_reason="length")
TOOLS = Expected(text="", finish_reason="tool_calls", tool_calls=({"name": "get_weather", "arguments": '{"city": "Paris"}'},))
ENDS_IN_ERROR = Expected(text="The quick", finish_reason=None)


def report(**fields) -> ClientReport:
    return ClientReport(**{"client": "test-client", "completed": True, "text": ANSWER, **fields})


def test_the_closed_set_is_these_five_words_in_this_order():
    assert [o.value for o in Outcome] == ["ok", "error", "flagged", "hang", "silent-truncation"]
    assert [o.severity for o in Outcome] == [0, 1, 2, 3, 4]


def test_full_answer_with_the_true_reason_is_ok():
    judgement = judge(report(finish_reason="stop"), STOP)
    assert judgement.outcome is Outcome.OK
    assert judgement.reason == "full answer, finish reason 'stop'"


def test_full_answer_without_a_reason_is_ok_when_the_truth_is_stop():
    judgement = judge(report(finish_reason=None), STOP)
    assert judgement.outcome is Outcome.OK
    assert "no finish reason surfaced" in judgement.reason


def test_empty_string_reason_counts_as_none():
    assert canonical_reason("") is None
    assert judge(report(finish_reason=""), STOP).outcome is Outcome.OK


def test_missing_length_is_silent_truncation():
    judgement = judge(report(finish_reason=None), LENGTH)
    assert judgement.outcome is Outcome.SILENT_TRUNCATION
    assert judgement.reason == "full text, but finish reason None where the worker's was 'length'"


def test_invented_stop_instead_of_length_is_silent_truncation():
    assert judge(report(finish_reason="stop"), LENGTH).outcome is Outcome.SILENT_TRUNCATION


def test_short_text_reported_as_success_is_silent_truncation():
    judgement = judge(report(text="The quick", finish_reason="stop"), STOP)
    assert judgement.outcome is Outcome.SILENT_TRUNCATION
    assert judgement.reason == f"success reported with 9 characters, shorter than the worker's {len(ANSWER)}"


def test_different_text_reported_as_success_is_silent_truncation():
    judgement = judge(report(text="The slow brown fox jumps over", finish_reason="stop"), STOP)
    assert judgement.outcome is Outcome.SILENT_TRUNCATION
    assert "different from" in judgement.reason


def test_missing_tool_call_is_silent_truncation():
    judgement = judge(report(text="", finish_reason="tool_calls", tool_calls=[]), TOOLS)
    assert judgement.outcome is Outcome.SILENT_TRUNCATION
    assert judgement.reason == "success reported with 0 tool calls, the worker sent 1"


@pytest.mark.parametrize("spelling", ["tool_calls", "tool-calls", "toolUse"])
def test_each_clients_spelling_of_tool_calls_is_the_same_reason(spelling):
    call = [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert judge(report(text="", finish_reason=spelling, tool_calls=call), TOOLS).outcome is Outcome.OK


def test_tool_call_arguments_are_compared_as_json_values():
    # The AI SDK and Pi hand over parsed arguments; the driver's re-serialization spaces them differently.
    call = [{"name": "get_weather", "arguments": '{"city":"Paris"}'}]
    assert judge(report(text="", finish_reason="tool_calls", tool_calls=call), TOOLS).outcome is Outcome.OK


def test_a_tool_call_with_cut_arguments_is_silent_truncation():
    call = [{"name": "get_weather", "arguments": '{"city": "Pa'}]
    judgement = judge(report(text="", finish_reason="tool_calls", tool_calls=call), TOOLS)
    assert judgement.outcome is Outcome.SILENT_TRUNCATION
    assert 'tool call 0 is get_weather({"city": "Pa)' in judgement.reason


def test_a_tool_call_with_another_name_is_silent_truncation():
    call = [{"name": "get_time", "arguments": '{"city": "Paris"}'}]
    judgement = judge(report(text="", finish_reason="tool_calls", tool_calls=call), TOOLS)
    assert judgement.outcome is Outcome.SILENT_TRUNCATION
    assert "where the worker sent get_weather(" in judgement.reason


def test_success_when_the_worker_answered_an_http_error_is_silent_truncation():
    before_stream = Expected(text="", finish_reason=None, http_error=429)
    judgement = judge(report(text="", finish_reason="stop"), before_stream)
    assert judgement.outcome is Outcome.SILENT_TRUNCATION
    assert "HTTP 429 before streaming" in judgement.reason


def test_an_http_error_before_streaming_raised_by_the_client_is_error():
    before_stream = Expected(text="", finish_reason=None, http_error=429)
    judgement = judge(report(completed=False, text="", error_class="RateLimitError", error_message="429"), before_stream)
    assert judgement.outcome is Outcome.ERROR


@pytest.mark.parametrize("reason", ["abort", "error", "interrupted", "other", "aborted"])
def test_a_surfaced_failure_reason_is_flagged_for_any_client(reason):
    # vLLM sends `abort`, OpenRouter `error`; a client that passes them on has told its application,
    # without raising.
    judgement = judge(report(client="openai-python", finish_reason=reason), STOP)
    assert judgement.outcome is Outcome.FLAGGED


def test_success_when_the_stream_ended_in_an_error_event_is_silent_truncation():
    judgement = judge(report(text="The quick", finish_reason=None), ENDS_IN_ERROR)
    assert judgement.outcome is Outcome.SILENT_TRUNCATION
    assert "ended in an error" in judgement.reason


def test_a_raised_error_is_error_with_class_and_message():
    judgement = judge(report(completed=False, error_class="APIError", error_message="stream was interrupted"), STOP)
    assert judgement.outcome is Outcome.ERROR
    assert judgement.reason == "APIError: stream was interrupted"


@pytest.mark.parametrize("reason", ["interrupted", "error", "other", "aborted"])
def test_a_failure_reason_without_exception_is_flagged_not_error(reason):
    judgement = judge(report(finish_reason=reason), STOP)
    assert judgement.outcome is Outcome.FLAGGED
    assert judgement.reason == f"no exception, but the client surfaced finish reason {reason!r}"


def test_a_failure_reason_after_a_short_answer_is_flagged_not_silent_truncation():
    # The AI SDK after a cut that undici took for a clean end: part of the text, reason `interrupted`.
    # The client did say so; whether the application listens is what `flagged` tells apart.
    assert judge(report(text="The quick", finish_reason="interrupted"), STOP).outcome is Outcome.FLAGGED


def test_a_timed_out_request_is_hang_even_with_partial_text():
    judgement = judge(report(completed=False, timed_out=True, text="The quick", error_class="TimeoutError"), STOP)
    assert judgement.outcome is Outcome.HANG
    assert judgement.reason == f"no end within the deadline; 9 of {len(ANSWER)} characters received"


def test_hang_wins_over_a_completed_flag():
    # A library that reports completion after the lab's deadline fired is still a hang.
    assert judge(report(timed_out=True, finish_reason="stop"), STOP).outcome is Outcome.HANG


@pytest.mark.parametrize(
    ("outcome", "books", "mismatch"),
    [
        (Outcome.OK, BOOKS_OK, False),
        (Outcome.OK, BOOKS_ERROR, True),
        (Outcome.ERROR, BOOKS_ERROR, False),
        (Outcome.ERROR, BOOKS_OK, True),
        # A flagged cell is a failure the client noticed: books that call it a success disagree.
        (Outcome.FLAGGED, BOOKS_OK, True),
        (Outcome.FLAGGED, BOOKS_ERROR, False),
        (Outcome.SILENT_TRUNCATION, BOOKS_OK, True),
        (Outcome.HANG, BOOKS_OK, True),
        (Outcome.HANG, BOOKS_ERROR, False),
        (Outcome.SILENT_TRUNCATION, None, False),
    ],
)
def test_books_mismatch(outcome, books, mismatch):
    assert books_mismatch(outcome, books) is mismatch


def test_report_round_trips_through_json_and_ignores_unknown_keys():
    original = report(finish_reason="stop", ttft_s=0.1, connection="close")
    data = {**original.to_json(), "id": "c0001", "something_new": 1}
    assert ClientReport.from_json(data) == original


# -- the other dialects' words (issue 13) -------------------------------------------------------------


def messages(reason: str, **fields) -> Expected:
    return Expected(text=ANSWER, finish_reason=reason, dialect=Dialect.MESSAGES, **fields)


def responses(reason: str, **fields) -> Expected:
    return Expected(text=ANSWER, finish_reason=reason, dialect=Dialect.RESPONSES, **fields)


@pytest.mark.parametrize(
    ("surfaced", "truth"),
    [
        ("end_turn", "end_turn"),  # anthropic-python and -node, LangChain's stop_reason
        ("stop", "end_turn"),  # the AI SDK's unified reason, pi-ai's stopReason
        ("max_tokens", "max_tokens"),
        ("length", "max_tokens"),
        ("tool_use", "tool_use"),
        ("tool-calls", "tool_use"),
        ("toolUse", "tool_use"),
    ],
)
def test_each_clients_word_for_a_messages_stop_reason_is_the_same_reason(surfaced, truth):
    assert judge(report(finish_reason=surfaced), messages(truth)).outcome is Outcome.OK


def test_a_messages_stream_without_stop_reason_is_ok_where_the_truth_is_end_turn():
    # anthropic-python's get_final_message() after `stop_reason: null` then `message_stop`: the
    # full text, no reason, which an application reads as a normal end (as Chat's missing `stop`).
    judgement = judge(report(finish_reason=None), messages("end_turn"))
    assert judgement.outcome is Outcome.OK
    assert judgement.reason == "full answer; no finish reason surfaced (true reason: end_turn)"


@pytest.mark.parametrize("truth", ["max_tokens", "tool_use"])
def test_a_messages_stream_without_the_reason_to_act_on_is_silent_truncation(truth):
    judgement = judge(report(finish_reason=None), messages(truth))
    assert judgement.outcome is Outcome.SILENT_TRUNCATION
    assert judgement.reason == f"full text, but finish reason None where the worker's was {truth!r}"


def test_an_invented_end_turn_for_a_tool_use_is_silent_truncation():
    call = [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    expected = Expected(text="", finish_reason="tool_use", tool_calls=TOOLS.tool_calls, dialect=Dialect.MESSAGES)
    assert judge(report(text="", finish_reason="end_turn", tool_calls=call), expected).outcome is Outcome.SILENT_TRUNCATION
    assert judge(report(text="", finish_reason="tool_use", tool_calls=call), expected).outcome is Outcome.OK


@pytest.mark.parametrize(
    ("surfaced", "truth"),
    [
        ("completed", "completed"),  # the final response's status
        ("stop", "completed"),  # the AI SDK, pi-ai
        ("max_output_tokens", "incomplete"),  # incomplete_details.reason, as the drivers report it
        ("incomplete", "incomplete"),
        ("length", "incomplete"),
        ("tool-calls", "completed"),  # a function call ends a completed response
        ("toolUse", "completed"),
    ],
)
def test_each_clients_word_for_a_responses_status_is_the_same_reason(surfaced, truth):
    assert judge(report(finish_reason=surfaced), responses(truth)).outcome is Outcome.OK


@pytest.mark.parametrize("surfaced", [None, "", "in_progress"])
def test_a_responses_success_without_a_terminal_status_is_silent_truncation(surfaced):
    # openai-node's finalResponse() resolves a cut stream's snapshot, status `in_progress`; the
    # raw iterators end with no terminal event at all. Unlike Chat, no reason is never right.
    judgement = judge(report(finish_reason=surfaced), responses("completed"))
    assert judgement.outcome is Outcome.SILENT_TRUNCATION
    assert (
        judgement.reason
        == f"full text, but finish reason {canonical_reason(surfaced, Dialect.RESPONSES)!r} where the worker's was 'completed'"
    )


def test_a_responses_failed_status_surfaced_without_raising_is_flagged():
    # openai-node's finalResponse() resolves with `status: "failed"`: the failure is there to be seen.
    judgement = judge(report(text="The quick", finish_reason="failed"), responses("completed"))
    assert judgement.outcome is Outcome.FLAGGED
    assert judgement.reason == "no exception, but the client surfaced finish reason 'failed'"


def test_failed_is_a_word_of_responses_only():
    # In Chat `failed` is no reason any client surfaces: it is a wrong reason, not a failure seen.
    assert judge(report(finish_reason="failed"), STOP).outcome is Outcome.SILENT_TRUNCATION


@pytest.mark.parametrize("dialect", [Dialect.MESSAGES, Dialect.RESPONSES])
@pytest.mark.parametrize("reason", ["interrupted", "error", "other", "aborted"])
def test_the_ai_sdks_and_pis_failure_reasons_are_flagged_in_every_dialect(dialect, reason):
    expected = Expected(text=ANSWER, finish_reason="end_turn" if dialect is Dialect.MESSAGES else "completed", dialect=dialect)
    assert judge(report(text="The quick", finish_reason=reason), expected).outcome is Outcome.FLAGGED


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_a_raised_error_and_a_hang_mean_the_same_in_every_dialect(dialect):
    expected = Expected(text=ANSWER, finish_reason=None, dialect=dialect)
    assert (
        judge(report(completed=False, error_class="APIError", error_message="stream was interrupted"), expected).outcome
        is Outcome.ERROR
    )
    assert judge(report(completed=False, timed_out=True), expected).outcome is Outcome.HANG
    assert judge(report(text="The quick"), expected).outcome is Outcome.SILENT_TRUNCATION
