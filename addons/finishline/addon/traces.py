"""finish_fix's books as OpenTelemetry spans (`finish_fix_otlp=URL`): one span per flow in scope,
following the GenAI semantic conventions v1.41.0 (`SEMCONV_VERSION`), sent over OTLP/HTTP.

When a flow's books close its facts are queued: the core's booking (`finishline.Booking`) as it
is, the request's, the trace context. A thread of this module's makes the spans from them in runs,
and the SDK's batch processor encodes and sends them from its own: nothing on the proxy's event
loop waits for the network or does the SDK's work. A collector that is down or slow costs one warning in
the log (`_ExportWatch`) and the spans it did not take; every stream is sent to its client as
without the option. The addon imports this module only when the option is set, so finish_fix with
it off never imports OpenTelemetry.

The span (docs/telemetry.md says the same for users):

- name `{gen_ai.operation.name} {gen_ai.request.model}` (`chat gpt-4o`), kind CLIENT, from the
  request's start to the end of its books; the child of the request's `traceparent`, if it has one;
- `gen_ai.operation.name` (`chat`), `gen_ai.provider.name` (the dialect's API: `openai`,
  `anthropic` or `gcp.gemini`), `gen_ai.request.model`, `gen_ai.request.stream`, `gen_ai.response.finish_reasons`
  (the core's, or `["error"]` when the flow ended in an error), `error.type` (`ERROR_TYPES`),
  `gen_ai.usage.input_tokens` and `gen_ai.usage.output_tokens` when the upstream reported them,
  `gen_ai.response.time_to_first_chunk`, `server.address` and `server.port` of the upstream;
- finish_fix's own: `finish_fix.verdict`, `finish_fix.dialect`, `finish_fix.detail`,
  `finish_fix.cause` (interrupted, or malformed and cut), `finish_fix.time_to_first_token`, `finish_fix.events`;
- one span event `finish_fix.injection` per event finish_fix wrote, at the end of the stream
  (where it writes them), with `finish_fix.injection.kind` and what else the core says of it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from finishline import Booking, CutCause, Dialect, RequestFacts, Verdict

__all__ = ["ERROR_TYPES", "SEMCONV_VERSION", "SpanExport", "error_type", "span_attributes", "traces_endpoint"]

logger = logging.getLogger(__name__)

#: The OpenTelemetry semantic conventions release the spans follow (its GenAI client inference span;
#: the last release before the GenAI conventions moved to a repository of their own).
SEMCONV_VERSION = "1.41.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
OPERATION = "chat"
# `gen_ai.provider.name`: the API a dialect speaks. The conventions ask for the instrumentation's best
# knowledge; behind a gateway the model may be another provider's (`gen_ai.request.model` and
# `server.address` tell more).
PROVIDERS = {Dialect.CHAT: "openai", Dialect.MESSAGES: "anthropic", Dialect.RESPONSES: "openai", Dialect.GEMINI: "gcp.gemini"}
#: `error.type` per verdict that ended in an error (`interrupted` by its cause, `error_type`).
ERROR_TYPES = {
    Verdict.INTERRUPTED: "stream_interrupted",
    Verdict.UPSTREAM_ERROR: "upstream_error",
    # The client read an event that is not JSON, however the stream ended (`finish_fix.cause` says
    # how it was cut, if it was).
    Verdict.MALFORMED: "malformed",
    Verdict.HTTP_ERROR: "http_error",
}
#: `error.type` of an interrupted stream whose cause has a word of its own.
CAUSE_ERROR_TYPES = {cause: str(cause) for cause in (CutCause.STALLED, CutCause.CLIENT_GONE, CutCause.NO_RESPONSE_HEAD)}
INJECTION_EVENT = "finish_fix.injection"
# The export's own time limits: one request to the collector, and the wait at shutdown for the spans
# still queued (then they are given up: a dead collector never holds the proxy's exit for long).
EXPORT_TIMEOUT_S = 2.0
SHUTDOWN_TIMEOUT_S = 3.0
# How long a flow's span may wait to be made, and then to be sent (each a queue of its own).
SCHEDULE_DELAY_MS = 1000
# Flows queued for their spans at most (as many as the SDK's own queue holds); past it the oldest go.
MAX_QUEUED = 2048
# The W3C trace context headers a span's parent is read from.
_TRACE_CONTEXT = ("traceparent", "tracestate")
# The SDK's exporter and batch processor log every failed batch and every dropped span themselves;
# `_ExportWatch` says it once instead.
_OTEL_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.sdk._shared_internal")


def traces_endpoint(text: str) -> str:
    """The OTLP/HTTP traces URL an option value names: as given, or with `/v1/traces` appended
    when it has no path (`http://127.0.0.1:4318` -> `http://127.0.0.1:4318/v1/traces`), as the
    OTel SDKs do with `OTEL_EXPORTER_OTLP_ENDPOINT`.

    Raises:
        ValueError: naming the valid form.
    """
    url = text.strip()
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 0) >= 0
    except ValueError:  # e.g. a port that is not a number
        valid = False
    if not valid:
        raise ValueError(f"{text!r} is not an http(s) URL, e.g. http://127.0.0.1:4318/v1/traces (empty = off)")
    if parts.path.strip("/"):
        return url
    return urlunsplit(parts._replace(path="/v1/traces"))


def error_type(booking: Booking) -> str | None:
    """`error.type` of a flow, or None when it did not end in an error."""
    if booking.verdict is Verdict.INTERRUPTED and booking.cause in CAUSE_ERROR_TYPES:
        return CAUSE_ERROR_TYPES[booking.cause]
    return ERROR_TYPES.get(booking.verdict)


def span_attributes(booking: Booking, request: RequestFacts, *, server: tuple[str, int]) -> dict[str, Any]:
    """The span's attributes for one flow's booking (the module's docstring lists them)."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": OPERATION,
        "gen_ai.provider.name": PROVIDERS[booking.dialect],
        "gen_ai.request.stream": request.stream,
        "server.address": server[0],
        "server.port": server[1],
        "finish_fix.verdict": str(booking.verdict),
        "finish_fix.dialect": str(booking.dialect),
        "finish_fix.detail": booking.detail,
    }
    if request.model:
        attributes["gen_ai.request.model"] = request.model
    error = error_type(booking)
    if error is not None:
        attributes["error.type"] = error
        attributes["gen_ai.response.finish_reasons"] = ["error"]
    elif booking.finish_reasons:
        attributes["gen_ai.response.finish_reasons"] = list(booking.finish_reasons)
    if booking.usage is not None:
        if booking.usage.input_tokens is not None:
            attributes["gen_ai.usage.input_tokens"] = booking.usage.input_tokens
        if booking.usage.output_tokens is not None:
            attributes["gen_ai.usage.output_tokens"] = booking.usage.output_tokens
    if booking.time_to_first_event is not None:  # (a stream's only)
        attributes["gen_ai.response.time_to_first_chunk"] = booking.time_to_first_event
    if booking.cause is not None:
        attributes["finish_fix.cause"] = str(booking.cause)
    if booking.time_to_first_token is not None:
        attributes["finish_fix.time_to_first_token"] = booking.time_to_first_token
    if booking.events is not None:
        attributes["finish_fix.events"] = booking.events
    return attributes


