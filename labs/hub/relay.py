"""The hub's HTTP/1.1 relay, on trio: gateway -> hub -> tunnel (toxiproxy) -> worker.

Each request from the gateway is parsed with the worker's own connection loop
(`labs.worker.server.serve_http_connection`) and sent on over a fresh upstream connection, one
per request: toxiproxy's byte counts are per connection, so a cut "after n tokens" must see each
response from its first byte. The response is read with h11 (as a client) and relayed as it
arrives: the head as received, the body in its own framing (chunked: each complete chunk as one
chunk of the same size; close-delimited and Content-Length: the bytes as they come), so a healthy
response reaches the gateway byte for byte. When the tunnel fails, `labs.hub.policy` says what the
gateway gets; for `error_event`, the request's dialect's error ending after the body relayed so far
(read as it goes out by `finishline.StreamErrorWriter`: a Responses ending continues the stream's
response id and sequence numbers).

The policy is read once per request, when it arrives: the lab's runner sets `Hub.on_tunnel_drop`
before each scenario, and a request already in flight keeps the policy it started with.

For the lab (issue 14), as the worker does (`labs.worker.server`): every completion request is an
`Attempt` in `Hub.attempts` (server `hub`); a request whose cell is not one of `Hub.current_cells`
gets the worker's 409 (`stale_refusal`) and is never relayed. The hub reads no events, so it knows
when the first token went through from the worker's own plan for the request: the body bytes up
to the end of the first token event of the healthy stream (`_first_token_end`), counted on a 2xx;
for a real worker, from its captured answer (`Hub.first_token_body_ends`, labs.worker.truth).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial

import h11
import trio

from finishline import Dialect
from labs.hub.policy import (
    ERROR_CODE,
    ERROR_MESSAGE,
    TERMINATOR,
    ConnectionEnd,
    TunnelDropPolicy,
    TunnelFailure,
    after_tunnel_drop,
    bad_gateway_body,
    error_writer,
    parse_policy,
)
from labs.worker.attempts import (
    ENDED_CLIENT_GONE,
    ENDED_REFUSED_STALE,
    Attempt,
    AttemptInProgress,
    request_cell_id,
    response_ending,
    tunnel_ending,
)
from labs.worker.request_reading import gemini_json_array, gemini_request_body
from labs.worker.server import (
    HOP_HEADERS,
    completion_dialect,
    relayed_headers,
    reset_on_close,
    send_quietly,
    serve_http_connection,
    settings_for_request,
    stale_refusal,
)
from labs.worker.settings import Framing, SettingsError, WorkerSettings
from labs.worker.wire import ResponsePlan, json_plan, response_plan

__all__ = ["Hub", "HubExchange", "open_hub", "serve_hub"]

#: Request headers the hub does not send on: a relay's (`HOP_HEADERS`), and the proxy's hop header a
#: gateway may send; the hub sets its own (`content-length`, `connection: close`) on the upstream request.
_DROPPED_HEADERS = HOP_HEADERS | {b"proxy-connection"}


@dataclass(frozen=True, slots=True, kw_only=True)
class HubExchange:
    """What the hub did for one request, for the lab's report."""

    method: str
    path: str
    #: The request's `model` (it carries the lab's cell id), None when the body has none.
    model: str | None
    policy: TunnelDropPolicy
    #: The upstream's status, None when no response head came through.
    status: int | None
    #: `complete`, or how the tunnel failed (`labs.hub.policy.TunnelFailure`), or `gateway_gone`
    #: when the gateway left before the response ended.
    upstream_ending: str
    #: `passed` (the response as it came), or the policy's action (`labs.hub.policy.AfterDrop`).
    action: str
    #: Body bytes the hub relayed from the tunnel (framing excluded; a dropped partial chunk too).
    body_bytes: int

    def summary(self) -> str:
        """One line for a report, e.g. `tunnel fin after 0 body bytes; hub close: clean_end`."""
        if self.upstream_ending == ENDED_REFUSED_STALE:
            return "refused: not a current cell (409)"
        if self.upstream_ending == "complete":
            return f"complete ({self.body_bytes} body bytes)"
        return f"tunnel {self.upstream_ending} after {self.body_bytes} body bytes; hub {self.policy}: {self.action}"


