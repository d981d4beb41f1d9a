"""Asking the graded target: one way to fetch a stream's bytes, one way to say it cannot be reached.

Both graders (`server_grader`, `gateway_grader`) read the body as it came off the wire
(`aiter_raw`): the byte-exact cuts and the core's verdict are about those bytes, not about what a
decoder made of them. So every request asks for `accept-encoding: identity`, as finish_fix does
(httpx would otherwise offer gzip, deflate, br and zstd); a body that comes compressed anyway is
recorded with its coding and not read (`StreamReading.compressed`), never judged as if it were SSE.

A transport failure is said in words (`transport_words`), never as a status of 0; a kept-alive
connection the target closed before any byte of the next response is asked again once, as the SDKs
do (`open_response`), and the reading carries a note saying so.
"""

from __future__ import annotations

import enum
import errno
import math
import os
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import trio

from finishline import Dialect
from labs.grade.card import GradeError
from labs.grade.reading import CLEAN_END, TIMEOUT, TRANSPORT_ERROR, StreamReading, read_stream

__all__ = [
    "IDENTITY",
    "cannot_connect",
    "failure_words",
    "fetch_stream",
    "grading_client",
    "open_response",
    "transport_words",
]

#: The request header that keeps the body as the target produced it.
IDENTITY = {"accept-encoding": "identity"}


def failure_words(error: BaseException) -> str:
    """The words for a failed connection or transfer: the OS's own for its error number
    (`Connection refused`) when an `OSError` with one is behind it (httpx says `[Errno 111]
    Connection refused`, trio `all attempts to connect to ... failed` over a group of them), else
    the error's own words."""
    os_error = _maybe_os_error(error)
    if os_error is not None and os_error.errno:
        return os.strerror(os_error.errno)
    return str(error) or type(error).__name__


def _maybe_os_error(error: BaseException) -> OSError | None:
    """The first `OSError` with an error number behind `error` (its causes, contexts, groups), or None."""
    waiting: list[BaseException] = [error]
    visited: set[int] = set()
    while waiting:
        seen = waiting.pop(0)
        if id(seen) in visited:
            continue
        visited.add(id(seen))
        if isinstance(seen, OSError) and seen.errno:
            return seen
        if isinstance(seen, BaseExceptionGroup):
            waiting.extend(seen.exceptions)
        waiting.extend(e for e in (seen.__cause__, seen.__context__) if e is not None)
    return None


def _named(error: BaseException) -> str:
    """`httpx.RemoteProtocolError: Server disconnected without sending a response`: the error as a
    reader can look it up (httpx's public name), and its own words."""
    kind = type(error)
    name = f"httpx.{kind.__name__}" if kind.__module__.split(".")[0] == "httpx" else f"{kind.__module__}.{kind.__qualname__}"
    words = str(error).strip().rstrip(".") or failure_words(error)  # empty: the OS's words, if any
    if words == kind.__name__:  # httpx's timeouts say only their own name
        return name
    return f"{name}: {words}"


class _Break(enum.Enum):
    """How a connection broke under a request, as the evidence words it. Only `CLOSED` and `RESET`
    are a peer that let go of the connection, what a retry on a fresh one is for."""

    #: A FIN: httpcore's `Server disconnected without sending a response`, h11's `peer closed
    #: connection without sending complete message body`, a broken pipe.
    CLOSED = "closed the connection"
    #: A TCP reset.
    RESET = "reset the connection"
    #: Bytes httpx could not read as HTTP/1.1 (a bad status line, bad chunk framing).
    GARBLED = "sent bytes that are not HTTP/1.1"
    OTHER = "broke the connection"


def _how_it_broke(error: BaseException) -> _Break:
    os_error = _maybe_os_error(error)
    if os_error is not None and os_error.errno == errno.ECONNRESET:
        return _Break.RESET
    if os_error is not None and os_error.errno == errno.EPIPE:
        return _Break.CLOSED
    if isinstance(error, httpx.RemoteProtocolError):
        words = str(error).lower()
        return _Break.CLOSED if "disconnected" in words or "closed" in words else _Break.GARBLED
    return _Break.OTHER


def transport_words(error: BaseException, *, what: str, before_head: bool, timeout_s: float | None = None) -> str:
    """What a transport failure was, in words, for the evidence (never `HTTP 0`): `the server
    closed the connection before sending a response head (httpx.RemoteProtocolError: Server
    disconnected without sending a response)`. `what` is `the server` or `the gateway`;
    `before_head` says whether the response head had come; `timeout_s` is the read timeout, for a
    timeout's words."""
    where = "before sending a response head" if before_head else "in the middle of the response body"
    if isinstance(error, httpx.TimeoutException):
        waited = f" within {timeout_s:g} s" if timeout_s is not None else " in time"
        return f"{what} sent {'no response head' if before_head else 'no more of the body'}{waited} ({_named(error)})"
    return f"{what} {_how_it_broke(error).value} {where} ({_named(error)})"


def cannot_connect(what: str, url: str, error: BaseException) -> GradeError:
    """The one line for a target that does not accept connections: `what` is `the server` or
    `the gateway`."""
    return GradeError(f"cannot connect to {what} at {url} ({failure_words(error)}); is it running? check --url")


