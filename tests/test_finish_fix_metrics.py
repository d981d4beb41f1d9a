"""finish_fix's Prometheus metrics (`finishline.addon.metrics`, docs/telemetry.md), in process:
the metric names and labels of the contract, label values from closed sets only, what one booking
adds, the server on its own thread scraped over a real socket, and the addon counting the flows it
books exactly as its books do."""

from __future__ import annotations

import os

import httpx
import pytest
from mitmproxy import flow as mitm_flow
from mitmproxy.exceptions import OptionsError
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from faults.child_processes import listening_ports
from finishline import Booking, Correction, CutCause, Dialect, InjectionKind, RepairPolicy, RequestFacts, Verdict, answer_no_head
from finishline.addon.metrics import NO_CAUSE, MetricsServer, StreamMetrics, parse_listen_address, process_metrics
from finishline.addon.stream import stream_of
from tests.feeding import chunk, run, sse
from tests.gemini_streams import gemini_chunks, sse_body
from tests.test_addon import HEALTHY, addon, make_flow, stream_through  # noqa: F401  (`addon` is a fixture)
from tests.test_core_malformed import DIALECTS, cut, healthy, with_malformed

#: The contract: every metric's name as scraped and its label names.
CONTRACT = {
    "finish_fix_streams_total": {"dialect", "verdict", "cause"},
    "finish_fix_injections_total": {"dialect", "kind"},
    "finish_fix_corrections_total": {"dialect", "rule"},
    "finish_fix_streams_in_flight": {"dialect"},
    "finish_fix_time_to_first_token_seconds": {"dialect"},
    "finish_fix_stream_duration_seconds": {"dialect", "verdict"},
    "finish_fix_stream_events": {"dialect"},
}
CLOSED_SETS = {
    "dialect": {str(d) for d in Dialect},
    "verdict": {str(v) for v in Verdict},
    "cause": {str(c) for c in CutCause} | {NO_CAUSE},
    "kind": {str(k) for k in InjectionKind},
    "rule": {str(r) for r in Correction},
}


def scrape(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, its labels): value} of an exposition (histogram buckets keep `le`)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[name, frozenset(labels.items())]


def samples_of(metrics: StreamMetrics) -> dict[tuple[str, frozenset], float]:
    return scrape(generate_latest(metrics.registry).decode())


def test_the_metrics_and_their_labels_are_the_contracts():
    families = {
        family.name: family for family in text_string_to_metric_families(generate_latest(StreamMetrics().registry).decode())
    }
    # The parser names a counter's family without `_total`; its samples carry it.
    names = {f"{name}_total" if family.type == "counter" else name for name, family in families.items()}
    assert names == set(CONTRACT)
    for name, family in families.items():
        scraped = f"{name}_total" if family.type == "counter" else name
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == CONTRACT[scraped], sample


def test_every_series_exists_at_zero_and_every_label_value_is_from_a_closed_set() -> None:
    samples = samples_of(StreamMetrics())
    seen: dict[str, set[str]] = {label: set() for label in CLOSED_SETS}
    for (name, labels), number in samples.items():
        if not name.endswith("_bucket") or ("le", "+Inf") in labels:
            assert number == 0, (name, labels)
        for label, word in labels:
            if label != "le":
                seen[label].add(word)
    assert seen == CLOSED_SETS
    # A cause for interrupted, which always has one, and for malformed, which has one when it was also cut.
    assert value(samples, "finish_fix_streams_total", dialect="chat", verdict="interrupted", cause="stalled") == 0
    assert value(samples, "finish_fix_streams_total", dialect="chat", verdict="malformed", cause=NO_CAUSE) == 0
    assert value(samples, "finish_fix_streams_total", dialect="chat", verdict="malformed", cause="stalled") == 0
    assert (
        "finish_fix_streams_total",
        frozenset({"dialect": "chat", "verdict": "clean", "cause": "stalled"}.items()),
    ) not in samples
    assert (
        "finish_fix_streams_total",
        frozenset({"dialect": "chat", "verdict": "interrupted", "cause": NO_CAUSE}.items()),
    ) not in samples


