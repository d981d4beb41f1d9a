"""No response head: what the client is answered when the upstream never started its response.

The first-token deadline (`RepairPolicy.first_token_timeout`) counts from the moment the request
went upstream (`_deadlines.head_deadline`). When it passes before any response head came, there is
no stream to end with an error event: nothing has been sent to the client yet. The caller answers
the client itself with what `answer_no_head` returns, HTTP 504 and the dialect's own error body
(every client library raises on it, the way it raises on its API's own 504), and abandons the
upstream exchange. It is never a made-up success, whatever `on_cut` says: there is no answer to
finish. The commonest outage there is looks like this: a dead worker behind a live load balancer,
which accepts the connection and never answers.

The error bodies, one per dialect (what each API itself sends for an error status):

* Chat Completions and Responses: OpenAI's `{"error": {"message", "type", "param", "code"}}`;
* Messages: Anthropic's `{"type": "error", "error": {"type", "message"}}`, with the type Anthropic
  gives its own 504 (`timeout_error`);
* Gemini: Google's `{"error": {"code": 504, "message", "status": "DEADLINE_EXCEEDED"}}`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

from ._dialect import Dialect
from ._gemini import error_payload
from ._request import RequestFacts
from ._verdict import Booking, CutCause, Verdict
from ._wording import no_head_detail, no_head_message

__all__ = ["NO_HEAD_STATUS", "NoHeadAnswer", "answer_no_head"]

#: 504 Gateway Timeout: a proxy that did not get a timely response from the server it went to.
NO_HEAD_STATUS = 504
_CONTENT_TYPE = "application/json"
# What Anthropic itself calls its 504 (its API's error types).
_MESSAGES_TIMEOUT_TYPE = "timeout_error"


def _openai_error(message: str) -> dict[str, Any]:
    # The code is the books' cause: a client, a gateway or a person reading the body can match it.
    return {"error": {"message": message, "type": "server_error", "param": None, "code": str(CutCause.NO_RESPONSE_HEAD)}}


def _anthropic_error(message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _MESSAGES_TIMEOUT_TYPE, "message": message}}


def _gemini_error(message: str) -> dict[str, Any]:
    # Google's own error body: its `code` is the response's status (the SDKs compare them).
    return error_payload(message, code=NO_HEAD_STATUS, status="DEADLINE_EXCEEDED")


# The error body of each dialect, from the message it carries.
_ERROR_BODIES: dict[Dialect, Callable[[str], dict[str, Any]]] = {
    Dialect.CHAT: _openai_error,
    Dialect.MESSAGES: _anthropic_error,
    Dialect.RESPONSES: _openai_error,
    Dialect.GEMINI: _gemini_error,
}


class NoHeadAnswer(NamedTuple):
    """The response the client gets instead of the upstream's, and the flow's books."""

    status: int
    content_type: str
    body: bytes
    booking: Booking


def answer_no_head(
    *, dialect: Dialect, timeout: float, request: RequestFacts = RequestFacts(), elapsed: float | None = None
) -> NoHeadAnswer:
    """The answer to a request that got no response head within `timeout` seconds (the first-token
    deadline) of going upstream; `elapsed` is the time since the request started, if known (the
    books' duration). Booked `interrupted` before the first token, cause `no_response_head`."""
    body = json.dumps(_ERROR_BODIES[dialect](no_head_message(timeout)), separators=(",", ":")).encode()
    booking = Booking(
        verdict=Verdict.INTERRUPTED,
        detail=no_head_detail(timeout=timeout, status=NO_HEAD_STATUS),
        model=request.model,
        dialect=dialect,
        events=0,
        upstream_bytes=0,
        client_bytes=len(body),
        duration=elapsed,
        cause=CutCause.NO_RESPONSE_HEAD,
    )
    return NoHeadAnswer(status=NO_HEAD_STATUS, content_type=_CONTENT_TYPE, body=body, booking=booking)
