"""finish_fix end to end: the real openai-python client -> a real `mitmdump -s addons/finish_fix.py`
in reverse mode -> a scripted upstream on 127.0.0.1 (tests/upstream_server.py).

One test per rule of issue 2 that a client can observe; raw bytes are compared with httpx where the
rule is about bytes. Nothing of mitmproxy is mocked: if an upgrade changes how it streams or how the
cut hook gets in (rule C6), these fail.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import openai
import pytest

from tests.chat_streams import chat_chunk, chat_stream, sse_event
from tests.e2e_support import (
    ANSWER,
    CUTS,
    CUTS_BEFORE_FIRST_TOKEN,
    PARTIAL,
    PROMPT,
    assert_interrupted_error,
    chat_url,
    finish_reasons,
    openai_client,
    raw_post,
    stream_completion,
    text_of,
)
from tests.feeding import complete_events
from tests.fixtures_e2e import FinishFixProxy
from tests.upstream_server import Framing, Script, UpstreamServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


# -- rule C3: missing terminal reason ------------------------------------------------------------------


def test_missing_finish_reason_comes_out_as_a_normal_completion_with_stop(
    finish_fix: FinishFixProxy, upstream: UpstreamServer
) -> None:
    prefix = upstream.route(Script(pieces=chat_stream(ANSWER, finish_reason=None)))

    with openai_client(finish_fix.base_url(prefix)) as client:
        chunks = stream_completion(client)

    assert text_of(chunks) == "".join(ANSWER)
    assert finish_reasons(chunks)[-1] == "stop"
    assert finish_reasons(chunks)[:-1] == [None] * len(ANSWER)
    [record] = finish_fix.wait_ledger_lines(prefix)
    assert record["verdict"] == "repaired", record


def test_injected_finish_event_copies_the_stream_identity_and_precedes_done(
    finish_fix: FinishFixProxy, upstream: UpstreamServer
) -> None:
    upstream_events = chat_stream(ANSWER, finish_reason=None)
    prefix = upstream.route(Script(pieces=upstream_events))

    response = raw_post(chat_url(finish_fix.mitmdump.url, prefix))

    assert response.error is None
    *content_events, done = upstream_events
    assert response.body.startswith(b"".join(content_events))
    assert response.body.endswith(done)
    injected = complete_events(response.body[len(b"".join(content_events)) : -len(done)])
    assert [json.loads(data) for data in injected] == [
        {
            "id": "chatcmpl-e2e",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "e2e-model",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
    ]


def test_injected_event_uses_the_streams_crlf_line_endings(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    upstream_events = chat_stream(ANSWER, finish_reason=None, line_ending=b"\r\n")
    prefix = upstream.route(Script(pieces=upstream_events))

    body = raw_post(chat_url(finish_fix.mitmdump.url, prefix)).body

    injected = body[len(b"".join(upstream_events[:-1])) : -len(upstream_events[-1])]
    assert injected.startswith(b"data:") and injected.endswith(b"\r\n\r\n"), injected
    assert b"\n" not in injected.replace(b"\r\n", b""), injected


def test_tool_call_stream_without_reason_finishes_with_tool_calls(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    tool_delta = {
        "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]
    }
    events = [
        sse_event(chat_chunk(choices=[{"index": 0, "delta": {"role": "assistant", **tool_delta}}])),
        sse_event("[DONE]"),
    ]
    prefix = upstream.route(Script(pieces=events))

    with openai_client(finish_fix.base_url(prefix)) as client:
        chunks = stream_completion(client)

    assert finish_reasons(chunks)[-1] == "tool_calls"


def test_length_is_inferred_and_the_finish_goes_before_the_usage_chunk(
    finish_fix: FinishFixProxy, upstream: UpstreamServer
) -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    events = [
        *chat_stream(ANSWER, finish_reason=None, done=False),
        sse_event(chat_chunk(choices=[], usage=usage)),
        sse_event("[DONE]"),
    ]
    prefix = upstream.route(Script(pieces=events))

    with openai_client(finish_fix.base_url(prefix)) as client:
        chunks = stream_completion(client, max_tokens=3, stream_options={"include_usage": True})

    assert [c.choices[0].finish_reason if c.choices else "usage" for c in chunks][-2:] == ["length", "usage"]
    assert chunks[-1].usage.completion_tokens == 3


def test_missing_finish_reason_on_a_content_length_body_comes_out_as_stop(
    finish_fix: FinishFixProxy, upstream: UpstreamServer
) -> None:
    # The injected event makes the body longer than the upstream's Content-Length: unless finish_fix
    # drops the length, the client reads exactly the old length and never sees the finish.
    prefix = upstream.route(Script(pieces=chat_stream(ANSWER, finish_reason=None), framing=Framing.CONTENT_LENGTH))

    with openai_client(finish_fix.base_url(prefix)) as client:
        chunks = stream_completion(client)

    assert text_of(chunks) == "".join(ANSWER)
    assert finish_reasons(chunks)[-1] == "stop"


# -- rule C2: empty reasons ----------------------------------------------------------------------------


def test_empty_finish_reason_on_every_chunk_becomes_null_and_a_final_stop(
    finish_fix: FinishFixProxy, upstream: UpstreamServer
) -> None:
    prefix = upstream.route(Script(pieces=chat_stream(ANSWER, finish_reason=None, every_chunk_reason="")))

    with openai_client(finish_fix.base_url(prefix)) as client:
        chunks = stream_completion(client)

    assert finish_reasons(chunks) == [None] * len(ANSWER) + ["stop"]
    assert text_of(chunks) == "".join(ANSWER)
    [record] = finish_fix.wait_ledger_lines(prefix)
    assert record["verdict"] == "repaired", record


def test_empty_to_null_off_keeps_empty_reasons_but_still_finishes(
    start_finish_fix: Callable[..., FinishFixProxy], upstream: UpstreamServer
) -> None:
    proxy = start_finish_fix(finish_fix_empty_to_null="false")
    prefix = upstream.route(Script(pieces=chat_stream(ANSWER, finish_reason=None, every_chunk_reason="")))

    with openai_client(proxy.base_url(prefix)) as client:
        chunks = stream_completion(client)

    assert finish_reasons(chunks) == [""] * len(ANSWER) + ["stop"]


# -- rule C1: passthrough ------------------------------------------------------------------------------


def _split_every(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


_WELL_FORMED = b"".join(chat_stream(ANSWER))
_WELL_FORMED_CRLF = b"".join(chat_stream(ANSWER, line_ending=b"\r\n"))
_WELL_FORMED_CR = b"".join(chat_stream(ANSWER, line_ending=b"\r"))
_WITH_FIELDS = (
    b": ping\n\nretry: 3000\n\nevent: message\nid: 1\n"
    + b"data:"
    + json.dumps(chat_chunk(content="a")).encode()
    + b"\n\n"
    # multi-line data: the JSON is split over two data lines (joined with "\n", still valid JSON)
    + b'data: {"id": "chatcmpl-e2e", "object": "chat.completion.chunk",\n'
    + b'data: "created": 1700000000, "model": "e2e-model", "choices": [{"index": 0, '
    + b'"delta": {}, "finish_reason": "stop"}]}\n\n'
    + b"data: [DONE]\n\n"
)
HEALTHY_STREAMS = {
    "one-chunk-per-event": chat_stream(ANSWER),
    "whole-body-in-one-chunk": [_WELL_FORMED],
    "one-byte-chunks": _split_every(_WELL_FORMED, 1),
    "seven-byte-chunks-crlf": _split_every(_WELL_FORMED_CRLF, 7),
    "cr-line-endings": _split_every(_WELL_FORMED_CR, 13),
    "comments-fields-no-space-multiline": _split_every(_WITH_FIELDS, 11),
}


_TEN_MB_EVENT = sse_event(chat_chunk(content="x" * (10 * 1024 * 1024)))
_FINISH = chat_stream([], finish_reason="stop")
# Rule C8: what no rule applies to passes through; the streams still end with a finish and [DONE].
# The books say what the client read (rule C8a): `malformed`, naming the event, when an event's data is
# not JSON; `clean` for odd fields and a huge event.
_NOT_JSON = "malformed: event 1's data is not JSON; passed on as it came"
MALFORMED_BUT_FINISHED_STREAMS: dict[str, tuple[list[bytes], str, str | None]] = {
    "non-json-data": ([b"data: not json at all\n\n", *chat_stream(ANSWER)], "malformed", _NOT_JSON),
    "invalid-utf8": ([b"data: \xff\xfe\xfd {\n\n", *chat_stream(ANSWER)], "malformed", _NOT_JSON),
    "unknown-fields": (
        [
            b"weird: field\nevent: delta\nid: 7\nretry: 10\n" + sse_event({**chat_chunk(content="a"), "x_vendor": {"k": [1, 2]}}),
            *chat_stream(ANSWER),
        ],
        "clean",
        None,
    ),
    "ten-megabyte-event": (_split_every(_TEN_MB_EVENT, 1 << 20) + _FINISH, "clean", None),
}


@pytest.mark.parametrize(
    ("pieces", "verdict", "detail"), MALFORMED_BUT_FINISHED_STREAMS.values(), ids=MALFORMED_BUT_FINISHED_STREAMS.keys()
)
def test_malformed_input_passes_through_unchanged(
    finish_fix: FinishFixProxy, upstream: UpstreamServer, pieces: list[bytes], verdict: str, detail: str | None
) -> None:
    prefix = upstream.route(Script(pieces=pieces))

    proxied = raw_post(chat_url(finish_fix.mitmdump.url, prefix))

    assert proxied.error is None, proxied.error
    assert proxied.body == b"".join(pieces)
    [record] = finish_fix.wait_ledger_lines(prefix)
    assert record["verdict"] == verdict, record
    if detail is not None:
        assert record["detail"] == detail, record


@pytest.mark.parametrize("pieces", HEALTHY_STREAMS.values(), ids=HEALTHY_STREAMS.keys())
def test_healthy_stream_is_byte_identical_through_the_proxy(
    finish_fix: FinishFixProxy, upstream: UpstreamServer, pieces: list[bytes]
) -> None:
    prefix = upstream.route(Script(pieces=pieces))

    direct = raw_post(chat_url(upstream.origin, prefix))
    proxied = raw_post(chat_url(finish_fix.mitmdump.url, prefix))

    assert direct.error is None and proxied.error is None, (direct.error, proxied.error)
    assert direct.body == b"".join(pieces)
    assert proxied.body == direct.body
    [record] = finish_fix.wait_ledger_lines(prefix)
    assert record["verdict"] == "clean", record


def test_healthy_stream_reads_the_same_through_openai_python(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    prefix = upstream.route(Script(pieces=chat_stream(ANSWER)))

    with openai_client(finish_fix.base_url(prefix)) as client:
        chunks = stream_completion(client)

    assert text_of(chunks) == "".join(ANSWER)
    assert finish_reasons(chunks) == [None] * len(ANSWER) + ["stop"]


def test_sse_outside_the_chat_completions_path_is_not_repaired(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    pieces = chat_stream(ANSWER, finish_reason=None, done=False)
    prefix = upstream.route(Script(pieces=pieces))

    proxied = raw_post(f"{finish_fix.mitmdump.url}{prefix}/v1/responses")

    assert proxied.error is None
    assert proxied.body == b"".join(pieces)


# -- rule C4: finished but no [DONE] -------------------------------------------------------------------


def test_finished_stream_without_done_gets_done_appended(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    pieces = chat_stream(ANSWER, finish_reason="stop", done=False)
    prefix = upstream.route(Script(pieces=pieces, framing=Framing.CLOSE_DELIMITED))

    proxied = raw_post(chat_url(finish_fix.mitmdump.url, prefix))

    assert proxied.error is None
    assert proxied.body == b"".join(pieces) + b"data: [DONE]\n\n"
    [record] = finish_fix.wait_ledger_lines(prefix)
    assert record["verdict"] == "repaired", record


def test_finished_content_length_body_without_done_gets_done_appended(
    finish_fix: FinishFixProxy, upstream: UpstreamServer
) -> None:
    pieces = chat_stream(ANSWER, finish_reason="stop", done=False)
    prefix = upstream.route(Script(pieces=pieces, framing=Framing.CONTENT_LENGTH))

    proxied = raw_post(chat_url(finish_fix.mitmdump.url, prefix))

    assert proxied.error is None
    assert proxied.body == b"".join(pieces) + b"data: [DONE]\n\n"


# -- rules C6 and C7: cut streams are errors --------------------------------------------------------------


def cut_through(finish_fix: FinishFixProxy, upstream: UpstreamServer, script: Script) -> tuple[openai.APIError, list]:
    """Streams `script` through finish_fix; asserts the client raised the interruption error and the
    ledger booked `interrupted`. Returns the error and the chunks received before it."""
    prefix = upstream.route(script)
    received: list = []
    with openai_client(finish_fix.base_url(prefix)) as client:
        with pytest.raises(openai.APIError) as raised:
            stream_completion(client, received)
    assert_interrupted_error(raised.value)
    [record] = finish_fix.wait_ledger_lines(prefix)
    assert record["verdict"] == "interrupted", record
    return raised.value, received


@pytest.mark.parametrize("script", CUTS.values(), ids=CUTS.keys())
def test_cut_stream_raises_api_error_saying_it_was_interrupted(
    finish_fix: FinishFixProxy, upstream: UpstreamServer, script: Script
) -> None:
    error, received = cut_through(finish_fix, upstream, script)
    assert text_of(received) == "".join(ANSWER[:2]), "what came before the cut was passed on"


@pytest.mark.parametrize("script", CUTS_BEFORE_FIRST_TOKEN.values(), ids=CUTS_BEFORE_FIRST_TOKEN.keys())
def test_cut_before_the_first_token_raises_api_error_saying_so(
    finish_fix: FinishFixProxy, upstream: UpstreamServer, script: Script
) -> None:
    error, received = cut_through(finish_fix, upstream, script)
    assert re.search(r"before the first token", error.message), error.message
    assert received == []


def test_cut_stream_gets_one_error_event_and_no_done(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    prefix = upstream.route(CUTS["fin-mid-chunk"])

    proxied = raw_post(chat_url(finish_fix.mitmdump.url, prefix))

    assert proxied.body.startswith(b"".join(PARTIAL))
    added = complete_events(proxied.body[len(b"".join(PARTIAL)) :])
    assert len(added) == 1, added
    error = json.loads(added[0])["error"]
    assert (error["type"], error["code"]) == ("server_error", "stream_interrupted")
    assert b"[DONE]" not in proxied.body


def test_on_cut_stop_finishes_a_cut_stream_as_success(
    start_finish_fix: Callable[..., FinishFixProxy], upstream: UpstreamServer
) -> None:
    proxy = start_finish_fix(finish_fix_on_cut="stop")
    prefix = upstream.route(CUTS["fin-mid-chunk"])

    with openai_client(proxy.base_url(prefix)) as client:
        chunks = stream_completion(client)

    assert text_of(chunks) == "".join(ANSWER[:2])
    assert finish_reasons(chunks)[-1] == "stop"
    [record] = proxy.wait_ledger_lines(prefix)
    assert record["verdict"] == "interrupted", "a cut is an error in the books whatever was sent"


def test_on_cut_pass_leaves_the_transport_error_to_the_client(
    start_finish_fix: Callable[..., FinishFixProxy], upstream: UpstreamServer
) -> None:
    proxy = start_finish_fix(finish_fix_on_cut="pass")
    prefix = upstream.route(CUTS["fin-mid-chunk"])

    proxied = raw_post(chat_url(proxy.mitmdump.url, prefix))

    assert proxied.error is not None, "mitmproxy closes the client connection after a cut"
    assert proxied.body == b"".join(PARTIAL) + CUTS["fin-mid-chunk"].cut_tail, "rule C1: every byte"
    [record] = proxy.wait_ledger_lines(prefix)
    assert record["verdict"] == "interrupted", record


# -- rule C5: error events pass through ------------------------------------------------------------------


def test_upstream_error_event_passes_through_untouched(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    pieces = [
        *PARTIAL,
        sse_event({"error": {"message": "worker lost", "type": "server_error", "code": "oops"}}),
    ]
    prefix = upstream.route(Script(pieces=pieces, framing=Framing.CLOSE_DELIMITED))

    proxied = raw_post(chat_url(finish_fix.mitmdump.url, prefix))
    with openai_client(finish_fix.base_url(prefix)) as client:
        with pytest.raises(openai.APIError) as raised:
            stream_completion(client)

    assert proxied.body == b"".join(pieces)
    assert raised.value.message == "worker lost"
    records = finish_fix.wait_ledger_lines(prefix, count=2)
    assert [r["verdict"] for r in records] == ["upstream_error", "upstream_error"], records


# -- rule C9: non-streaming responses -----------------------------------------------------------------


def _completion_body(finish_reason: object) -> bytes:
    choice: dict = {"index": 0, "message": {"role": "assistant", "content": "".join(ANSWER)}}
    if finish_reason != "absent":
        choice["finish_reason"] = finish_reason
    return json.dumps(
        {"id": "chatcmpl-json", "object": "chat.completion", "created": 1, "model": "e2e-model", "choices": [choice]}
    ).encode()


@pytest.mark.parametrize("finish_reason", ["absent", None, ""])
def test_json_completion_without_finish_reason_gets_stop(
    finish_fix: FinishFixProxy, upstream: UpstreamServer, finish_reason: object
) -> None:
    prefix = upstream.route(
        Script(content_type="application/json", framing=Framing.CONTENT_LENGTH, pieces=[_completion_body(finish_reason)])
    )

    with openai_client(finish_fix.base_url(prefix)) as client:
        completion = client.chat.completions.create(model="e2e-model", messages=[{"role": "user", "content": PROMPT}])

    assert completion.choices[0].finish_reason == "stop"
    assert completion.choices[0].message.content == "".join(ANSWER)
    [record] = finish_fix.wait_ledger_lines(prefix)
    assert record["verdict"] == "repaired", record


def test_json_completion_with_finish_reason_is_byte_identical(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    body = _completion_body("stop")
    prefix = upstream.route(Script(content_type="application/json", framing=Framing.CONTENT_LENGTH, pieces=[body]))

    proxied = raw_post(chat_url(finish_fix.mitmdump.url, prefix), body={"model": "e2e-model"})

    assert proxied.body == body
    [record] = finish_fix.wait_ledger_lines(prefix)
    assert record["verdict"] == "clean", record


# -- HTTP errors, rule C10, and the request side ----------------------------------------------------------


@pytest.mark.parametrize("status", [429, 500])
def test_http_error_passes_through_and_is_booked_as_http_error(
    finish_fix: FinishFixProxy, upstream: UpstreamServer, status: int
) -> None:
    body = json.dumps({"error": {"message": f"status {status}", "type": "e2e"}}).encode()
    prefix = upstream.route(Script(status=status, content_type="application/json", framing=Framing.CONTENT_LENGTH, pieces=[body]))

    with openai_client(finish_fix.base_url(prefix)) as client:
        with pytest.raises(openai.APIStatusError) as raised:
            stream_completion(client)

    assert raised.value.status_code == status
    [record] = finish_fix.wait_ledger_lines(prefix)
    assert record["verdict"] == "http_error", record


def test_accept_encoding_identity_reaches_the_upstream(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    prefix = upstream.route(Script(pieces=chat_stream(ANSWER)))

    with openai_client(finish_fix.base_url(prefix)) as client:
        stream_completion(client)

    [request] = upstream.requests_under(prefix)
    assert request.header("accept-encoding") == "identity", request.headers


def test_requests_outside_the_paths_keep_their_accept_encoding(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    prefix = upstream.route(Script(content_type="application/json", framing=Framing.CONTENT_LENGTH, pieces=[b'{"data": []}']))

    with openai_client(finish_fix.base_url(prefix)) as client:
        client.models.list()

    [request] = upstream.requests_under(prefix)
    assert request.target.endswith("/v1/models")
    assert request.header("accept-encoding") != "identity", "finish_fix rewrote an out-of-scope request"


def test_gzip_sse_despite_identity_passes_through_untouched_and_is_skipped(
    finish_fix: FinishFixProxy, upstream: UpstreamServer
) -> None:
    script = Script(pieces=chat_stream(ANSWER, finish_reason=None), gzip=True)
    prefix = upstream.route(script)

    proxied = raw_post(chat_url(finish_fix.mitmdump.url, prefix))

    assert proxied.headers.get("content-encoding") == "gzip"
    assert proxied.body == b"".join(script.iter_pieces())
    [record] = finish_fix.wait_ledger_lines(prefix)
    assert record["verdict"] == "skipped", record
