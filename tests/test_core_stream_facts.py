"""What a stream's report says besides its verdict, for finish_fix's metrics and spans: the time to
the first token, the finish reasons the client was sent, the usage the upstream reported, the kind
of each injection and the cause of a cut (docs/telemetry.md). Every stream is fed whole, byte by
byte and at random splits, on the fast path and the full parse; each event arrives at its own time
on the caller's clock (event i at 10 * (i + 1) s), whatever its split."""

from __future__ import annotations

import dataclasses
import json

import pytest

from finishline import (
    Booking,
    Correction,
    CutCause,
    Dialect,
    InjectionKind,
    Interruption,
    RequestFacts,
    StreamRepair,
    StreamReport,
    TokenUsage,
    Verdict,
)
from labs.worker.frames import sse_frame
from tests.dialect_streams import messages_stream, responses_stream
from tests.feeding import CHUNKINGS, chunk, split, sse

PATHS = (True, False)  # fast_path


def feed(
    events: list[bytes],
    chunking: str,
    *,
    fast_path: bool = True,
    dialect: Dialect = Dialect.CHAT,
    end: str = "clean",
    request: RequestFacts = RequestFacts(),
) -> StreamRepair:
    """Feeds each event's pieces at the event's time and ends the stream at the next one."""
    repair = StreamRepair(request=request, started_at=0.0, fast_path=fast_path, dialect=dialect)
    for position, event in enumerate(events):
        for piece in split(event, chunking, seed=position):
            repair.receive_data(piece, now=10.0 * (position + 1))
    ended = 10.0 * (len(events) + 1)
    if end == "clean":
        repair.receive_end(now=ended)
    else:
        repair.receive_failure("peer reset", now=ended)
    return repair


def chat_events(*chunks: dict) -> list[bytes]:
    return [sse(one) for one in chunks] + [sse(b"[DONE]")]


def first_index(events: list[bytes], marker: bytes) -> int:
    return next(position for position, event in enumerate(events) if marker in event)


# -- time to first token ------------------------------------------------------------------------------


@pytest.mark.parametrize("fast_path", PATHS)
@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_chat_time_to_first_token_is_the_first_content_not_the_role_chunk(chunking, fast_path):
    events = chat_events(
        chunk(delta={"role": "assistant", "content": ""}),
        chunk("The"),
        chunk(" quick"),
        chunk(" fox"),
        chunk(finish_reason="stop"),
    )
    report = feed(events, chunking, fast_path=fast_path).report
    assert report.time_to_first_event == 10.0
    assert report.time_to_first_token == 20.0
    assert report.booking().time_to_first_token == 20.0


@pytest.mark.parametrize("fast_path", PATHS)
@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize(
    ("dialect", "events", "token_marker"),
    [
        (Dialect.MESSAGES, messages_stream(["The", " quick", " fox"]), b'"text_delta"'),
        (Dialect.MESSAGES, messages_stream(["The"], thinking=["hm"]), b'"thinking_delta"'),
        (Dialect.RESPONSES, responses_stream(["The", " quick", " fox"]), b"response.output_text.delta"),
        (Dialect.RESPONSES, responses_stream(["The"], reasoning=["hm"]), b"response.reasoning_summary_text.delta"),
    ],
)
def test_typed_dialects_time_to_first_token_is_their_first_token_delta(dialect, events, token_marker, chunking, fast_path):
    report = feed(events, chunking, fast_path=fast_path, dialect=dialect).report
    assert report.verdict is Verdict.CLEAN, report.detail
    assert report.time_to_first_event == 10.0
    assert report.time_to_first_token == 10.0 * (first_index(events, token_marker) + 1)


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_no_token_no_time_to_first_token(chunking):
    report = feed([sse(chunk(delta={"role": "assistant", "content": ""}))], chunking, end="failure").report
    assert report.verdict is Verdict.INTERRUPTED
    assert report.time_to_first_event == 10.0
    assert report.time_to_first_token is None


def test_without_a_clock_there_is_no_time_to_first_token():
    repair = StreamRepair()
    repair.receive_data(b"".join(chat_events(chunk("Hi"), chunk(finish_reason="stop"))))
    repair.receive_end()
    assert repair.report.time_to_first_token is None


