"""The simulated worker's HTTP/1.1 server, on trio.

Routes: `POST .../chat/completions`, `POST .../messages` (Anthropic Messages; not
`.../messages/count_tokens`), `POST .../responses` (OpenAI Responses) and `POST
.../models/{model}:streamGenerateContent` / `:generateContent` (Google Gemini: the model, which
carries the settings, and the stream flag are in the path, `?alt=sse` picks SSE over the JSON-array
form), each answered from the same settings in its dialect (`_COMPLETION_ROUTES`); `GET .../models`; the routers' probes.

h11 parses requests; responses are written as the exact bytes of `labs.worker.wire` (h11 would
choose the framing itself, and the point here is to choose it: chunked, Content-Length or
close-delimited). One connection serves requests one after another (keep-alive) until the client
closes, the settings say `Connection: close`, or the framing is close-delimited; an answer to
anything but a streamed completion (a whole answer, a probe, the model list, a 404) always closes
it (`_probe_answer` and `wire.completion_plan` say why: a tunnel's byte budget is per connection).

For the lab (issue 14): every completion request is an `Attempt` in `RunningWorker.attempts`
(`labs.worker.attempts`); a request for a cell that is not one of `RunningWorker.current_cells`
is refused with 409 and never served (`stale_refusal`); and the conduct faults that hold "once"
(`http_429_retry_after`, `http_500_once`, `reset_before_head`) fail only a cell's first attempt
at this worker, a flapping primary (`primary_503_first`) fails a cell's first attempts, and the
spare (`spare=True`) is spared the primary's failover faults (`WorkerSettings.for_attempt`).
`reset_before_head` and `no_response` are done here, on the socket; every other
knob is bytes (`labs.worker.wire`).
"""

from __future__ import annotations

import json
import socket
import struct
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import h11
import trio

from finishline import Dialect
from labs.worker.attempts import (
    ENDED_CLIENT_GONE,
    ENDED_NO_RESPONSE,
    ENDED_REFUSED_STALE,
    ENDED_RESET,
    Attempt,
    AttemptInProgress,
    request_cell_id,
    response_ending,
)
from labs.worker.gemini_events import gemini_error
from labs.worker.request_reading import gemini_json_array, gemini_request_body
from labs.worker.settings import (
    DEFAULT_MODEL_NAME,
    SETTINGS_HEADER,
    SettingsError,
    WorkerSettings,
    parse_settings,
)
from labs.worker.wire import ResponsePlan, json_plan, response_plan

__all__ = [
    "HOP_HEADERS",
    "STALE_STATUS",
    "HandledRequest",
    "RequestHandler",
    "RunningWorker",
    "completion_dialect",
    "maybe_read_request",
    "open_worker",
    "refusal_plan",
    "relayed_headers",
    "reset_on_close",
    "run_server_cli",
    "send_quietly",
    "serve_http_connection",
    "serve_worker",
    "settings_for_request",
    "stale_refusal",
]

#: Requests larger than this are refused (a lab request is a few KB).
MAX_REQUEST_BYTES = 1 << 20
#: The status of a request for a cell that is not current (409 Conflict: the request is valid, the
#: lab's state is not its cell's any more). A 4xx, so no gateway retries it as a server failure.
STALE_STATUS = 409
#: The worker's name in its attempt records when the lab gives none.
DEFAULT_WORKER_NAME = "worker"


@dataclass(frozen=True, slots=True, kw_only=True)
class HandledRequest:
    """What the worker did for one request, for a lab's books."""

    method: str
    path: str
    #: Effective settings (resolved), None when the request was refused before that.
    settings: WorkerSettings | None
    stream: bool
    status: int
    #: Whether the worker sent `Connection: close`.
    connection_close: bool
    #: `complete`, or `client_gone` when a write failed because the other side closed.
    outcome: str
    #: Response bytes written before the end or the failure.
    bytes_sent: int
    #: The dialect of a completion route, None for the other routes.
    dialect: Dialect | None = None


