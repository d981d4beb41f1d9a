"""The one private mitmproxy method finish_fix wraps (`HttpStream._handle_event`) and the methods whose
behaviour its wrapper mirrors or relies on. If a mitmproxy upgrade changes any of them, these fail
loudly and say what to re-check; the end-to-end cut and stall tests then show whether the hook still
works."""

from __future__ import annotations

import hashlib
import inspect
import time
import types

import pytest
from mitmproxy import options
from mitmproxy.proxy import commands, context, events
from mitmproxy.proxy.layers import http as http_layer
from mitmproxy.proxy.layers.http import HttpLayer, HttpStream
from mitmproxy.test import tflow

from finishline.addon import cut_hook

# sha256 of `inspect.getsource(HttpStream.<method>)` in mitmproxy 12.3.1. A new value means: read the
# new method, check that finishline.addon.cut_hook still does what mitmproxy would (states, hooks, commands,
# the b"" end-of-body call), run the e2e cut tests, then move the pin together with the mitmproxy pin
# in pyproject.toml.
PINNED_SOURCES = {
    # Wrapped: every HTTP event of a stream passes through it.
    "_handle_event": "e3cbfef7310ae81ffa7ed7ecba57f932afabada8cd48921308db363c47dd6c89",
    # What a ResponseProtocolError would have done; the wrapper's clean end follows it.
    "handle_protocol_error": "59fc3b2eeeabf63a64d4cce98b4fe4cab5193ebefbd9c32ae186e65c7d25bfe2",
    # How a finished response is ended toward the client; mirrored after a cut.
    "flow_done": "ad9969744785c572bf38b70c9269469554e6fcf016ea7d7f89541b865cff6d85",
    # Calls the stream callable with each piece and with b"" at the end (why empty pieces are dropped);
    # the wrapper sends the pieces of a finish_fix body as its ResponseData branch does.
    "state_stream_response_body": "3fb6320300d3ddd5569cfe3c04720b339cd64e400956b7d55b5d31fdcaf22e49",
    # Called by the wrapper after the error hook, as handle_protocol_error does.
    "check_killed": "368cad352d1e82b6907688a0d3196d2e586b4af9af2a8465ea00d46e2d3c3672",
    # Sends the response head and enters state_stream_response_body: where the stall timer starts.
    "start_response_stream": "b0de9e9a5ee272769f0e6013299e2803d9ca45aa4c1517c66a21a20822ae06ff",
    # Where the request goes upstream, leaving the client side `state_done` and the server side
    # `state_wait_for_response_headers`: where the head timer starts.
    "state_consume_request_body": "45459c1bbd8bdb1ac31251376aea71cfa58cb5dbd3a603d4e4e22b2891e663d7",
    "state_stream_request_body": "c98f7f715cef7cfa3fd50993f4c6818d5780b048021006aa1b2d0d309f348fbc",
    # Overwrites `flow.response` with the head that came (why no public way answers a pending read).
    "state_wait_for_response_headers": "10e32e91b294816432efae8d1f68c784ce36fc94f0f8202516be2c7f136707dd",
    # Buffers a whole body in `response_body_buf`: what a WholeBodyWatch is given when it is cut (G6).
    "state_consume_response_body": "5323db61dfc7e2e15034f921ded45d2a1369903eaa31154ebf228a58e8d0e1ee",
    # How a response an addon made is sent; mirrored when no head came.
    "send_response": "d581bc106152e3697ccdcad192fe60bac6f6bea84f86a40d94d62bb38b351fa4",
}
# HttpLayer.event_to_child remembers which stream asked for a wakeup and hands the Wakeup back to it.
EVENT_TO_CHILD = "1095f6e1581d1780afd5e87446b11eee0b12fb196c9be559f0fe15055436c8d7"


@pytest.mark.parametrize("method", sorted(PINNED_SOURCES))
def test_the_methods_are_the_ones_we_read(method):
    cut_hook.uninstall()
    source = inspect.getsource(getattr(HttpStream, method))
    digest = hashlib.sha256(source.encode()).hexdigest()
    assert digest == PINNED_SOURCES[method], (
        f"mitmproxy's HttpStream.{method} changed; finishline.addon.cut_hook depends on it. "
        "Re-verify the hook against the new source before moving the pin:\n" + source
    )


def test_wakeups_are_routed_back_to_the_stream_that_asked():
    source = inspect.getsource(HttpLayer.event_to_child)
    assert hashlib.sha256(source.encode()).hexdigest() == EVENT_TO_CHILD, (
        "mitmproxy's HttpLayer.event_to_child changed; the stall timer relies on it handing a Wakeup "
        "back to the HttpStream that yielded the RequestWakeup. Re-verify, then move the pin:\n" + source
    )


