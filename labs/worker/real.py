"""A real model server as the lab's worker: llama.cpp started by the lab, or any OpenAI-compatible
server by URL, behind a thin front that keeps the lab's records.

Theory of operation. The lab's gateways, hub and tunnel stay as they are; where the simulated
worker listened, the front listens (in the lab's process, on trio, like the simulated worker):
`gateway -> [hub] -> tunnel (toxiproxy) -> front -> real server`. The front does for a real server
what the simulated worker does for itself, and nothing more:

- it keeps the lab's records: every completion request is an `Attempt` (`labs.worker.attempts`),
  its model in `arrivals` (which worker answered a cell), and a request of a cell that is not
  current is refused 409 (`stale_refusal`, issue 14), never sent on;
- it makes every cell's request the same request, as the simulated worker pins its settings
  (`labs.scenario.load_scenario`): the `model` becomes the server's (the lab's model name carries
  the cell id, which the server does not know), the output limit becomes the run's
  (`RealWorker.max_tokens`, in the dialect's field), and the temperature 0 (greedy: a client that
  asks for its own would get another answer than the captured one);
- it relays the server's response byte for byte, head included, as it arrives; a server that
  resets the connection is reset on, a close is a close. Each request goes to the server on a
  fresh connection with `Connection: close`, so the response ends where the server's bytes end
  (llama.cpp answers it with `Connection: close` in the head, which the gateways then see).
- it does the one conduct fault that is the connection's, not the model's: `reset_before_head`
  (read from the lab's model name as the simulated worker reads it), a reset before any byte on a
  cell's first attempt. Every other knob of the simulated worker shapes its answer, which a real
  server gives itself: a scenario that needs one is `n/a` (`needs_simulated_worker`);
- it answers the routers' probes (`/health`, `/version`, ...) and `GET .../models` itself, as the
  simulated worker does: those are the lab's routing, not the model's answer.

What the server answers is learnt from the server (`capture_answer`): the healthy answer to a
cell's request, captured twice through the front (they must agree, as `faults.probe` checks), is
the expected text, reason and token events, and its layout places the cuts.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import h11
import trio

from faults.layout import CapturedLayout, layout_from_capture
from faults.probe import capture_response, same_layout
from finishline import Dialect
from labs.worker.attempts import (
    ENDED_CLIENT_GONE,
    ENDED_CLOSED,
    ENDED_REFUSED_STALE,
    ENDED_RESET,
    Attempt,
    AttemptInProgress,
    request_cell_id,
    response_ending,
)
from labs.worker.server import (
    _PROBES,
    HOP_HEADERS,
    _error_body,
    _probe,
    _probe_answer,
    completion_dialect,
    refusal_plan,
    relayed_headers,
    reset_on_close,
    send_quietly,
    serve_http_connection,
    stale_refusal,
)
from labs.worker.settings import SettingsError, WorkerSettings, parse_settings

__all__ = [
    "LLAMA_CPP",
    "SIMULATED",
    "RealUpstream",
    "RealWorker",
    "RealWorkerError",
    "discover_model",
    "needs_simulated_worker",
    "open_real_worker",
    "parse_worker_url",
    "pinned_body",
]

#: `--worker` words besides a URL.
SIMULATED = "simulated"
LLAMA_CPP = "llama.cpp"
#: The output limit of every request to a real worker when a scenario sets none: above the
#: lab prompt's natural answer (SmolLM2-135M: 10 tokens, `stop`), so it ends on its own, and low
#: enough that a model that rambles ends in seconds on a CPU.
DEFAULT_REAL_MAX_TOKENS = 48
#: The field that carries the output limit, per dialect.
_LIMIT_FIELDS = {Dialect.CHAT: "max_tokens", Dialect.MESSAGES: "max_tokens", Dialect.RESPONSES: "max_output_tokens"}
#: Fields a client may send that would make the answer differ from the captured one.
_SAMPLING_FIELDS = ("top_p", "top_k", "seed", "min_p", "max_completion_tokens")


#: Worker settings a real worker runs with: those the front does on the socket, and those that
#: only shape the simulated worker's own answer (its length, its pace, the fields every request
#: pins), which a real model gives itself.
_REAL_WORKER_SETTINGS = frozenset(
    {"reset_before_head", "connection_close", "tokens", "token_delay", "prefill_delay", "n", "include_usage", "max_tokens"}
)


def needs_simulated_worker(settings: WorkerSettings, *, faulted: bool = True) -> tuple[str, ...]:
    """The settings a scenario's worker has that only the simulated worker can honour (the
    stream's own defects, status codes, reasoning, tool calls...), by name; () if a real one can.
    `connection_close` is one it can: the front asks every response with `Connection: close`. A
    scenario without a fault (`faulted`) whose point is the worker's pace (`prefill_delay`: a slow
    first token) needs the simulated worker too: a real one keeps its own pace.
    """
    defaults = WorkerSettings()
    allowed = _REAL_WORKER_SETTINGS if faulted else _REAL_WORKER_SETTINGS - {"prefill_delay"}
    return tuple(
        name
        for name in WorkerSettings.__dataclass_fields__
        if name not in allowed and getattr(settings, name) != getattr(defaults, name)
    )


class RealWorkerError(ValueError):
    """A real worker cannot be used as given (bad URL, no model); the message says what to do."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RealUpstream:
    """Where the real server is: `http://host:port` and the path its OpenAI routes sit under
    (`/v1` for `http://host:port/v1`), the model to ask for, and what it is, for the reports."""

    host: str
    port: int
    #: The base URL's path, without a trailing `/` (`/v1`); the lab's `/v1/...` routes map onto it.
    path: str
    model: str
    #: What the reports name: `worker` (`llama.cpp` or the URL), `model`, and for llama.cpp
    #: `model_file`, `xllamacpp_version`, `llama_cpp_version`.
    facts: dict[str, Any]

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}{self.path}"

    def target(self, lab_path: str) -> str:
        """The server's path for a lab route (`/v1/chat/completions` -> PATH`/chat/completions`)."""
        rest = lab_path.split("/v1", 1)[1] if lab_path.startswith("/v1") else lab_path
        return f"{self.path}{rest}"


