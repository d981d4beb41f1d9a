"""The one private mitmproxy method finish_fix relies on, isolated here.

Why it is needed: when the upstream dies mid-body (incomplete chunked body, short Content-Length,
TCP reset, HTTP/2 stream reset), mitmproxy never calls the response's stream callable again; it runs
the `error` hook and closes the client connection. No public API can write bytes to the client at
that point, so a cut stream would reach the client as a bare transport error with no explanation,
and finish_fix could not append its error event (rule 6).

What it does: it wraps `HttpStream.handle_protocol_error` (mitmproxy/proxy/layers/http/__init__.py,
identical from 11.0.2 to 12.3.1). When a `ResponseProtocolError` arrives while the response body is
being streamed, it asks the installed handler what to do; the handler returns the bytes to send
first and whether to then end the client's response normally. Otherwise, or if the handler declines,
mitmproxy's own method runs unchanged.

Hot reloads: mitmproxy re-executes the addon script on change, but this sibling module stays
imported. The original method is kept on the class itself, so a wrapper is never wrapped, and
`uninstall` (called from the addon's `done`) puts the original back.

`tests/test_cut_hook.py` pins the wrapped method's source and the names used here, and the end-to-end
tests cut real streams through a real mitmdump: a mitmproxy upgrade that changes any of it fails loudly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

from mitmproxy import flow as mitm_flow
from mitmproxy import http
from mitmproxy.proxy.layers.http import DropStream, HttpErrorHook, HttpStream, ResponseData, SendHttp
from mitmproxy.proxy.layers.http import ResponseEndOfMessage, ResponseProtocolError

__all__ = ["CutAction", "CutHandler", "install", "uninstall", "installed"]

logger = logging.getLogger(__name__)

_ORIGINAL = "_finishline_original_handle_protocol_error"
_HANDLER = "_finishline_cut_handler"


class CutAction(NamedTuple):
    """What to do with a response whose upstream died mid-body."""

    # Bytes to send to the client before anything else (already in the client's framing: plain
    # body bytes; mitmproxy adds chunked framing or HTTP/2 DATA frames).
    client_bytes: bytes
    # True: end the client's response normally after those bytes (the body says why it ended).
    # False: let mitmproxy close the client connection / reset the stream as it would have.
    end_response: bool


# Called with the flow and the transport's error message; returns None to leave mitmproxy alone.
CutHandler = Callable[[http.HTTPFlow, str], CutAction | None]


def install(handler: CutHandler) -> None:
    """Routes mid-body upstream failures of streamed responses to `handler` (replacing any earlier
    handler; the method is wrapped only once)."""
    if not hasattr(HttpStream, _ORIGINAL):
        setattr(HttpStream, _ORIGINAL, HttpStream.handle_protocol_error)
        HttpStream.handle_protocol_error = _handle_protocol_error
    setattr(HttpStream, _HANDLER, handler)


def uninstall() -> None:
    """Puts mitmproxy's own method back."""
    original = HttpStream.__dict__.get(_ORIGINAL)
    if original is not None:
        HttpStream.handle_protocol_error = original
        delattr(HttpStream, _ORIGINAL)
    if _HANDLER in HttpStream.__dict__:
        delattr(HttpStream, _HANDLER)


def installed() -> bool:
    return HttpStream.__dict__.get("handle_protocol_error") is _handle_protocol_error


def _handle_protocol_error(self: HttpStream, event):
    original = getattr(HttpStream, _ORIGINAL)
    handler = getattr(HttpStream, _HANDLER, None)
    action = None
    if (
        handler is not None
        and isinstance(event, ResponseProtocolError)
        and self.server_state == self.state_stream_response_body
        and self.flow.response is not None
        and not self.flow.error  # killed flows keep mitmproxy's own handling
    ):
        try:
            action = handler(self.flow, event.message)
        except Exception:  # never let the repair make a failure worse
            logger.exception("finish_fix: cut handler failed; mitmproxy handles this cut as usual")
            action = None
    if action is None:
        return (yield from original(self, event))
    if action.client_bytes:
        yield SendHttp(ResponseData(self.stream_id, action.client_bytes), self.context.client)
    if not action.end_response:
        return (yield from original(self, event))
    # End the client's response like a finished one (mirrors HttpStream.flow_done), but keep the
    # books true: the flow carries the upstream's error and the error hook runs, the response hook not.
    self.flow.error = mitm_flow.Error(event.message)
    yield HttpErrorHook(self.flow)
    self.server_state = self.state_errored
    self.flow.live = False
    yield DropStream(self.stream_id)
    yield SendHttp(ResponseEndOfMessage(self.stream_id), self.context.client)
