"""finish_fix end to end, no response head: a real mitmdump in front of an upstream that takes the
request and holds its response head back (`Script.head_gate`), for as long as the test says.

- No head at all: the client gets HTTP 504 with its dialect's error body once the first-token
  deadline (2 s here) passed, the upstream connection is closed, the books say `interrupted` with
  the head's cause, and the real SDKs raise on it.
- A head that never comes after the request body was sent: the client sends its body slowly, past
  the deadline; the deadline counts from the moment the whole request went upstream, so the upstream
  gets it, and only then does the 504 come.
- A head that comes inside the deadline is untouched: the upstream sends it when the test, having
  seen the request arrive, tells it to (the deadline generous, so no race of sleeps decides it).
- A head that came in time, with its body still streaming when the head timer goes off: the timer's
  Wakeup is swallowed, and the stream ends whole and `clean`.
- Requests the deadline must not touch (one that asked for no stream, a path out of scope) are
  left waiting, as mitmproxy would: the first is booked as the client's leaving once it gave up.

No timed assertions: each case waits on a condition (the request arrived, the response ended, the
upstream saw the close); a late 504 only makes a test slower.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from faults.child_processes import START_DEADLINE_S
from finishline import Dialect
from labs.dialects import LAB_DIALECTS
from tests.chat_streams import chat_stream
from tests.dialect_streams import messages_stream, responses_stream
from tests.e2e_support import ANSWER, API_KEY, PROMPT, RawResponse, openai_client, raw_post
from tests.fixtures_e2e import FinishFixProxy
from tests.mitmdump_process import running_finish_fix
from tests.upstream_server import Script, UpstreamServer

# A backstop above the waits a test chains (each up to START_DEADLINE_S on a loaded machine), so a
# slow run fails with the wait's own message, not pytest-timeout's.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3 * START_DEADLINE_S)]

DEADLINE_S = 2.0
DEADLINE = {"finish_fix_first_token_timeout": f"{DEADLINE_S:g}"}
# Ample for a head the test releases at once, on a loaded machine; no test waits it out.
GENEROUS_DEADLINE = {"finish_fix_first_token_timeout": "60"}
MESSAGE = "no response head within 2 s of the request; the upstream did not answer (finish_fix)"
PATHS = {Dialect.CHAT: "/v1/chat/completions", Dialect.MESSAGES: "/v1/messages", Dialect.RESPONSES: "/v1/responses"}
#: The dialects of these cases (Gemini's no-head and whole-body answers: test_finish_fix_e2e_gemini.py).
DIALECTS = tuple(dialect for dialect in LAB_DIALECTS if dialect in PATHS)
OPENAI_BODY = {"error": {"message": MESSAGE, "type": "server_error", "param": None, "code": "no_response_head"}}
BODIES = {
    Dialect.CHAT: OPENAI_BODY,
    Dialect.MESSAGES: {"type": "error", "error": {"type": "timeout_error", "message": MESSAGE}},
    Dialect.RESPONSES: OPENAI_BODY,
}
STREAMS = {
    Dialect.CHAT: chat_stream(ANSWER),
    Dialect.MESSAGES: messages_stream(ANSWER),
    Dialect.RESPONSES: responses_stream(ANSWER),
}


def request_body(dialect: Dialect, *, stream: bool = True) -> dict:
    if dialect is Dialect.RESPONSES:
        return {"model": "e2e-model", "stream": stream, "input": PROMPT}
    body = {"model": "e2e-model", "stream": stream, "messages": [{"role": "user", "content": PROMPT}]}
    return {**body, "max_tokens": 64} if dialect is Dialect.MESSAGES else body


def never_answered(upstream: UpstreamServer) -> str:
    """A route whose upstream reads the request and never sends a head."""
    return upstream.route(Script(pieces=chat_stream(ANSWER), head_gate=threading.Event()))


@pytest.fixture(scope="module")
def no_head_proxy(
    upstream: UpstreamServer, mitmproxy_confdir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FinishFixProxy]:
    """One mitmdump with a 2 s first-token deadline for the module's no-head cases."""
    ledger = tmp_path_factory.mktemp("ledger") / "no-head.jsonl"
    with running_finish_fix(confdir=mitmproxy_confdir, upstream_url=upstream.origin, ledger=ledger, options=DEADLINE) as mitmdump:
        yield FinishFixProxy(mitmdump=mitmdump, upstream=upstream, ledger=ledger)


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_no_head_at_all_is_a_504_with_the_dialects_error_body(no_head_proxy, upstream: UpstreamServer, dialect):
    prefix = never_answered(upstream)
    response = raw_post(f"{no_head_proxy.mitmdump.url}{prefix}{PATHS[dialect]}", body=request_body(dialect))

    assert response.error is None, response.error
    assert response.status == 504
    assert response.headers["content-type"] == "application/json"
    assert json.loads(response.body) == BODIES[dialect]
    assert upstream.wait_abandoned(prefix), "finish_fix must close the upstream connection that never answered"
    [record] = no_head_proxy.wait_ledger_lines(prefix)
    assert record["status"] == 504 and record["dialect"] == str(dialect) and record["verdict"] == "interrupted"
    assert (
        record["detail"] == "interrupted before the response head (no response head within 2 s of the request); answered HTTP 504"
    )
    assert (record["events"], record["upstream_bytes"], record["client_bytes"]) == (0, 0, len(response.body))


