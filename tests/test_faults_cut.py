"""Cuts through the real toxiproxy server: the client gets exactly what the fault promises.

"Exactly n token events" is checked with a reader of our own in tests/fixtures_lab.py (not the
code under test): the bytes received equal the worker's healthy response up to the promised
offset, the complete events carry exactly n tokens, and the connection ended with a FIN or a reset.
"""

from __future__ import annotations

import json
from functools import partial

import httpx
import pytest
import trio

from faults import catalog
from faults.probe import probe_layout
from finishline import Dialect
from labs.worker import WorkerSettings, open_worker, parse_settings, response_plan
from labs.worker.answer import CONTENT_WORDS
from labs.worker.settings import Finish, Framing
from tests.feeding import complete_events
from tests.fixtures_lab import (
    chat_request,
    client_exchange,
    open_proxy,
    request_for,
    run_trio,
    split_response,
    token_texts,
)

N_VALUES = [0, 1, 7, 100, 1000]


def content_word(i: int) -> str:
    word = CONTENT_WORDS[i % len(CONTENT_WORDS)]
    return word if i == 0 else " " + word


async def cut_exchange(toxiproxy, fault_for, body, *, headers=None):
    async with open_worker() as worker, open_proxy(toxiproxy, worker.port) as proxy:
        async with fault_for().applied(toxiproxy, proxy.name):
            return await client_exchange(proxy.listen_port, chat_request(body, headers=headers))


@pytest.mark.e2e
@pytest.mark.parametrize("framing", ["chunked", "close"])
@pytest.mark.parametrize("include_usage", [False, True], ids=["no_usage", "usage"])
@pytest.mark.parametrize("n", N_VALUES)
def test_cut_after_tokens_delivers_exactly_n_token_events(toxiproxy, n, include_usage, framing):
    settings = WorkerSettings(tokens=1000, include_usage=include_usage, framing=framing)
    body, plan = request_for(settings)
    offset = plan.offset_after_tokens(n)

    received = run_trio(cut_exchange, toxiproxy, lambda: catalog.cut_after_tokens(n, plan), body)

    assert received.ending == "fin"
    assert len(received.data) == offset
    assert received.data == plan.to_bytes()[:offset]
    head, decoded = split_response(received.data)
    assert head.startswith("HTTP/1.1 200 OK")
    assert token_texts(complete_events(decoded)) == [content_word(i) for i in range(n)]
    # The cut falls between events (and between chunks): no partial event or chunk follows.
    assert received.data.endswith(b"\n\n\r\n" if framing == "chunked" else b"\n\n")


@pytest.mark.e2e
@pytest.mark.parametrize("n", [0, 1, 7, 100, 1000])
def test_cut_after_tokens_reset_variant_ends_with_a_tcp_reset(toxiproxy, n):
    settings = WorkerSettings(tokens=1000, include_usage=True)
    body, plan = request_for(settings)

    received = run_trio(cut_exchange, toxiproxy, lambda: catalog.cut_after_tokens(n, plan, reset=True), body)

    assert received.ending == "reset"
    assert received.data == plan.to_bytes()[: plan.offset_after_tokens(n)]
    assert len(token_texts(complete_events(split_response(received.data)[1]))) == n


@pytest.mark.e2e
@pytest.mark.parametrize(
    "settings",
    [
        WorkerSettings(tokens=5, reasoning_tokens=4, n=2),
        WorkerSettings(tokens=3, tool_calls=2, include_usage=True, framing=Framing.CONTENT_LENGTH),
        WorkerSettings(tokens=9, max_tokens=6, finish=Finish.EMPTY, done=False),
        WorkerSettings(tokens=9, error_after=5, connection_close=True),
    ],
    ids=["reasoning_n2", "tool_calls_content_length", "max_tokens_empty_reason", "error_event"],
)
@pytest.mark.parametrize("n", [0, 3, 5])
def test_cut_after_tokens_is_exact_at_other_settings(toxiproxy, settings, n):
    body, plan = request_for(settings)

    received = run_trio(cut_exchange, toxiproxy, lambda: catalog.cut_after_tokens(n, plan), body)

    assert received.ending == "fin"
    assert received.data == plan.to_bytes()[: plan.offset_after_tokens(n)]
    assert len(token_texts(complete_events(split_response(received.data)[1]))) == n


@pytest.mark.e2e
def test_cut_after_tokens_by_header_settings(toxiproxy):
    """The scenario picked with the x-finishline-worker header instead of the model name."""
    settings = WorkerSettings(tokens=20, framing="close", include_usage=True)
    body = {"model": "any-model", "stream": True}
    plan = response_plan(settings.for_request(body))

    headers = {"x-finishline-worker": settings.to_header()}
    received = run_trio(partial(cut_exchange, headers=headers), toxiproxy, lambda: catalog.cut_after_tokens(7, plan), body)

    assert received.ending == "fin"
    assert token_texts(complete_events(split_response(received.data)[1])) == [content_word(i) for i in range(7)]


