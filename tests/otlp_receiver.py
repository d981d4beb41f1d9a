"""A real OTLP/HTTP traces receiver for the tests: what the real exporter sends, decoded by the
official protobuf types (`opentelemetry-proto`).

`running_otlp_receiver()` serves `POST /v1/traces` on 127.0.0.1 (port 0: the kernel picks one) from
a thread, decodes each body as an `ExportTraceServiceRequest` (gzip or deflate if the exporter
compressed it), keeps every span as a `ReceivedSpan` and answers as a collector does: 200 with an
`ExportTraceServiceResponse`. Anything it cannot decode is answered 400 and kept in `errors`, so a
test sees it.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

__all__ = ["OtlpReceiver", "ReceivedSpan", "refusing_otlp_endpoint", "running_otlp_receiver"]

TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it came over the wire, its values decoded to Python."""

    name: str
    kind: str  # the protobuf enum's name, e.g. SPAN_KIND_CLIENT
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root span
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status_code: str  # e.g. STATUS_CODE_ERROR
    start_ns: int
    end_ns: int
    resource: dict[str, Any]
    scope_name: str
    scope_schema_url: str


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, which) if which else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


def decode_spans(body: bytes) -> list[ReceivedSpan]:
    """Every span of one `ExportTraceServiceRequest`. Raises DecodeError for what is not one."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        kind=Span.SpanKind.Name(span.kind),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        attributes=_attributes(span.attributes),
                        events=[(event.name, _attributes(event.attributes)) for event in span.events],
                        status_code=type(span.status).StatusCode.Name(span.status.code),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        resource=resource,
                        scope_name=scope_spans.scope.name,
                        scope_schema_url=scope_spans.schema_url,
                    )
                )
    return spans


@dataclass
class OtlpReceiver:
    """The spans received so far (and the bodies refused)."""

    port: int = 0
    spans: list[ReceivedSpan] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    requests: int = 0
    _lock: threading.Condition = field(default_factory=threading.Condition)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}{TRACES_PATH}"

    def received(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            self.requests += 1
            self.spans.extend(spans)
            self._lock.notify_all()

    def wait_for(self, count: int, timeout: float) -> list[ReceivedSpan]:
        """The spans, once at least `count` came; raises AssertionError after `timeout` s."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.spans) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"{len(self.spans)} spans received within {timeout} s, expected {count}: {self.spans}")
                self._lock.wait(remaining)
            return list(self.spans)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        receiver = self.server.receiver
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        encoding = self.headers.get("content-encoding", "").lower()
        try:
            if self.path != TRACES_PATH:
                raise ValueError(f"POST to {self.path}, not {TRACES_PATH}")
            if self.headers.get("content-type") != "application/x-protobuf":
                raise ValueError(f"content-type {self.headers.get('content-type')!r}")
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            spans = decode_spans(body)
        except (ValueError, DecodeError, OSError, zlib.error) as error:
            receiver.errors.append(repr(error))
            self.send_response(400)
            self.end_headers()
            return
        receiver.received(spans)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the test shows what matters
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, receiver: OtlpReceiver) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.receiver = receiver


@contextmanager
def running_otlp_receiver() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP traces receiver on 127.0.0.1, serving from a thread until the block ends."""
    receiver = OtlpReceiver()
    server = _Server(receiver)
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, name="otlp receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def refusing_otlp_endpoint() -> Iterator[str]:
    """An OTLP traces URL on a port bound but not listening, for the block: a dead collector that
    refuses every connection, and whose port nothing else can take meanwhile."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{bound.getsockname()[1]}{TRACES_PATH}"
