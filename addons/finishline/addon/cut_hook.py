"""The one private mitmproxy method finish_fix relies on, isolated here: `HttpStream._handle_event`
(mitmproxy/proxy/layers/http/__init__.py), the entry point of every HTTP event of a stream.

Why it is needed, for a response body that is being streamed:

* When the upstream dies mid-body (incomplete chunked body, short Content-Length, TCP reset, HTTP/2
  stream reset), mitmproxy never calls the stream callable again; it runs the `error` hook and closes
  the client connection. No public API can write to the client then, so a cut stream would reach the
  client as a bare transport error, and finish_fix could not append its error event (rule C6).
  Here a `ResponseProtocolError` goes to the flow's handler first, which returns the bytes to send
  and whether to then end the client's response normally (a `finishline.ClientEnding`).
* When the upstream goes silent, nothing happens at all: no event reaches any hook. Here the stream
  asks mitmproxy's event loop for a timer (`RequestWakeup`, the command mitmproxy's own HTTP/2 layer
  uses for its keep-alive pings) when its response head has gone out; on each `Wakeup` the handler
  says whether a stall deadline passed. If one did, the client's response ends like a cut one and the
  upstream exchange is abandoned the way mitmproxy abandons it for a client that went away: a
  `RequestProtocolError` sent to the server connection, which closes an HTTP/1 connection and resets
  only this stream on HTTP/2.
* When the upstream never sends a response head (a dead worker behind a live load balancer),
  mitmproxy waits on its server read for as long as the connection lives, and no public API ends
  that wait: `flow.kill()` only marks the flow, which `HttpStream` reads after a hook (mitmproxy's
  own TODO in `Flow.kill`: flows in transit cannot be killed), and a `flow.response`
  assigned meanwhile is overwritten by `state_wait_for_response_headers` when a head comes, and
  sent by nothing if none does. Here, once the request went upstream (the event that moved the
  client side to `state_done` left the server side in `state_wait_for_response_headers`), the
  flow's `HeadWatch` (registered by `watch_head`) is asked for a timer; if its `Wakeup` finds the
  server side still waiting, the watch says what the client is answered (an `http.Response`), the
  upstream exchange is abandoned as after a stall, the error hook runs, and the response is sent as
  `HttpStream.send_response` sends one an addon made. A `Wakeup` is told apart from the stall
  timer's by its command (`HeadWatch.wakeup`); one that arrives after the head came is swallowed.
* Every piece of a streamed body costs mitmproxy two generators (this method and
  `state_stream_response_body`) and a read of the `store_streamed_bodies` option, whose value
  mitmproxy deep-copies on every read: together more than finish_fix's own work on a routine piece
  (`make bench`). So the pieces of a flow whose handler is a `CutHandler` are sent here, the way
  `state_stream_response_body` sends them: each piece through the stream callable, each chunk it
  returns as one `SendHttp(ResponseData)` to the client. The option is read once, when the response
  head has gone out; while it is on, mitmproxy's own method handles the pieces (and stores them).
* When the upstream dies while mitmproxy buffers a whole (not streamed) body, mitmproxy answers the
  client itself, with a 502 and a body of its own words. A Gemini client judges a whole body by its
  status and reads Gemini's error shape (finish_fix rule G6), so here a flow's `WholeBodyWatch`
  (registered by `watch_whole_body`) is asked first, with the bytes buffered so far; if it gives a
  response, the error hook runs and that response is sent as when no head came.
* mitmproxy passes an empty HTTP/2 DATA frame (without END_STREAM) to the stream callable as `b""`,
  which is also how it signals the end of the body: the callable cannot tell them apart, and for an
  HTTP/1.1 client the empty piece would be written as the chunked terminator. Here such an empty
  piece is dropped before it reaches the callable.

Everything else goes to mitmproxy's own method unchanged. The handler is the flow's own stream
callable (`flow.response.stream`) when it is a `CutHandler`: nothing per process is stored on
mitmproxy's class but the original method. The clean end mirrors `HttpStream.handle_protocol_error`
and `HttpStream.flow_done`, the pieces and the empty piece `HttpStream.state_stream_response_body`,
the timer's start `HttpStream.start_response_stream`, the buffered body
`HttpStream.state_consume_response_body`, the head timer's start
`HttpStream.state_consume_request_body` and `state_stream_request_body` (where the request is sent),
the answer without a head `HttpStream.send_response`, and the timers' delivery
`HttpLayer.event_to_child`; `tests/test_cut_hook.py`
pins their source, and the end-to-end tests cut and stall real streams through a real mitmdump: a
mitmproxy upgrade that changes any of them fails loudly.

Hot reloads: mitmproxy re-executes the addon script on change, but this module of the package stays
imported. The original method is kept on the class itself, so a wrapper is never wrapped, and
`uninstall` (called from the addon's `done`) puts the original back. A timer may still be pending
then (a stall timer outlives its response by up to one timeout, a head timer is booked for every
streaming request in scope), and mitmproxy's own method would refuse its `Wakeup` as an unexpected
event: so while timers of open connections are pending, `uninstall` leaves the wrapper in place doing
nothing but swallow them, and puts the original back when the last one arrived or its connection
closed. Timers are counted per client connection because mitmproxy cancels a connection's timers when
its client disconnects (`ConnectionHandler.handle_client`, before it sets the client's
`timestamp_end`): such a `Wakeup` never arrives, and counting it would keep the wrapper forever.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Iterable

from mitmproxy import flow as mitm_flow
from mitmproxy import http
from mitmproxy.connection import Client
from mitmproxy.proxy.commands import RequestWakeup
from mitmproxy.proxy.events import Event, Wakeup
from mitmproxy.proxy.layer import CommandGenerator
from mitmproxy.proxy.layers.http import (
    DropStream,
    ErrorCode,
    HttpErrorHook,
    HttpStream,
    RequestProtocolError,
    ResponseData,
    ResponseEndOfMessage,
    ResponseHeaders,
    ResponseProtocolError,
    SendHttp,
)

from finishline import ClientEnding

__all__ = [
    "CutHandler",
    "HeadWatch",
    "NO_HEAD_MESSAGE",
    "STALL_MESSAGE",
    "head_watch_of",
    "install",
    "installed",
    "uninstall",
    "watch_head",
    "watch_whole_body",
    "whole_body_watch_of",
    "WholeBodyWatch",
]

logger = logging.getLogger(__name__)

_ORIGINAL = "_finishline_original_handle_event"
# The flow's error after a stall (the books carry the details: which deadline, after how many events).
STALL_MESSAGE = "the upstream stalled; finish_fix closed it"
# The flow's error when no response head came (the books and the answer's body say more).
NO_HEAD_MESSAGE = "no response head from the upstream in time; finish_fix closed it"
# A timer never fires sooner than this: a deadline that is due now is checked on the next turn of the
# event loop rather than in a tight loop should the clock step back.
_MIN_DELAY_S = 0.01
# Timers (stall and head) asked for and not yet delivered, by client connection, and whether
# `uninstall` waits for them (module state: it survives hot reloads of the addon, as this module does).
# Weak: a connection's entry goes with it; one whose client is gone is not waited for (its timers
# were cancelled, see the module's docstring).
_timers_pending: weakref.WeakKeyDictionary[Client, int] = weakref.WeakKeyDictionary()
_draining = False
# mitmproxy's own method while the wrapper is installed (also kept on the class, see `install`): read
# from here for every piece, a module global being the cheapest lookup. Until `install` sets it (the
# wrapper never runs before that), it is the class's method as imported.
_original_handle_event: Callable[[HttpStream, Event], CommandGenerator[None]] = HttpStream._handle_event
# Each flow's HeadWatch, from `watch_head` (weak: an entry goes with its flow; module state, so a
# flow waiting for its head across a hot reload keeps its watch).
_head_watches: weakref.WeakKeyDictionary[http.HTTPFlow, HeadWatch] = weakref.WeakKeyDictionary()
# Each flow's WholeBodyWatch, from `watch_whole_body` (weak, module state, as the head watches).
_whole_body_watches: weakref.WeakKeyDictionary[http.HTTPFlow, WholeBodyWatch] = weakref.WeakKeyDictionary()


class CutHandler:
    """What a flow's stream callable provides to hear of cuts and stalls. The defaults do nothing:
    mitmproxy then handles the flow as it would without finish_fix.

    Every method must be cheap and should not raise (an exception is logged and mitmproxy goes on
    as usual). `now` is `time.time()`.

    Attributes:
        sent_by_hook: set by the hook once the response head went out: True when the hook sends
            each piece of the body itself (`store_streamed_bodies` is off), False while mitmproxy's
            own method does. Subclasses call `CutHandler.__init__`.
    """

    __slots__ = ("sent_by_hook",)

    def __init__(self) -> None:
        self.sent_by_hook = False

    def __call__(self, data: bytes) -> bytes | Iterable[bytes]:
        """The stream callable itself (`flow.response.stream`): what to send for a piece of the body.
        The default passes it unchanged, as `stream = True` does."""
        return data

    def on_upstream_failure(self, message: str) -> ClientEnding | None:
        """The upstream died mid-body (`message`: mitmproxy's words). None: leave it to mitmproxy."""
        return None

    def next_stall_check(self, now: float) -> float | None:
        """When to call `on_timer` next (a time like `now`), or None for no timer."""
        return None

    def on_timer(self, now: float) -> ClientEnding | None:
        """The timer went off: None if nothing stalled, else how the client's response ends (the
        upstream connection is then closed)."""
        return None


class HeadWatch:
    """What a flow provides (`watch_head`) to have its request answered when the upstream sends no
    response head in time. The defaults ask for no timer: mitmproxy then waits as it would.

    Every method must be cheap and should not raise (an exception is logged and mitmproxy goes on
    waiting). Times are `time.time()`.

    Attributes:
        sent_at: when the request went upstream, set by the hook (None until then).
        wakeup: the hook's pending timer for this watch, if any (the hook's own bookkeeping), and
            `due`, when it is due.
        serves_stall: set by the hook when the response head came while that timer was pending and
            due no later than the stream's first stall check: the timer is then that check (every
            timer is an asyncio task in mitmproxy, which showed in the bench's 200-event streams).
    """

    __slots__ = ("sent_at", "wakeup", "due", "serves_stall", "__weakref__")

    def __init__(self) -> None:
        self.sent_at: float | None = None
        self.wakeup: RequestWakeup | None = None
        self.due = 0.0
        self.serves_stall = False

    def next_head_check(self, now: float) -> float | None:
        """When to call `on_head_timer` (a time like `now`; `sent_at` is set), or None for no timer."""
        return None

    def on_head_timer(self, now: float) -> http.Response | None:
        """The timer went off with no response head yet: None to wait on (the hook then asks
        `next_head_check` again), else the response the client gets instead (the upstream
        exchange is then abandoned and the flow's error hook runs first)."""
        return None


class WholeBodyWatch:
    """What a flow provides (`watch_whole_body`) to answer its client itself when the upstream dies
    while mitmproxy buffers its whole body. The default leaves it to mitmproxy (its 502)."""

    __slots__ = ("__weakref__",)

    def on_body_cut(self, body: bytes, message: str) -> http.Response | None:
        """The upstream failed mid-body (`body`: the bytes buffered, `message`: mitmproxy's words):
        None for mitmproxy's own answer, else the response the client gets (the error hook runs
        first)."""
        return None


def watch_whole_body(flow: http.HTTPFlow, watch: WholeBodyWatch) -> None:
    """Gives `flow` a WholeBodyWatch; call it when its response head came (`responseheaders`)."""
    _whole_body_watches[flow] = watch


def whole_body_watch_of(flow: http.HTTPFlow) -> WholeBodyWatch | None:
    """The flow's WholeBodyWatch, if `watch_whole_body` gave it one."""
    return _whole_body_watches.get(flow)


def watch_head(flow: http.HTTPFlow, watch: HeadWatch) -> None:
    """Gives `flow` a HeadWatch; call it before the request goes upstream (the `request` hook)."""
    _head_watches[flow] = watch


def head_watch_of(flow: http.HTTPFlow) -> HeadWatch | None:
    """The flow's HeadWatch, if `watch_head` gave it one."""
    return _head_watches.get(flow)


def install() -> None:
    """Routes mid-body failures and stall timers of streamed responses to each flow's handler (the
    method is wrapped only once, however often this is called)."""
    global _draining, _original_handle_event
    _draining = False
    if _ORIGINAL not in HttpStream.__dict__:
        setattr(HttpStream, _ORIGINAL, HttpStream.__dict__["_handle_event"])
        # setattr, not assignment: it replaces a method, which mypy refuses as an assignment.
        setattr(HttpStream, "_handle_event", _handle_event)  # noqa: B010
    _original_handle_event = HttpStream.__dict__[_ORIGINAL]


def uninstall() -> None:
    """Puts mitmproxy's own method back, at once or, while stall timers are pending, once they all
    arrived (the wrapper meanwhile only swallows them)."""
    global _draining
    if _ORIGINAL in HttpStream.__dict__ and _open_timers():
        _draining = True
        return
    _restore()


def _open_timers() -> bool:
    """Whether a timer may still arrive: one is pending on a client connection that is still open."""
    return any(count > 0 and client.timestamp_end is None for client, count in list(_timers_pending.items()))


def _book_timer(self: HttpStream, change: int) -> None:
    client = self.context.client
    count = _timers_pending.get(client, 0) + change
    if count > 0:
        _timers_pending[client] = count
    else:
        _timers_pending.pop(client, None)


def installed() -> bool:
    """True while the wrapper handles cuts and stalls (not while it only drains timers)."""
    return HttpStream.__dict__.get("_handle_event") is _handle_event and not _draining


def _restore() -> None:
    global _draining
    _draining = False
    original = HttpStream.__dict__.get(_ORIGINAL)
    if original is not None:
        setattr(HttpStream, "_handle_event", original)  # noqa: B010 (as in `install`)
        delattr(HttpStream, _ORIGINAL)


def _handle_event(self: HttpStream, event):
    # Every piece of every body comes here, and `_handle_other_event` never acts on a non-empty one
    # (only on an empty piece, a failure, a timer or the response head): so this is a plain function
    # (like mitmproxy's own `expect` wrapper) that returns the generator for such a piece without one
    # of ours around it: `_send_pieces` for a body the hook sends, else mitmproxy's own.
    if isinstance(event, ResponseData) and event.data:
        handler = getattr(self.flow.response, "stream", None)
        # `server_state` is checked too: after a cut or a stall ended the client's response, later
        # pieces go to mitmproxy's state_errored, which drops them.
        if isinstance(handler, CutHandler) and handler.sent_by_hook and self.server_state.__func__ is _STREAM_RESPONSE_BODY:
            return _send_pieces(self, handler, event.data)
        return _original_handle_event(self, event)
    return _handle_other_event(self, event)


_STREAM_RESPONSE_BODY = HttpStream.state_stream_response_body


def _send_pieces(self: HttpStream, handler: CutHandler, data: bytes):
    """What `state_stream_response_body` does with a piece of the body (a `ResponseData`) while
    `store_streamed_bodies` is off: the piece through the stream callable, one `SendHttp` per chunk
    it returns."""
    chunks = handler(data)
    if isinstance(chunks, bytes):
        chunks = [chunks]
    client = self.context.client
    for chunk in chunks:
        yield SendHttp(ResponseData(self.stream_id, chunk), client)


def _handle_other_event(self: HttpStream, event):
    original = getattr(HttpStream, _ORIGINAL)
    if isinstance(event, Wakeup):
        _book_timer(self, -1)
        if _draining:
            if not _open_timers():
                _restore()
            return
        watch = _head_watches.get(self.flow)
        if watch is not None and event.command is watch.wakeup:
            watch.wakeup = None
            if self.server_state == self.state_wait_for_response_headers:
                return (yield from _on_head_timer(self, watch))
            if not watch.serves_stall:
                return  # the head came meanwhile: its stream has a stall timer of its own
            # Else it is the stream's stall check (`_set_timer`), handled below like one.
    elif _draining:
        # The last pending timers may have gone with their connections: no Wakeup is then left to
        # swallow, and mitmproxy's own method can take over from the next event.
        if not _open_timers():
            _restore()
        return (yield from original(self, event))
    if isinstance(event, ResponseProtocolError) and self.flow in _whole_body_watches:
        if getattr(self, "server_state", None) == getattr(self, "state_consume_response_body", object()):
            return (yield from _on_body_cut(self, _whole_body_watches[self.flow], event))
    if getattr(self, "server_state", None) == getattr(self, "state_stream_response_body", object()):
        if isinstance(event, ResponseData) and not event.data:
            return  # an empty DATA frame mid-body: nothing to send, and not the end
        if isinstance(event, ResponseProtocolError):
            ending = _ask(self.flow, "on_upstream_failure", event.message)
            if ending is not None:
                return (yield from _end_after_cut(self, event, ending))
        elif isinstance(event, Wakeup):
            return (yield from _on_timer(self))
        return (yield from original(self, event))
    if isinstance(event, Wakeup):
        return  # the timer of a response that is over (HttpStream asks for no wakeups of its own)
    request_was_sent = getattr(self, "client_state", None) == getattr(self, "state_done", object())
    yield from original(self, event)
    if (
        not request_was_sent
        and self.client_state == self.state_done
        and self.server_state == self.state_wait_for_response_headers
    ):
        # The request just went upstream (whole, or the end of a streamed body), and no response
        # was made instead (a connection failure, an addon's answer or a kill leave another state).
        yield from _watch_for_head(self)
        return
    if getattr(self, "server_state", None) == getattr(self, "state_stream_response_body", object()):
        # The response head just went to the client (start_response_stream): from here the hook
        # sends the pieces (unless mitmproxy is to store them), and the stall timer starts.
        handler = _handler_of(self.flow)
        if handler is not None:
            handler.sent_by_hook = not self.context.options.store_streamed_bodies
        yield from _set_timer(self, time.time(), _head_watches.get(self.flow))


def _handler_of(flow: http.HTTPFlow) -> CutHandler | None:
    stream = flow.response.stream if flow.response is not None else None
    return stream if isinstance(stream, CutHandler) else None


def _ask(flow: http.HTTPFlow, method: str, *args):
    handler = _handler_of(flow)
    if handler is None or flow.error:  # killed flows: mitmproxy's way
        return None
    try:
        return getattr(handler, method)(*args)
    except Exception:  # never let the repair make a failure worse
        logger.exception(f"finish_fix: {method} failed; mitmproxy handles this flow as usual")
        return None


def _set_timer(self: HttpStream, now: float, watch: HeadWatch | None = None):
    at = _ask(self.flow, "next_stall_check", now)
    if at is not None and watch is not None and watch.wakeup is not None and watch.due <= at:
        # The head timer, still pending, comes first: it is the stall check (`HeadWatch.serves_stall`).
        watch.serves_stall = True
        return
    if at is not None:
        _book_timer(self, 1)
        # Delivered back to this stream: HttpLayer.event_to_child remembers who asked for a wakeup.
        yield RequestWakeup(max(at - now, _MIN_DELAY_S))


def _watch_for_head(self: HttpStream):
    watch = _head_watches.get(self.flow)
    if watch is None or self.flow.error:
        return
    watch.sent_at = now = time.time()
    yield from _set_head_timer(self, watch, now)


def _set_head_timer(self: HttpStream, watch: HeadWatch, now: float):
    try:
        at = watch.next_head_check(now)
    except Exception:  # never let the repair make a failure worse
        logger.exception("finish_fix: next_head_check failed; mitmproxy waits for the response head as usual")
        return
    if at is not None:
        _book_timer(self, 1)
        # Delivered back to this stream, as the stall timer's (HttpLayer.event_to_child).
        watch.wakeup = RequestWakeup(max(at - now, _MIN_DELAY_S))
        watch.due = now + watch.wakeup.delay
        yield watch.wakeup


def _on_head_timer(self: HttpStream, watch: HeadWatch):
    if self.flow.error:  # killed meanwhile: mitmproxy's way
        return
    now = time.time()
    try:
        response = watch.on_head_timer(now)
    except Exception:
        logger.exception("finish_fix: on_head_timer failed; mitmproxy waits for the response head as usual")
        return
    if response is None:  # early (the clock moved): look again when the watch says
        return (yield from _set_head_timer(self, watch, now))
    # Abandon the upstream exchange as after a stall (an HTTP/1 connection is closed, an HTTP/2
    # stream reset), book the failure (the error hook), then send the answer the way
    # HttpStream.send_response sends a response an addon made, and end the stream as flow_done does.
    yield SendHttp(RequestProtocolError(self.stream_id, NO_HEAD_MESSAGE, ErrorCode.CANCEL), self.context.server)
    yield from _answer_after_failure(self, response, NO_HEAD_MESSAGE)


def _answer_after_failure(self: HttpStream, response: http.Response, message: str):
    """The client's answer when the upstream failed before a response reached it (no head, or a
    whole body cut): the error hook books the failure, then `response` goes out the way
    HttpStream.send_response sends one an addon made, and the stream ends as flow_done ends it."""
    self.flow.response = response
    if not (yield from _book_error_and_drop(self, message)):
        return
    body = response.raw_content or b""
    yield SendHttp(ResponseHeaders(self.stream_id, response, not body), self.context.client)
    if body:
        yield SendHttp(ResponseData(self.stream_id, body), self.context.client)
    yield SendHttp(ResponseEndOfMessage(self.stream_id), self.context.client)


def _on_body_cut(self: HttpStream, watch: WholeBodyWatch, event: ResponseProtocolError):
    original = getattr(HttpStream, _ORIGINAL)
    if self.flow.error:  # killed meanwhile: mitmproxy's way
        return (yield from original(self, event))
    try:
        response = watch.on_body_cut(bytes(self.response_body_buf), event.message)
    except Exception:  # never let the repair make a failure worse
        logger.exception("finish_fix: on_body_cut failed; mitmproxy answers the client as usual")
        response = None
    if response is None:
        return (yield from original(self, event))
    # The upstream's side has failed already: its buffered bytes are dropped, and the client gets
    # the watch's answer, as when no head came.
    self.response_body_buf.clear()
    yield from _answer_after_failure(self, response, event.message)


def _on_timer(self: HttpStream):
    now = time.time()
    ending = _ask(self.flow, "on_timer", now)
    if ending is None:
        return (yield from _set_timer(self, now))
    # Abandon the upstream exchange as HttpStream.handle_protocol_error does for a client that left,
    # then end the client's side exactly as after a cut.
    yield SendHttp(RequestProtocolError(self.stream_id, STALL_MESSAGE, ErrorCode.CANCEL), self.context.server)
    stall = ResponseProtocolError(self.stream_id, STALL_MESSAGE, ErrorCode.GENERIC_SERVER_ERROR)
    return (yield from _end_after_cut(self, stall, ending))


def _end_after_cut(self: HttpStream, event: ResponseProtocolError, ending: ClientEnding):
    if ending.client_bytes:
        yield SendHttp(ResponseData(self.stream_id, ending.client_bytes), self.context.client)
    if not ending.end_response:
        return (yield from getattr(HttpStream, _ORIGINAL)(self, event))
    # End the client's response like a finished one (as HttpStream.flow_done does), but keep the books
    # true: the flow carries the upstream's error and the error hook runs, the response hook does not
    # (as in HttpStream.handle_protocol_error).
    if not (yield from _book_error_and_drop(self, event.message)):
        return
    yield SendHttp(ResponseEndOfMessage(self.stream_id), self.context.client)


def _book_error_and_drop(self: HttpStream, message: str):
    """Book the upstream's failure `message` on the flow and run the error hook (not the response
    hook), then take the stream off the server's side as HttpStream.flow_done does, so the caller
    ends the client's response itself. Returns False when an addon killed the flow in the error
    hook: then nothing more goes to the client."""
    self.flow.error = mitm_flow.Error(message)
    yield HttpErrorHook(self.flow)
    if (yield from self.check_killed(False)):
        return False
    self.server_state = self.state_errored
    self.flow.live = False
    yield DropStream(self.stream_id)
    return True
