"""What the hub sends its client (the gateway) when its upstream (the worker's tunnel) fails.

Pure data and small functions: no sockets, no clock. `labs.hub.relay` asks `after_tunnel_drop` what
to write and how to end the connection, and does it.

Theory of operation
-------------------
The hub relays one response at a time from the tunnel to the gateway. The tunnel can fail before
the response head has come through (nothing was sent to the gateway yet) or in the middle of the
body (the head and some complete chunks are out). It fails with a FIN (a clean TCP close in the
middle of a body that says it is longer: an unfinished chunked body or a short Content-Length) or
with a reset. A close-delimited body cannot be cut by a FIN as HTTP sees it: its end *is* a FIN,
so only a reset is a failure there.

Mid-body, the scenario's policy (`[hub] on_tunnel_drop`) decides, per body framing:

    policy        chunked                          close-delimited       Content-Length
    close         `0\\r\\n\\r\\n` (a clean end)        FIN (a clean end)     FIN (short body)
    error_event   the error frames as a chunk,     the frames, then FIN  FIN (short body)
                  then `0\\r\\n\\r\\n`
    abort         the tunnel's failure as it came: a FIN as a FIN, a reset as a reset

`close` is the hub of the post-mortem: the gateway sees a complete response that never finished.
`error_event` is the fixed hub: it says why, in the request's dialect, then ends cleanly (no
`[DONE]`, no `message_stop` after it). The error frames are finish_fix's own for a cut
(`finishline.StreamErrorWriter`) in the hub's words (`ERROR_MESSAGE`, code `ERROR_CODE`):

    chat       `data: {"error": {...}}` (`ERROR_EVENT`, byte for byte)
    messages   `event: error`, `{"type":"error","error":{"type":"api_error","message":...}}`
    responses  `event: error` (OpenAI's error event, flat and nested), then `event: response.failed`
               (the stream's response, `status: "failed"`, its `error`), sequence numbers continued

A Content-Length body has no clean end short of its length, so it gets a FIN whatever the policy
(no lab scenario streams with Content-Length framing through the hub; the row is here so the
function is total). An incomplete chunk at the drop is never forwarded (a partial chunk is not a
chunk), as finish_fix drops an incomplete event.

Before the head, `close` and `error_event` answer 502 with a JSON error in the request's dialect's
shape (`bad_gateway_body`), as a reverse proxy does; `abort` passes the failure on (a FIN or a
reset, no response at all).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from finishline import Dialect, StreamErrorWriter
from labs.worker.settings import Framing

__all__ = [
    "BAD_GATEWAY_BODY",
    "ERROR_CODE",
    "ERROR_EVENT",
    "ERROR_MESSAGE",
    "TERMINATOR",
    "AfterDrop",
    "ConnectionEnd",
    "TunnelDropPolicy",
    "TunnelFailure",
    "after_tunnel_drop",
    "bad_gateway_body",
    "error_writer",
    "parse_policy",
]

#: The fixed hub's words for a dropped tunnel, and its code (Chat and Responses carry a code).
ERROR_MESSAGE = "agent disconnected mid-request"
ERROR_CODE = "worker_disconnected"
#: The fixed hub's Chat event, byte for byte (issue 7): one `data:` line and a blank line.
ERROR_EVENT = StreamErrorWriter(Dialect.CHAT).error_frames(ERROR_MESSAGE, code=ERROR_CODE)
#: The JSON body of the hub's 502, when the tunnel failed before a response head came through.
BAD_GATEWAY_BODY = {
    "error": {"message": "the worker's tunnel failed before a response", "type": "server_error", "code": "worker_unreachable"}
}


def bad_gateway_body(dialect: Dialect | None) -> dict:
    """The 502's body in `dialect`'s error shape: Anthropic's `{"type": "error", "error": {type,
    message}}` for Messages (an `api_error`: Anthropic's errors have no code), Google's `{"error":
    {code, message, status}}` for Gemini, else `BAD_GATEWAY_BODY`, OpenAI's."""
    if dialect is Dialect.MESSAGES:
        return {"type": "error", "error": {"type": "api_error", "message": BAD_GATEWAY_BODY["error"]["message"]}}
    if dialect is Dialect.GEMINI:  # Google's shape: `code` the status, a status word
        return {"error": {"code": 502, "message": BAD_GATEWAY_BODY["error"]["message"], "status": "UNAVAILABLE"}}
    return BAD_GATEWAY_BODY


#: The end of a chunked body.
TERMINATOR = b"0\r\n\r\n"


class TunnelDropPolicy(enum.StrEnum):
    """`[hub] on_tunnel_drop`: what the hub does when the tunnel fails mid-response."""

    #: End the response cleanly (the post-mortem's hub: the failure disappears).
    CLOSE = "close"
    #: Send the request's dialect's error frames (Chat: `ERROR_EVENT`), then end cleanly (the fixed hub).
    ERROR_EVENT = "error_event"
    #: Pass the failure on as a transport failure: FIN as FIN, reset as reset.
    ABORT = "abort"


class TunnelFailure(enum.StrEnum):
    """How the tunnel failed, as the hub saw it on its upstream connection."""

    #: The tunnel closed (EOF) before the response was complete.
    FIN = "fin"
    #: The tunnel reset the connection (ECONNRESET).
    RESET = "reset"
    #: The tunnel could not be reached (connection refused).
    UNREACHABLE = "unreachable"
    #: The tunnel sent bytes that are not an HTTP/1.1 response.
    MALFORMED = "malformed"


class ConnectionEnd(enum.StrEnum):
    """What the hub does with the gateway's connection after `AfterDrop.send`."""

    #: Nothing: the response is complete and the connection may serve another request.
    KEEP = "keep"
    #: Close it (FIN).
    FIN = "fin"
    #: Reset it (SO_LINGER 0, then close).
    RESET = "reset"


@dataclass(frozen=True, slots=True, kw_only=True)
class AfterDrop:
    """The hub's answer to a tunnel failure: these bytes, then this end."""

    send: bytes
    end: ConnectionEnd
    #: One word for the hub's record: `clean_end`, `error_event`, `fin`, `reset` or `bad_gateway`.
    action: str


def parse_policy(value: object) -> TunnelDropPolicy:
    """A policy from its TOML / command-line spelling.

    Raises:
        ValueError: not one of the policies; the message names the value and the valid ones.
    """
    if isinstance(value, str):  # (TOML may hold any value here)
        try:
            return TunnelDropPolicy(value)
        except ValueError:
            pass
    valid = ", ".join(p.value for p in TunnelDropPolicy)
    raise ValueError(f"on_tunnel_drop {value!r} is not one of {valid}")


def _passed_on(failure: TunnelFailure) -> AfterDrop:
    if failure is TunnelFailure.RESET:
        return AfterDrop(send=b"", end=ConnectionEnd.RESET, action="reset")
    return AfterDrop(send=b"", end=ConnectionEnd.FIN, action="fin")


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class _Send(enum.Enum):
    """What a mid-body answer writes before its end."""

    NOTHING = enum.auto()
    TERMINATOR = enum.auto()
    ERROR = enum.auto()
    #: The error frames as one chunk, then the terminator.
    ERROR_CHUNK_AND_TERMINATOR = enum.auto()


#: Mid-body answers of the non-abort policies, by (policy, framing): the table in the docstring.
_MID_BODY = {
    (TunnelDropPolicy.CLOSE, Framing.CHUNKED): (_Send.TERMINATOR, ConnectionEnd.KEEP, "clean_end"),
    (TunnelDropPolicy.CLOSE, Framing.CLOSE): (_Send.NOTHING, ConnectionEnd.FIN, "clean_end"),
    (TunnelDropPolicy.CLOSE, Framing.CONTENT_LENGTH): (_Send.NOTHING, ConnectionEnd.FIN, "fin"),
    (TunnelDropPolicy.ERROR_EVENT, Framing.CHUNKED): (_Send.ERROR_CHUNK_AND_TERMINATOR, ConnectionEnd.KEEP, "error_event"),
    (TunnelDropPolicy.ERROR_EVENT, Framing.CLOSE): (_Send.ERROR, ConnectionEnd.FIN, "error_event"),
    (TunnelDropPolicy.ERROR_EVENT, Framing.CONTENT_LENGTH): (_Send.NOTHING, ConnectionEnd.FIN, "fin"),
}


def error_writer(dialect: Dialect | None) -> StreamErrorWriter:
    """The reader of one relayed body that writes the hub's error frames at a drop, in `dialect`
    (None, a request on no completion route: Chat's frame, the hub's only one before dialects)."""
    return StreamErrorWriter(dialect if dialect is not None else Dialect.CHAT)


def after_tunnel_drop(
    policy: TunnelDropPolicy, failure: TunnelFailure, *, framing: Framing | None, error_frames: bytes = ERROR_EVENT
) -> AfterDrop:
    """What to send the gateway after the tunnel failed; `framing` None: no head was sent yet.
    `error_frames` is what `error_event` writes (the relay's `error_writer(...).error_frames(...)`
    for the request's dialect and the body so far; Chat's `ERROR_EVENT` when not given).

    Before the head the answer for `close` and `error_event` is `action="bad_gateway"` with empty
    `send`: the relay writes the 502 itself (a whole response with `BAD_GATEWAY_BODY`).
    """
    if policy is TunnelDropPolicy.ABORT:
        return _passed_on(failure)
    if framing is None:
        return AfterDrop(send=b"", end=ConnectionEnd.FIN, action="bad_gateway")
    send, end, action = _MID_BODY[(policy, framing)]
    payload = {
        _Send.NOTHING: b"",
        _Send.TERMINATOR: TERMINATOR,
        _Send.ERROR: error_frames,
        _Send.ERROR_CHUNK_AND_TERMINATOR: _chunk(error_frames) + TERMINATOR,
    }[send]
    return AfterDrop(send=payload, end=end, action=action)