@dataclass(slots=True, kw_only=True)
class RunningWorker:
    """A worker serving on `host:port`; `handled` grows as requests finish, `arrivals` as they come.

    `attempts`, `current_cells` and `stale_refused` are the lab's (issue 14); `current_cells` may
    be set at any time and holds from the next request on.
    """

    host: str
    port: int
    defaults: WorkerSettings
    #: Requests that got a response (a reset or held `no_response` request is in `attempts` only).
    handled: list[HandledRequest]
    #: The `model` of each served completion request (any dialect), as it arrived (a request in a
    #: long prefill is here before it is in `handled`): which worker a gateway sent a request to.
    arrivals: list[str] = field(default_factory=list)
    #: Its name in `attempts` (`primary`, `spare`).
    name: str = DEFAULT_WORKER_NAME
    #: Every completion request, stale ones included, in order of arrival (`labs.worker.attempts`).
    attempts: list[Attempt] = field(default_factory=list)
    #: The cell ids served; a request naming another cell gets 409 (`stale_refusal`). None: all.
    current_cells: frozenset[str] | None = None
    #: How many requests were refused as stale.
    stale_refused: int = 0
    #: The cell ids (None: requests without one) that had their first attempt here: a "once"
    #: conduct fault fails only that one.
    attempted_cells: set[str | None] = field(default_factory=set)
    #: Per cell id, how many of its attempts this worker answered (a flapping primary's count).
    attempt_counts: dict[str | None, int] = field(default_factory=dict)
    #: Whether this is the lab's spare: the primary's failover faults do not hold here, and its
    #: own model name and usage do (`WorkerSettings.for_attempt`).
    spare: bool = False

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. `http://127.0.0.1:41234/v1`."""
        return f"http://{self.host}:{self.port}/v1"


def settings_for_request(
    defaults: WorkerSettings, headers: dict[str, str], body: dict[str, Any], dialect: Dialect = Dialect.CHAT
) -> WorkerSettings:
    """Effective settings: defaults, then the model name's items, then the header's, resolved
    from the body as `dialect` reads it (`WorkerSettings.for_request`).

    Raises:
        SettingsError: a bad item in the model name or the header.
    """
    settings = defaults
    model = body.get("model")
    if isinstance(model, str) and ";" in model:
        settings = parse_settings(model, base=settings)
    header = headers.get(SETTINGS_HEADER)
    if header:
        settings = parse_settings(header, base=settings)
    return settings.for_request(body, dialect)


async def serve_worker(
    defaults: WorkerSettings | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    handled: list[HandledRequest] | None = None,
    arrivals: list[str] | None = None,
    worker: RunningWorker | None = None,
    spare: bool = False,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled. `await nursery.start(serve_worker, ...)` returns the bound port.

    `worker`: the record to keep (its defaults, lists and lab controls win over the other
    arguments; `open_worker` passes one); without it, one is made from the arguments (`spare`:
    the lab's spare, `RunningWorker.spare`).
    """
    if worker is None:
        worker = RunningWorker(
            host=host,
            port=port,
            defaults=defaults if defaults is not None else WorkerSettings(),
            handled=handled if handled is not None else [],
            arrivals=arrivals if arrivals is not None else [],
            spare=spare,
        )
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound_port = listeners[0].socket.getsockname()[1]
    worker.port = bound_port

    async def handler(stream: trio.SocketStream) -> None:
        await serve_http_connection(stream, partial(_answer, worker=worker), partial(_bad_request, worker.defaults))

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handler, listeners)
        task_status.started(bound_port)


@asynccontextmanager
async def open_worker(
    defaults: WorkerSettings | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    name: str = DEFAULT_WORKER_NAME,
    current_cells: frozenset[str] | None = None,
    spare: bool = False,
) -> AsyncIterator[RunningWorker]:
    """Run a worker for the duration of the block (port 0 = a free port, see `.port`), named `name`
    in its attempt records, serving `current_cells` (None: every request); `spare`: the lab's
    spare (`RunningWorker.spare`)."""
    worker = RunningWorker(
        host=host,
        port=port,
        defaults=defaults if defaults is not None else WorkerSettings(),
        handled=[],
        name=name,
        current_cells=current_cells,
        spare=spare,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve_worker, host=host, port=port, worker=worker))
        yield worker
        nursery.cancel_scope.cancel()


#: Answers one parsed request on the connection; True when the connection can take another.
RequestHandler = Callable[[trio.SocketStream, h11.Request, bytes], Awaitable[bool]]


