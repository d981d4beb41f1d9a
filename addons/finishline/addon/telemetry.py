"""finish_fix's books where operators look, as the addon's options set them: Prometheus metrics
(`finish_fix_metrics`, `finishline.addon.metrics`) and one OpenTelemetry span per flow
(`finish_fix_otlp`, `finishline.addon.traces`).

The addon (`finishline.addon.hooks`) hands this object each option's value (`serve_metrics`,
`export_spans`), each stream whose head went out (`stream_started`, the in-flight gauge) and each
flow whose books closed (`booked`). Their libraries are imported only when an option asks for
them: with both off finish_fix imports neither. A bad value raises `ValueError` (the addon refuses
it in one line) before anything changes, so what was served stays served. A replaced span export
is flushed and shut down on a thread of its own, never on the proxy's event loop. A failure while
booking is logged once and never breaks a flow.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from finishline import Booking, Dialect, RequestFacts

if TYPE_CHECKING:  # the libraries are imported when an option asks for them
    from finishline.addon.metrics import MetricsServer, StreamMetrics
    from finishline.addon.traces import SpanExport

__all__ = ["Telemetry"]

logger = logging.getLogger(__name__)


class Telemetry:
    """The process's metrics and their server, and the span export, while their options are set."""

    def __init__(self) -> None:
        self.metrics: StreamMetrics | None = None
        self.metrics_server: MetricsServer | None = None
        self.traces: SpanExport | None = None
        self._failed = False

    @property
    def on(self) -> bool:
        return self.metrics is not None or self.traces is not None

    def serve_metrics(self, address: str) -> None:
        """Serve the metrics at `address` (`HOST:PORT`; "" stops serving them).

        Raises:
            ValueError: not HOST:PORT, or nothing can listen there; the message says which.
        """
        parsed = None
        if address:
            # Lazy: prometheus-client is imported only once finish_fix_metrics asks for it.
            from finishline.addon import metrics as prometheus_metrics

            parsed = prometheus_metrics.parse_listen_address(address)
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None
        self.metrics = None
        if parsed is None:
            return
        metrics = prometheus_metrics.process_metrics()
        try:
            self.metrics_server = prometheus_metrics.MetricsServer(*parsed, metrics.registry)
        except OSError as e:
            raise ValueError(f"cannot listen on {address!r} ({e.strerror or e})") from None
        self.metrics = metrics
        logger.info(f"finish_fix: metrics at {self.metrics_server.url}")

    def export_spans(self, url: str) -> None:
        """Export the spans to the OTLP/HTTP endpoint `url` ("" stops exporting them).

        Raises:
            ValueError: not an http:// or https:// URL; the message says so.
        """
        endpoint = None
        if url:
            # Lazy: OpenTelemetry is imported only once finish_fix_otlp asks for it.
            from finishline.addon import traces as otlp_traces

            endpoint = otlp_traces.traces_endpoint(url)
        if self.traces is not None:
            threading.Thread(target=self.traces.close, name="finish_fix: closing a span export", daemon=True).start()
            self.traces = None
        if endpoint is None:
            return
        self.traces = otlp_traces.SpanExport(endpoint)
        logger.info(f"finish_fix: spans to {endpoint} (GenAI semantic conventions v{otlp_traces.SEMCONV_VERSION})")

    def stream_started(self, dialect: Dialect) -> StreamMetrics | None:
        """A stream's head went out: the in-flight gauge goes up, and the metrics to take it down
        again when its books close come back (None without metrics)."""
        if self.metrics is None:
            return None
        self.metrics.stream_started(dialect)
        return self.metrics

    def booked(
        self,
        booking: Booking,
        request: RequestFacts,
        *,
        server: tuple[str, int],
        headers: Mapping[str, str],
        started_at: float,
    ) -> None:
        """One flow's books closed: its metrics and its span."""
        try:
            if self.metrics is not None:
                self.metrics.booked(booking)
            if self.traces is not None:
                self.traces.booked(
                    booking,
                    request,
                    server=server,
                    headers=headers,
                    started_at=started_at,
                    ended_at=started_at + booking.duration if booking.duration is not None else time.time(),
                )
        except Exception as error:
            if not self._failed:
                self._failed = True
                logger.error(f"finish_fix: metrics or spans failed ({error!r}); the flows are booked as before (said once)")

    def close(self) -> None:
        self.serve_metrics("")
        self.export_spans("")
