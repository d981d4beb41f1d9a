"""The server grader against a server that breaks the HTTP exchange (`labs.grade.fetch`): a transport
failure is said in words, never as `HTTP 0`; a kept-alive connection the server closed before any byte
of the next response is asked again once, on a fresh connection, as openai-python and anthropic-python
do, and the card notes it on the no-error checks without failing them. The server is the project's
scripted upstream on 127.0.0.1 (`tests.upstream_server`), closing connections on purpose (`Drop`)."""

from __future__ import annotations

import errno
import json

import httpx
import pytest

from labs.grade.card import Mark
from labs.grade.fetch import transport_words
from labs.grade.render import render_terminal
from labs.grade.server_checks import REQUESTS
from labs.grade.server_grader import grade_server
from tests.chat_streams import chat_stream
from tests.upstream_server import Drop, Script

#: What the server says to a non-streamed request: a whole chat.completion.
CHAT_COMPLETION = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "The quick"}, "finish_reason": "stop"}],
    }
).encode()
KEPT_ALIVE_NOTE = (
    "the server closed a kept-alive connection without `Connection: close` before any byte of the next response "
    "(httpx.RemoteProtocolError: Server disconnected without sending a response); retried once on a fresh "
    "connection, as the SDKs do"
)
CLOSED_BEFORE_HEAD = (
    "the server closed the connection before sending a response head "
    "(httpx.RemoteProtocolError: Server disconnected without sending a response)"
)
LABELS = {r.name: r.label for r in REQUESTS}


@pytest.mark.timeout(600)
def test_a_kept_alive_connection_closed_before_the_next_response_is_asked_again_once(upstream):
    # Every request that goes out on a connection the server kept alive finds it closed (llama.cpp's
    # FIN after a stream, losing the race every time): each is asked again, once, on a new one.
    prefix = upstream.route(Script(pieces=chat_stream(["The", " quick"]), json_body=CHAT_COMPLETION, drop=Drop.REUSED))
    card = grade_server(f"{upstream.origin}{prefix}/v1", model="m")
    sent = upstream.requests_under(prefix)
    # Nine requests (five streamed, four not), in this order; the first opened its own connection.
    asked = [(json.loads(r.body)["stream"], json.loads(r.body).get("max_tokens")) for r in sent]
    assert len(sent) == 1 + 2 * 8
    assert asked[1::2] == asked[2::2], "each dropped request is asked again, the same, right after"
    stream_no_error, json_no_error = card.result("stream-no-error"), card.result("json-no-error")
    assert stream_no_error.mark is Mark.PASS and json_no_error.mark is Mark.PASS
    retried_streams = ["length", "tool_call", "n2", "usage"]  # stop, the first, had a new connection
    retried_json = ["stop", "length", "tool_call", "n2"]
    assert stream_no_error.evidence == "; ".join(
        ["5 streams, each completed without an error event or a cut"]
        + [f"stream {LABELS[name]}: {KEPT_ALIVE_NOTE}" for name in retried_streams]
    )
    assert json_no_error.evidence == "; ".join(
        ["4 completions, none an error"] + [f"JSON {LABELS[name]}: {KEPT_ALIVE_NOTE}" for name in retried_json]
    )
    # The note is on the no-error checks only, and nothing else failed for it.
    assert [r.check for r in card.results if "kept-alive" in r.evidence] == ["stream-no-error", "json-no-error"]
    # What fails is the script's one answer to every request: a stop, one choice, no usage chunk.
    assert {r.check for r in card.results if r.mark is Mark.FAIL} == {"reason-length", "n-choices", "stream-usage-after-finish"}
    # The JSON card's setup keeps the note on each answer, for the reader who checks the evidence.
    assert KEPT_ALIVE_NOTE in card.setup["answers"]["stream length"]
    assert KEPT_ALIVE_NOTE in card.setup["answers"]["JSON stop"]


@pytest.mark.timeout(600)
def test_a_server_that_closes_before_any_answer_is_said_in_words_and_not_asked_again(upstream):
    # Every request, each on a new connection, finds it closed: no kept-alive connection, no retry;
    # the evidence says what happened, not a status of 0.
    prefix = upstream.route(Script(pieces=chat_stream(["The"]), drop=Drop.EVERY))
    card = grade_server(f"{upstream.origin}{prefix}/v1", model="m")
    assert len(upstream.requests_under(prefix)) == 9
    assert card.result("stream-no-error").evidence == f"stream a natural stop: {CLOSED_BEFORE_HEAD}"
    assert card.result("json-no-error").evidence == f"JSON a natural stop: {CLOSED_BEFORE_HEAD}"
    assert card.result("reason-stop").evidence == f"stream a natural stop: {CLOSED_BEFORE_HEAD}"
    assert card.result("stream-no-error").mark is Mark.FAIL and card.result("json-no-error").mark is Mark.FAIL
    assert "HTTP 0" not in render_terminal(card)
    assert "HTTP 0" not in json.dumps(card.to_json())


def _raised(error: BaseException, cause: BaseException | None = None) -> BaseException:
    """`error` as Python leaves it after `raise error from cause`: its cause chained."""
    try:
        raise error from cause
    except BaseException as caught:
        return caught


@pytest.mark.parametrize(
    ("error", "before_head", "words"),
    [
        pytest.param(
            httpx.RemoteProtocolError("Server disconnected without sending a response."),
            True,
            CLOSED_BEFORE_HEAD,
            id="closed-before-the-head",
        ),
        pytest.param(
            _raised(httpx.ReadError(""), ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")),
            True,
            "the server reset the connection before sending a response head (httpx.ReadError: Connection reset by peer)",
            id="reset-before-the-head",
        ),
        pytest.param(
            httpx.RemoteProtocolError("peer closed connection without sending complete message body: incomplete chunked read"),
            False,
            "the server closed the connection in the middle of the response body (httpx.RemoteProtocolError: peer "
            "closed connection without sending complete message body: incomplete chunked read)",
            id="closed-mid-body",
        ),
        pytest.param(
            httpx.RemoteProtocolError("illegal status line: bytearray(b'SSH-2.0')"),
            True,
            "the server sent bytes that are not HTTP/1.1 before sending a response head "
            "(httpx.RemoteProtocolError: illegal status line: bytearray(b'SSH-2.0'))",
            id="not-http",
        ),
        pytest.param(
            httpx.ReadTimeout("ReadTimeout"),
            True,
            "the server sent no response head within 180 s (httpx.ReadTimeout)",
            id="no-head-in-time",
        ),
    ],
)
def test_a_transport_failure_is_said_in_words(error, before_head, words):
    assert transport_words(error, what="the server", before_head=before_head, timeout_s=180) == words
