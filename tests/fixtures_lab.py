"""Fixtures and helpers for the lab's lower layers: the worker, the real toxiproxy server, a raw client.

Registered in tests/conftest.py (`pytest_plugins`). One toxiproxy server per test session (it
starts in ~0.1 s but there is no need to start it per test); every test gets a clean one (`reset`,
and the proxies it made are deleted). The worker runs in the test's own `trio.run`, so tests are
plain functions that call `run_trio(...)` with a deadline.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
import trio

from faults.toxiproxy_client import ProxyInfo, ToxiproxyClient
from faults.toxiproxy_server import ToxiproxyServer, run_toxiproxy_server
from labs.worker import ResponsePlan, WorkerSettings, parse_settings, response_plan

_proxy_numbers = itertools.count()

#: A lab cell's deadline in a test whose scenario has no stall: every cell ends by itself (the
#: stream's end, an error, a cut), so the deadline is only the backstop that would call a real
#: hang one, and it has a loaded machine's room. A scenario's own 15 s once called healthy cells
#: `hang` under a parallel build (issue 25; tests/test_gateway_litellm_dialects.py says what they
#: waited on). A stall keeps its short deadline: there the deadline is what is measured.
CELL_BACKSTOP_S = 120.0


@pytest.fixture(scope="session")
def toxiproxy_server() -> Iterator[ToxiproxyServer]:
    """The real toxiproxy-server (built by `make setup`), on 127.0.0.1 and a free port."""
    with run_toxiproxy_server() as server:
        yield server


@pytest.fixture
def toxiproxy(toxiproxy_server: ToxiproxyServer) -> Iterator[ToxiproxyClient]:
    """A client of the session's toxiproxy, with no toxics and no proxies left from other tests."""
    client = toxiproxy_server.client
    client.reset()
    yield client
    client.reset()
    for name in client.proxies():
        client.delete_proxy(name)


def run_trio(
    function: Callable[..., Awaitable[Any]], *args: Any, deadline: float = 30.0, clock: trio.abc.Clock | None = None
) -> Any:
    """Run an async test body under trio with a deadline (raises trio.TooSlowError past it), on
    `clock` if given: `trio.testing.MockClock(autojump_threshold=0)` for a body whose waits are all
    trio's own (no socket, thread or process to wait for), so its sleeps and deadlines take no time."""

    async def bounded() -> Any:
        with trio.fail_after(deadline):
            return await function(*args)

    return trio.run(bounded, clock=clock)


@asynccontextmanager
async def open_proxy(client: ToxiproxyClient, upstream_port: int) -> AsyncIterator[ProxyInfo]:
    """A toxiproxy proxy on 127.0.0.1 (free port) in front of `127.0.0.1:upstream_port`."""
    name = f"test_{next(_proxy_numbers)}"
    info = await trio.to_thread.run_sync(partial(client.create_proxy, name, upstream=f"127.0.0.1:{upstream_port}"))
    try:
        yield info
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(client.delete_proxy, name)


def chat_request(body: dict[str, Any], *, headers: dict[str, str] | None = None, path: str = "/v1/chat/completions") -> bytes:
    """Raw HTTP/1.1 POST bytes for a chat-completions request."""
    payload = json.dumps(body).encode()
    lines = [f"POST {path} HTTP/1.1", "host: 127.0.0.1", "content-type: application/json", f"content-length: {len(payload)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


def request_for(settings: WorkerSettings) -> tuple[dict[str, Any], Any]:
    """A request that selects `settings` by model name, and the worker's plan (`ResponsePlan`) for it."""
    body: dict[str, Any] = {"model": settings.to_model_name(), "stream": True}
    return body, response_plan(parse_settings(body["model"]).for_request(body))


@dataclass(frozen=True, slots=True)
class Received:
    """What a raw client got: the bytes, how the connection ended, and how many reads it took.

    ending: `fin` (EOF), `reset` (ECONNRESET), or `open` (still open and silent when we stopped).
    """

    data: bytes
    ending: str
    reads: int


async def client_exchange(
    port: int, request: bytes, *, stop_after_bytes: int | None = None, quiet_seconds: float = 0.5
) -> Received:
    """Send `request` on a fresh connection and read until EOF or reset.

    With `stop_after_bytes`, once that many bytes arrived, wait `quiet_seconds` more: if nothing
    else arrives and the connection is still open, the ending is `open` (a stall). Only ever
    "nothing happened for a while" is concluded from time, never "it happened in time".
    """
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    data = bytearray()
    reads = 0
    try:
        await stream.send_all(request)
        while True:
            waiting = stop_after_bytes is not None and len(data) >= stop_after_bytes
            with trio.move_on_after(quiet_seconds if waiting else float("inf")):
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return Received(bytes(data), "fin", reads)
                data += chunk
                reads += 1
                continue
            return Received(bytes(data), "open", reads)
    except trio.BrokenResourceError as exc:
        if isinstance(exc.__cause__, ConnectionResetError):
            return Received(bytes(data), "reset", reads)
        raise
    finally:
        await stream.aclose()


# -- an independent reader of what the client got (not the code under test) -------------------


def split_response(raw: bytes) -> tuple[str, bytes]:
    """The head (text) and the body decoded from its framing, tolerating a cut anywhere."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    head_text = head.decode("latin-1")
    if "transfer-encoding: chunked" not in head_text.lower():
        return head_text, rest
    body = bytearray()
    while rest:
        size_line, sep, rest = rest.partition(b"\r\n")
        if not sep:
            break
        size = int(size_line, 16)
        if size == 0:
            break
        body += rest[:size]
        rest = rest[size + 2 :]
    return head_text, bytes(body)


def token_texts(events: list[str]) -> list[str]:
    """One string per token event: its content, reasoning, tool-call name or arguments piece."""
    texts = []
    for data in events:
        if data == "[DONE]":
            continue
        for choice in json.loads(data).get("choices", []):
            delta = choice.get("delta", {})
            for key in ("reasoning_content", "content"):
                if delta.get(key):
                    texts.append(delta[key])
            for call in delta.get("tool_calls") or []:
                function = call.get("function", {})
                texts.append(function.get("name") or function.get("arguments"))
    return texts


def body_bytes_through_token(plan: ResponsePlan, n: int) -> int:
    """The body bytes (chunk data, as the hub counts them) up to the end of the n-th token event."""
    total = tokens = 0
    for segment in plan.segments:
        total += len(segment.event)
        tokens += segment.kind == "token"
        if tokens == n:
            return total
    raise AssertionError(f"the plan has {tokens} token events")