@pytest.mark.e2e
@pytest.mark.parametrize("framing", ["chunked", "close"])
@pytest.mark.parametrize("n", [0, 1, 7, 100])
def test_cut_after_tokens_with_a_probed_layout_is_exact(toxiproxy, framing, n):
    """The capture method (for upstreams whose bytes are not known): probe twice, then cut."""
    settings = WorkerSettings(tokens=100, include_usage=True, framing=framing)
    body = {"model": settings.to_model_name(), "stream": True}

    async def scenario():
        async with open_worker() as worker, open_proxy(toxiproxy, worker.port) as proxy:
            layout = await trio.to_thread.run_sync(
                lambda: probe_layout(proxy.listen_host, proxy.listen_port, body=body, timeout=10)
            )
            async with catalog.cut_after_tokens(n, layout).applied(toxiproxy, proxy.name):
                received = await client_exchange(proxy.listen_port, chat_request(body))
            return layout, received

    layout, received = run_trio(scenario)

    plan = response_plan(parse_settings(body["model"]).for_request(body))
    assert layout.offset_after_tokens(n) == plan.offset_after_tokens(n)
    assert received.ending == "fin"
    assert token_texts(complete_events(split_response(received.data)[1])) == [content_word(i) for i in range(n)]


@pytest.mark.e2e
def test_cut_during_prefill_delivers_only_the_head(toxiproxy):
    # A long prefill: the worker is still "thinking" when the tunnel drops.
    settings = WorkerSettings(tokens=5, prefill_delay=30.0)
    body, plan = request_for(settings)

    received = run_trio(cut_exchange, toxiproxy, lambda: catalog.cut_during_prefill(plan), body)

    assert received.ending == "fin"
    assert received.data == plan.head
    assert received.data.startswith(b"HTTP/1.1 200 OK\r\n") and received.data.endswith(b"\r\n\r\n")


@pytest.mark.e2e
def test_cut_during_prefill_reset_variant(toxiproxy):
    settings = WorkerSettings(tokens=5, prefill_delay=30.0)
    body, plan = request_for(settings)

    received = run_trio(cut_exchange, toxiproxy, lambda: catalog.cut_during_prefill(plan, reset=True), body)

    assert received.ending == "reset"
    assert received.data == plan.head


def pooled_probe_then_stream(base_url: str, body: dict) -> tuple[int, bytes]:
    """As a router does: one pooled keep-alive client probes the worker's health, then streams a
    completion; returns how many connections the pool opened and the stream's body as received
    (up to the cut)."""
    opened = 0

    def count(event_name: str, info: dict) -> None:
        nonlocal opened
        if event_name == "connection.connect_tcp.complete":
            opened += 1

    received = bytearray()
    with httpx.Client(base_url=base_url, trust_env=False, timeout=30, transport=httpx.HTTPTransport(retries=0)) as client:
        client.get("/health", extensions={"trace": count}).raise_for_status()
        try:
            with client.stream("POST", "/v1/messages", json=body, extensions={"trace": count}) as response:
                for piece in response.iter_raw():
                    received += piece
        except httpx.RemoteProtocolError:
            pass  # the cut: the chunked body ends early
    return opened, bytes(received)


@pytest.mark.e2e
def test_a_routers_probe_does_not_spend_the_byte_budget_of_the_request_after_it(toxiproxy):
    # Issue 25: smg+finish_fix cells in a stall got only `message_start` and a ping. toxiproxy's
    # `limit_data` counts bytes per connection, across keep-alive requests, and a router's pool
    # sent a cell's request on the connection its probe had used. The worker answers every probe
    # with `Connection: close` (labs/worker/server.py, `_probe_answer`): the pool opens a second
    # connection, and the cut falls after exactly the promised tokens.
    n = 5
    model = "finishline-worker;tokens=12"
    body = {"model": model, "max_tokens": 4096, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    plan = response_plan(parse_settings(model).for_request(body, Dialect.MESSAGES), dialect=Dialect.MESSAGES)
    offset = plan.offset_after_tokens(n)

    async def run() -> tuple[int, bytes]:
        async with open_worker() as worker, open_proxy(toxiproxy, worker.port) as proxy:
            async with catalog.cut_after_tokens(n, plan).applied(toxiproxy, proxy.name):
                return await trio.to_thread.run_sync(pooled_probe_then_stream, f"http://127.0.0.1:{proxy.listen_port}", body)

    opened, received = run_trio(run)

    assert [json.loads(event)["type"] for event in complete_events(received)].count("content_block_delta") == n
    assert received == split_response(plan.to_bytes()[:offset])[1]
    assert opened == 2


def test_cut_after_more_tokens_than_the_stream_has_is_refused():
    settings = WorkerSettings(tokens=3).for_request({})
    with pytest.raises(ValueError, match="the stream has 3 token events, cannot cut after 4"):
        catalog.cut_after_tokens(4, response_plan(settings))
    with pytest.raises(ValueError, match="n must be >= 0"):
        catalog.cut_after_tokens(-1, response_plan(settings))