async def serve_http_connection(
    stream: trio.SocketStream, answer: RequestHandler, bad_request: Callable[[str], ResponsePlan]
) -> None:
    """Serve one HTTP/1.1 connection: parse each request (h11), let `answer` write the response
    bytes itself, and go on while it says the connection stays open. A malformed request gets
    `bad_request(why)` and the connection closes. The worker and the lab's hub (labs.hub) both
    serve their connections with this loop; the stream is closed when it returns.
    """
    buffered = b""
    try:
        while True:
            # A fresh h11 state per request: responses are written without h11, so its state
            # machine would not know the previous response ended. Unparsed bytes carry over.
            parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
            if buffered:  # receive_data(b"") would mean EOF to h11
                parser.receive_data(buffered)
            try:
                maybe_request = await maybe_read_request(stream, parser)
            except h11.RemoteProtocolError as exc:
                await send_quietly(stream, bad_request(f"malformed HTTP request: {exc}"))
                return
            if maybe_request is None:
                return
            request, body = maybe_request
            buffered = parser.trailing_data[0]
            keep_open = await answer(stream, request, body)
            if not keep_open:
                return
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        # The client (or the proxy in front) reset the connection between or during requests:
        # a lab does that on purpose, so it is not a server error.
        return
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def maybe_read_request(stream: trio.SocketStream, parser: h11.Connection) -> tuple[h11.Request, bytes] | None:
    """The next request and its body, or None when the client closed between requests.

    Raises:
        h11.RemoteProtocolError: the bytes are not an HTTP/1.1 request, or the body is too large.
    """
    request = None
    body = bytearray()
    while True:
        event = parser.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            parser.receive_data(data)  # b"" is EOF, which h11 turns into ConnectionClosed
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_REQUEST_BYTES:
                raise h11.RemoteProtocolError("request body too large")
        elif isinstance(event, h11.EndOfMessage):
            assert request is not None
            return request, bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            return None


async def _answer(stream: trio.SocketStream, request: h11.Request, body: bytes, *, worker: RunningWorker) -> bool:
    """Send the response to one request; True when the connection can take another request."""
    arrived_at = trio.current_time()
    defaults = worker.defaults
    method = request.method.decode()
    path = request.target.decode("latin-1").split("?", 1)[0]
    headers = {name.decode().lower(): value.decode("latin-1") for name, value in request.headers}
    client_wants_close = request.http_version != b"1.1" or "close" in headers.get("connection", "").lower()

    settings: WorkerSettings | None = None
    stream_requested = False
    dialect: Dialect | None = None
    attempt: AttemptInProgress | None = None
    #: An ending decided before the send (`refused_stale`).
    decided: str | None = None
    if method == "GET" and path.endswith("/models"):
        plan = _probe_answer(200, {"object": "list", "data": [_model_entry()]})
    elif method == "GET" and (probe := _probe(path)) is not None:
        # What routers (SMG, vllm-router) probe before they route to a worker (labs/gateways).
        plan = _probe_answer(200, _PROBES[probe])
    elif method == "POST" and (dialect := completion_dialect(path)) is not None:
        payload: Any = None
        try:
            payload = json.loads(body or b"{}")
            if not isinstance(payload, dict):
                raise ValueError("the body must be a JSON object")
        except ValueError as exc:
            payload = None
            plan = _bad_request(defaults, str(exc), dialect)
        if payload is not None and dialect is Dialect.GEMINI:
            payload = gemini_request_body(request.target.decode("latin-1"), payload)
        cell = request_cell_id(payload.get("model") if payload is not None else None)
        attempt = AttemptInProgress.open(worker, cell, dialect, arrived_at)
        if payload is None:
            pass
        elif worker.current_cells is not None and cell is not None and cell not in worker.current_cells:
            # A late request of an earlier cell (a gateway still retrying): it must never meet the
            # current cell's settings or fault (issue 14, item 1).
            worker.stale_refused += 1
            plan = stale_refusal(cell, dialect, connection_close=defaults.connection_close)
            decided = ENDED_REFUSED_STALE
        else:
            try:
                settings = settings_for_request(defaults, headers, payload, dialect)
            except SettingsError as exc:
                plan = _bad_request(defaults, str(exc), dialect)
            else:
                earlier = worker.attempt_counts.get(cell, 0)
                settings = settings.for_attempt(earlier, spare=worker.spare)
                worker.attempted_cells.add(cell)
                worker.attempt_counts[cell] = earlier + 1
                worker.arrivals.append(str(payload.get("model")))
                stream_requested = payload.get("stream") is True
                json_array = dialect is Dialect.GEMINI and gemini_json_array(request.target.decode("latin-1"))
                plan = response_plan(settings, stream=stream_requested, dialect=dialect, json_array=json_array)
                if not settings.answers_at_all:
                    return await _fail_on_socket(stream, settings, attempt, worker)
    else:
        plan = _probe_answer(404, _error_body(f"no route for {method} {path}", "not_found"))

    outcome, bytes_sent = await _send_plan(stream, plan, settings, stream_requested, attempt)
    status = int(plan.head.split(b" ", 2)[1])
    if attempt is not None:
        if outcome != "complete":
            attempt.close(worker, ENDED_CLIENT_GONE, status if attempt.head_at is not None else None)
        else:
            attempt.close(worker, decided or response_ending(status), status)
    worker.handled.append(
        HandledRequest(
            method=method,
            path=path,
            settings=settings,
            stream=stream_requested,
            status=status,
            connection_close=b"\r\nconnection: close\r\n" in plan.head,
            outcome=outcome,
            bytes_sent=bytes_sent,
            dialect=dialect,
        )
    )
    return outcome == "complete" and not plan.closes and not client_wants_close


