"""finish_fix end to end, the finer points of the contract: several choices, legacy function calls,
copied identity fields, CR line endings, `event: error`, HTTP errors and compressed or foreign bodies
in scope, queries, the `finish_fix_paths` option, rule C9's inference on JSON bodies, and rule C1's
"each complete event leaves as soon as it arrived"."""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Callable

import httpx
import pytest

from tests.chat_streams import chat_chunk, chat_stream, sse_event
from tests.e2e_support import ANSWER, PARTIAL, chat_url, openai_client, raw_post
from tests.feeding import complete_events
from tests.fixtures_e2e import FinishFixProxy
from tests.upstream_server import Framing, Script, UpstreamServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def injected_events(proxied: bytes, upstream_events: list[bytes]) -> list[dict]:
    """The events finish_fix put between the upstream's last content event and its [DONE]."""
    *content, done = upstream_events
    assert proxied.startswith(b"".join(content)), proxied
    assert proxied.endswith(done), proxied
    return [json.loads(data) for data in complete_events(proxied[len(b"".join(content)) : -len(done)])]


# -- rule C3 ------------------------------------------------------------------------------------------


def test_each_unfinished_choice_gets_its_own_finishing_event(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    events = [
        sse_event(chat_chunk(content="a", index=0)),
        sse_event(chat_chunk(content="b", index=1)),
        sse_event(chat_chunk(content="c", index=2)),
        sse_event(chat_chunk(finish_reason="length", index=2)),
        sse_event("[DONE]"),
    ]
    prefix = upstream.route(Script(pieces=events))

    injected = injected_events(raw_post(chat_url(finish_fix.mitmdump.url, prefix)).body, events)

    assert [(e["choices"][0]["index"], e["choices"][0]["finish_reason"]) for e in injected] == [(0, "stop"), (1, "stop")]
    assert all(len(e["choices"]) == 1 for e in injected), "one event per choice"


def test_legacy_function_call_stream_finishes_with_function_call(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    events = [
        sse_event(chat_chunk(choices=[{"index": 0, "delta": {"function_call": {"name": "lookup", "arguments": "{}"}}}])),
        sse_event("[DONE]"),
    ]
    prefix = upstream.route(Script(pieces=events))

    injected = injected_events(raw_post(chat_url(finish_fix.mitmdump.url, prefix)).body, events)

    assert [e["choices"][0]["finish_reason"] for e in injected] == ["function_call"]


def test_injected_event_copies_system_fingerprint_from_the_last_chunk(
    finish_fix: FinishFixProxy, upstream: UpstreamServer
) -> None:
    first = chat_chunk(content="a", chunk_id="chatcmpl-first", model="model-a")
    last = {**chat_chunk(content="b", chunk_id="chatcmpl-last", model="model-b", created=42), "system_fingerprint": "fp_e2e"}
    events = [sse_event(first), sse_event(last), sse_event("[DONE]")]
    prefix = upstream.route(Script(pieces=events))

    [injected] = injected_events(raw_post(chat_url(finish_fix.mitmdump.url, prefix)).body, events)

    assert {k: injected[k] for k in ("id", "object", "created", "model", "system_fingerprint")} == {
        "id": "chatcmpl-last",
        "object": "chat.completion.chunk",
        "created": 42,
        "model": "model-b",
        "system_fingerprint": "fp_e2e",
    }


def test_injected_event_uses_cr_line_endings_on_a_cr_stream(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    events = chat_stream(ANSWER, finish_reason=None, line_ending=b"\r")
    prefix = upstream.route(Script(pieces=events))

    body = raw_post(chat_url(finish_fix.mitmdump.url, prefix)).body

    injected = body[len(b"".join(events[:-1])) : -len(events[-1])]
    assert injected.endswith(b"\r\r") and b"\n" not in injected, injected


def test_stream_with_a_query_string_is_still_in_scope(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    events = chat_stream(ANSWER, finish_reason=None)
    prefix = upstream.route(Script(pieces=events))

    body = raw_post(chat_url(finish_fix.mitmdump.url, prefix) + "?api-version=2024-10-21").body

    assert [e["choices"][0]["finish_reason"] for e in injected_events(body, events)] == ["stop"]


def test_finish_fix_paths_option_sets_the_scope(
    start_finish_fix: Callable[..., FinishFixProxy], upstream: UpstreamServer
) -> None:
    proxy = start_finish_fix(finish_fix_paths=r"/custom/generate$")
    events = chat_stream(ANSWER, finish_reason=None)
    prefix = upstream.route(Script(pieces=events))

    custom = raw_post(f"{proxy.mitmdump.url}{prefix}/custom/generate").body
    default_path = raw_post(chat_url(proxy.mitmdump.url, prefix)).body

    assert [e["choices"][0]["finish_reason"] for e in injected_events(custom, events)] == ["stop"]
    assert default_path == b"".join(events), "outside the configured paths nothing is repaired"


# -- rule C5 and HTTP errors ----------------------------------------------------------------------------


def test_event_error_field_marks_the_stream_failed(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    pieces = [*PARTIAL, b'event: error\ndata: {"message": "worker lost"}\n\n']
    prefix = upstream.route(Script(pieces=pieces, framing=Framing.CLOSE_DELIMITED))

    proxied = raw_post(chat_url(finish_fix.mitmdump.url, prefix))

    assert proxied.body == b"".join(pieces), "nothing injected after an error event"
    [record] = finish_fix.wait_ledger_lines(prefix)
    assert record["verdict"] == "upstream_error", record


def test_event_stream_with_an_http_error_status_passes_untouched(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    pieces = chat_stream(ANSWER, finish_reason=None)
    prefix = upstream.route(Script(status=500, pieces=pieces))

    proxied = raw_post(chat_url(finish_fix.mitmdump.url, prefix))

    assert (proxied.status, proxied.body) == (500, b"".join(pieces))
    [record] = finish_fix.wait_ledger_lines(prefix)
    assert record["verdict"] == "http_error", record


# -- rules C9 and C10 ------------------------------------------------------------------------------------


def _completion(message: dict, usage: dict | None = None) -> bytes:
    body: dict = {
        "id": "chatcmpl-json",
        "object": "chat.completion",
        "created": 1,
        "model": "e2e-model",
        "choices": [{"index": 0, "message": message}],
    }
    if usage is not None:
        body["usage"] = usage
    return json.dumps(body).encode()


JSON_INFERENCES = {
    "length-at-max-tokens": (
        _completion({"role": "assistant", "content": "abc"}, {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}),
        {"max_tokens": 3},
        "length",
    ),
    "stop-below-max-completion-tokens": (
        _completion({"role": "assistant", "content": "abc"}, {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}),
        {"max_completion_tokens": 3},
        "stop",
    ),
    "tool-calls": (
        _completion(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            }
        ),
        {},
        "tool_calls",
    ),
}


@pytest.mark.parametrize("body,request_extra,expected", JSON_INFERENCES.values(), ids=JSON_INFERENCES.keys())
def test_json_completion_reason_is_inferred_like_a_stream(
    finish_fix: FinishFixProxy,
    upstream: UpstreamServer,
    body: bytes,
    request_extra: dict,
    expected: str,
) -> None:
    prefix = upstream.route(Script(content_type="application/json", framing=Framing.CONTENT_LENGTH, pieces=[body]))

    with openai_client(f"{finish_fix.mitmdump.url}{prefix}/v1") as client:
        completion = client.chat.completions.create(
            model="e2e-model", messages=[{"role": "user", "content": "hi"}], **request_extra
        )

    assert completion.choices[0].finish_reason == expected


def test_gzip_json_completion_passes_through_untouched_and_is_skipped(
    finish_fix: FinishFixProxy, upstream: UpstreamServer
) -> None:
    compressed = gzip.compress(_completion({"role": "assistant", "content": "abc"}))
    prefix = upstream.route(
        Script(
            content_type="application/json",
            framing=Framing.CONTENT_LENGTH,
            headers=[("content-encoding", "gzip")],
            pieces=[compressed],
        )
    )

    proxied = raw_post(chat_url(finish_fix.mitmdump.url, prefix), body={"model": "e2e-model"})

    assert proxied.body == compressed
    [record] = finish_fix.wait_ledger_lines(prefix)
    assert record["verdict"] == "skipped", record


def test_json_body_that_is_not_a_chat_completion_passes_untouched(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    body = b'{"error": {"message": "quota", "type": "insufficient_quota"}}'
    prefix = upstream.route(Script(content_type="application/json", framing=Framing.CONTENT_LENGTH, pieces=[body]))

    proxied = raw_post(chat_url(finish_fix.mitmdump.url, prefix), body={"model": "e2e-model"})

    assert proxied.body == body


# -- rule C1: no buffering beyond the current event ------------------------------------------------------


def test_each_complete_event_reaches_the_client_before_the_upstream_sends_the_next(
    finish_fix: FinishFixProxy, upstream: UpstreamServer
) -> None:
    # The upstream holds event i back until the client has everything before it: a proxy that
    # buffered would leave the client waiting, and httpx's read deadline would end the test.
    events = chat_stream(ANSWER, finish_reason=None)
    gates = {index: threading.Event() for index in range(1, len(events))}
    prefix = upstream.route(Script(pieces=events, gates=gates))
    received = bytearray()
    held_back = False
    try:
        with httpx.Client(trust_env=False, timeout=10) as client:
            with client.stream("POST", chat_url(finish_fix.mitmdump.url, prefix), json={}) as response:
                pieces = response.iter_raw()
                for index in range(1, len(events)):
                    expected = b"".join(events[:index])
                    while len(received) < len(expected):
                        received += next(pieces)
                    assert bytes(received) == expected
                    gates[index].set()
                for piece in pieces:
                    received += piece
    except httpx.ReadTimeout:
        held_back = True
    finally:
        for gate in gates.values():
            gate.set()  # never leave the upstream thread waiting
    if held_back:
        pytest.fail(f"the proxy held back what the upstream had sent; the client had {bytes(received)!r}", pytrace=False)
    assert bytes(received).endswith(b"data: [DONE]\n\n")
