"""Rule C8's books (issue 25, "Malformed is booked"): an event whose data is not JSON passes through
byte for byte, and the stream is booked `malformed`, naming the event, in every dialect and however
the stream ended (docs/repair-rules.md, "Which verdict a stream gets"). Each stream is fed whole,
a byte at a time and at random splits.

The malformed event is the lab worker's own (`malformed_chunk`: a chunk cut in half, under the
dialect's token event name), put after the first token event.
"""

from __future__ import annotations

import json

import pytest

from finishline import (
    CutCause,
    Dialect,
    EventFramer,
    RepairPolicy,
    StreamRepair,
    Verdict,
    transcribe_stream,
)
from labs.dialects import LAB_DIALECTS
from labs.worker.answer import anthropic_error, error_object
from labs.worker.wire import malformed_event
from tests.dialect_streams import messages_stream, responses_stream
from tests.feeding import CHUNKINGS, chunk, run, split, sse

pytestmark = pytest.mark.parametrize("chunking", CHUNKINGS)
# The streams below are the OpenAI-shaped and Anthropic dialects'; Gemini's malformed chunk (rule
# C8 there too) is tests/test_core_gemini.py's, in both of its stream forms.
DIALECTS: list[Dialect] = [dialect for dialect in LAB_DIALECTS if dialect is not Dialect.GEMINI]


def healthy(dialect: Dialect) -> list[bytes]:
    """A well-formed stream of two tokens, one event per item."""
    if dialect is Dialect.CHAT:
        return [sse(event) for event in (chunk("Hel"), chunk("lo", finish_reason="stop"), b"[DONE]")]
    if dialect is Dialect.MESSAGES:
        return messages_stream(["Hel", "lo"])
    return responses_stream(["Hel", "lo"])


def repairable(dialect: Dialect) -> list[bytes]:
    """A stream that ends well but for what a rule supplies: Chat's finish_reason (C3), Messages'
    stop_reason (M2), and in Responses (which has no made-up endings, R2) the blank line its last
    event lacks."""
    if dialect is Dialect.CHAT:
        return [sse(chunk("Hel")), sse(chunk("lo")), sse(b"[DONE]")]
    if dialect is Dialect.MESSAGES:
        return messages_stream(["Hel", "lo"], stop_reason=None)
    events = responses_stream(["Hel", "lo"])
    return [*events[:-1], events[-1].removesuffix(b"\n")]


def cut(dialect: Dialect) -> list[bytes]:
    """A stream that stops after its tokens, without its ending."""
    if dialect is Dialect.CHAT:
        return [sse(chunk("Hel")), sse(chunk("lo"))]
    if dialect is Dialect.MESSAGES:
        return messages_stream(["Hel", "lo"], closed=False)
    return responses_stream(["Hel", "lo"], closed=False)


def errored(dialect: Dialect) -> list[bytes]:
    """A stream the upstream ends with its own error event (C5, M5, R4)."""
    if dialect is Dialect.CHAT:
        return [sse(chunk("Hel")), sse(chunk("lo")), sse({"error": {"message": "boom", "type": "server_error"}})]
    if dialect is Dialect.MESSAGES:
        return messages_stream(["Hel", "lo"], error=anthropic_error(529, "m"))
    return responses_stream(["Hel", "lo"], error=error_object(500, "m"))


def with_malformed(events: list[bytes], dialect: Dialect, *, at: int | None = None) -> tuple[bytes, int]:
    """The stream with the malformed event after its first token event (or at index `at`), and the
    event's number in the stream, from 1 (every item of `events` is one event with data, a Messages
    `ping` too, as a client dispatches it)."""
    if at is None:
        at = next(i for i, event in enumerate(events) if b"Hel" in event) + 1
    return b"".join([*events[:at], malformed_event(dialect), *events[at:]]), at + 1


def feed(upstream: bytes, chunking: str, dialect: Dialect, end: str = "clean") -> tuple[bytes, StreamRepair]:
    return run(upstream, chunking, end=end, dialect=dialect)


def one_alone(number: int) -> str:
    return f"malformed: event {number}'s data is not JSON; passed on as it came"