def _injection_attributes(injection: Mapping[str, object]) -> dict[str, Any]:
    """An injection's facts as event attributes (`finish_fix.injection.<key>`); values the OTLP
    attribute types cannot carry are written as strings."""
    return {
        f"{INJECTION_EVENT}.{key}": value if isinstance(value, (str, int, float, bool)) else str(value)
        for key, value in injection.items()
        if value is not None
    }


class _ExportWatch(SpanExporter, logging.Filter):
    """The OTLP exporter, watched: the first batch it fails to send is logged once as a warning
    (with the exporter's own reason, which its loggers would otherwise repeat per batch), and so is
    the first success after failures."""

    def __init__(self, exporter: SpanExporter, endpoint: str) -> None:
        logging.Filter.__init__(self)
        self._exporter = exporter
        self._endpoint = endpoint
        self._failing = False
        self._warned = False
        # The first thing the exporter logged during the current batch: why it failed.
        self._reason: str | None = None
        #: Spans the collector did not take.
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """A log record of the SDK's exporter or batch processor: kept as the reason, not printed."""
        if record.name == _OTEL_LOGGERS[0] and self._reason is None:
            self._reason = record.getMessage()
        return False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._reason = None
        try:
            result = self._exporter.export(spans)
        except Exception as error:  # the exporter's own bug: the spans are lost, the proxy is not
            result, self._reason = SpanExportResult.FAILURE, repr(error)
        if result is SpanExportResult.SUCCESS:
            if self._failing:
                self._failing = False
                logger.info(f"finish_fix: exporting spans to {self._endpoint} again")
            return result
        self.dropped += len(spans)
        self._failing = True
        if not self._warned:
            self._warned = True
            logger.warning(
                f"finish_fix: cannot export spans to {self._endpoint} ({self._reason or 'no answer'}); spans are dropped "
                "while it does not take them, streams are not affected (said once)"
            )
        return result

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)


class _Booked(NamedTuple):
    """What the event loop hands the span maker for one flow: the facts, none of the SDK's work."""

    booking: Booking
    request: RequestFacts
    server: tuple[str, int]
    trace_context: dict[str, str]  # the request's `traceparent` and `tracestate`, those it had
    started_at: float
    ended_at: float


