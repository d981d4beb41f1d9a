"""The one private mitmproxy method finish_fix relies on. If a mitmproxy upgrade changes it, these
fail loudly and say what to re-check (the end-to-end cut tests then show whether the hook still works)."""

from __future__ import annotations

import hashlib
import inspect

from mitmproxy.proxy.layers import http as http_layer
from mitmproxy.proxy.layers.http import HttpStream

import finish_fix_cut_hook

# sha256 of `inspect.getsource(HttpStream.handle_protocol_error)` in mitmproxy 12.3.1 (the method is
# unchanged since 11.0.2). A new value means: read the new method, check that finish_fix_cut_hook
# still ends a cut stream the way mitmproxy would (states, hooks, commands), run the e2e cut tests,
# then update this pin together with the mitmproxy pin in pyproject.toml.
PINNED_SOURCE_SHA256 = "59fc3b2eeeabf63a64d4cce98b4fe4cab5193ebefbd9c32ae186e65c7d25bfe2"


def test_the_wrapped_method_is_the_one_we_read():
    finish_fix_cut_hook.uninstall()
    source = inspect.getsource(HttpStream.handle_protocol_error)
    digest = hashlib.sha256(source.encode()).hexdigest()
    assert digest == PINNED_SOURCE_SHA256, (
        "mitmproxy's HttpStream.handle_protocol_error changed; finish_fix_cut_hook wraps it. "
        "Re-verify the hook against the new source before moving the pin:\n" + source
    )


def test_the_names_the_hook_uses_still_exist():
    for name in ("DropStream", "HttpErrorHook", "ResponseData", "ResponseEndOfMessage", "ResponseProtocolError", "SendHttp"):
        assert hasattr(http_layer, name), f"mitmproxy.proxy.layers.http.{name} is gone"
    for name in ("state_stream_response_body", "state_errored", "server_state", "stream_id", "flow", "context"):
        assert name in inspect.getsource(HttpStream), f"HttpStream no longer has {name}"
    parameters = list(inspect.signature(HttpStream.handle_protocol_error).parameters)
    assert parameters == ["self", "event"]


def test_install_wraps_once_and_uninstall_restores():
    original = HttpStream.handle_protocol_error
    try:
        finish_fix_cut_hook.install(lambda flow, message: None)
        wrapped = HttpStream.handle_protocol_error
        assert wrapped is not original and finish_fix_cut_hook.installed()
        # A hot reload installs again with a new handler: still one wrapper around the original.
        finish_fix_cut_hook.install(lambda flow, message: None)
        assert HttpStream.handle_protocol_error is wrapped
        assert getattr(HttpStream, "_finishline_original_handle_protocol_error") is original
    finally:
        finish_fix_cut_hook.uninstall()
    assert HttpStream.handle_protocol_error is original
    assert not finish_fix_cut_hook.installed()