def test_one_booking_adds_one_to_each_of_its_series():
    metrics = StreamMetrics()
    metrics.booked(
        Booking(
            verdict=Verdict.INTERRUPTED,
            detail="interrupted",
            dialect=Dialect.MESSAGES,
            cause=CutCause.STALLED,
            events=7,
            time_to_first_token=0.3,
            duration=4.0,
            injected=({"kind": InjectionKind.FINISH, "stop_reason": "end_turn"}, {"kind": InjectionKind.ERROR_EVENT}),
        )
    )
    samples = samples_of(metrics)
    assert value(samples, "finish_fix_streams_total", dialect="messages", verdict="interrupted", cause="stalled") == 1
    assert sum(n for (name, _), n in samples.items() if name == "finish_fix_streams_total") == 1
    assert value(samples, "finish_fix_injections_total", dialect="messages", kind="finish") == 1
    assert value(samples, "finish_fix_injections_total", dialect="messages", kind="error_event") == 1
    assert value(samples, "finish_fix_time_to_first_token_seconds_count", dialect="messages") == 1
    assert value(samples, "finish_fix_time_to_first_token_seconds_bucket", dialect="messages", le="0.25") == 0
    assert value(samples, "finish_fix_time_to_first_token_seconds_bucket", dialect="messages", le="0.5") == 1
    assert value(samples, "finish_fix_stream_duration_seconds_sum", dialect="messages", verdict="interrupted") == 4.0
    assert value(samples, "finish_fix_stream_events_sum", dialect="messages") == 7


def test_a_correction_counts_once_per_flow_under_its_rule():
    metrics = StreamMetrics()
    corrections = (Correction.LIMIT_REASON, Correction.RESPONSES_INDEXES)
    metrics.booked(Booking(verdict=Verdict.REPAIRED, detail="repaired", dialect=Dialect.RESPONSES, corrections=corrections))
    samples = samples_of(metrics)
    assert value(samples, "finish_fix_corrections_total", dialect="responses", rule="limit_reason") == 1
    assert value(samples, "finish_fix_corrections_total", dialect="responses", rule="responses_indexes") == 1
    assert value(samples, "finish_fix_corrections_total", dialect="messages", rule="limit_reason") == 0


def test_a_request_without_a_response_head_counts_as_interrupted_by_its_cause():
    metrics = StreamMetrics()
    metrics.booked(answer_no_head(dialect=Dialect.RESPONSES, timeout=2, elapsed=2.1).booking)
    samples = samples_of(metrics)
    assert value(samples, "finish_fix_streams_total", dialect="responses", verdict="interrupted", cause="no_response_head") == 1
    assert sum(n for (name, _), n in samples.items() if name == "finish_fix_streams_total") == 1
    assert value(samples, "finish_fix_time_to_first_token_seconds_count", dialect="responses") == 0
    assert value(samples, "finish_fix_stream_duration_seconds_sum", dialect="responses", verdict="interrupted") == 2.1


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_malformed_stream_counts_as_malformed_with_its_cut_as_the_cause(dialect):
    # The core's bookings as they are: one malformed stream that ended well, one also cut.
    metrics = StreamMetrics()
    for events in (healthy(dialect), cut(dialect)):
        _, repair = run(with_malformed(events, dialect)[0], dialect=dialect)
        metrics.booked(repair.report.booking())
    samples = samples_of(metrics)
    assert value(samples, "finish_fix_streams_total", dialect=str(dialect), verdict="malformed", cause=NO_CAUSE) == 1
    assert value(samples, "finish_fix_streams_total", dialect=str(dialect), verdict="malformed", cause="clean_end") == 1
    assert sum(n for (name, _), n in samples.items() if name == "finish_fix_streams_total") == 2
    assert value(samples, "finish_fix_injections_total", dialect=str(dialect), kind="error_event") == 1


def test_a_cut_gemini_stream_counts_under_the_gemini_label():
    # The core's booking of a Gemini stream without a finishReason (G2), G7 on another.
    metrics = StreamMetrics()
    _, cut_stream = run(sse_body(gemini_chunks(["Hel"], finish=None)), dialect=Dialect.GEMINI)
    _, limited = run(
        sse_body(gemini_chunks(["a", "b"])),
        dialect=Dialect.GEMINI,
        request=RequestFacts(max_tokens=2),
        policy=RepairPolicy(limit_reasons=True),
    )
    metrics.booked(cut_stream.report.booking())
    metrics.booked(limited.report.booking())
    samples = samples_of(metrics)
    assert value(samples, "finish_fix_streams_total", dialect="gemini", verdict="interrupted", cause="clean_end") == 1
    assert value(samples, "finish_fix_injections_total", dialect="gemini", kind="error_event") == 1
    assert value(samples, "finish_fix_corrections_total", dialect="gemini", rule="limit_reason") == 1


def test_a_whole_response_counts_but_has_no_event_count_nor_first_token():
    metrics = StreamMetrics()
    metrics.booked(Booking(verdict=Verdict.HTTP_ERROR, detail="http_error: HTTP 429", duration=0.1))
    samples = samples_of(metrics)
    assert value(samples, "finish_fix_streams_total", dialect="chat", verdict="http_error", cause=NO_CAUSE) == 1
    assert value(samples, "finish_fix_stream_events_count", dialect="chat") == 0
    assert value(samples, "finish_fix_time_to_first_token_seconds_count", dialect="chat") == 0
    assert value(samples, "finish_fix_stream_duration_seconds_count", dialect="chat", verdict="http_error") == 1