class SpanExport:
    """Spans to `endpoint` (the full OTLP/HTTP traces URL): `booked` queues a flow's facts, a thread
    of its own makes the spans from them every `SCHEDULE_DELAY_MS` (or at `MAX_QUEUED` flows) and
    the SDK's batch processor sends them from its thread. `close` sends what is left and stops,
    within `SHUTDOWN_TIMEOUT_S`.

    Why a thread makes the spans: an SDK span costs about 100 µs (its attribute checks, the
    sampler, the span objects), which on the event loop, between the pieces of other streams whose
    work keeps the caches cold, cost several times that in `make bench`'s race; made in a run, one
    after another, they cost what they cost alone, and no stream waits for them.
    """

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._watch = _ExportWatch(OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_S), endpoint)
        for name in _OTEL_LOGGERS:
            logging.getLogger(name).addFilter(self._watch)
        # Its own provider, not the global one: finish_fix shares the process with other addons.
        # `shutdown_on_exit=False`: `close` does it, bounded; the SDK's atexit hook would wait for a
        # dead collector.
        # `finish_fix` unless the environment names the service (OTEL_SERVICE_NAME, or service.name in
        # OTEL_RESOURCE_ATTRIBUTES): the SDK merges the attributes given here over the environment's.
        named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
        resource = Resource.create({} if named else {"service.name": "finish_fix"})
        self._provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self._provider.add_span_processor(BatchSpanProcessor(self._watch, schedule_delay_millis=SCHEDULE_DELAY_MS))
        self._tracer = self._provider.get_tracer("finish_fix", schema_url=SCHEMA_URL)
        self._propagator = TraceContextTextMapPropagator()
        # Flows booked and not made into spans yet (appended on the event loop, taken by the maker:
        # a deque's append and popleft are atomic). Past `MAX_QUEUED` the oldest are dropped.
        self._queued: deque[_Booked] = deque(maxlen=MAX_QUEUED)
        self._wake = threading.Event()
        self._closing = False
        self._maker = threading.Thread(target=self._make_spans_until_closed, name="finish_fix span maker", daemon=True)
        self._maker.start()

    def booked(
        self,
        booking: Booking,
        request: RequestFacts,
        *,
        server: tuple[str, int],
        headers: Mapping[str, str],
        started_at: float,
        ended_at: float,
    ) -> None:
        """Queues the span of one flow whose books closed (made and sent from other threads).

        Args:
            request: what the request's body said (its model, whether it asked for a stream).
            server: the upstream's host and port.
            headers: the request's headers (a `traceparent` there makes the span its child).
            started_at, ended_at: the request's start and the books' close, in seconds since the epoch.
        """
        trace_context = {name: value for name in _TRACE_CONTEXT if (value := headers.get(name)) is not None}
        queued = self._queued
        queued.append(_Booked(booking, request, server, trace_context, started_at, ended_at))
        if len(queued) >= MAX_QUEUED // 4:
            self._wake.set()

    def _make_spans_until_closed(self) -> None:
        while not self._closing:
            self._wake.wait(SCHEDULE_DELAY_MS / 1000)
            self._wake.clear()
            self._make_queued_spans()

    def _make_queued_spans(self) -> None:
        queued = self._queued
        while True:
            try:
                booked = queued.popleft()
            except IndexError:  # (`flush` may take from the queue at the same time)
                return
            try:
                self._make_span(booked)
            except Exception as error:  # a bug of ours: this span is lost, the others are not
                logger.error(f"finish_fix: could not make a span ({error!r})")

    def _make_span(self, booked: _Booked) -> None:
        booking, request = booked.booking, booked.request
        parent = self._propagator.extract(carrier=booked.trace_context)
        name = f"{OPERATION} {request.model}" if request.model else OPERATION
        attributes = span_attributes(booking, request, server=booked.server)
        span = self._tracer.start_span(
            name, context=parent, kind=SpanKind.CLIENT, attributes=attributes, start_time=_nanoseconds(booked.started_at)
        )
        ended = _nanoseconds(booked.ended_at)
        for injection in booking.injected:
            span.add_event(INJECTION_EVENT, _injection_attributes(injection), timestamp=ended)
        if "error.type" in attributes:
            span.set_status(Status(StatusCode.ERROR, booking.detail))
        span.end(end_time=ended)

    def flush(self) -> None:
        """Makes and sends every span booked so far, on the calling thread (then the SDK's
        `force_flush`): for a caller that must know they went, such as a test."""
        self._make_queued_spans()
        self._provider.force_flush()

    @property
    def dropped(self) -> int:
        """Spans the collector did not take so far."""
        return self._watch.dropped

    def close(self) -> None:
        """Makes the spans still queued, sends them and stops; gives up on them after
        `SHUTDOWN_TIMEOUT_S` (the SDK's shutdown has no limit of its own while a collector does not
        answer)."""
        self._closing = True
        self._wake.set()

        def finish() -> None:
            self._maker.join()
            self._make_queued_spans()
            self._provider.shutdown()

        closing = threading.Thread(target=finish, name="finish_fix span export shutdown", daemon=True)
        closing.start()
        closing.join(SHUTDOWN_TIMEOUT_S)
        if closing.is_alive():
            logger.warning(f"finish_fix: gave up sending the last spans to {self.endpoint} after {SHUTDOWN_TIMEOUT_S:g} s")
        for name in _OTEL_LOGGERS:
            logging.getLogger(name).removeFilter(self._watch)


def _nanoseconds(seconds: float) -> int:
    return int(seconds * 1_000_000_000)