# -- a proper ending: passed byte for byte, booked malformed -----------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_malformed_event_in_a_stream_that_ends_well_passes_byte_for_byte_and_is_booked_malformed(chunking, dialect):
    upstream, number = with_malformed(healthy(dialect), dialect)
    out, repair = feed(upstream, chunking, dialect)
    assert out == upstream
    report = repair.report
    assert report.verdict is Verdict.MALFORMED
    assert report.detail == one_alone(number)
    assert (report.malformed_events, report.first_malformed_event) == (1, number)
    assert report.repairs == [] and report.injected == [] and report.interruption is None
    booking = repair.report.booking()
    assert booking.verdict is Verdict.MALFORMED and booking.cause is None
    assert booking.to_json()["verdict"] == "malformed"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_same_stream_without_the_malformed_event_is_clean(chunking, dialect):
    # What the verdict above is compared with: the rest of the stream alone is well formed.
    upstream = b"".join(healthy(dialect))
    out, repair = feed(upstream, chunking, dialect)
    assert out == upstream and repair.report.verdict is Verdict.CLEAN


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_detail_names_the_first_of_several_malformed_events_and_counts_them(chunking, dialect):
    events = healthy(dialect)
    bad = malformed_event(dialect)
    upstream = b"".join([events[0], bad, *events[1:-1], bad, events[-1]])  # the second before the end
    out, repair = feed(upstream, chunking, dialect)
    assert out == upstream
    assert repair.report.verdict is Verdict.MALFORMED
    assert repair.report.detail == "malformed: event 2's data is not JSON (2 such events in all); passed on as they came"


# -- a stream that is malformed and more: the books say malformed and keep the rest -------------------


@pytest.mark.parametrize("dialect", DIALECTS)
def test_malformed_and_repaired_books_malformed_and_keeps_the_repair(chunking, dialect):
    events = repairable(dialect)
    upstream, number = with_malformed(events, dialect)
    out, clean_repair = feed(b"".join(events), chunking, dialect)
    assert clean_repair.report.verdict is Verdict.REPAIRED  # the stream without it is repaired
    out, repair = feed(upstream, chunking, dialect)
    report = repair.report
    assert report.verdict is Verdict.MALFORMED
    assert report.repairs == clean_repair.report.repairs
    assert report.injected == clean_repair.report.injected
    assert report.detail == one_alone(number) + "; " + clean_repair.report.detail
    assert report.detail.split("; ")[2].startswith("repaired: ")
    assert malformed_event(dialect) in out  # passed on as it came


