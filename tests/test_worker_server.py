"""The worker over real sockets: exact bytes, per-request settings, connections, and real clients."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import trio

from faults.child_processes import run_child, start_child
from labs.worker import WorkerSettings, open_worker, parse_settings, response_plan
from tests.fixtures_lab import chat_request, client_exchange, run_trio, split_response

ROOT = Path(__file__).resolve().parent.parent


def exchange(request: bytes, defaults: WorkerSettings | None = None, **kwargs):
    async def scenario():
        async with open_worker(defaults) as worker:
            received = await client_exchange(worker.port, request, **kwargs)
            return received, list(worker.handled)

    return run_trio(scenario)


@pytest.mark.parametrize(
    "model",
    [
        "finishline-worker;tokens=5",
        "finishline-worker;tokens=5;framing=close",
        "finishline-worker;tokens=5;framing=content-length;connection_close=1",
        "finishline-worker;tokens=3;reasoning_tokens=2;tool_calls=1;n=2;include_usage=1",
        "finishline-worker;tokens=5;finish=empty;done=0;connection_close=1",
        "finishline-worker;tokens=5;error_after=2;connection_close=1",
    ],
)
def test_the_wire_carries_exactly_the_planned_bytes(model):
    body = {"model": model, "stream": True}
    plan = response_plan(parse_settings(model).for_request(body))
    # Ask for close so keep-alive responses end too; the worker's answer does not depend on it.
    received, _ = exchange(chat_request(body, headers={"connection": "close"}))
    assert received.data == plan.to_bytes()
    assert received.ending == "fin"


def test_precedence_defaults_then_model_name_then_header():
    defaults = WorkerSettings(tokens=2, token_delay=0.0, reasoning_tokens=1)
    body = {"model": "finishline-worker;tokens=4;include_usage=1", "stream": True}
    request = chat_request(body, headers={"x-finishline-worker": "tokens=6", "connection": "close"})
    received, handled = exchange(request, defaults)
    effective = handled[0].settings
    assert (effective.tokens, effective.include_usage, effective.reasoning_tokens) == (6, True, 1)
    assert received.data == response_plan(effective).to_bytes()


def test_request_fields_fill_the_open_knobs():
    body = {"model": "gpt-4o", "stream": True, "n": 2, "max_tokens": 3, "stream_options": {"include_usage": True}}
    _, handled = exchange(chat_request(body, headers={"connection": "close"}))
    assert handled[0].settings == WorkerSettings(n=2, max_tokens=3, include_usage=True, model="gpt-4o")


def test_keep_alive_serves_two_requests_on_one_connection():
    body = {"model": "m;tokens=2", "stream": True}
    once = response_plan(parse_settings(body["model"]).for_request(body)).to_bytes()
    received, handled = exchange(chat_request(body) + chat_request(body, headers={"connection": "close"}))
    assert received.data == once + once
    assert [h.outcome for h in handled] == ["complete", "complete"]


@pytest.mark.parametrize("knob", ["connection_close=1", "framing=close"])
def test_worker_closes_after_a_response_when_settings_say_so(knob):
    body = {"model": f"m;tokens=2;{knob}", "stream": True}
    received, handled = exchange(chat_request(body))  # no `connection: close` from the client
    assert received.ending == "fin"
    assert handled[0].connection_close == (knob == "connection_close=1")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_a_whole_answer_closes_its_connection_and_a_streamed_one_keeps_it(path):
    # A non-streamed answer is shorter than any fault's byte budget, which toxiproxy counts per
    # connection: kept alive, its connection would hand the next stream a spent budget (issue 25,
    # claude-code's whole request before pi-coding-agent's retry). The client asks for keep-alive.
    body = {"model": "m;tokens=3", "max_tokens": 16, "input": "hi", "messages": [{"role": "user", "content": "hi"}]}
    received, handled = exchange(chat_request(body, path=path))
    head, whole = split_response(received.data)
    assert received.ending == "fin"
    assert "\r\nconnection: close\r\n" in head.lower() + "\r\n"
    assert head.startswith("HTTP/1.1 200") and json.loads(whole)
    assert [(h.stream, h.connection_close, h.outcome) for h in handled] == [(False, True, "complete")]
    streamed, _ = exchange(chat_request({**body, "stream": True}, path=path), stop_after_bytes=1, quiet_seconds=0.3)
    assert streamed.ending == "open"


def test_keep_alive_connection_stays_open_otherwise():
    received, _ = exchange(chat_request({"model": "m;tokens=2", "stream": True}), stop_after_bytes=1, quiet_seconds=0.3)
    assert received.ending == "open"


def test_prefill_delay_sends_the_head_then_waits():
    plan = response_plan(WorkerSettings(prefill_delay=30).for_request({"model": "m"}))
    request = chat_request({"model": "m", "stream": True}, headers={"x-finishline-worker": "prefill_delay=30"})
    received, _ = exchange(request, stop_after_bytes=plan.head_length, quiet_seconds=0.4)
    assert (received.data, received.ending) == (plan.head, "open")


def test_a_request_in_prefill_is_an_arrival_before_it_is_handled():
    # The lab tells which worker a gateway asked from `arrivals`: a request whose tunnel dropped
    # during a long prefill is handled only when the prefill ends, long after its cell.
    async def scenario():
        async with open_worker() as worker:
            request = chat_request({"model": "c0007;prefill_delay=30", "stream": True})
            await client_exchange(worker.port, request, stop_after_bytes=1, quiet_seconds=0.3)
            return list(worker.arrivals), list(worker.handled)

    arrivals, handled = run_trio(scenario)
    assert (arrivals, handled) == (["c0007;prefill_delay=30"], [])


def test_token_delay_paces_token_events():
    request = chat_request({"model": "m;token_delay=30", "stream": True})
    plan = response_plan(parse_settings("token_delay=30").for_request({"model": "m;token_delay=30"}))
    received, _ = exchange(request, stop_after_bytes=plan.offset_after_tokens(1), quiet_seconds=0.4)
    assert received.data == plan.to_bytes()[: plan.offset_after_tokens(1)]
    assert received.ending == "open"


def test_a_client_that_leaves_mid_stream_is_recorded():
    async def scenario():
        async with open_worker(WorkerSettings(tokens=100, token_delay=0.01)) as worker:
            stream = await trio.open_tcp_stream("127.0.0.1", worker.port)
            await stream.send_all(chat_request({"model": "m", "stream": True}))
            await stream.receive_some()
            await stream.aclose()
            while not worker.handled:
                await trio.sleep(0.01)
            return worker.handled[0]

    handled = run_trio(scenario)
    assert handled.outcome == "client_gone"
    assert 0 < handled.bytes_sent < len(response_plan(handled.settings).to_bytes())


@pytest.mark.parametrize("status", [429, 500])
def test_http_error_before_streaming(status):
    received, handled = exchange(
        chat_request({"model": f"m;http_error={status}", "stream": True}, headers={"connection": "close"})
    )
    head, body = split_response(received.data)
    assert head.startswith(f"HTTP/1.1 {status} ")
    assert json.loads(body)["error"]["type"]
    assert handled[0].status == status


#: Every path a worker answers that is not a completion: the model list, each router probe
#: (`_PROBES` in labs/worker/server.py), one under SMG's per-cell worker URL, and an unknown route.
NON_COMPLETION_PATHS = (
    "/v1/models",
    "/health",
    "/version",
    "/server_info",
    "/get_server_info",
    "/v1/loads",
    "/get_load",
    "/cells/c0001/health",
    "/v2/other",
)


@pytest.mark.parametrize("path", NON_COMPLETION_PATHS)
def test_a_probe_is_answered_with_connection_close_and_the_connection_ends(path):
    # The client asks for keep-alive; the worker still closes after the answer, so no router can
    # pool the connection and later send a cell's request on it (a tunnel's byte budget is per
    # connection: tests/test_faults_cut.py). The exchange reads until EOF: before the fix it never
    # came, and the run's deadline failed the test.
    received, handled = exchange(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
    head, body = split_response(received.data)
    assert received.ending == "fin"
    assert "\r\nconnection: close\r\n" in head.lower() + "\r\n"
    assert len(body) == int(head.lower().split("content-length: ", 1)[1].split("\r\n", 1)[0])
    assert [h.connection_close for h in handled] == [True]


def test_models_route():
    request = b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    received, _ = exchange(request)
    assert json.loads(split_response(received.data)[1])["data"][0]["id"] == "finishline-worker"


@pytest.mark.parametrize(
    ("request_bytes", "status", "words"),
    [
        (b"GET /v2/other HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n", 404, "no route for GET /v2/other"),
        (chat_request({"model": "m;colour=red"}, headers={"connection": "close"}), 400, "unknown worker setting 'colour'"),
        (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\nconnection: close\r\n\r\n{{{", 400, "Expecting"),
        (b"NONSENSE\r\n\r\n", 400, "malformed HTTP request"),
    ],
    ids=["unknown_route", "bad_setting", "bad_json", "bad_http"],
)
def test_bad_requests_get_an_error_that_says_why(request_bytes, status, words):
    received, _ = exchange(request_bytes)
    head, body = split_response(received.data)
    assert head.startswith(f"HTTP/1.1 {status} ")
    assert words in json.loads(body)["error"]["message"]


# -- a real client ------------------------------------------------------------------------------


def with_openai(function, defaults: WorkerSettings | None = None):
    """Run a blocking openai-python call against a worker served by trio in this thread."""

    async def scenario():
        async with open_worker(defaults) as worker:
            client = openai.OpenAI(base_url=worker.base_url, api_key="unused", max_retries=0, timeout=10)
            return await trio.to_thread.run_sync(function, client)

    return run_trio(scenario)


def test_openai_python_streams_the_expected_answer():
    def call(client):
        stream = client.chat.completions.create(
            model="finishline-worker;tokens=9;reasoning_tokens=3",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        return content, reasoning, reasons, chunks[-1].usage.completion_tokens

    assert with_openai(call) == ("The quick brown fox jumps over the lazy dog.", "Let me think", ["stop"], 12)


def test_openai_python_reads_tool_calls_and_non_streaming():
    def call(client):
        completion = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "weather?"}],
            extra_headers={"x-finishline-worker": "tokens=0; tool_calls=1; n=2"},
        )
        return [(c.finish_reason, c.message.tool_calls[0].function.arguments) for c in completion.choices]

    assert with_openai(call) == [("tool_calls", '{"city": "Paris", "unit": "celsius"}')] * 2


def test_openai_python_raises_on_http_429():
    def call(client):
        with pytest.raises(openai.RateLimitError, match="Rate limit reached") as error:
            client.chat.completions.create(model="m;http_error=429", messages=[], stream=True)
        return error.value.code

    assert with_openai(call) == "rate_limit_exceeded"


# -- standalone ---------------------------------------------------------------------------------


@pytest.mark.e2e
def test_standalone_help_lists_every_knob():
    result = run_child([sys.executable, "-m", "labs.worker", "--help"], cwd=ROOT, timeout=30)
    assert result.returncode == 0
    for option in ("--tokens", "--prefill-delay", "--framing", "--connection-close", "--finish", "--error-after", "--http-error"):
        assert option in result.stdout


@pytest.mark.e2e
def test_standalone_refuses_a_bad_default_in_one_line():
    result = run_child([sys.executable, "-m", "labs.worker", "--framing", "zip"], cwd=ROOT, timeout=30)
    assert result.returncode == 2
    assert "framing must be one of chunked, content-length, close" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.e2e
def test_standalone_worker_serves_with_its_command_line_defaults():
    process = start_child(
        [sys.executable, "-m", "labs.worker", "--port", "0", "--tokens", "3", "--finish", "omitted"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("worker listening on http://127.0.0.1:")
        port = int(line.split("127.0.0.1:")[1].split("/")[0])

        async def scenario():
            return await client_exchange(port, chat_request({"model": "m", "stream": True}, headers={"connection": "close"}))

        received = run_trio(scenario, deadline=15)
        expected = response_plan(WorkerSettings(tokens=3, finish="omitted").for_request({"model": "m"}))
        assert received.data == expected.to_bytes()
    finally:
        process.terminate()
        process.wait(timeout=10)
