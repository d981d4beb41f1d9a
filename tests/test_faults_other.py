"""stall_after_tokens, slice, latency, bandwidth and down through the real toxiproxy server.

Timing: only lower bounds are asserted (toxiproxy cannot deliver before its delay; a busy machine
only makes things later), and "stays silent" is concluded after a quiet period, never "arrived in time".
"""

from __future__ import annotations

import time

import pytest
import trio

from faults import catalog
from labs.worker import WorkerSettings, open_worker
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

# Every test applies its fault through the real toxiproxy server (the session's `toxiproxy_server`).
pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("n", [0, 3])
def test_stall_after_tokens_goes_silent_on_an_open_connection_then_closes_when_removed(toxiproxy, n):
    settings = WorkerSettings(tokens=8, include_usage=True)
    body, plan = request_for(settings)
    offset = plan.offset_after_tokens(n)

    async def scenario():
        async with open_worker() as worker, open_proxy(toxiproxy, worker.port) as proxy:
            stream = await trio.open_tcp_stream("127.0.0.1", proxy.listen_port)
            async with catalog.stall_after_tokens(n, plan).applied(toxiproxy, proxy.name):
                # The fault is in place before the request's bytes arrive at the proxy.
                await stream.send_all(chat_request(body))
                stalled = bytearray()
                while len(stalled) < offset:
                    chunk = await stream.receive_some()
                    assert chunk, "the connection closed during the stall"
                    stalled += chunk
                with trio.move_on_after(0.7) as quiet:
                    more = await stream.receive_some()
                    pytest.fail(f"data or EOF during the stall: {more!r}")
                assert quiet.cancelled_caught
            # Removing the fault ends the hung connection with a FIN.
            rest = await stream.receive_some()
            await stream.aclose()
            return bytes(stalled), rest

    stalled, rest = run_trio(scenario)

    assert stalled == plan.to_bytes()[:offset]
    assert len(token_texts(complete_events(split_response(stalled)[1]))) == n
    assert rest == b""


def test_stall_is_seen_by_the_client_helper_as_open(toxiproxy):
    settings = WorkerSettings(tokens=8)
    body, plan = request_for(settings)

    async def scenario():
        async with open_worker() as worker, open_proxy(toxiproxy, worker.port) as proxy:
            async with catalog.stall_after_tokens(2, plan).applied(toxiproxy, proxy.name):
                return await client_exchange(
                    proxy.listen_port, chat_request(body), stop_after_bytes=plan.offset_after_tokens(2), quiet_seconds=0.5
                )

    received = run_trio(scenario)

    assert received.ending == "open"
    assert received.data == plan.to_bytes()[: plan.offset_after_tokens(2)]


def test_slice_delivers_every_byte_in_many_small_reads(toxiproxy):
    settings = WorkerSettings(tokens=4)
    body, plan = request_for(settings)
    fault = catalog.slice(average_size=3, size_variation=2, delay_microseconds=500)

    async def scenario():
        async with open_worker() as worker, open_proxy(toxiproxy, worker.port) as proxy:
            async with fault.applied(toxiproxy, proxy.name):
                return await client_exchange(proxy.listen_port, chat_request(body, headers={"connection": "close"}))

    received = run_trio(scenario)

    assert received.data == plan.to_bytes()
    assert received.ending == "fin"
    # ~1 KB in 1-5 byte segments 0.5 ms apart: a reader that keeps up sees hundreds of reads; ten
    # is a bound that a loaded machine (which coalesces segments) still clears.
    assert received.reads >= 10


def test_latency_delays_without_changing_bytes(toxiproxy):
    settings = WorkerSettings(tokens=4)
    body, plan = request_for(settings)

    async def scenario():
        async with open_worker() as worker, open_proxy(toxiproxy, worker.port) as proxy:
            async with catalog.latency(milliseconds=300, jitter=0).applied(toxiproxy, proxy.name):
                started = time.monotonic()
                received = await client_exchange(proxy.listen_port, chat_request(body, headers={"connection": "close"}))
                return received, time.monotonic() - started

    received, elapsed = run_trio(scenario)

    assert received.data == plan.to_bytes()
    assert elapsed >= 0.3  # a lower bound only: toxiproxy holds every chunk 300 ms


def test_latency_with_jitter_is_accepted_and_keeps_bytes(toxiproxy):
    settings = WorkerSettings(tokens=6, token_delay=0.01)
    body, plan = request_for(settings)

    async def scenario():
        async with open_worker() as worker, open_proxy(toxiproxy, worker.port) as proxy:
            async with catalog.latency(milliseconds=20, jitter=15).applied(toxiproxy, proxy.name):
                kinds = {(t.type, dict(t.attributes)["jitter"]) for t in toxiproxy.toxics(proxy.name)}
                return kinds, await client_exchange(proxy.listen_port, chat_request(body, headers={"connection": "close"}))

    kinds, received = run_trio(scenario)

    assert kinds == {("latency", 15)}
    assert received.data == plan.to_bytes()


def test_bandwidth_limits_throughput(toxiproxy):
    settings = WorkerSettings(tokens=100)  # ~20 KB
    body, plan = request_for(settings)
    size = len(plan.to_bytes())

    async def scenario():
        async with open_worker() as worker, open_proxy(toxiproxy, worker.port) as proxy:
            async with catalog.bandwidth(kilobytes_per_second=20).applied(toxiproxy, proxy.name):
                started = time.monotonic()
                received = await client_exchange(proxy.listen_port, chat_request(body, headers={"connection": "close"}))
                return received, time.monotonic() - started

    received, elapsed = run_trio(scenario)

    assert received.data == plan.to_bytes()
    assert elapsed >= 0.5 * size / 20_000  # lower bound, with room for how toxiproxy rounds


def test_down_refuses_connections_and_comes_back(toxiproxy):
    settings = WorkerSettings(tokens=2)
    body, plan = request_for(settings)

    async def scenario():
        async with open_worker() as worker, open_proxy(toxiproxy, worker.port) as proxy:
            async with catalog.down().applied(toxiproxy, proxy.name):
                with pytest.raises(OSError):
                    await trio.open_tcp_stream("127.0.0.1", proxy.listen_port)
            return await client_exchange(proxy.listen_port, chat_request(body, headers={"connection": "close"}))

    received = run_trio(scenario)

    assert received.data == plan.to_bytes()


def test_down_closes_a_live_stream_with_a_fin(toxiproxy):
    settings = WorkerSettings(tokens=50, token_delay=0.05)
    body, plan = request_for(settings)

    async def scenario():
        async with open_worker() as worker, open_proxy(toxiproxy, worker.port) as proxy:
            stream = await trio.open_tcp_stream("127.0.0.1", proxy.listen_port)
            await stream.send_all(chat_request(body))
            data = bytearray()
            while len(data) < plan.offset_after_tokens(1):
                data += await stream.receive_some()
            async with catalog.down().applied(toxiproxy, proxy.name):
                while chunk := await stream.receive_some():
                    data += chunk
            await stream.aclose()
            return bytes(data)

    data = run_trio(scenario)

    assert plan.to_bytes().startswith(data)
    assert len(data) < len(plan.to_bytes())