@pytest.mark.parametrize("end", ["clean", "failure"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_malformed_and_cut_books_malformed_and_keeps_the_cut(chunking, dialect, end):
    upstream, number = with_malformed(cut(dialect), dialect)
    out, repair = feed(upstream, chunking, dialect, end=end)
    report = repair.report
    assert report.verdict is Verdict.MALFORMED
    assert report.detail.startswith(one_alone(number) + "; interrupted after the first token (")
    assert out.startswith(upstream)  # the error event follows what the upstream sent
    assert [injected["kind"] for injected in report.injected][:1] == ["error_event"]
    cause = CutCause.CLEAN_END if end == "clean" else CutCause.TRANSPORT_ERROR
    assert report.interruption is not None and report.interruption.cause is cause
    assert report.booking().cause is cause


@pytest.mark.parametrize("dialect", DIALECTS)
def test_malformed_and_stalled_books_malformed_with_the_stall_as_its_cause(chunking, dialect):
    upstream, number = with_malformed(cut(dialect), dialect)
    repair = StreamRepair(policy=RepairPolicy(idle_timeout=2.0), started_at=0.0, dialect=dialect)
    for piece in split(upstream, chunking):
        repair.receive_data(piece, now=0.5)
    ending = repair.receive_timer(10.0)
    assert ending is not None and ending.end_response
    assert repair.report.verdict is Verdict.MALFORMED
    assert "; interrupted after the first token (stalled: no event for 2 s" in repair.report.detail
    assert repair.report.booking().cause is CutCause.STALLED


@pytest.mark.parametrize("dialect", DIALECTS)
def test_malformed_and_the_client_gone_books_malformed_with_that_cause(chunking, dialect):
    upstream, number = with_malformed(cut(dialect), dialect)
    _, repair = feed(upstream, chunking, dialect, end="open")
    repair.receive_client_gone("client disconnected")
    assert repair.report.verdict is Verdict.MALFORMED
    assert repair.report.detail.startswith(one_alone(number) + "; interrupted: client gone: client disconnected")
    assert repair.report.booking().cause is CutCause.CLIENT_GONE


@pytest.mark.parametrize("dialect", DIALECTS)
def test_malformed_then_an_upstream_error_books_malformed_and_keeps_the_error(chunking, dialect):
    upstream, number = with_malformed(errored(dialect), dialect)
    out, repair = feed(upstream, chunking, dialect)
    assert out == upstream  # nothing is injected after an upstream error
    report = repair.report
    assert report.verdict is Verdict.MALFORMED
    assert report.detail.startswith(one_alone(number) + "; upstream_error: error event")
    assert report.upstream_error_message  # mitmweb's comment still quotes it
    assert report.booking().cause is None


# -- what is not booked malformed -------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_malformed_event_after_the_end_is_not_read(chunking, dialect):
    # After [DONE], message_stop or a terminal event every client stopped reading.
    events = healthy(dialect)
    upstream = b"".join(events) + malformed_event(dialect)
    out, repair = feed(upstream, chunking, dialect)
    assert out == upstream
    assert repair.report.verdict is Verdict.CLEAN and repair.report.malformed_events == 0


@pytest.mark.parametrize("dialect", [Dialect.CHAT, Dialect.MESSAGES])
def test_an_error_event_whose_data_is_not_json_is_the_upstreams_error(chunking, dialect):
    # C5, M5: an `event: error` is the upstream's error whatever its data (the Anthropic SDKs raise
    # with its text); the graders read it so too (labs.grade.reading).
    upstream = b"".join(healthy(dialect)[:2]) + b"event: error\ndata: Overloaded\n\n"
    out, repair = feed(upstream, chunking, dialect)
    assert out == upstream
    assert repair.report.verdict is Verdict.UPSTREAM_ERROR and repair.report.malformed_events == 0


@pytest.mark.parametrize("dialect", DIALECTS)
def test_events_that_are_json_of_another_shape_are_not_malformed(chunking, dialect):
    # Rule C8's other oddities parse: the verdict is what the rest of the stream says.
    events = healthy(dialect)
    odd = b'data: [1, 2]\n\n: a comment\n\ndata: {"unknown": true}\n\nid: 7\n\n'
    upstream = events[0] + odd + b"".join(events[1:])
    out, repair = feed(upstream, chunking, dialect)
    assert out == upstream
    assert repair.report.malformed_events == 0 and repair.report.verdict is not Verdict.MALFORMED


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_stream_finish_fix_stopped_reading_is_skipped_not_malformed(chunking, dialect):
    # finish_fix gave up (a bug of its own, caught by the caller): it vouches for nothing after.
    upstream, _ = with_malformed(healthy(dialect), dialect)
    repair = StreamRepair(dialect=dialect)
    out = b"".join(repair.receive_data(piece) for piece in split(upstream, chunking))
    repair.give_up(RuntimeError("a bug"))
    repair.receive_end()
    assert out == upstream
    assert repair.report.verdict is Verdict.SKIPPED


@pytest.mark.parametrize("dialect", DIALECTS)
def test_an_http_error_body_is_not_read(chunking, dialect):
    upstream, _ = with_malformed(healthy(dialect), dialect)
    repair = StreamRepair(status=500, dialect=dialect)
    out = b"".join(repair.receive_data(piece) for piece in split(upstream, chunking)) + repair.receive_end()
    assert out == upstream
    assert repair.report.verdict is Verdict.HTTP_ERROR


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_number_in_the_detail_is_the_event_a_client_reads(chunking, dialect):
    # Counted by an independent reader: the n-th event with data (a comment is none, a Messages
    # ping is one) is the one whose data does not parse; mitmweb's view numbers it so too.
    events = healthy(dialect)
    upstream = b"".join([events[0], b": keep-alive\n\n", events[1], b"data: {\n\n", *events[2:]])
    _, repair = feed(upstream, chunking, dialect)
    data = [event.data for event in EventFramer().receive_data(upstream) if event.data is not None]
    number = repair.report.first_malformed_event
    assert number == 3
    with pytest.raises(json.JSONDecodeError):
        json.loads(data[number - 1])
    assert f"\n{number:>5} not JSON: {{" in transcribe_stream(upstream, dialect)