# -- finish reasons ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fast_path", PATHS)
@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_chat_finish_reasons_per_choice_by_index_the_upstreams_and_the_injected(chunking, fast_path):
    tool_call = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    events = chat_events(
        chunk(delta=tool_call, index=1),
        chunk("Hi", index=0),
        chunk(finish_reason="length", index=0),
    )
    report = feed(events, chunking, fast_path=fast_path).report
    assert report.verdict is Verdict.REPAIRED
    assert report.finish_reasons == ["length", "tool_calls"]  # choice 1's injected before [DONE]


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_chat_cut_has_no_finish_reason(chunking):
    report = feed([sse(chunk("Hi"))], chunking, end="failure").report
    assert report.verdict is Verdict.INTERRUPTED
    assert report.finish_reasons == []


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize(
    ("events", "verdict", "reasons"),
    [
        (messages_stream(["Hi"]), Verdict.CLEAN, ["end_turn"]),
        (messages_stream(["Hi"], stop_reason="max_tokens"), Verdict.CLEAN, ["max_tokens"]),
        (messages_stream(["Hi"], stop_reason=None), Verdict.REPAIRED, ["end_turn"]),  # M2: injected
        (messages_stream(["Hi"], closed=False), Verdict.INTERRUPTED, []),
    ],
)
def test_messages_finish_reason_is_the_stop_reason_sent(events, verdict, reasons, chunking):
    report = feed(events, chunking, dialect=Dialect.MESSAGES).report
    assert report.verdict is verdict, report.detail
    assert report.finish_reasons == reasons


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize(
    ("events", "verdict", "reasons"),
    [
        (responses_stream(["Hi"]), Verdict.CLEAN, ["completed"]),
        (responses_stream(["Hi"], terminal="response.incomplete"), Verdict.CLEAN, ["max_output_tokens"]),
        (responses_stream(["Hi"], closed=False), Verdict.INTERRUPTED, []),
    ],
)
def test_responses_finish_reason_is_the_terminal_events_word(events, verdict, reasons, chunking):
    report = feed(events, chunking, dialect=Dialect.RESPONSES).report
    assert report.verdict is verdict, report.detail
    assert report.finish_reasons == reasons


def test_responses_incomplete_without_a_reason_is_incomplete():
    event = sse_frame(
        {"type": "response.incomplete", "sequence_number": 0, "response": {"id": "resp_1", "status": "incomplete"}},
        event="response.incomplete",
    )
    report = feed([event], "whole", dialect=Dialect.RESPONSES).report
    assert report.finish_reasons == ["incomplete"]


# -- usage ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_chat_usage_chunk(chunking):
    events = chat_events(
        chunk("Hi"), chunk(finish_reason="stop"), chunk(choices=[], usage={"prompt_tokens": 12, "completion_tokens": 3})
    )
    assert feed(events, chunking).report.usage == TokenUsage(input_tokens=12, output_tokens=3)


def test_chat_without_usage_has_none():
    assert feed(chat_events(chunk("Hi"), chunk(finish_reason="stop")), "whole").report.usage is None


