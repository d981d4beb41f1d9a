"""finish_fix's books as Prometheus metrics (`finish_fix_metrics=HOST:PORT`).

The counters and histograms below, served at `/metrics` in the Prometheus text format by
prometheus-client's own HTTP server, on a thread of its own: a scrape never runs on the proxy's
event loop. The addon imports this module only when the option is set, so finish_fix with it off
never imports prometheus-client.

Every label value comes from a closed set the core defines: `dialect` (`Dialect`), `verdict`
(`Verdict`), `cause` (`CutCause` for `interrupted`, and for `malformed` when it was also cut, else
`none`), `kind` (`InjectionKind`), `rule` (`Correction`); never a
model, a path or an id. Each series exists from the start, at 0, so a rate or a share is defined
before the first stream of its kind.

A flow costs two updates: one when its response head goes out (in flight), one when its books
close (the rest); none per piece. What they count is the core's booking (`finishline.Booking`), read
as it is: the counters count every flow the ledger has a line for.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from wsgiref.simple_server import WSGIServer

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from finishline import Booking, Correction, CutCause, Dialect, InjectionKind, Verdict

__all__ = ["NO_CAUSE", "MetricsServer", "StreamMetrics", "parse_listen_address", "process_metrics"]

#: The `cause` of every verdict but `interrupted`.
NO_CAUSE = "none"

# Buckets, in the units of each histogram. Time to first token: a cached prompt answers in tens of
# milliseconds, a reasoning model may think for minutes (the first-token deadline's default is 600 s).
_FIRST_TOKEN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# A whole stream: up to the half hour a long agent turn may take.
_DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
# Events per stream: a refusal is a handful, a long answer tens of thousands.
_EVENT_BUCKETS = (1, 5, 10, 50, 100, 500, 1_000, 5_000, 10_000, 50_000, 100_000)


def _verdict_causes() -> Iterator[tuple[Verdict, str]]:
    """Every (verdict, cause) pair a booking can have: `interrupted` always has a cause, `malformed`
    one when the stream was also cut (`Booking.cause`), every other verdict none."""
    for verdict in Verdict:
        if verdict is Verdict.MALFORMED:
            yield verdict, NO_CAUSE
        if verdict in (Verdict.INTERRUPTED, Verdict.MALFORMED):
            yield from ((verdict, str(cause)) for cause in CutCause)
        else:
            yield verdict, NO_CAUSE


class StreamMetrics:
    """finish_fix's metrics in one registry (the process's is `process_metrics()`; a test may make its own).

    Thread-safe (prometheus-client's metrics lock), but called from the proxy's event loop only.
    """

    def __init__(self) -> None:
        # Counters' and histograms' `_created` series would double the output, and no query here
        # reads them. (A switch of prometheus-client's for the whole process.)
        prometheus_client.disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        streams = Counter(
            "finish_fix_streams",
            "Flows in finish_fix's scope whose books closed, by dialect, verdict and, for interrupted ones, cause.",
            ["dialect", "verdict", "cause"],
            registry=self.registry,
        )
        injections = Counter(
            "finish_fix_injections",
            "Events finish_fix wrote into streams, by dialect and kind.",
            ["dialect", "kind"],
            registry=self.registry,
        )
        corrections = Counter(
            "finish_fix_corrections",
            "Flows in which a rule of finish_fix changed values the upstream sent, by dialect and rule.",
            ["dialect", "rule"],
            registry=self.registry,
        )
        in_flight = Gauge(
            "finish_fix_streams_in_flight",
            "Streams in finish_fix's scope whose response head went out and whose books are not closed yet.",
            ["dialect"],
            registry=self.registry,
        )
        first_token = Histogram(
            "finish_fix_time_to_first_token_seconds",
            "Seconds from the request to the first event that carried a token, per stream that had one.",
            ["dialect"],
            buckets=_FIRST_TOKEN_BUCKETS,
            registry=self.registry,
        )
        duration = Histogram(
            "finish_fix_stream_duration_seconds",
            "Seconds from the request to the end of the flow's books, by dialect and verdict.",
            ["dialect", "verdict"],
            buckets=_DURATION_BUCKETS,
            registry=self.registry,
        )
        events = Histogram(
            "finish_fix_stream_events",
            "SSE events per stream (keep-alives and comments not counted).",
            ["dialect"],
            buckets=_EVENT_BUCKETS,
            registry=self.registry,
        )
        # Every child made once: a booking then costs dictionary look-ups, not label handling.
        self._streams = {
            (dialect, verdict, cause): streams.labels(dialect, verdict, cause)
            for dialect in Dialect
            for verdict, cause in _verdict_causes()
        }
        self._injections = {(dialect, kind): injections.labels(dialect, kind) for dialect in Dialect for kind in InjectionKind}
        self._corrections = {(dialect, rule): corrections.labels(dialect, rule) for dialect in Dialect for rule in Correction}
        self._in_flight = {dialect: in_flight.labels(dialect) for dialect in Dialect}
        self._first_token = {dialect: first_token.labels(dialect) for dialect in Dialect}
        self._duration = {(dialect, verdict): duration.labels(dialect, verdict) for dialect in Dialect for verdict in Verdict}
        self._events = {dialect: events.labels(dialect) for dialect in Dialect}

    def stream_started(self, dialect: Dialect) -> None:
        """A stream's response head went out: it is in flight until `stream_ended`."""
        self._in_flight[dialect].inc()

    def stream_ended(self, dialect: Dialect) -> None:
        self._in_flight[dialect].dec()

    def booked(self, booking: Booking) -> None:
        """One flow's books closed (a stream's, a whole response's or a missing one's, as in the ledger)."""
        dialect, verdict = booking.dialect, booking.verdict
        cause = str(booking.cause) if booking.cause is not None else NO_CAUSE
        self._streams[dialect, verdict, cause].inc()
        for injection in booking.injected:
            self._injections[dialect, injection["kind"]].inc()
        for rule in booking.corrections:
            self._corrections[dialect, rule].inc()
        if booking.time_to_first_token is not None:
            self._first_token[dialect].observe(booking.time_to_first_token)
        if booking.duration is not None:
            self._duration[dialect, verdict].observe(booking.duration)
        if booking.events is not None:
            self._events[dialect].observe(booking.events)


@functools.cache
def process_metrics() -> StreamMetrics:
    """The process's one `StreamMetrics`. This module is imported once (mitmproxy re-executes only
    the addon script on a hot reload), so counts and streams in flight carry over a reload."""
    return StreamMetrics()


class MetricsServer:
    """prometheus-client's HTTP server for `registry` on `host:port`, on a daemon thread.

    Raises:
        OSError: the address cannot be listened on (in use, not this host's).
    """

    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        server, thread = prometheus_client.start_http_server(port, addr=host, registry=registry)
        self._server: WSGIServer = server
        self._thread: threading.Thread = thread
        #: (host, port) as bound: with port 0, the port the kernel picked.
        self.address: tuple[str, int] = (host, server.server_address[1])

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def close(self) -> None:
        """Stops serving and closes the socket (waits for a scrape being answered, if any)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def parse_listen_address(text: str) -> tuple[str, int]:
    """'127.0.0.1:9464' -> ('127.0.0.1', 9464); '[::1]:9464' -> ('::1', 9464). Port 0 lets the
    kernel pick one (the addon logs which).

    Raises:
        ValueError: naming the valid form.
    """
    host, separator, port_text = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not separator or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT, e.g. 127.0.0.1:9464 or [::1]:9464 (empty = off)")
    return host, int(port_text)
