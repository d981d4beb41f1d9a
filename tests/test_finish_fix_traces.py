"""finish_fix's spans (`finishline.addon.traces`, docs/telemetry.md), in process: the attributes
per verdict, the endpoint option, and the real SDK exporter sending to a real OTLP receiver
(tests/otlp_receiver.py decodes its protobuf bytes), a `traceparent` continued, and a collector
that refuses every connection costing one warning and the spans, nothing else."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

import finishline.addon.traces
from finishline import Booking, CutCause, Dialect, InjectionKind, RequestFacts, TokenUsage, Verdict, answer_no_head
from finishline.addon.traces import SCHEMA_URL, SpanExport, error_type, span_attributes, traces_endpoint
from tests.feeding import run
from tests.otlp_receiver import refusing_otlp_endpoint, running_otlp_receiver
from tests.test_core_malformed import DIALECTS, cut, healthy, with_malformed

REQUEST = RequestFacts(model="gpt-test", stream=True)
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
SPAN_WAIT_S = 30


def booking(verdict: Verdict = Verdict.CLEAN, **fields: object) -> Booking:
    fields.setdefault("detail", str(verdict))
    return Booking(verdict=verdict, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("verdict", "cause", "expected"),
    [
        (Verdict.CLEAN, None, None),
        (Verdict.REPAIRED, None, None),
        (Verdict.SKIPPED, None, None),
        (Verdict.INTERRUPTED, CutCause.TRANSPORT_ERROR, "stream_interrupted"),
        (Verdict.INTERRUPTED, CutCause.CLEAN_END, "stream_interrupted"),
        (Verdict.INTERRUPTED, CutCause.STALLED, "stalled"),
        (Verdict.INTERRUPTED, CutCause.CLIENT_GONE, "client_gone"),
        (Verdict.INTERRUPTED, CutCause.NO_RESPONSE_HEAD, "no_response_head"),
        (Verdict.UPSTREAM_ERROR, None, "upstream_error"),
        (Verdict.MALFORMED, None, "malformed"),
        (Verdict.MALFORMED, CutCause.STALLED, "malformed"),
        (Verdict.HTTP_ERROR, None, "http_error"),
    ],
)
def test_error_type_per_verdict_and_cause(verdict, cause, expected):
    assert error_type(booking(verdict, cause=cause)) == expected


def test_a_finished_stream_has_its_reasons_and_no_error_type():
    attributes = span_attributes(
        booking(Verdict.REPAIRED, finish_reasons=("stop", "length"), usage=TokenUsage(input_tokens=9, output_tokens=4), events=5),
        REQUEST,
        server=("api.example.com", 443),
    )
    assert attributes["gen_ai.response.finish_reasons"] == ["stop", "length"]
    assert "error.type" not in attributes
    assert attributes["gen_ai.usage.input_tokens"] == 9
    assert attributes["gen_ai.usage.output_tokens"] == 4
    assert attributes["server.address"] == "api.example.com"
    assert attributes["server.port"] == 443
    assert attributes["finish_fix.verdict"] == "repaired"


def test_a_stream_that_ended_in_an_error_says_error_whatever_it_was_sent():
    # finish_fix_on_cut=stop sends the client a finish; the span, like the books, says what happened.
    attributes = span_attributes(
        booking(Verdict.INTERRUPTED, cause=CutCause.STALLED, finish_reasons=("stop",)), REQUEST, server=("h", 1)
    )
    assert attributes["gen_ai.response.finish_reasons"] == ["error"]
    assert attributes["error.type"] == "stalled"
    assert attributes["finish_fix.cause"] == "stalled"


def test_a_request_without_a_response_head_is_an_error_with_its_cause():
    attributes = span_attributes(
        answer_no_head(dialect=Dialect.MESSAGES, timeout=2, request=REQUEST).booking, REQUEST, server=("h", 1)
    )
    assert attributes["error.type"] == "no_response_head"
    assert attributes["finish_fix.cause"] == "no_response_head"
    assert attributes["finish_fix.verdict"] == "interrupted"
    assert attributes["gen_ai.response.finish_reasons"] == ["error"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_malformed_stream_is_an_error_span_whatever_else_it_was(dialect):
    # The core's bookings as they are: a malformed stream that ended well, one also cut.
    _, repair = run(with_malformed(healthy(dialect), dialect)[0], dialect=dialect)
    attributes = span_attributes(repair.report.booking(), REQUEST, server=("h", 1))
    assert attributes["finish_fix.verdict"] == "malformed"
    assert attributes["error.type"] == "malformed"
    assert attributes["gen_ai.response.finish_reasons"] == ["error"]
    assert attributes["finish_fix.detail"].startswith("malformed: event ")
    assert "finish_fix.cause" not in attributes
    _, repair = run(with_malformed(cut(dialect), dialect)[0], dialect=dialect, end="failure")
    attributes = span_attributes(repair.report.booking(), REQUEST, server=("h", 1))
    assert attributes["error.type"] == "malformed"
    assert attributes["finish_fix.cause"] == "transport_error"


@pytest.mark.parametrize(
    ("dialect", "provider"),
    [(Dialect.CHAT, "openai"), (Dialect.MESSAGES, "anthropic"), (Dialect.RESPONSES, "openai"), (Dialect.GEMINI, "gcp.gemini")],
)
def test_the_provider_is_the_dialects_api(dialect, provider):
    assert span_attributes(booking(dialect=dialect), REQUEST, server=("h", 1))["gen_ai.provider.name"] == provider


def test_unknown_facts_are_left_out():
    attributes = span_attributes(booking(), RequestFacts(), server=("h", 1))
    assert attributes["gen_ai.request.stream"] is False
    for absent in ("gen_ai.request.model", "gen_ai.response.finish_reasons", "gen_ai.usage.input_tokens", "error.type"):
        assert absent not in attributes
    assert "gen_ai.response.time_to_first_chunk" not in attributes


@pytest.mark.parametrize(
    ("text", "endpoint"),
    [
        ("http://127.0.0.1:4318/v1/traces", "http://127.0.0.1:4318/v1/traces"),
        ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
        ("http://127.0.0.1:4318/", "http://127.0.0.1:4318/v1/traces"),
        ("https://collector.example/otlp/v1/traces", "https://collector.example/otlp/v1/traces"),
        ("http://127.0.0.1:4318?tenant=a", "http://127.0.0.1:4318/v1/traces?tenant=a"),
    ],
)
def test_traces_endpoint(text, endpoint):
    assert traces_endpoint(text) == endpoint


@pytest.mark.parametrize(
    "text", ["127.0.0.1:4318", "grpc://127.0.0.1:4317", "http://", "http://h:port/v1/traces", "file:///tmp/x"]
)
def test_a_bad_endpoint_names_the_valid_form(text):
    with pytest.raises(ValueError, match=r"is not an http\(s\) URL, e\.g\. http://127\.0\.0\.1:4318/v1/traces"):
        traces_endpoint(text)


def export_one(export: SpanExport, made: Booking, headers: dict[str, str]) -> None:
    export.booked(made, REQUEST, server=("127.0.0.1", 8400), headers=headers, started_at=1_000.0, ended_at=1_002.5)


def test_the_real_exporter_sends_the_span_a_real_receiver_decodes():
    made = booking(
        Verdict.INTERRUPTED,
        detail="interrupted after the first token (transport error: reset)",
        cause=CutCause.TRANSPORT_ERROR,
        events=4,
        time_to_first_event=0.2,
        time_to_first_token=0.25,
        injected=({"kind": InjectionKind.ERROR_EVENT, "code": "stream_interrupted"},),
    )
    with running_otlp_receiver() as receiver:
        export = SpanExport(receiver.endpoint)
        try:
            export_one(export, made, {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
            [span] = receiver.wait_for(1, SPAN_WAIT_S)
        finally:
            export.close()
    assert receiver.errors == []
    assert span.name == "chat gpt-test"
    assert span.kind == "SPAN_KIND_CLIENT"
    assert span.status_code == "STATUS_CODE_ERROR"
    assert (span.trace_id, span.parent_span_id) == (TRACE_ID, PARENT_ID)
    assert (span.start_ns, span.end_ns) == (1_000_000_000_000, 1_002_500_000_000)
    assert span.scope_name == "finish_fix" and span.scope_schema_url == SCHEMA_URL
    assert span.resource["service.name"] == "finish_fix"
    assert span.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-test",
        "gen_ai.request.stream": True,
        "gen_ai.response.finish_reasons": ["error"],
        "gen_ai.response.time_to_first_chunk": 0.2,
        "error.type": "stream_interrupted",
        "server.address": "127.0.0.1",
        "server.port": 8400,
        "finish_fix.verdict": "interrupted",
        "finish_fix.dialect": "chat",
        "finish_fix.detail": "interrupted after the first token (transport error: reset)",
        "finish_fix.cause": "transport_error",
        "finish_fix.time_to_first_token": 0.25,
        "finish_fix.events": 4,
    }
    assert span.events == [
        ("finish_fix.injection", {"finish_fix.injection.kind": "error_event", "finish_fix.injection.code": "stream_interrupted"})
    ]


def test_without_a_traceparent_the_span_starts_its_own_trace():
    with running_otlp_receiver() as receiver:
        export = SpanExport(receiver.endpoint)
        try:
            export_one(export, booking(), {})
            export_one(export, booking(), {"traceparent": "not a traceparent"})
            spans = receiver.wait_for(2, SPAN_WAIT_S)
        finally:
            export.close()
    assert [span.parent_span_id for span in spans] == ["", ""]
    assert len({span.trace_id for span in spans}) == 2


@pytest.fixture
def refusing_endpoint() -> Iterator[str]:
    with refusing_otlp_endpoint() as endpoint:
        yield endpoint


def test_a_dead_collector_costs_one_warning_and_the_spans(refusing_endpoint, caplog):
    caplog.set_level(logging.DEBUG)
    export = SpanExport(refusing_endpoint)
    try:
        for _ in range(3):  # three batches, each refused
            export_one(export, booking(), {})
            export.flush()
        # A span the maker thread had in hand during a flush goes with the next one.
        deadline = time.monotonic() + SPAN_WAIT_S
        while export.dropped < 3 and time.monotonic() < deadline:
            export.flush()
    finally:
        export.close()
    assert export.dropped == 3
    warnings = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert [record.name for record in warnings] == [finishline.addon.traces.__name__], [r.getMessage() for r in warnings]
    assert warnings[0].getMessage().startswith(f"finish_fix: cannot export spans to {refusing_endpoint} (")
    assert not [record for record in caplog.records if record.name.startswith("opentelemetry")]


def test_the_environment_names_the_service_when_it_says_one(monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-east")
    with running_otlp_receiver() as receiver:
        export = SpanExport(receiver.endpoint)
        try:
            export_one(export, booking(Verdict.CLEAN, detail="clean"), {})
            [span] = receiver.wait_for(1, SPAN_WAIT_S)
        finally:
            export.close()
    assert span.resource["service.name"] == "gateway-east"
