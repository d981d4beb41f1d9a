"""Asking the graded target: one way to fetch a stream's bytes, one way to say it cannot be reached.

Both graders (`server_grader`, `gateway_grader`) read the body as it came off the wire
(`aiter_raw`): the byte-exact cuts and the core's verdict are about those bytes, not about what a
decoder made of them. So every request asks for `accept-encoding: identity`, as finish_fix does
(httpx would otherwise offer gzip, deflate, br and zstd); a body that comes compressed anyway is
recorded with its coding and not read (`StreamReading.compressed`), never judged as if it were SSE.
"""

from __future__ import annotations

import math
import os
from typing import Any

import httpx
import trio

from finishline import Dialect
from labs.grade.card import GradeError
from labs.grade.reading import CLEAN_END, TIMEOUT, TRANSPORT_ERROR, StreamReading, read_stream

__all__ = ["IDENTITY", "cannot_connect", "failure_words", "fetch_stream", "grading_client"]

#: The request header that keeps the body as the target produced it.
IDENTITY = {"accept-encoding": "identity"}


def failure_words(error: BaseException) -> str:
    """The words for a failed connection or transfer: the OS's own for its error number
    (`Connection refused`) when an `OSError` with one is behind it (httpx says `[Errno 111]
    Connection refused`, trio `all attempts to connect to ... failed` over a group of them), else
    the error's own words."""
    waiting: list[BaseException] = [error]
    visited: set[int] = set()
    while waiting:
        seen = waiting.pop(0)
        if id(seen) in visited:
            continue
        visited.add(id(seen))
        if isinstance(seen, OSError) and seen.errno:
            return os.strerror(seen.errno)
        if isinstance(seen, BaseExceptionGroup):
            waiting.extend(seen.exceptions)
        waiting.extend(e for e in (seen.__cause__, seen.__context__) if e is not None)
    return str(error) or type(error).__name__


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

    The ending is `end`, `transport error: ...`, `timeout: no byte for N s` (the client's read
    timeout passed between two reads) or `timeout: no end within N s` (`deadline_s` passed).

    Raises:
        GradeError: `url` does not accept connections, or sent no response head within the
            client's read timeout: nothing from it can be judged.
    """
    chunks: list[bytes] = []
    status, content_type, content_encoding, ending = 0, "", "", CLEAN_END
    with trio.move_on_after(math.inf if deadline_s is None else deadline_s) as waited:
        try:
            async with client.stream("POST", url, json=body) as response:
                status, content_type = response.status_code, response.headers.get("content-type", "")
                content_encoding = response.headers.get("content-encoding", "")
                try:
                    async for chunk in response.aiter_raw():
                        chunks.append(chunk)
                except httpx.TimeoutException:
                    ending = f"{TIMEOUT}no byte for {client.timeout.read:g} s"
        except (httpx.ConnectError, httpx.ConnectTimeout) as error:
            raise cannot_connect(what, url, error) from None
        except httpx.TimeoutException:
            raise GradeError(f"{url} sent no response head within {client.timeout.read:g} s; check --url") from None
        except httpx.TransportError as error:
            ending = f"{TRANSPORT_ERROR}{failure_words(error)}"
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
    )