def test_a_head_that_never_comes_after_a_slow_body_counts_from_the_body_sent(no_head_proxy, upstream: UpstreamServer):
    # The body's second half goes no sooner than twice the 2 s deadline after the first: a deadline
    # counted from the request head would answer before the request ever went upstream. (A lower
    # bound only: a right implementation waits for the whole body however late it comes; only a
    # wrong one is timing-sensitive.)
    prefix = never_answered(upstream)
    body = json.dumps(request_body(Dialect.CHAT)).encode()

    def slowly() -> Iterator[bytes]:
        yield body[: len(body) // 2]
        time.sleep(2 * DEADLINE_S)
        yield body[len(body) // 2 :]

    with httpx.Client(trust_env=False, timeout=START_DEADLINE_S) as client:
        response = client.post(
            f"{no_head_proxy.mitmdump.url}{prefix}/v1/chat/completions",
            content=slowly(),
            headers={"content-type": "application/json", "content-length": str(len(body))},
        )
    assert response.status_code == 504 and response.json() == OPENAI_BODY
    arrived = upstream.wait_request(prefix, timeout=START_DEADLINE_S)
    assert arrived.body == body, "the whole request went upstream before finish_fix answered"
    assert upstream.wait_abandoned(prefix)


def test_openai_python_raises_the_504(no_head_proxy, upstream: UpstreamServer):
    prefix = never_answered(upstream)
    with openai_client(no_head_proxy.base_url(prefix)) as client:
        with pytest.raises(openai.InternalServerError) as raised:
            client.chat.completions.create(model="e2e-model", messages=[{"role": "user", "content": PROMPT}], stream=True)
    assert raised.value.status_code == 504
    assert raised.value.code == "no_response_head" and MESSAGE in raised.value.message


def test_anthropic_python_raises_the_504(no_head_proxy, upstream: UpstreamServer):
    prefix = upstream.route(Script(pieces=messages_stream(ANSWER), head_gate=threading.Event()))
    http_client = anthropic.DefaultHttpxClient(trust_env=False, timeout=30)
    with anthropic.Anthropic(
        base_url=f"{no_head_proxy.mitmdump.url}{prefix}", api_key=API_KEY, max_retries=0, http_client=http_client
    ) as client:
        with pytest.raises(anthropic.InternalServerError) as raised:
            with client.messages.stream(
                model="e2e-model", max_tokens=64, messages=[{"role": "user", "content": PROMPT}]
            ) as stream:
                stream.get_final_message()
    assert raised.value.status_code == 504
    assert raised.value.body == BODIES[Dialect.MESSAGES]


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_a_head_inside_the_deadline_is_untouched(start_finish_fix, upstream: UpstreamServer, dialect):
    proxy = start_finish_fix(**GENEROUS_DEADLINE)
    gate = threading.Event()
    prefix = upstream.route(Script(pieces=STREAMS[dialect], head_gate=gate))
    result: list[RawResponse] = []
    client = threading.Thread(
        target=lambda: result.append(raw_post(f"{proxy.mitmdump.url}{prefix}{PATHS[dialect]}", body=request_body(dialect)))
    )
    client.start()
    upstream.wait_request(prefix)  # the request went upstream and is waiting for its head
    gate.set()
    client.join(60)

    [response] = result
    assert response.error is None and response.status == 200
    assert response.body == b"".join(STREAMS[dialect])
    [record] = proxy.wait_ledger_lines(prefix)
    assert record["verdict"] == "clean", record
    assert not any(target.startswith(prefix + "/") for target in upstream.abandoned)


# The piece after each stream's first token: the upstream holds it back (an HTTP/1.1 gate).
AFTER_FIRST_TOKEN = {Dialect.CHAT: 1, Dialect.MESSAGES: 4, Dialect.RESPONSES: 5}


def test_the_head_timer_going_off_mid_body_leaves_the_stream_alone(start_finish_fix, upstream: UpstreamServer):
    # The head and the first token come at once; the rest is held until the head timer has gone off
    # while the body streams (at least twice the deadline after the request went upstream: a lower
    # bound only, so only a wrong implementation is timing-sensitive). The hook must swallow that
    # Wakeup: no 504, no stall, no error, every byte, booked `clean`. With no idle timeout, no stall timer
    # runs after the first token. 5 s rather than the module's 2 s: the head must pass mitmproxy
    # within the deadline, which a loaded machine must be given room for.
    deadline_s = 5.0
    proxy = start_finish_fix(finish_fix_first_token_timeout=f"{deadline_s:g}", finish_fix_idle_timeout="0")
    rest = threading.Event()
    prefixes = {
        dialect: upstream.route(Script(pieces=STREAMS[dialect], gates={AFTER_FIRST_TOKEN[dialect]: rest})) for dialect in DIALECTS
    }
    results: dict[Dialect, tuple[int, bytes]] = {}

    def ask(dialect: Dialect) -> None:
        # Not raw_post: its read timeout (CLIENT_TIMEOUT_S) is too close to the held gap on a loaded machine.
        url = f"{proxy.mitmdump.url}{prefixes[dialect]}{PATHS[dialect]}"
        with httpx.Client(trust_env=False, timeout=START_DEADLINE_S) as client:
            with client.stream("POST", url, json=request_body(dialect)) as response:
                results[dialect] = (response.status_code, b"".join(response.iter_raw()))

    clients = [threading.Thread(target=ask, args=(dialect,)) for dialect in DIALECTS]
    for client in clients:
        client.start()
    for prefix in prefixes.values():
        upstream.wait_request(prefix, timeout=START_DEADLINE_S)
    time.sleep(2 * deadline_s)
    rest.set()
    for client in clients:
        client.join(START_DEADLINE_S)

    for dialect, prefix in prefixes.items():
        assert results[dialect] == (200, b"".join(STREAMS[dialect])), dialect
        [record] = proxy.wait_ledger_lines(prefix)
        assert record["verdict"] == "clean", record
    # mitmproxy's own method refuses a Wakeup mid-body with an AssertionError it logs and survives:
    # only its output shows that the hook let one through.
    assert "Traceback" not in proxy.mitmdump.output, proxy.mitmdump.output


def ask_and_give_up(proxy: FinishFixProxy, prefix: str, path: str, *, stream: bool) -> None:
    """Posts a request whose upstream never answers; the client gives up at twice the 2 s deadline
    (a lower bound: only a wrong 504 is timing-sensitive, and a late one fails the books' check)."""
    with httpx.Client(trust_env=False, timeout=4) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post(f"{proxy.mitmdump.url}{prefix}{path}", json=request_body(Dialect.CHAT, stream=stream))


def test_a_request_that_asked_for_no_stream_is_left_waiting(no_head_proxy, upstream: UpstreamServer):
    # A whole answer's head comes after all its tokens: mitmproxy waits for it as it would without
    # finish_fix, and the flow is booked as the client's leaving, never as a 504 of finish_fix's.
    prefix = never_answered(upstream)
    ask_and_give_up(no_head_proxy, prefix, "/v1/chat/completions", stream=False)
    [record] = no_head_proxy.wait_ledger_lines(prefix)
    assert record["verdict"] == "skipped" and record["detail"] == "skipped: the client went away before the response", record
    assert record.get("status") != 504, record


def test_a_path_out_of_scope_is_left_waiting(no_head_proxy, upstream: UpstreamServer):
    # Not finish_fix's path: it neither answers nor books it (no ledger line to wait for), so the proof
    # is the client's own timeout; mitmproxy closes the upstream once the client left.
    prefix = never_answered(upstream)
    ask_and_give_up(no_head_proxy, prefix, "/v1/embeddings", stream=True)
    assert upstream.wait_abandoned(prefix)
    assert no_head_proxy.ledger_lines(prefix) == []
