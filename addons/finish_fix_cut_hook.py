"""The one private mitmproxy method finish_fix relies on, isolated here: `HttpStream._handle_event`
(mitmproxy/proxy/layers/http/__init__.py), the entry point of every HTTP event of a stream.

Why it is needed, for a response body that is being streamed:

* When the upstream dies mid-body (incomplete chunked body, short Content-Length, TCP reset, HTTP/2
  stream reset), mitmproxy never calls the stream callable again; it runs the `error` hook and closes
  the client connection. No public API can write to the client then, so a cut stream would reach the
  client as a bare transport error, and finish_fix could not append its error event (rule 6).
  Here a `ResponseProtocolError` goes to the installed handler first, which returns the bytes to send
  and whether to then end the client's response normally.
* mitmproxy passes an empty HTTP/2 DATA frame (without END_STREAM) to the stream callable as `b""`,
  which is also how it signals the end of the body: the callable cannot tell them apart, and for an
  HTTP/1.1 client the empty piece would be written as the chunked terminator. Here such an empty
  piece is dropped before it reaches the callable.

Everything else goes to mitmproxy's own method unchanged. The clean end mirrors
`HttpStream.handle_protocol_error` and `HttpStream.flow_done`, and the empty piece
`HttpStream.state_stream_response_body`; `tests/test_cut_hook.py` pins the source of all four, and the
end-to-end tests cut real streams through a real mitmdump: a mitmproxy upgrade that changes any of
them fails loudly.

Hot reloads: mitmproxy re-executes the addon script on change, but this sibling module stays
imported. The original method is kept on the class itself, so a wrapper is never wrapped, and
`uninstall` (called from the addon's `done`) puts the original back.
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

_ORIGINAL = "_finishline_original_handle_event"
_HANDLER = "_finishline_cut_handler"


class CutAction(NamedTuple):
    """What to do with a response whose upstream died mid-body."""

    # Bytes to send to the client first (body bytes; mitmproxy adds chunked framing or DATA frames).
    client_bytes: bytes
    # True: end the client's response normally after them (the body says why it ended).
    # False: let mitmproxy close the client connection / reset the stream as it would have.
    end_response: bool


# Called with the flow and the transport's error message; returns None to leave mitmproxy alone.
CutHandler = Callable[[http.HTTPFlow, str], CutAction | None]


def install(handler: CutHandler) -> None:
    """Routes mid-body upstream failures of streamed responses to `handler` (replacing any earlier
    handler; the method is wrapped only once)."""
    if _ORIGINAL not in HttpStream.__dict__:
        setattr(HttpStream, _ORIGINAL, HttpStream.__dict__["_handle_event"])
        HttpStream._handle_event = _handle_event
    setattr(HttpStream, _HANDLER, handler)


def uninstall() -> None:
    """Puts mitmproxy's own method back."""
    original = HttpStream.__dict__.get(_ORIGINAL)
    if original is not None:
        HttpStream._handle_event = original
        delattr(HttpStream, _ORIGINAL)
    if _HANDLER in HttpStream.__dict__:
        delattr(HttpStream, _HANDLER)


def installed() -> bool:
    return HttpStream.__dict__.get("_handle_event") is _handle_event


def _handle_event(self: HttpStream, event):
    original = getattr(HttpStream, _ORIGINAL)
    streaming = getattr(self, "server_state", None) == getattr(self, "state_stream_response_body", object())
    if streaming and isinstance(event, ResponseData) and not event.data:
        return  # an empty DATA frame mid-body: nothing to send, and not the end
    if streaming and isinstance(event, ResponseProtocolError):
        action = _ask_handler(self.flow, event.message)
        if action is not None:
            return (yield from _end_after_cut(self, event, action))
    return (yield from original(self, event))


def _ask_handler(flow: http.HTTPFlow, message: str) -> CutAction | None:
    handler = getattr(HttpStream, _HANDLER, None)
    if handler is None or flow.response is None or flow.error:  # killed flows: mitmproxy's way
        return None
    try:
        return handler(flow, message)
    except Exception:  # never let the repair make a failure worse
        logger.exception("finish_fix: cut handler failed; mitmproxy handles this cut as usual")
        return None


def _end_after_cut(self: HttpStream, event: ResponseProtocolError, action: CutAction):
    if action.client_bytes:
        yield SendHttp(ResponseData(self.stream_id, action.client_bytes), self.context.client)
    if not action.end_response:
        return (yield from getattr(HttpStream, _ORIGINAL)(self, event))
    # End the client's response like a finished one (as HttpStream.flow_done does), but keep the books
    # true: the flow carries the upstream's error and the error hook runs, the response hook does not
    # (as in HttpStream.handle_protocol_error).
    self.flow.error = mitm_flow.Error(event.message)
    yield HttpErrorHook(self.flow)
    if (yield from self.check_killed(False)):
        return
    self.server_state = self.state_errored
    self.flow.live = False
    yield DropStream(self.stream_id)
    yield SendHttp(ResponseEndOfMessage(self.stream_id), self.context.client)
