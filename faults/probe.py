"""The capture method for exact cuts: learn a real upstream's response layout from clean requests.

`probe_layout` sends the same request twice (through the proxy, before any fault is applied),
captures both raw responses, and returns their `CapturedLayout` if the two agree on where the head
and every token event end. If they disagree (the upstream's answers vary in length: sampling, a
timestamp of varying width, ...), no byte count can promise "exactly n tokens", so it raises
`UnstableUpstream` instead of guessing. Blocking sockets with a deadline; trio code calls it with
`trio.to_thread.run_sync`.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping
from typing import Any

import h11

from faults.layout import CapturedLayout, layout_from_capture
from finishline import Dialect

__all__ = ["UnstableUpstream", "capture_response", "probe_layout", "same_layout"]


class UnstableUpstream(RuntimeError):
    """Two clean captures of one request have different layouts; the message says where."""


def capture_response(
    host: str,
    port: int,
    *,
    body: Mapping[str, Any],
    path: str = "/v1/chat/completions",
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> bytes:
    """POST `body` as JSON and return the raw response bytes (head and framed body), complete.

    Raises:
        TimeoutError: the response did not complete within `timeout` seconds.
        ConnectionError: the connection failed or ended before the response was complete, or
            the response is not valid HTTP/1.1 (h11's errors are converted, never raised).
    """
    payload = json.dumps(body).encode()
    request_headers = [
        ("host", f"{host}:{port}"),
        ("content-type", "application/json"),
        ("accept", "text/event-stream, application/json"),
        # Probing asks for what the lab's clients get: no compression (finish_fix asks the same).
        ("accept-encoding", "identity"),
        ("content-length", str(len(payload))),
        *((headers or {}).items()),
    ]
    client = h11.Connection(h11.CLIENT)
    deadline = time.monotonic() + timeout
    raw = bytearray()
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(client.send(h11.Request(method="POST", target=path, headers=request_headers)))
        sock.sendall(client.send(h11.Data(data=payload)))
        sock.sendall(client.send(h11.EndOfMessage()))
        while True:
            try:
                event = client.next_event()
            except h11.RemoteProtocolError as exc:
                # What a response cut short looks like to h11 ("peer closed connection without
                # sending complete message body"): e.g. a cut fault still applied on the proxy.
                raise ConnectionError(f"the response through {host}:{port} broke off or is not HTTP/1.1: {exc}") from None
            if event is h11.NEED_DATA:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"the probe response was not complete after {timeout} s")
                sock.settimeout(remaining)
                data = sock.recv(65536)
                raw += data
                client.receive_data(data)
            elif isinstance(event, h11.EndOfMessage):
                return bytes(raw)
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("the upstream closed the connection before the response was complete")


def probe_layout(
    host: str,
    port: int,
    *,
    body: Mapping[str, Any],
    path: str = "/v1/chat/completions",
    headers: Mapping[str, str] | None = None,
    probes: int = 2,
    timeout: float = 30.0,
    dialect: Dialect = Dialect.CHAT,
) -> CapturedLayout:
    """Capture the response `probes` times and return its layout if every capture agrees; token
    events are counted in `dialect` (`faults.layout.is_token_event`).

    Raises:
        UnstableUpstream: the captures disagree on the head length or a token event's end.
    """
    captures = [
        capture_response(host, port, body=body, path=path, headers=headers, timeout=timeout) for _ in range(max(1, probes))
    ]
    return same_layout([layout_from_capture(raw, dialect) for raw in captures])


def same_layout(layouts: list[CapturedLayout]) -> CapturedLayout:
    """The first of several captures' layouts, if they all agree on the head and every token event.

    Raises:
        UnstableUpstream: they disagree (the message says where).
    """
    first = layouts[0]
    for other in layouts[1:]:
        if other.head_length != first.head_length:
            raise UnstableUpstream(
                f"the response head was {first.head_length} bytes, then {other.head_length}: "
                "the upstream's layout varies, so no byte count cuts it exactly"
            )
        for index, (a, b) in enumerate(zip(first.token_event_ends, other.token_event_ends, strict=False)):
            if a != b:
                raise UnstableUpstream(
                    f"token event {index + 1} ended at byte {a}, then at {b}: the upstream's layout "
                    "varies (sampling? pin temperature and seed), so no byte count cuts it exactly"
                )
        if other.token_events != first.token_events or other.preamble_end != first.preamble_end:
            raise UnstableUpstream(
                f"the captures have {first.token_events} and {other.token_events} token events: "
                "the upstream's answer varies, so no byte count cuts it exactly"
            )
    return first