def parse_worker_url(url: str) -> tuple[str, int, str]:
    """`http://host:port/path` -> (host, port, path without a trailing `/`).

    Raises:
        RealWorkerError: not an `http://` URL with a host (https is not relayed: the tunnel and the
            front speak plain HTTP, as the lab's gateways do to their upstreams).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise RealWorkerError(
            f"--worker {url!r}: not simulated, llama.cpp or an http:// base URL (e.g. http://127.0.0.1:8080/v1)"
        )
    try:
        port = parts.port or 80
    except ValueError:
        raise RealWorkerError(f"--worker {url!r}: the port is not a number") from None
    return parts.hostname, port, parts.path.rstrip("/")


def discover_model(base_url: str, timeout: float = 30.0) -> str:
    """The first model `GET BASE/models` lists (OpenAI's `data[].id`).

    Raises:
        RealWorkerError: the server does not answer, or lists no model (then `--worker-model` names it).
    """
    url = f"{base_url.rstrip('/')}/models"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            listed = json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", None) or error
        raise RealWorkerError(
            f"GET {url} failed ({reason}): is the server running? or name the model with --worker-model"
        ) from None
    data = listed.get("data") if isinstance(listed, dict) else None
    ids: list[str] = [entry["id"] for entry in data or () if isinstance(entry, dict) and isinstance(entry.get("id"), str)]
    if not ids:
        raise RealWorkerError(f"GET {url} lists no model: name it with --worker-model")
    return ids[0]


@dataclass(slots=True, kw_only=True)
class RealWorker:
    """The front of a real server: where it listens, where it relays, and the lab's records (the
    fields `labs.worker.server.RunningWorker` has for the lab: `arrivals`, `attempts`,
    `current_cells`, `stale_refused`)."""

    host: str
    port: int
    upstream: RealUpstream
    name: str = "primary"
    #: The output limit every request gets (set per scenario run by the runner).
    max_tokens: int = DEFAULT_REAL_MAX_TOKENS
    arrivals: list[str] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    current_cells: frozenset[str] | None = None
    stale_refused: int = 0
    #: The cells that had their first attempt here (`reset_before_head` fails only that one).
    attempted_cells: set[str | None] = field(default_factory=set)
    #: Per dialect, where the server's first token event ends in its response (bytes from the
    #: first, head included: the captured layout's), for the attempts' first-token time; set per
    #: scenario run by the runner. A dialect not in it: no first-token time.
    first_token_ends: dict[Dialect, int] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def facts(self) -> dict[str, Any]:
        return self.upstream.facts


def pinned_body(payload: dict[str, Any], dialect: Dialect, *, model: str, max_tokens: int) -> dict[str, Any]:
    """A cell's request as the real server gets it (module docstring): the server's model, the
    run's output limit in the dialect's field, temperature 0, no other sampling fields."""
    body = {key: value for key, value in payload.items() if key not in _SAMPLING_FIELDS}
    body["model"] = model
    body[_LIMIT_FIELDS[dialect]] = max_tokens
    body["temperature"] = 0
    return body


@asynccontextmanager
async def open_real_worker(
    upstream: RealUpstream, *, name: str = "primary", host: str = "127.0.0.1"
) -> AsyncIterator[RealWorker]:
    """Run the front of `upstream` for the duration of the block, on `host` and a free port."""
    listeners = await trio.open_tcp_listeners(0, host=host)
    worker = RealWorker(host=host, port=listeners[0].socket.getsockname()[1], upstream=upstream, name=name)

    async def handler(stream: trio.SocketStream) -> None:
        await serve_http_connection(stream, partial(_answer, worker=worker), _bad_request)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handler, listeners)
        yield worker
        nursery.cancel_scope.cancel()


def _bad_request(message: str) -> Any:
    return refusal_plan(400, message, "invalid_worker_request", None, connection_close=True)


async def _answer(stream: trio.SocketStream, request: h11.Request, body: bytes, *, worker: RealWorker) -> bool:
    """Answer one request (module docstring); True when the connection can take another."""
    arrived_at = trio.current_time()
    method = request.method.decode()
    path = request.target.decode("latin-1").split("?", 1)[0]
    dialect = completion_dialect(path) if method == "POST" else None
    # An answer of the front's own to a completion request (400, 409) keeps the connection unless
    # the client asked to close it.
    keep_open = request.http_version == b"1.1" and not any(
        name.lower() == b"connection" and b"close" in value.lower() for name, value in request.headers.raw_items()
    )
    if dialect is None:
        # Anything else closes, as the simulated worker's answers do (`_probe_answer` says why: a
        # probe on a connection a router pools would spend a cell's byte budget on the tunnel).
        if method == "GET" and path.endswith("/models"):
            entry = {"id": worker.upstream.model, "object": "model", "created": 1764000000, "owned_by": "finishline"}
            await send_quietly(stream, _probe_answer(200, {"object": "list", "data": [entry]}))
        elif method == "GET" and (probe := _probe(path)) is not None:
            await send_quietly(stream, _probe_answer(200, _PROBES[probe]))
        else:
            await send_quietly(stream, _probe_answer(404, _error_body(f"no route for {method} {path}", "not_found")))
        return False
    if dialect not in REAL_WORKER_DIALECTS:
        # A Gemini request: the server behind the front speaks no Gemini (the lab runs no such cell).
        spoken = ", ".join(d.value for d in REAL_WORKER_DIALECTS)
        message = f"the real worker's front relays no {dialect.value} route (it speaks {spoken})"
        await send_quietly(stream, refusal_plan(404, message, "not_found", dialect, connection_close=True))
        return False
    try:
        payload = json.loads(body or b"{}")
        if not isinstance(payload, dict):
            raise ValueError("the body must be a JSON object")
    except ValueError as error:
        await send_quietly(stream, refusal_plan(400, str(error), "invalid_worker_request", dialect))
        return keep_open
    cell = request_cell_id(payload.get("model"))
    attempt = AttemptInProgress.open(worker, cell, dialect, arrived_at)
    if worker.current_cells is not None and cell is not None and cell not in worker.current_cells:
        worker.stale_refused += 1
        attempt.note_head(trio.current_time())
        await send_quietly(stream, stale_refusal(cell, dialect))
        attempt.close(worker, ENDED_REFUSED_STALE, 409)
        return keep_open
    first_attempt = cell not in worker.attempted_cells
    worker.attempted_cells.add(cell)
    if cell is None:
        # Not a lab cell (the lab's own capture, a user's request): the body's own limit and
        # sampling stand; only the model is the server's.
        pinned = {**payload, "model": worker.upstream.model}
    else:
        if first_attempt and _lab_settings(payload).reset_before_head:
            reset_on_close(stream)  # serve_http_connection closes it: a reset, before any byte
            attempt.close(worker, ENDED_RESET, None)
            return False
        worker.arrivals.append(str(payload.get("model")))
        pinned = pinned_body(payload, dialect, model=worker.upstream.model, max_tokens=worker.max_tokens)
    return await _relay(stream, request, path, json.dumps(pinned).encode(), attempt, worker)


def _lab_settings(payload: dict[str, Any]) -> WorkerSettings:
    """The simulated worker's settings the lab's model name carries (the front reads only
    `reset_before_head` of them); the defaults if it carries none or bad ones."""
    model = payload.get("model")
    try:
        return parse_settings(model) if isinstance(model, str) else WorkerSettings()
    except SettingsError:
        return WorkerSettings()


#: Request headers not sent on: a relay's (`HOP_HEADERS`), and `host`, which names the server.
_DROPPED_HEADERS = HOP_HEADERS | {b"host"}
_STATUS = re.compile(rb"^HTTP/1\.[01] (\d{3})")


async def _relay(
    stream: trio.SocketStream, request: h11.Request, path: str, body: bytes, attempt: AttemptInProgress, worker: RealWorker
) -> bool:
    """Send the pinned request to the server on a fresh connection and pass its bytes on as they
    come until it closes; False: the connection to the gateway ends with the server's."""
    upstream = worker.upstream
    headers = relayed_headers(request, _DROPPED_HEADERS)
    lines = [
        f"{request.method.decode()} {upstream.target(path)} HTTP/1.1".encode(),
        f"host: {upstream.host}:{upstream.port}".encode(),
    ]
    lines += [name + b": " + value for name, value in headers]
    lines += [f"content-length: {len(body)}".encode(), b"connection: close"]
    data = b"\r\n".join(lines) + b"\r\n\r\n" + body
    status: int | None = None
    head = b""  # the server's head while it is incomplete
    head_sent = False
    relayed = 0
    first_token_end = worker.first_token_ends.get(attempt.dialect) if attempt.dialect is not None else None
    try:
        server = await trio.open_tcp_stream(upstream.host, upstream.port)
    except OSError as error:
        attempt.note_head(trio.current_time())
        message = f"the real worker at {upstream.base_url} is unreachable: {error.strerror or error}"
        await send_quietly(stream, refusal_plan(502, message, "worker_unreachable", attempt.dialect, connection_close=True))
        attempt.close(worker, response_ending(502), 502)
        return False
    async with server:
        try:
            while True:
                try:
                    if data:
                        await server.send_all(data)  # the request, once
                        data = b""
                    chunk = await server.receive_some(65536)
                except trio.BrokenResourceError as error:
                    reset = isinstance(error.__cause__, ConnectionResetError)
                    await _pass_on(stream, head)  # a part of a head that came is passed on
                    if reset:
                        reset_on_close(stream)  # a reset is passed on as a reset
                    attempt.close(worker, _ending_before_head(reset) if status is None else response_ending(status), status)
                    return False
                if not chunk:
                    break
                if not head_sent:
                    # The head is held until it is whole, so it can be made to say the connection
                    # closes (the front always closes it after the response).
                    head += chunk
                    if status is None and (match := _STATUS.match(head)) is not None:
                        status = int(match.group(1))
                        attempt.note_head(trio.current_time())
                    if (blank := head.find(b"\r\n\r\n")) < 0:
                        continue
                    chunk, head, head_sent = _closing_head(head[: blank + 2]) + head[blank + 2 :], b"", True
                await stream.send_all(chunk)
                relayed += len(chunk)
                if first_token_end is not None and status is not None and status < 300 and relayed >= first_token_end:
                    attempt.note_first_token(trio.current_time())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            attempt.close(worker, ENDED_CLIENT_GONE, status)
            return False
    await _pass_on(stream, head)  # the server ended inside its head: what came is passed on
    attempt.close(worker, _ending_before_head(reset=False) if status is None else response_ending(status), status)
    return False