@dataclass(slots=True, kw_only=True)
class Hub:
    """A running hub: where it listens, where it relays to, its policy (settable) and its record."""

    host: str
    port: int
    upstream_host: str
    upstream_port: int
    _policy: TunnelDropPolicy
    exchanges: list[HubExchange] = field(default_factory=list)
    #: Its name in `attempts`.
    name: str = "hub"
    #: Every completion request, stale ones included, in order of arrival (`labs.worker.attempts`).
    attempts: list[Attempt] = field(default_factory=list)
    #: The cell ids relayed; a request naming another cell gets 409 and is not relayed. None: all.
    current_cells: frozenset[str] | None = None
    #: How many requests were refused as stale.
    stale_refused: int = 0
    #: For a real worker (labs.worker.real), per dialect, the body bytes through its captured
    #: answer's first token event (set per scenario run by the runner); None: the simulated
    #: worker's, computed from each request's settings (`_first_token_end`).
    first_token_body_ends: dict[Dialect, int] | None = None

    @property
    def on_tunnel_drop(self) -> TunnelDropPolicy:
        return self._policy

    @on_tunnel_drop.setter
    def on_tunnel_drop(self, value: TunnelDropPolicy | str) -> None:
        # Checked here, so a bad policy fails where it is set, not in the middle of a request.
        self._policy = parse_policy(value)

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT`, no `/v1`: what a gateway's upstream is set to."""
        return f"http://{self.host}:{self.port}"


async def serve_hub(
    *,
    upstream_port: int,
    on_tunnel_drop: TunnelDropPolicy | str = TunnelDropPolicy.CLOSE,
    host: str = "127.0.0.1",
    port: int = 0,
    upstream_host: str = "127.0.0.1",
    task_status: trio.TaskStatus[Hub] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled. `await nursery.start(partial(serve_hub, upstream_port=P))` returns the
    `Hub` (its `.port` is the bound one; set `.on_tunnel_drop` to change the policy).

    Raises:
        ValueError: `on_tunnel_drop` is not a policy (before anything listens).
    """
    hub = Hub(host=host, port=0, upstream_host=upstream_host, upstream_port=upstream_port, _policy=parse_policy(on_tunnel_drop))
    listeners = await trio.open_tcp_listeners(port, host=host)
    hub.port = listeners[0].socket.getsockname()[1]

    async def handler(stream: trio.SocketStream) -> None:
        await serve_http_connection(stream, partial(_relay, hub=hub), _bad_request)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handler, listeners)
        task_status.started(hub)


@asynccontextmanager
async def open_hub(
    *,
    upstream_port: int,
    on_tunnel_drop: TunnelDropPolicy | str = TunnelDropPolicy.CLOSE,
    port: int = 0,
    host: str = "127.0.0.1",
    upstream_host: str = "127.0.0.1",
) -> AsyncIterator[Hub]:
    """Run a hub for the duration of the block, relaying to `upstream_host:upstream_port`."""
    async with trio.open_nursery() as nursery:
        hub = await nursery.start(
            partial(
                serve_hub,
                upstream_port=upstream_port,
                on_tunnel_drop=on_tunnel_drop,
                host=host,
                port=port,
                upstream_host=upstream_host,
            )
        )
        yield hub
        nursery.cancel_scope.cancel()


def _bad_request(message: str) -> ResponsePlan:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_hub_request"}
    return json_plan(400, {"error": error}, connection_close=True)


def _payload_of(body: bytes) -> dict:
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _model_of(payload: dict) -> str | None:
    model = payload.get("model")
    return model if isinstance(model, str) else None


def _first_token_end(request: h11.Request, payload: dict, dialect: Dialect) -> int | None:
    """Body bytes (framing excluded) through the first token event of the worker's healthy stream
    for this request, None when it is no stream, has no token, or its settings do not parse.
    Resolved over the worker's default settings, as the lab's worker runs (`open_worker()`)."""
    if payload.get("stream") is not True:
        return None
    headers = {name.decode().lower(): value.decode("latin-1") for name, value in request.headers}
    try:
        settings = settings_for_request(WorkerSettings(), headers, payload, dialect).after_first_attempt()
    except SettingsError:
        return None
    offset = 0
    json_array = dialect is Dialect.GEMINI and gemini_json_array(request.target.decode("latin-1"))
    for segment in response_plan(settings, stream=True, dialect=dialect, json_array=json_array).segments:
        offset += len(segment.event)
        if segment.kind == "token":
            return offset
    return None


def _upstream_request(request: h11.Request, body: bytes) -> tuple[h11.Connection, bytes]:
    """An h11 client for the upstream connection, and the request bytes to send on it."""
    headers = relayed_headers(request, _DROPPED_HEADERS)
    if not any(name.lower() == b"host" for name, _ in headers):
        headers.append((b"host", b"127.0.0.1"))  # HTTP/1.1 needs one; an HTTP/1.0 gateway may send none
    headers += [(b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    parser = h11.Connection(h11.CLIENT)
    data = parser.send(h11.Request(method=request.method, target=request.target, headers=headers))
    data += parser.send(h11.Data(data=body)) if body else b""
    data += parser.send(h11.EndOfMessage())
    return parser, data


def _framing(response: h11.Response) -> Framing:
    names = {name.lower(): value.lower() for name, value in response.headers.raw_items()}
    if b"chunked" in names.get(b"transfer-encoding", b""):
        return Framing.CHUNKED
    if b"content-length" in names:
        return Framing.CONTENT_LENGTH
    return Framing.CLOSE


def _head(response: h11.Response) -> bytes:
    # The headers as received (h11 keeps each one's original spelling in `raw_items`) under a status
    # line of our own: the hub speaks HTTP/1.1 to the gateway whatever version the tunnel answered with.
    lines = [b"HTTP/1.1 %d %s" % (response.status_code, response.reason)]
    lines += [name + b": " + value for name, value in response.headers.raw_items()]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _closes(response: h11.Response, framing: Framing | None) -> bool:
    connection = b",".join(value.lower() for name, value in response.headers.raw_items() if name.lower() == b"connection")
    return framing is Framing.CLOSE or b"close" in connection


def _failure(error: trio.BrokenResourceError) -> TunnelFailure:
    return TunnelFailure.RESET if isinstance(error.__cause__, ConnectionResetError) else TunnelFailure.FIN


@dataclass(slots=True, kw_only=True)
class _Exchange:
    """One request from the gateway, as the hub relays it: what it asks, and how it is recorded."""

    hub: Hub
    request: h11.Request
    body: bytes
    path: str
    #: Read once, when the request arrives (the module's docstring).
    policy: TunnelDropPolicy
    #: The completion dialect of a POST to a completion route, else None (no attempt is recorded).
    dialect: Dialect | None
    payload: dict
    cell: str | None
    attempt: AttemptInProgress | None
    client_wants_close: bool
    #: Body bytes through the first token event, when known (`_first_token_end`).
    first_token_end: int | None

    @classmethod
    def arrived(cls, request: h11.Request, body: bytes, hub: Hub) -> _Exchange:
        arrived_at = trio.current_time()
        path = request.target.decode("latin-1").split("?", 1)[0]
        dialect = completion_dialect(path) if request.method == b"POST" else None
        payload = _payload_of(body)
        if dialect is Dialect.GEMINI:
            # Gemini's model (the cell id) and stream flag are in its path (labs.worker.request_reading).
            payload = gemini_request_body(request.target.decode("latin-1"), payload)
        cell = request_cell_id(payload.get("model"))
        if dialect is None:
            first_token_end = None
        elif hub.first_token_body_ends is not None:
            first_token_end = hub.first_token_body_ends.get(dialect) if payload.get("stream") is True else None
        else:
            first_token_end = _first_token_end(request, payload, dialect)
        return cls(
            hub=hub,
            request=request,
            body=body,
            path=path,
            policy=hub.on_tunnel_drop,
            dialect=dialect,
            payload=payload,
            cell=cell,
            attempt=AttemptInProgress.open(hub, cell, dialect, arrived_at) if dialect is not None else None,
            client_wants_close=request.http_version != b"1.1"
            or any(name.lower() == b"connection" and b"close" in value.lower() for name, value in request.headers.raw_items()),
            first_token_end=first_token_end,
        )

    @property
    def stale(self) -> bool:
        """A late completion request of an earlier cell: it never reaches the worker."""
        current = self.hub.current_cells
        return self.dialect is not None and self.cell is not None and current is not None and self.cell not in current

    def record(self, status: int | None, ending: str, action: str, body_bytes: int) -> None:
        """Book the exchange (`Hub.exchanges`) and close its attempt with the ending it had."""
        self.hub.exchanges.append(
            HubExchange(
                method=self.request.method.decode(),
                path=self.path,
                # The payload's: a Gemini request's model is its path's (`arrived`), not its body's.
                model=_model_of(self.payload),
                policy=self.policy,
                status=status,
                upstream_ending=ending,
                action=action,
                body_bytes=body_bytes,
            )
        )
        attempt = self.attempt
        if attempt is None:
            return
        sent_status = status if attempt.head_at is not None else None
        if ending == "complete":
            ended = response_ending(status or 0)
        elif ending == "gateway_gone":
            ended = ENDED_CLIENT_GONE
        elif ending == ENDED_REFUSED_STALE:
            ended = ending
        else:
            ended = tunnel_ending(ending)
            if action == "bad_gateway":  # the hub's own 502 goes out right after this record
                attempt.note_head(trio.current_time())
                sent_status = 502
        attempt.close(self.hub, ended, sent_status)


async def _relay(stream: trio.SocketStream, request: h11.Request, body: bytes, *, hub: Hub) -> bool:
    """Relay one request; True when the gateway's connection can take another."""
    exchange = _Exchange.arrived(request, body, hub)
    if exchange.stale:
        # A late request of an earlier cell never reaches the worker.
        hub.stale_refused += 1
        assert exchange.attempt is not None and exchange.dialect is not None and exchange.cell is not None
        exchange.attempt.note_head(trio.current_time())
        exchange.record(409, ENDED_REFUSED_STALE, ENDED_REFUSED_STALE, 0)
        await stream.send_all(stale_refusal(exchange.cell, exchange.dialect).to_bytes())
        return not exchange.client_wants_close
    try:
        upstream = await trio.open_tcp_stream(hub.upstream_host, hub.upstream_port)
    except OSError:
        return await _dropped(
            stream,
            exchange.policy,
            TunnelFailure.UNREACHABLE,
            None,
            exchange.record,
            dialect=exchange.dialect,
            status=None,
            body_bytes=0,
            closes=True,
        )
    async with upstream:
        passed = await _pass_response(stream, upstream, exchange)
    if isinstance(passed, bool):
        return passed
    # The tunnel failed mid-response: answered once the upstream connection is closed.
    return await _dropped(
        stream,
        exchange.policy,
        passed.failure,
        passed.framing,
        exchange.record,
        dialect=exchange.dialect,
        error_frames=passed.error_frames,
        status=passed.status,
        body_bytes=passed.body_bytes,
        closes=passed.closes,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _TunnelDrop:
    """How the tunnel failed a response already under way, for `_dropped` to answer."""

    failure: TunnelFailure
    framing: Framing | None
    #: What `error_event` writes mid-body in the request's dialect.
    error_frames: bytes
    status: int | None
    #: Body bytes the gateway got (a chunk held back for being cut is not counted).
    body_bytes: int
    closes: bool


async def _pass_response(stream: trio.SocketStream, upstream: trio.SocketStream, exchange: _Exchange) -> bool | _TunnelDrop:
    """Send the request up the tunnel and pass the response down to the gateway as it comes; True
    when the gateway's connection can take another request. A tunnel failure before the request
    went up is answered here (`_dropped`); one during the response is returned, to be answered
    once the upstream connection is closed."""
    # Reads what went to the gateway, for the error frames of `error_event` in the request's dialect.
    relayed_body = error_writer(exchange.dialect)
    parser, request_bytes = _upstream_request(exchange.request, exchange.body)
    response: h11.Response | None = None
    framing: Framing | None = None
    chunk = bytearray()
    relayed = 0
    try:
        await upstream.send_all(request_bytes)
    except trio.BrokenResourceError as error:
        # The tunnel failed before it took the request: nothing reached the gateway yet.
        return await _dropped(
            stream,
            exchange.policy,
            _failure(error),
            None,
            exchange.record,
            dialect=exchange.dialect,
            status=None,
            body_bytes=0,
            closes=True,
        )
    try:
        while True:
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError:
                # At EOF: the tunnel closed mid-body (h11: "peer closed connection without
                # sending complete message body"); before EOF: bytes that are no response.
                failure = TunnelFailure.FIN if parser.trailing_data[1] else TunnelFailure.MALFORMED
                break
            if event is h11.NEED_DATA:
                try:
                    data = await upstream.receive_some(65536)
                except trio.BrokenResourceError as error:
                    failure = _failure(error)
                    break
                parser.receive_data(data)  # b"" is EOF
            elif isinstance(event, h11.InformationalResponse):
                continue
            elif isinstance(event, h11.Response):
                response, framing = event, _framing(event)
                await stream.send_all(_head(event))
                if exchange.attempt is not None:
                    exchange.attempt.note_head(trio.current_time())
            elif isinstance(event, h11.Data):
                relayed += len(event.data)
                if framing is Framing.CHUNKED:
                    # Whole chunks only, each as it was framed: a healthy stream passes byte
                    # for byte, and a chunk the tunnel cut in half is never half-forwarded.
                    chunk += event.data
                    if event.chunk_end:
                        await stream.send_all(b"%x\r\n%s\r\n" % (len(chunk), bytes(chunk)))
                        relayed_body.receive_data(bytes(chunk))
                        chunk.clear()
                else:
                    await stream.send_all(event.data)
                    relayed_body.receive_data(event.data)
                assert response is not None
                if (
                    exchange.attempt is not None
                    and exchange.first_token_end is not None
                    and response.status_code < 300
                    and relayed - len(chunk) >= exchange.first_token_end
                ):
                    exchange.attempt.note_first_token(trio.current_time())
            elif isinstance(event, h11.EndOfMessage):
                if framing is Framing.CHUNKED:
                    await stream.send_all(TERMINATOR)
                assert response is not None
                if (
                    exchange.attempt is not None
                    and exchange.payload.get("stream") is not True
                    and response.status_code < 300
                    and relayed
                ):
                    exchange.attempt.note_first_token(trio.current_time())  # a whole body carries the tokens
                exchange.record(response.status_code, "complete", "passed", relayed)
                return not exchange.client_wants_close and not _closes(response, framing)
            else:  # h11.ConnectionClosed before a response: the tunnel closed at once
                failure = TunnelFailure.FIN
                break
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        # Writing to the gateway failed: it left. Nothing to tell it; the upstream closes.
        exchange.record(response.status_code if response else None, "gateway_gone", "none", relayed)
        raise

    return _TunnelDrop(
        failure=failure,
        framing=framing,
        error_frames=relayed_body.error_frames(ERROR_MESSAGE, code=ERROR_CODE),
        status=response.status_code if response else None,
        body_bytes=relayed - len(chunk),
        closes=exchange.client_wants_close or (response is not None and _closes(response, framing)),
    )


async def _dropped(
    stream: trio.SocketStream,
    policy: TunnelDropPolicy,
    failure: TunnelFailure,
    framing: Framing | None,
    record,
    *,
    dialect: Dialect | None,
    error_frames: bytes = b"",
    status: int | None,
    body_bytes: int,
    closes: bool,
) -> bool:
    """Answer the gateway after a tunnel failure, as the policy says; True to keep its connection.
    `error_frames`: what `error_event` writes mid-body (none before a head: that is the 502)."""
    answer = after_tunnel_drop(policy, failure, framing=framing, error_frames=error_frames)
    record(status, failure.value, answer.action, body_bytes)
    if answer.action == "bad_gateway":
        await send_quietly(stream, json_plan(502, bad_gateway_body(dialect), connection_close=True))
        return False
    if answer.send:
        await stream.send_all(answer.send)
    if answer.end is ConnectionEnd.RESET:
        reset_on_close(stream)
    return answer.end is ConnectionEnd.KEEP and not closes