async def _fail_on_socket(
    stream: trio.SocketStream, settings: WorkerSettings, attempt: AttemptInProgress, worker: RunningWorker
) -> bool:
    """`reset_before_head` (reset now, no byte sent) or `no_response` (hold the request, answer
    nothing, until the client goes). Returns False: the connection ends here."""
    if settings.reset_before_head:
        reset_on_close(stream)  # serve_http_connection closes it: a RST, not a FIN
        ended = ENDED_RESET
    else:
        try:
            while await stream.receive_some(65536):
                pass  # the client may send more; nothing is answered
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        ended = ENDED_NO_RESPONSE
    attempt.close(worker, ended, None)
    return False


async def _send_plan(
    stream: trio.SocketStream,
    plan: ResponsePlan,
    settings: WorkerSettings | None,
    streaming: bool,
    attempt: AttemptInProgress | None = None,
) -> tuple[str, int]:
    sent = 0
    try:
        await stream.send_all(plan.head)
        sent += len(plan.head)
        if attempt is not None:
            attempt.note_head(trio.current_time())
        if streaming and settings is not None:
            # The model is in prefill: the head is out (like vLLM), no event yet.
            await trio.sleep(settings.prefill_delay)
        tokens_sent = 0
        last_token = max((i for i, s in enumerate(plan.segments) if s.kind == "token"), default=-1)
        for segment in plan.segments[: last_token + 1]:
            if streaming and settings is not None and segment.kind == "token":
                if tokens_sent:
                    await trio.sleep(settings.token_delay)
                tokens_sent += 1
            await stream.send_all(segment.framed)
            sent += len(segment.framed)
            if attempt is not None and segment.kind == "token":
                attempt.note_first_token(trio.current_time())
        # What follows the last token (finish, usage, an error event, `[DONE]`) and the chunked
        # terminator go out in one write. No setting asks for a gap there, and a gap would let a
        # race decide a gateway's books: a client that stops reading at `[DONE]` or at an error
        # event (openai-node, pi-ai; openai-python when it raises) hangs up at once, and a
        # terminator still on its way then makes Envoy log `DC` for a stream the worker finished
        # (labs/gateways/envoy.py, "Books"). In one write the gateway has the end first.
        tail = b"".join(segment.framed for segment in plan.segments[last_token + 1 :]) + plan.end
        if tail:
            await stream.send_all(tail)
            sent += len(tail)
            if attempt is not None and not streaming and plan.answer.token_events and plan.answer.error is None:
                attempt.note_first_token(trio.current_time())  # a whole body carries the tokens
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return "client_gone", sent
    return "complete", sent


#: Request headers a relay (the hub, the real worker's front) does not send on: one hop's (RFC 9110
#: section 7.6.1) and the body's framing, which the relay sets itself on its fresh upstream connection.
HOP_HEADERS = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"content-length",
        b"expect",
    }
)


def relayed_headers(request: h11.Request, dropped: frozenset[bytes] = HOP_HEADERS) -> list[tuple[bytes, bytes]]:
    """`request`'s headers as received (raw names, in order) but those `dropped` (lower-case names)."""
    return [(name, value) for name, value in request.headers.raw_items() if name.lower() not in dropped]


def reset_on_close(stream: trio.SocketStream) -> None:
    """Make the coming close of `stream` a TCP reset (SO_LINGER with a zero timeout), not a FIN."""
    stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


async def send_quietly(stream: trio.SocketStream, plan: ResponsePlan) -> None:
    try:
        await stream.send_all(plan.to_bytes())
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


#: The completion routes, by the path's end: a gateway may mount the API under any prefix
#: (`/anthropic/v1/messages`). `.../messages/count_tokens` ends otherwise, so it is no completion.
#: Gemini's end in the action after the model (`/v1beta/models/{model}:streamGenerateContent`,
#: Vertex's `/v1beta1/projects/P/locations/L/publishers/google/models/…`, LiteLLM's `/models/…` and
#: its passthrough's `/gemini/…`): only the suffix is common to them all, as finish_fix matches it.
_COMPLETION_ROUTES: tuple[tuple[str, Dialect], ...] = (
    ("/chat/completions", Dialect.CHAT),
    ("/messages", Dialect.MESSAGES),
    ("/responses", Dialect.RESPONSES),
    (":streamGenerateContent", Dialect.GEMINI),
    (":generateContent", Dialect.GEMINI),
)