async def _pass_on(stream: trio.SocketStream, data: bytes) -> None:
    """Send what is held to the gateway, if anything, unless it has left."""
    if data:
        with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(data)


def _ending_before_head(reset: bool) -> str:
    """How an attempt ended that the server ended before a status line: the gateway got what the
    server did, a reset or a FIN (not `client_gone`: the gateway did not leave)."""
    return ENDED_RESET if reset else ENDED_CLOSED


def _closing_head(head: bytes) -> bytes:
    """The server's head (its lines, each with its CRLF, without the blank line) saying
    `connection: close`: the front asked for it, and closes the connection after the response
    whatever the server says, so a head that would keep it alive gets its connection headers
    replaced (llama.cpp's server echoes `Connection: close`; another server may not)."""
    status_line, *lines = head.split(b"\r\n")[:-1]
    names = [line.partition(b":")[0].strip().lower() for line in lines]
    for name, line in zip(names, lines, strict=True):
        if name == b"connection" and b"close" in [t.strip().lower() for t in line.partition(b":")[2].split(b",")]:
            return head
    kept = [line for name, line in zip(names, lines, strict=True) if name not in (b"connection", b"keep-alive")]
    return b"\r\n".join([status_line, *kept, b"connection: close"]) + b"\r\n"


# -- the truth, from the server ----------------------------------------------------------------

