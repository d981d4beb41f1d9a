"""What the end-to-end tests share: the real clients (openai-python, and httpx for raw bytes), the
assertion for finish_fix's cut error event, and the upstream scripts for every cut of rules C6 and C7."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from tests.chat_streams import chat_stream
from tests.upstream_server import Ending, Framing, Script

__all__ = [
    "ANSWER",
    "API_KEY",
    "CUTS",
    "CUTS_BEFORE_FIRST_TOKEN",
    "PARTIAL",
    "PROMPT",
    "RawResponse",
    "assert_interrupted_error",
    "chat_url",
    "finish_reasons",
    "openai_client",
    "raw_post",
    "stream_completion",
    "text_of",
]

API_KEY = "sk-e2e-SECRET-api-key-0123456789"
PROMPT = "PROMPT-MARKER say hello"
ANSWER = ["ANSWER", "-MARKER", " hello"]
CLIENT_TIMEOUT_S = 15.0


# -- clients ----------------------------------------------------------------------------------------


@contextmanager
def openai_client(base_url: str, **http_options: object) -> Iterator[openai.OpenAI]:
    """The real openai-python client, no retries, a deadline, no proxy from the environment."""
    http_client = openai.DefaultHttpx2Client(trust_env=False, timeout=CLIENT_TIMEOUT_S, **http_options)
    with openai.OpenAI(
        base_url=base_url,
        api_key=API_KEY,
        max_retries=0,
        timeout=CLIENT_TIMEOUT_S,
        http_client=http_client,
    ) as client:
        yield client


def stream_completion(client: openai.OpenAI, received: list | None = None, **request: Any) -> list:
    """Stream a chat completion; return its chunks (also appended to `received` as they come)."""
    chunks = received if received is not None else []
    stream = client.chat.completions.create(
        model="e2e-model", messages=[{"role": "user", "content": PROMPT}], stream=True, **request
    )
    for chunk in stream:
        chunks.append(chunk)
    return chunks


def text_of(chunks: list) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def finish_reasons(chunks: list) -> list:
    return [c.choices[0].finish_reason for c in chunks if c.choices]


@dataclass
class RawResponse:
    status: int
    headers: httpx.Headers
    body: bytes  # as received: transfer-decoded, never content-decoded
    error: Exception | None


def raw_post(url: str, *, body: dict | None = None, headers: dict | None = None) -> RawResponse:
    """POST with httpx and read the body raw; a transport error mid-body is returned, not raised."""
    request_body = body or {"model": "e2e-model", "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
    received = bytearray()
    with httpx.Client(trust_env=False, timeout=CLIENT_TIMEOUT_S) as client:
        with client.stream("POST", url, json=request_body, headers=headers or {}) as response:
            try:
                for piece in response.iter_raw():
                    received += piece
            except httpx.TransportError as error:
                return RawResponse(response.status_code, response.headers, bytes(received), error)
            return RawResponse(response.status_code, response.headers, bytes(received), None)


def chat_url(base: str, prefix: str) -> str:
    return f"{base}{prefix}/v1/chat/completions"


def assert_interrupted_error(error: BaseException) -> None:
    """The error event of rule C6, as openai-python surfaces it (not a transport error)."""
    assert isinstance(error, openai.APIError), f"expected openai.APIError, got {error!r}"
    assert not isinstance(error, openai.APIConnectionError), (
        f"the client saw a transport error, not finish_fix's error event: {error!r}"
    )
    assert error.code == "stream_interrupted", error.body
    assert error.type == "server_error", error.body
    assert re.search(r"interrupted", error.message, re.I), error.message


# -- the cuts of rules C6 and C7 -----------------------------------------------------------------------

PARTIAL = chat_stream(ANSWER, finish_reason=None, done=False)[:2]
CUTS = {
    "fin-mid-chunk": Script(pieces=PARTIAL, ending=Ending.FIN_MID_CHUNK),
    "chunked-body-without-terminator": Script(pieces=PARTIAL, ending=Ending.FIN_MID_CHUNK, cut_tail=b""),
    "tcp-reset": Script(pieces=PARTIAL, ending=Ending.RST, pause_before_end_s=0.3),
    "short-content-length": Script(pieces=PARTIAL, framing=Framing.CONTENT_LENGTH, ending=Ending.SHORT_CONTENT_LENGTH),
    "close-delimited-clean-end-without-done": Script(pieces=PARTIAL, framing=Framing.CLOSE_DELIMITED),
    "chunked-clean-end-without-done": Script(pieces=PARTIAL),
}
CUTS_BEFORE_FIRST_TOKEN = {
    "headers-then-fin": Script(pieces=[], ending=Ending.FIN_MID_CHUNK, cut_tail=b"", pause_before_end_s=0.3),
    "headers-then-reset": Script(pieces=[], ending=Ending.RST, pause_before_end_s=0.3),
    "headers-then-clean-empty-body": Script(pieces=[], framing=Framing.CLOSE_DELIMITED, pause_before_end_s=0.3),
}