def completion_dialect(path: str) -> Dialect | None:
    """The dialect of a completion route's path (a trailing `/` allowed), None for other paths."""
    trimmed = path.rstrip("/")
    return next((dialect for end, dialect in _COMPLETION_ROUTES if trimmed.endswith(end)), None)


#: GET probes that routers send a worker, with the answer each gets: SMG and vllm-router poll
#: `/health` before routing and drop a worker that fails it; the others are load and metadata
#: polls whose answers they only log.
_PROBES: dict[str, dict[str, Any]] = {
    "/health": {},
    "/version": {"version": "finishline-worker"},
    "/server_info": {},
    "/get_server_info": {},
    "/v1/loads": {"loads": []},
    "/get_load": {"load": 0},
}


def _probe(path: str) -> str | None:
    """The probe `path` ends with: a router may know the worker by a URL with a path (SMG's lab
    gateway registers one per request model, labs/gateways/smg.py)."""
    return next((probe for probe in _PROBES if path.endswith(probe)), None)


def _model_entry() -> dict[str, Any]:
    return {"id": DEFAULT_MODEL_NAME, "object": "model", "created": 1764000000, "owned_by": "finishline"}


def _error_body(message: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}


def refusal_plan(
    status: int, message: str, code: str, dialect: Dialect | None, *, connection_close: bool = False
) -> ResponsePlan:
    """A 4xx the server itself gives (a bad request, a stale cell), its JSON body in `dialect`'s
    error shape: OpenAI's `{"error": {message, type, param, code}}` (Chat, Responses, no dialect),
    Anthropic's `{"type": "error", "error": {type, message}}` (Messages; it has no codes), Google's
    `{"error": {code, message, status}}` (Gemini), so every SDK shows the message."""
    if dialect is Dialect.MESSAGES:
        body = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    elif dialect is Dialect.GEMINI:
        body = gemini_error(status, message)
    else:
        body = _error_body(message, code)
    return json_plan(status, body, connection_close=connection_close)


def stale_refusal(cell_id: str, dialect: Dialect | None, *, connection_close: bool = False) -> ResponsePlan:
    """The 409 for a request of a cell that is not current (code `stale_cell`), naming the cell."""
    message = (
        f"cell {cell_id} is not one of the lab's current cells: a late request from an earlier "
        "cell is refused, not served (finishline lab)"
    )
    return refusal_plan(STALE_STATUS, message, "stale_cell", dialect, connection_close=connection_close)


def _bad_request(defaults: WorkerSettings, message: str, dialect: Dialect = Dialect.CHAT) -> ResponsePlan:
    return refusal_plan(400, message, "invalid_worker_request", dialect, connection_close=defaults.connection_close)


def _probe_answer(status: int, value: dict[str, Any]) -> ResponsePlan:
    """The answer to anything that is not a completion request (the model list, the routers'
    probes, a 404): Content-Length whatever the framing knob says (the knob is about completions,
    and a client must be able to read these), and always `Connection: close`.

    Why close: a lab fault is a toxiproxy `limit_data` on the tunnel, and toxiproxy counts its
    bytes per TCP connection, across keep-alive requests (toxics/limit_data.go; the budget is laid
    out for one completion, faults/layout.py). A router's probe answered on a connection its pool
    keeps (SMG's health, version and server-info probes, through finish_fix's mitmdump, which keeps
    the tunnel connection of each client connection) handed a cell's request a connection whose
    budget the probe had partly spent: the cell got `message_start` and a ping where the fault
    promised 5 tokens (issue 25). Budgeting bytes per request instead would need a toxic that
    parses HTTP, which toxiproxy has not; closing after a probe keeps every completion on a
    connection of its own budget, whatever the router pools, at the cost of a connect per probe.
    """
    return json_plan(status, value, connection_close=True)


def run_server_cli(serve: Callable[..., Awaitable[None]], *args: Any, host: str, port: int) -> int:
    """Run a standalone server (`python -m labs.worker`, `python -m labs.hub`) until Ctrl-C.

    Returns the exit status: 0 on Ctrl-C, 2 with one line on stderr when it cannot listen.
    """
    try:
        trio.run(serve, *args)
    except KeyboardInterrupt:
        return 0
    except (OSError, BaseExceptionGroup) as error:
        # trio raises the bind failure from inside a nursery, wrapped in an ExceptionGroup.
        while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
            error = error.exceptions[0]
        if not isinstance(error, OSError):
            raise
        print(f"error: cannot listen on {host}:{port}: {error.strerror}; pick another --port", file=sys.stderr)
        return 2
    return 0