def test_every_wakeup_a_stream_gets_is_finish_fixs():
    # The wrapper takes any Wakeup reaching an HttpStream as its stall timer: true only while
    # HttpStream asks for none of its own.
    cut_hook.uninstall()
    assert "Wakeup" not in inspect.getsource(HttpStream), "HttpStream now uses wakeups of its own"


def test_the_names_the_hook_uses_still_exist():
    for name in (
        "DropStream",
        "ErrorCode",
        "HttpErrorHook",
        "RequestProtocolError",
        "ResponseData",
        "ResponseEndOfMessage",
        "ResponseHeaders",
        "ResponseProtocolError",
        "SendHttp",
    ):
        assert hasattr(http_layer, name), f"mitmproxy.proxy.layers.http.{name} is gone"
    assert hasattr(commands, "RequestWakeup") and hasattr(events, "Wakeup")
    assert list(inspect.signature(commands.RequestWakeup).parameters) == ["delay"]
    assert http_layer.ErrorCode.CANCEL.name == "CANCEL"
    for name in (
        "state_stream_response_body",
        "state_wait_for_response_headers",
        "state_done",
        "state_errored",
        "client_state",
        "server_state",
        "stream_id",
        "flow",
        "context",
    ):
        assert name in inspect.getsource(HttpStream), f"HttpStream no longer has {name}"
    assert list(inspect.signature(HttpStream._handle_event).parameters) == ["self", "event"]


def test_install_wraps_once_and_uninstall_restores():
    original = HttpStream.__dict__["_handle_event"]
    try:
        cut_hook.install()
        wrapped = HttpStream.__dict__["_handle_event"]
        assert wrapped is not original and cut_hook.installed()
        # A hot reload installs again with a new handler: still one wrapper around the original.
        cut_hook.install()
        assert HttpStream.__dict__["_handle_event"] is wrapped
        assert HttpStream.__dict__["_finishline_original_handle_event"] is original
    finally:
        cut_hook.uninstall()
    assert HttpStream.__dict__["_handle_event"] is original
    assert not cut_hook.installed()


class _Stream:
    """What the hook reads of an HttpStream to book its timers: the client connection."""

    def __init__(self) -> None:
        client = tflow.tclient_conn()
        client.timestamp_end = None  # connected (tflow's client has come and gone)
        self.context = types.SimpleNamespace(client=client)


class _DueWatch(cut_hook.HeadWatch):
    def next_head_check(self, now):
        return now + 600.0


def _book_head_timer(stream: _Stream) -> commands.RequestWakeup:
    (wakeup,) = cut_hook._set_head_timer(stream, _DueWatch(), time.time())  # type: ignore[arg-type]
    return wakeup


def test_uninstall_waits_for_pending_timers_of_open_connections():
    # mitmproxy's own method refuses a Wakeup (an unexpected event), and a timer outlives its response:
    # until the pending ones arrived, the wrapper stays, swallowing them and nothing else.
    original = HttpStream.__dict__["_handle_event"]
    cut_hook.install()
    stream = _Stream()
    wakeup = _book_head_timer(stream)
    cut_hook.uninstall()
    assert HttpStream.__dict__["_handle_event"] is not original and not cut_hook.installed()
    assert list(cut_hook._handle_event(stream, events.Wakeup(wakeup))) == []
    assert HttpStream.__dict__["_handle_event"] is original


def test_uninstall_restores_at_once_when_the_clients_with_pending_timers_left():
    # Every streaming request in scope books a head timer; mitmproxy cancels a connection's timers when
    # its client disconnects (then sets the client's timestamp_end), so that Wakeup never arrives and
    # must not keep the wrapper in place.
    original = HttpStream.__dict__["_handle_event"]
    cut_hook.install()
    stream = _Stream()
    _book_head_timer(stream)
    stream.context.client.timestamp_end = time.time()
    cut_hook.uninstall()
    assert HttpStream.__dict__["_handle_event"] is original


def test_a_drain_ends_at_the_next_event_once_the_client_waited_for_left():
    original = HttpStream.__dict__["_handle_event"]
    cut_hook.install()
    gone = _Stream()
    _book_head_timer(gone)
    cut_hook.uninstall()
    assert HttpStream.__dict__["_handle_event"] is not original
    gone.context.client.timestamp_end = time.time()
    # Another connection's stream starts: mitmproxy's own method handles it, and is back in place.
    other = HttpStream(context.Context(tflow.tclient_conn(), options.Options()), 1)
    assert list(cut_hook._handle_event(other, events.Start())) == []
    assert other.client_state == other.state_wait_for_request_headers
    assert HttpStream.__dict__["_handle_event"] is original