def messages_frame(kind: str, **fields: object) -> bytes:
    return sse_frame({"type": kind, **fields}, event=kind)


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_messages_usage_counts_cached_input_and_the_last_output_count(chunking):
    usage = {"input_tokens": 10, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 2, "output_tokens": 1}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [], "usage": usage}
    events = [
        messages_frame("message_start", message=message),
        messages_frame("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        messages_frame("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hi"}),
        messages_frame("content_block_stop", index=0),
        messages_frame("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 7}),
        messages_frame("message_stop"),
    ]
    report = feed(events, chunking, dialect=Dialect.MESSAGES).report
    assert report.usage == TokenUsage(input_tokens=17, output_tokens=7)


def test_a_cut_messages_stream_books_its_input_not_the_placeholder_output_count():
    # message_start's `output_tokens` is the count of a turn just begun, not the answer's.
    report = feed(messages_stream(["Hi", " there"], closed=False), "whole", dialect=Dialect.MESSAGES).report
    assert report.verdict is Verdict.INTERRUPTED
    assert report.usage is not None and report.usage.output_tokens is None
    assert report.usage.input_tokens is not None


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_responses_usage_is_the_terminal_responses(chunking):
    events = responses_stream(["a", "b", "c"])
    usage = json.loads(events[-1].split(b"data: ", 1)[1])["response"]["usage"]
    report = feed(events, chunking, dialect=Dialect.RESPONSES).report
    assert report.usage == TokenUsage(input_tokens=usage["input_tokens"], output_tokens=usage["output_tokens"])
    assert report.usage.output_tokens == 3


# -- injections and causes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dialect", "events", "kinds"),
    [
        (Dialect.CHAT, [sse(chunk("Hi"))], [InjectionKind.ERROR_EVENT]),
        (Dialect.CHAT, [sse(chunk("Hi")), sse(b"[DONE]")], [InjectionKind.FINISH]),
        (Dialect.MESSAGES, messages_stream(["Hi"], closed=False), [InjectionKind.ERROR_EVENT]),
        (Dialect.MESSAGES, messages_stream(["Hi"], stop_reason=None), [InjectionKind.FINISH]),
        (Dialect.RESPONSES, responses_stream(["Hi"], closed=False), [InjectionKind.ERROR_EVENT, InjectionKind.RESPONSE_FAILED]),
    ],
)
def test_every_injection_names_its_kind_from_the_closed_set(dialect, events, kinds):
    report = feed(events, "whole", dialect=dialect).report
    assert [injection["kind"] for injection in report.injected] == kinds
    assert all(type(injection["kind"]) is InjectionKind for injection in report.injected)


def test_the_ledger_and_metadata_write_kinds_as_plain_words():
    report = feed([sse(chunk("Hi")), sse(b"[DONE]")], "whole").report
    line = report.booking().to_json()
    assert line["injected"] == [{"kind": "finish", "choice": 0, "finish_reason": "stop"}]
    assert type(line["injected"][0]["kind"]) is str
    assert type(report.as_json()["injected"][0]["kind"]) is str
    assert json.loads(json.dumps(line))["injected"][0]["kind"] == "finish"


@pytest.mark.parametrize(
    ("end", "cause"),
    [("clean", CutCause.CLEAN_END), ("failure", CutCause.TRANSPORT_ERROR)],
)
def test_a_cut_streams_booking_carries_its_cause(end, cause):
    booking = feed([sse(chunk("Hi"))], "whole", end=end).report.booking()
    assert booking.verdict is Verdict.INTERRUPTED
    assert booking.cause is cause


def test_a_finished_streams_booking_has_no_cause_and_its_facts():
    events = chat_events(
        chunk("Hi"), chunk(finish_reason="stop"), chunk(choices=[], usage={"prompt_tokens": 4, "completion_tokens": 1})
    )
    booking = feed(events, "whole").report.booking()
    assert booking.cause is None
    assert booking.finish_reasons == ("stop",)
    assert booking.usage == TokenUsage(input_tokens=4, output_tokens=1)


def test_the_ledger_line_is_unchanged_by_the_new_facts():
    """The ledger's keys are its documented ones (docs/repair-rules.md "The books"): the facts for
    metrics and spans stay out of it."""
    assert set(Booking(verdict=Verdict.CLEAN, detail="clean").to_json()) == {
        "model",
        "dialect",
        "verdict",
        "detail",
        "events",
        "upstream_bytes",
        "client_bytes",
        "time_to_first_event",
        "duration",
        "injected",
        "repairs",
    }


@pytest.mark.parametrize(
    ("body", "stream"),
    [
        (b'{"model": "m", "stream": true}', True),
        (b'{"model": "m", "stream": false}', False),
        (b'{"model": "m"}', False),
        (b'{"model": "m", "stream": "yes"}', False),
        (b"not json", False),
    ],
)
def test_request_facts_say_whether_it_asked_for_a_stream(body, stream):
    assert RequestFacts.from_body(body).stream is stream


def test_a_cut_booked_anything_but_interrupted_has_no_cause():
    # The metrics' `cause` label is for interrupted streams only; a report whose verdict was changed
    # after its cut (a stream given up on: `skipped`) books none.
    report = feed([sse(chunk("Hi"))], "whole", end="clean").report
    assert report.interruption is not None
    report.verdict = Verdict.SKIPPED
    assert report.booking().cause is None


def test_a_reports_json_is_what_asdict_gives_with_its_enums_as_words():
    # `as_json` copies field by field for speed: it must stay what `dataclasses.asdict` gives.
    report = StreamReport(
        verdict=Verdict.INTERRUPTED,
        detail="cut",
        dialect=Dialect.RESPONSES,
        repairs=["a", "b"],
        injected=[{"kind": InjectionKind.ERROR_EVENT, "code": "x"}],
        interruption=Interruption(before_first_token=False, cause=CutCause.CLEAN_END, dialect=Dialect.RESPONSES),
        model="m",
        events=3,
        malformed_events=1,
        first_malformed_event=2,
        upstream_bytes=10,
        client_bytes=12,
        dropped_incomplete_bytes=1,
        time_to_first_event=0.5,
        time_to_first_token=0.7,
        duration=1.5,
        finish_reasons=["stop"],
        usage=TokenUsage(output_tokens=4),
        corrections={Correction.RESPONSES_INDEXES: 2},
        upstream_error_message="boom",
        internal_error=None,
    )
    expected = dataclasses.asdict(report)
    record = report.as_json()
    for key in ("verdict", "dialect", "injected", "corrections", "interruption"):
        del expected[key], record[key]
    assert record == expected and list(report.as_json()) == [field.name for field in dataclasses.fields(report)]
    assert json.loads(json.dumps(report.as_json())) == report.as_json()
    assert report.as_json()["repairs"] is not report.repairs