def test_streams_in_flight_go_up_at_the_head_and_down_at_the_books():
    metrics = StreamMetrics()
    metrics.stream_started(Dialect.RESPONSES)
    metrics.stream_started(Dialect.RESPONSES)
    metrics.stream_ended(Dialect.RESPONSES)
    assert value(samples_of(metrics), "finish_fix_streams_in_flight", dialect="responses") == 1


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        (" 0.0.0.0:9464 ", ("0.0.0.0", 9464)),
        ("[::1]:9464", ("::1", 9464)),
        ("localhost:0", ("localhost", 0)),
    ],
)
def test_listen_address(text, address):
    assert parse_listen_address(text) == address


@pytest.mark.parametrize("text", ["9464", ":9464", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1", "host:port"])
def test_a_bad_listen_address_names_the_valid_form(text):
    with pytest.raises(ValueError, match=r"is not HOST:PORT, e\.g\. 127\.0\.0\.1:9464"):
        parse_listen_address(text)


def test_the_server_answers_a_scrape_in_the_text_format_until_closed():
    metrics = StreamMetrics()
    metrics.booked(Booking(verdict=Verdict.CLEAN, detail="clean", events=3))
    server = MetricsServer("127.0.0.1", 0, metrics.registry)
    try:
        assert server.address[1] in listening_ports(os.getpid())
        response = httpx.get(server.url, timeout=10, trust_env=False)
    finally:
        server.close()
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    assert value(scrape(response.text), "finish_fix_streams_total", dialect="chat", verdict="clean", cause=NO_CAUSE) == 1
    # Closed: this process no longer listens there (asked of the kernel, not of the port, which
    # another process may take the moment it is free).
    assert server.address[1] not in listening_ports(os.getpid())


def test_a_taken_port_is_refused_at_start(addon):  # noqa: F811
    first = MetricsServer("127.0.0.1", 0, StreamMetrics().registry)
    try:
        taken = f"127.0.0.1:{first.address[1]}"
        with pytest.raises(OptionsError, match=rf"^finish_fix_metrics: cannot listen on '{taken}' \("):
            addon.tctx.configure(addon, finish_fix_metrics=taken)
    finally:
        first.close()


# -- the addon ------------------------------------------------------------------------------------


def test_the_addon_counts_every_flow_it_books_as_its_books_do(addon):  # noqa: F811
    addon.tctx.configure(addon, finish_fix_metrics="127.0.0.1:0")
    server = addon.telemetry.metrics_server
    assert server is not None and server.address[1] != 0
    before = scrape(httpx.get(server.url, timeout=10, trust_env=False).text)

    clean = make_flow()
    stream_through(addon, clean, [HEALTHY])
    repaired = make_flow()
    stream_through(addon, repaired, [sse(chunk("Hel"), chunk("lo"), b"[DONE]")])
    cut = make_flow()
    stream_through(addon, cut, [sse(chunk("Hel"))], end="open")
    in_flight = scrape(httpx.get(server.url, timeout=10, trust_env=False).text)
    stream_of(cut).on_upstream_failure("reset")
    cut.error = mitm_flow.Error("reset")
    addon.error(cut)
    after = scrape(httpx.get(server.url, timeout=10, trust_env=False).text)

    def added(samples: dict, name: str, **labels: str) -> float:
        return value(samples, name, **labels) - value(before, name, **labels)

    assert added(in_flight, "finish_fix_streams_in_flight", dialect="chat") == 1
    assert added(after, "finish_fix_streams_in_flight", dialect="chat") == 0
    streams = {
        verdict: added(after, "finish_fix_streams_total", dialect="chat", verdict=verdict, cause=NO_CAUSE)
        for verdict in ("clean", "repaired")
    }
    assert streams == {"clean": 1, "repaired": 1}
    assert added(after, "finish_fix_streams_total", dialect="chat", verdict="interrupted", cause="transport_error") == 1
    assert added(after, "finish_fix_injections_total", dialect="chat", kind="finish") == 1
    assert added(after, "finish_fix_injections_total", dialect="chat", kind="error_event") == 1
    assert added(after, "finish_fix_stream_events_count", dialect="chat") == 3
    assert addon.verdicts == {"clean": 1, "repaired": 1, "interrupted": 1}

    addon.tctx.configure(addon, finish_fix_metrics="")
    assert addon.telemetry.metrics is None and addon.telemetry.metrics_server is None
    assert server.address[1] not in listening_ports(os.getpid())


def test_the_process_has_one_set_of_metrics_across_reloads():
    assert process_metrics() is process_metrics()