def grading_client(
    *, timeout: httpx.Timeout, api_key: str | None, headers: dict[str, str] | None = None, api_key_header: str | None = None
) -> httpx.AsyncClient:
    """An httpx client that asks for identity bodies, sends `headers`, and `api_key` as a bearer
    token (and also in `api_key_header`, e.g. Anthropic's `x-api-key`, when given)."""
    sent = {**IDENTITY, **(headers or {})}
    if api_key:
        sent["authorization"] = f"Bearer {api_key}"
        if api_key_header:
            sent[api_key_header] = api_key
    return httpx.AsyncClient(timeout=timeout, headers=sent)


def _kept_alive_note(error: BaseException, *, what: str) -> str:
    """The evidence's note for a first attempt sent again (`open_response`)."""
    verb = "reset" if _how_it_broke(error) is _Break.RESET else "closed"
    return (
        f"{what} {verb} a kept-alive connection without `Connection: close` before any byte of the next "
        f"response ({_named(error)}); retried once on a fresh connection, as the SDKs do"
    )


async def open_response(
    client: httpx.AsyncClient, url: str, body: dict[str, Any] | bytes, *, what: str
) -> tuple[httpx.Response, str | None]:
    """POST `body` (JSON, or bytes as they are) to `url`; returns the response with its head read and its body not yet (the
    caller reads it, then closes it), and a note when the first attempt was sent again (else None).

    A server may close a kept-alive connection without saying `Connection: close` (llama.cpp does,
    right after a stream's last chunk, though it answered `Keep-Alive: timeout=5`): its FIN can arrive after httpx handed the idle
    connection to the next request, which then fails before any byte of its response
    (`httpx.RemoteProtocolError: Server disconnected without sending a response`). openai-python
    and anthropic-python retry that (`httpx.TransportError`, their `max_retries`), so the grader
    does too, once: only when the attempt went out on a connection it did not open itself (httpx's
    documented `trace` request extension says whether it connected) and the peer closed or reset it
    before the response head. The failed connection is gone from httpx's pool, and the grader asks
    one request at a time, so the retry opens a fresh one. Every other failure is raised as it came.

    Raises:
        httpx.TransportError: what httpx raised (on the second attempt, when there was one).
    """
    note: str | None = None
    while True:
        opened: list[str] = []
        extensions = {"trace": _connect_recorder(opened)}
        if isinstance(body, bytes):  # sent as it is (a request the target must refuse)
            request = client.build_request(
                "POST", url, content=body, headers={"content-type": "application/json"}, extensions=extensions
            )
        else:
            request = client.build_request("POST", url, json=body, extensions=extensions)
        try:
            return await client.send(request, stream=True), note
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as error:
            if note is not None or opened or _how_it_broke(error) not in (_Break.CLOSED, _Break.RESET):
                raise
            note = _kept_alive_note(error, what=what)


def _connect_recorder(opened: list[str]) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """A `trace` callback that records the connect events (`connection.connect_tcp.started`) of one
    request: none means it went out on a connection the pool kept alive."""

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event.startswith("connection.connect_"):
            opened.append(event)

    return trace


async def fetch_stream(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    *,
    what: str,
    deadline_s: float | None = None,
    dialect: Dialect = Dialect.CHAT,
) -> StreamReading:
    """POST `body` to `url` and read the response as it arrived (in `dialect`), and how it ended.

    The ending is `end`, `transport error: ...` (no response head: `transport_words`; mid-body: the
    transport's words, which the core quotes), `timeout: no byte for N s` (the client's read timeout
    passed between two reads) or `timeout: no end within N s` (`deadline_s` passed). A kept-alive
    connection closed before any byte is asked again once (`open_response`), noted in the reading.

    Raises:
        GradeError: `url` does not accept connections, or sent no response head within the
            client's read timeout: nothing from it can be judged.
    """
    chunks: list[bytes] = []
    status, content_type, content_encoding, ending = 0, "", "", CLEAN_END
    retry_note: str | None = None
    with trio.move_on_after(math.inf if deadline_s is None else deadline_s) as waited:
        try:
            response, retry_note = await open_response(client, url, body, what=what)
        except (httpx.ConnectError, httpx.ConnectTimeout) as error:
            raise cannot_connect(what, url, error) from None
        except httpx.TimeoutException:
            raise GradeError(f"{url} sent no response head within {client.timeout.read:g} s; check --url") from None
        except httpx.TransportError as error:
            ending = f"{TRANSPORT_ERROR}{transport_words(error, what=what, before_head=True)}"
        else:
            try:
                status, content_type = response.status_code, response.headers.get("content-type", "")
                content_encoding = response.headers.get("content-encoding", "")
                async for chunk in response.aiter_raw():
                    chunks.append(chunk)
            except httpx.TimeoutException:
                ending = f"{TIMEOUT}no byte for {client.timeout.read:g} s"
            except httpx.TransportError as error:
                ending = f"{TRANSPORT_ERROR}{failure_words(error)}"
            finally:
                await response.aclose()
    if waited.cancelled_caught:
        ending = f"{TIMEOUT}no end within {deadline_s:g} s"
    return read_stream(
        b"".join(chunks),
        status=status,
        content_type=content_type,
        ending=ending,
        request=body,
        content_encoding=content_encoding,
        dialect=dialect,
        retry_note=retry_note,
    )