#: The lab's route for each dialect (the front maps it onto the server's base path).
ROUTES = {Dialect.CHAT: "/v1/chat/completions", Dialect.MESSAGES: "/v1/messages", Dialect.RESPONSES: "/v1/responses"}
#: The dialects a real worker runs in: the routes the front relays (llama.cpp and the OpenAI-compatible
#: servers speak no Gemini; a Gemini cell needs the simulated worker).
REAL_WORKER_DIALECTS: tuple[Dialect, ...] = tuple(ROUTES)


def capture_body(dialect: Dialect, *, prompt: str, model: str, max_tokens: int) -> dict[str, Any]:
    """The request a cell's client makes, as the front sends it on (`pinned_body`): the prompt as
    the one user message, streamed."""
    message = {"role": "user", "content": prompt}
    body: dict[str, Any] = {"model": model, "stream": True}
    if dialect is Dialect.RESPONSES:
        body["input"] = [message]
    else:
        body["messages"] = [message]
    return pinned_body(body, dialect, model=model, max_tokens=max_tokens)


def capture_answers(
    worker: RealWorker, dialect: Dialect, *, prompt: str, max_tokens: int, probes: int = 2, timeout: float = 120.0
) -> tuple[CapturedLayout, list[bytes]]:
    """The server's healthy answer to the cells' request in `dialect`, through the front (blocking:
    trio code calls it in a thread), captured `probes` times, one after another: their common
    layout (where the head and each token event end) and the raw responses.

    Raises:
        faults.probe.UnstableUpstream: the captures' layouts disagree (the server's answer varies).
        faults.layout.LayoutError, ConnectionError, TimeoutError: no complete response.
    """
    body = capture_body(dialect, prompt=prompt, model=worker.upstream.model, max_tokens=max_tokens)
    raws = [
        capture_response(worker.host, worker.port, body=body, path=ROUTES[dialect], timeout=timeout)
        for _ in range(max(1, probes))
    ]
    return same_layout([layout_from_capture(raw, dialect) for raw in raws]), raws
