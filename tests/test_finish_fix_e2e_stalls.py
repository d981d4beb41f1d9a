"""finish_fix end to end, stalls: a real mitmdump with short deadlines in front of an upstream that
goes silent, and the clients behind it (raw httpx for the bytes, openai-python for what an
application sees).

The deadlines are 2 s (`finish_fix_idle_timeout`, `finish_fix_first_token_timeout`). The tests assert
the order and the content of what the client got, what the books say, and that the upstream
connection was closed; times only within generous bounds (the machine is shared).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.chat_streams import chat_stream, sse_event
from tests.e2e_support import ANSWER, PROMPT, assert_interrupted_error, chat_url, openai_client, stream_completion
from tests.feeding import chunk, complete_events
from tests.fixtures_e2e import FinishFixProxy
from tests.mitmdump_process import FINISH_FIX_SCRIPT, running_finish_fix
from tests.process_watch import DEADLINE
from tests.upstream_server import Script, UpstreamServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

DEADLINES = {"finish_fix_idle_timeout": "2", "finish_fix_first_token_timeout": "2"}
KEEP_ALIVE = b": keep-alive\n\n"
# Comments every 0.5 s for 15 s: the upstream is alive on the wire, but sends no event.
COMMENTS = [KEEP_ALIVE] * 30
THREE_EVENTS = chat_stream(ANSWER, finish_reason=None, done=False)


def read_with_times(url: str) -> tuple[list[tuple[float, bytes]], Exception | None]:
    """POST and read the raw body; each piece with the monotonic time it arrived. A transport
    error is returned, not raised."""
    body = {"model": "e2e-model", "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
    pieces: list[tuple[float, bytes]] = []
    with httpx.Client(trust_env=False, timeout=30) as client:
        with client.stream("POST", url, json=body) as response:
            assert response.status_code == 200
            try:
                for piece in response.iter_raw():
                    pieces.append((time.monotonic(), piece))
            except httpx.TransportError as error:
                return pieces, error
    return pieces, None


def arrival_of(pieces: list[tuple[float, bytes]], marker: bytes) -> float:
    """When the piece that completed the first occurrence of `marker` arrived."""
    received = b""
    for at, piece in pieces:
        received += piece
        if marker in received:
            return at
    raise AssertionError(f"{marker!r} never arrived in {received!r}")


@pytest.fixture(scope="module")
def stalling_proxy(
    upstream: UpstreamServer, mitmproxy_confdir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FinishFixProxy]:
    """One mitmdump with both deadlines at 2 s for the module (each test has its own script)."""
    ledger = tmp_path_factory.mktemp("ledger") / "stalls.jsonl"
    with running_finish_fix(
        confdir=mitmproxy_confdir, upstream_url=upstream.origin, ledger=ledger, options=DEADLINES
    ) as mitmdump:
        yield FinishFixProxy(mitmdump=mitmdump, upstream=upstream, ledger=ledger)


def test_events_then_only_comments_get_the_idle_error_after_the_deadline(stalling_proxy, upstream: UpstreamServer):
    prefix = upstream.route(Script(pieces=THREE_EVENTS + COMMENTS, pause_between_s=0.5))
    pieces, error = read_with_times(chat_url(stalling_proxy.mitmdump.url, prefix))
    body = b"".join(piece for _, piece in pieces)

    assert error is None, f"the client's response must end normally, got {error!r}"
    # The three events unchanged and first, then the comments that came meanwhile, then the error.
    assert body.startswith(b"".join(THREE_EVENTS)), body
    between = body[len(b"".join(THREE_EVENTS)) : body.index(b'data: {"error"')]
    assert between and between == KEEP_ALIVE * (len(between) // len(KEEP_ALIVE)), between
    *tokens, last = complete_events(body)
    assert [json.loads(t)["choices"][0]["delta"]["content"] for t in tokens] == ANSWER
    error_event = json.loads(last)["error"]
    assert error_event["type"] == "server_error" and error_event["code"] == "stream_interrupted"
    assert "stream was interrupted: no event for 2 s after 3 events; the upstream stalled" in error_event["message"]
    # Never before the deadline (a lower bound: a loaded machine only makes it later), and long
    # before the upstream ends: told by what arrived, not by a clock, so load cannot fail it.
    waited = arrival_of(pieces, b'"error"') - arrival_of(pieces, b"".join(THREE_EVENTS))
    assert waited > 1.0, waited
    assert len(between) // len(KEEP_ALIVE) < len(COMMENTS), "the error came only after the upstream's last comment"

    assert upstream.wait_abandoned(prefix), "finish_fix must close the stalled upstream connection"
    [record] = stalling_proxy.wait_ledger_lines(prefix)
    assert record["verdict"] == "interrupted", record
    assert record["detail"].startswith("interrupted after the first token (stalled: no event for 2 s after 3 events)")
    assert record["injected"] == [{"kind": "error_event", "code": "stream_interrupted"}]


def test_the_idle_deadline_alone_fires_with_the_default_first_token_deadline(start_finish_fix, upstream: UpstreamServer):
    # The lab's setting: only the idle deadline short; the first-token one at its default (600 s).
    proxy = start_finish_fix(finish_fix_idle_timeout="2")
    prefix = upstream.route(Script(pieces=THREE_EVENTS + COMMENTS, pause_between_s=0.5))
    pieces, error = read_with_times(chat_url(proxy.mitmdump.url, prefix))
    assert error is None
    assert (
        "no event for 2 s after 3 events" in json.loads(complete_events(b"".join(p for _, p in pieces))[-1])["error"]["message"]
    )


def test_a_role_chunk_then_silence_is_judged_by_the_first_token_deadline(start_finish_fix, upstream: UpstreamServer):
    # A reasoning model's shape: the role chunk at once, then nothing but comments while it thinks.
    # The idle deadline (2 s) waits for the first token; the first-token one (6 s) ends the stream.
    proxy = start_finish_fix(finish_fix_idle_timeout="2", finish_fix_first_token_timeout="6")
    role = sse_event(chunk(delta={"role": "assistant", "content": ""}, id="chatcmpl-e2e", model="e2e-model"))
    prefix = upstream.route(Script(pieces=[role] + COMMENTS, pause_between_s=0.5))
    pieces, error = read_with_times(chat_url(proxy.mitmdump.url, prefix))
    assert error is None, error
    first, last = complete_events(b"".join(piece for _, piece in pieces))
    assert json.loads(first)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "no token within 6 s of the request; the upstream stalled" in json.loads(last)["error"]["message"]
    [record] = proxy.wait_ledger_lines(prefix)
    assert record["verdict"] == "interrupted" and "before the first token (stalled: no token within 6 s" in record["detail"]


def test_headers_then_only_comments_get_the_first_token_error(stalling_proxy, upstream: UpstreamServer):
    prefix = upstream.route(Script(pieces=COMMENTS, pause_between_s=0.5))
    pieces, error = read_with_times(chat_url(stalling_proxy.mitmdump.url, prefix))
    body = b"".join(piece for _, piece in pieces)

    assert error is None, error
    assert body.startswith(KEEP_ALIVE), body
    [last] = complete_events(body)
    error_event = json.loads(last)["error"]
    assert error_event["code"] == "stream_interrupted"
    assert "no token within 2 s of the request; the upstream stalled" in error_event["message"]
    assert upstream.wait_abandoned(prefix)
    [record] = stalling_proxy.wait_ledger_lines(prefix)
    assert record["verdict"] == "interrupted"
    assert "before the first token (stalled: no token within 2 s of the request)" in record["detail"]


def test_openai_python_raises_the_stall_as_an_api_error(stalling_proxy, upstream: UpstreamServer):
    prefix = upstream.route(Script(pieces=THREE_EVENTS + COMMENTS, pause_between_s=0.5))
    received: list = []
    with openai_client(stalling_proxy.base_url(prefix)) as client:
        with pytest.raises(openai.APIError) as raised:
            stream_completion(client, received)
    assert_interrupted_error(raised.value)
    assert "stalled" in raised.value.message
    assert "".join(c.choices[0].delta.content or "" for c in received if c.choices) == "".join(ANSWER)


def test_a_healthy_stream_with_a_second_between_events_is_byte_identical(stalling_proxy, upstream: UpstreamServer):
    events = chat_stream(ANSWER)
    prefix = upstream.route(Script(pieces=events, pause_between_s=1.0))
    pieces, error = read_with_times(chat_url(stalling_proxy.mitmdump.url, prefix))
    assert error is None
    assert b"".join(piece for _, piece in pieces) == b"".join(events)
    [record] = stalling_proxy.wait_ledger_lines(prefix)
    assert record["verdict"] == "clean", record


def test_on_cut_pass_lets_the_client_see_the_stall_as_a_failure(start_finish_fix, upstream: UpstreamServer):
    proxy = start_finish_fix(finish_fix_on_cut="pass", **DEADLINES)
    prefix = upstream.route(Script(pieces=THREE_EVENTS + COMMENTS, pause_between_s=0.5))
    pieces, error = read_with_times(chat_url(proxy.mitmdump.url, prefix))
    body = b"".join(piece for _, piece in pieces)
    assert isinstance(error, httpx.TransportError), "pass adds nothing: the client sees the connection end"
    assert b'"error"' not in body and body.startswith(b"".join(THREE_EVENTS))
    assert upstream.wait_abandoned(prefix)
    [record] = proxy.wait_ledger_lines(prefix)
    assert record["verdict"] == "interrupted" and record["detail"].endswith("; passed on unchanged")


def test_on_cut_stop_finishes_a_stall_as_success_but_books_it(start_finish_fix, upstream: UpstreamServer):
    proxy = start_finish_fix(finish_fix_on_cut="stop", **DEADLINES)
    prefix = upstream.route(Script(pieces=THREE_EVENTS + COMMENTS, pause_between_s=0.5))
    pieces, error = read_with_times(chat_url(proxy.mitmdump.url, prefix))
    data = complete_events(b"".join(piece for _, piece in pieces))
    assert error is None
    assert data[-1] == "[DONE]" and json.loads(data[-2])["choices"][0]["finish_reason"] == "stop"
    [record] = proxy.wait_ledger_lines(prefix)
    assert record["verdict"] == "interrupted" and "stalled" in record["detail"]


def test_a_timer_pending_when_the_script_fails_to_reload_is_swallowed(start_mitmdump, upstream: UpstreamServer, tmp_path):
    # A stall timer outlives its response; if finish_fix is unloaded (here: an edit that does not
    # import), mitmproxy's own method would refuse the timer's Wakeup and log a crash. A copy of
    # the script (it imports the installed package) so the test can break it without touching the checkout.
    script = tmp_path / FINISH_FIX_SCRIPT.name
    shutil.copyfile(FINISH_FIX_SCRIPT, script)
    mitmdump = start_mitmdump(mode=f"reverse:{upstream.origin}", scripts=[script], options=DEADLINES)
    prefix = upstream.route(Script(pieces=chat_stream(ANSWER)))
    body = {"model": "e2e-model", "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
    with httpx.Client(trust_env=False, timeout=30) as client:  # one connection, kept open throughout
        first = client.post(chat_url(mitmdump.url, prefix), json=body)
        assert first.status_code == 200 and first.content == b"".join(chat_stream(ANSWER))
        script.write_text(script.read_text() + "\nthis is not python\n")
        future = time.time() + 10
        os.utime(script, (future, future))
        mitmdump.wait_for_output(r"(Loading script.*\n(.|\n)*){2}", timeout=DEADLINE)
        time.sleep(3)  # the first response's timers (2 s deadlines) come due on the open connection
        second = client.post(chat_url(mitmdump.url, prefix), json=body)
    assert second.status_code == 200 and second.content == b"".join(chat_stream(ANSWER))
    assert "crashed" not in mitmdump.output, mitmdump.output
