"""SMG (Shepherd Model Gateway, formerly sglang-router; PyPI `smg` 1.13.0) as lab gateways: `smg`,
and `smg+finish_fix` (finish_fix between SMG and the worker, the gateway-side placement).

Theory of operation
-------------------
SMG routes a request only to a worker registered for the request's exact model id
(`WorkerModels::supports` / `ModelCard::matches`, crates/protocols; a miss is 404
`model_not_found`), and a model alias is no way around that: SMG rewrites an aliased request's
model to the canonical name (`Router::route_typed_request`, routers/http/router.rs), which would
erase the worker settings the lab's model names carry. So the lab registers, before each scenario,
one SMG worker per request model through SMG's worker API (`POST /workers` with the model named
in `models`, SMG's documented way to add a backend at run time). Each registration needs a URL of
its own (SMG keeps one worker per URL), so it points at `<upstream>/cells/<cell id>`; the lab's
worker serves any path that ends in a route (labs/worker/server.py). Registration happens before
the scenario's fault is applied and before the runner drops pooled connections; and the worker
answers every probe with `Connection: close` (labs/worker/server.py, `_probe_answer`), so no
probe SMG sends later shares a connection (and so toxiproxy's per-connection byte count) with a
request. A side effect
the lab wants: each cell's workers have circuit breakers of their own, so the failures of the
cells running at once never open the breaker for the next one (SMG opens it after 10 failures,
`--cb-failure-threshold`), and a cell's outcome does not depend on the order cells arrive in.

The spare (pool of two): each model gets a second worker on the spare, registered after the
primary (and only once the primary is in). With `--policy round_robin` the first attempt goes to
the first-registered worker: each model gets a policy of its own (the `policy` label on its
workers), and `RoundRobinPolicy::select_worker` counts from 0 over the model's workers in the order
`WorkerRegistry::add_worker_to_model_index` appended them. Then
SMG's retry (`RetryExecutor`, routers/common/retry.rs: 408, 429, 500, 502, 503, 504 and send
errors are retried; `--retry-max-retries`, 5 by default, counts every attempt, the first included,
`RetryExecutor::execute_response_with_retry`; a new worker is chosen per attempt) moves on
to the spare: that is SMG's documented failover, and it is on by default, so there is one variant.
It retries only what fails before the response head: once the worker's 200 head went out, a cut
is forwarded as it happens (the 1.13.0 binary writes an SSE `stream_error` frame and `[DONE]`;
the newest source we could read, after v1.9.0, still ended the body with an error instead).

Lab-only settings, each with its reason: `--disable-load-monitoring` and a health-check interval
of an hour (round robin needs neither, and a poll through the tunnel during a fault would spend
a connection's byte budget), `--shutdown-grace-period-secs 1` (the default 180 s would hold the
lab's exit), JSON logs at debug level (the books, below).

Books: SMG's own log, `--log-json`: per request (its `request_id` span) the worker URLs it sent
to (`Sending request`, which names the cell), the status it answered with (`finished processing
request` and its `status_code`, logged when the response head goes out) and the WARN and ERROR
lines it logged for the request. The books say `error` for a status of 400 or more, or a WARN or
ERROR after the last attempt's send (a cut after the head: "Stream ended by the worker before
completion"); an attempt it retried is not the request's failure. A stream cut after its head is
logged as a 200.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import trio

from faults.child_processes import START_DEADLINE_S, ChildStartError
from finishline import Dialect
from labs.cell_ids import cell_id_of
from labs.gateways.finish_fix_proxy import open_finish_fix
from labs.gateways.registry import NATIVE_ROUTES, REQUEST_PATHS, GatewayContext, GatewayEntry
from labs.gateways.router_listen import router_listen_args
from labs.gateways.services import Gateway, books_reader_from, open_service_on_free_ports
from labs.gateways.tool_envs import missing_tool_env, tool_binary
from labs.outcome import BOOKS_ERROR, BOOKS_OK

PIN = "smg==1.13.0"
#: A registered worker is ready within a second here; this bounds a registration that never is,
#: with a loaded machine's room (faults.child_processes.START_DEADLINE_S).
REGISTRATION_DEADLINE_S = START_DEADLINE_S
#: Where a cell's SMG worker points, under an upstream (labs/worker/server.py serves any prefix).
CELL_PATH = "/cells/{cell}"
_CELL_IN_URL = re.compile(r"/cells/([^/]+)")
#: The request paths whose spans are the books: a completion in each dialect SMG forwards (its
#: HTTP router sends `/v1/messages` and `/v1/responses` to the worker's same path).
_ROUTED_PATHS = tuple(REQUEST_PATHS[dialect] for dialect in NATIVE_ROUTES)


def smg_missing() -> str | None:
    return missing_tool_env("smg", "smg", PIN)


class SmgRegistrationError(ChildStartError):
    """SMG did not register a cell's workers in time; the message names them."""


@dataclass(slots=True, kw_only=True)
class RunningSmg:
    base_url: str
    admin_url: str
    log: Path
    #: The upstreams each model gets a worker on, in routing order (primary, then spare).
    upstreams: tuple[str, ...]
    _registered: set[str] = field(default_factory=set)

    async def register_models(self, models: Sequence[str]) -> None:
        """Register every new model's workers, and wait until SMG routes to them.

        One upstream at a time, each waited for: SMG registers in background jobs that finish in
        any order, and the order a model's workers finish in is the order round robin takes them
        in, so the primary must be in before the spare is added.
        """
        new = [m for m in dict.fromkeys(models) if m not in self._registered]
        for upstream in self.upstreams:
            urls = [upstream + CELL_PATH.format(cell=cell_id_of(model)) for model in new]
            for url, model in zip(urls, new):
                await trio.to_thread.run_sync(self._post_worker, url, model)
            await self._wait_until_ready(urls)
        self._registered.update(new)

    async def _wait_until_ready(self, urls: list[str]) -> None:
        with trio.move_on_after(REGISTRATION_DEADLINE_S):
            while not set(urls) <= await trio.to_thread.run_sync(self._ready_urls):
                await trio.sleep(0.1)
            return
        waiting = sorted(set(urls) - await trio.to_thread.run_sync(self._ready_urls))
        raise SmgRegistrationError(
            f"SMG did not register {len(waiting)} workers within {REGISTRATION_DEADLINE_S} s: "
            f"{', '.join(waiting[:3])}; its log: {self.log}"
        )

    def _post_worker(self, url: str, model: str) -> None:
        # The `policy` label is SMG's per-model policy hint (`UpdatePoliciesStep` ->
        # `PolicyRegistry::on_worker_added`): with it each model gets a round robin of its own;
        # without it every model shares the default policy, and with it one counter.
        body = json.dumps({"url": url, "models": [{"id": model}], "labels": {"policy": "round_robin"}}).encode()
        request = urllib.request.Request(f"{self.admin_url}/workers", data=body, headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()
        except urllib.error.HTTPError as refused:
            answer = refused.read().decode(errors="replace")[:300]
            raise SmgRegistrationError(f"SMG refused the worker {url} for {model!r}: HTTP {refused.code} {answer}") from None

    def _ready_urls(self) -> set[str]:
        try:
            with urllib.request.urlopen(f"{self.admin_url}/workers", timeout=10) as response:
                listing = json.load(response)
        except (urllib.error.URLError, OSError, ValueError):
            return set()
        return {w["url"] for w in listing.get("workers", []) if w.get("status") == "ready" and w.get("is_healthy")}


@asynccontextmanager
async def open_smg(upstreams: Sequence[str], run_dir: Path, label: str) -> AsyncIterator[RunningSmg]:
    """`smg launch` on 127.0.0.1 with no workers yet (they are registered per model)."""
    log = run_dir / f"{label}.log"

    def argv(port: int, metrics_port: int) -> list[str]:
        return [
            str(tool_binary("smg", "smg")),
            "launch",
            *router_listen_args(port, metrics_port),
            "--policy",
            "round_robin",
            "--disable-load-monitoring",
            "--health-check-interval-secs",
            "3600",
            "--shutdown-grace-period-secs",
            "1",
            "--log-json",
            "--log-level",
            "debug",
        ]

    async with open_service_on_free_ports(f"SMG ({label})", argv, log_path=log, health_path="/health") as port:
        url = f"http://127.0.0.1:{port}"
        yield RunningSmg(base_url=f"{url}/v1", admin_url=url, log=log, upstreams=tuple(upstreams))


def _requests(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """SMG's JSON log lines, grouped by the request id of their `http_request` span."""
    requests: dict[str, dict[str, Any]] = {}
    for line in entries:
        span = line.get("span") or {}
        request_id = span.get("request_id")
        if not request_id or not str(span.get("path", "")).split("?", 1)[0].endswith(_ROUTED_PATHS):
            continue
        request = requests.setdefault(
            request_id,
            {"request_id": request_id, "workers": [], "status_code": None, "problems": [], "last_attempt_problems": []},
        )
        message = str(line.get("message", ""))
        if message == "Sending request" and line.get("url"):
            request["workers"].append(line["url"])
            request["last_attempt_problems"] = []
        if span.get("status_code") is not None:
            request["status_code"] = int(span["status_code"])
        if line.get("model_id"):
            request.setdefault("model", line["model_id"])
        if line.get("level") in ("WARN", "ERROR"):
            request["problems"].append(f"{line['level']} {message}")
            request["last_attempt_problems"].append(f"{line['level']} {message}")
    return requests


#: The last log read and its requests: the runner asks for every cell of a run with one list of
#: entries (a full run's debug log has tens of thousands of lines), so it is grouped once.
_grouped: tuple[list[dict[str, Any]], dict[str, dict[str, Any]]] | None = None


def _requests_of(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    global _grouped
    if _grouped is None or _grouped[0] is not entries:
        _grouped = (entries, _requests(entries))
    return _grouped[1]


def _cells_of(request: dict[str, Any]) -> tuple[str | None, ...]:
    """The cells a request is about: the per-cell path of every worker URL it was sent to, and
    the model it named (a request SMG refused was sent nowhere)."""
    in_urls = (m.group(1) for url in request["workers"] if (m := _CELL_IN_URL.search(url)))
    return (*in_urls, cell_id_of(request.get("model")))


def smg_books(request: dict[str, Any]) -> str:
    """The books' word for one request (its log lines grouped): `error` for no status, a status of
    400 or more, or a WARN/ERROR in its last attempt; else `ok`."""
    # A failed attempt that SMG retried is not the request's failure: the attempt that answered is.
    failed = request["status_code"] is None or request["status_code"] >= 400 or bool(request["last_attempt_problems"])
    return BOOKS_ERROR if failed else BOOKS_OK


read_smg_books = books_reader_from(smg_books, cells_of=_cells_of, records=lambda entries: _requests_of(entries).values())


async def _start(ctx: GatewayContext, *, behind_finish_fix: bool) -> Gateway:
    name = "smg+finish_fix" if behind_finish_fix else "smg"
    capture = configure = None
    primary = ctx.upstream()
    if behind_finish_fix:
        # A finish_fix of its own: the shared one serves `/v1` on the primary for other gateways,
        # this one sees SMG's per-cell paths; its ledger is not the gateway's books.
        finish_fix = await ctx.enter(
            open_finish_fix(primary, ctx.run_dir, label="smg-finish_fix", idle_timeout_s=ctx.run.finish_fix_idle_timeout_s)
        )
        primary, capture, configure = finish_fix.base_url.removesuffix("/v1"), finish_fix.capture, finish_fix.options.apply
    upstreams = (primary, ctx.spare_url) if ctx.spare_url else (primary,)
    running = await ctx.enter(open_smg(upstreams, ctx.run_dir, label=name.replace("+", "-")))
    return Gateway(
        name=name,
        base_url=running.base_url,
        books_path=running.log,
        capture_path=capture,
        prepare=running.register_models,
        configure=configure,
    )


async def _start_smg(ctx: GatewayContext) -> Gateway:
    return await _start(ctx, behind_finish_fix=False)


async def _start_smg_finish_fix(ctx: GatewayContext) -> Gateway:
    return await _start(ctx, behind_finish_fix=True)


#: Observed with SMG 1.13.0 in front of the worker: it answers a Gemini POST itself, never the worker.
_UNROUTED = MappingProxyType(
    {
        Dialect.GEMINI: "SMG 1.13.0 has no Gemini route: POST /v1/models/{model}:streamGenerateContent is a 405 "
        "(its /v1/models/{id} is GET only), /v1beta/models/... a 404 unknown_url"
    }
)

ENTRIES = (
    GatewayEntry(
        name="smg",
        summary="SMG 1.13.0 (round robin; the spare as a second worker, retried by SMG's default retries)",
        start=_start_smg,
        missing=smg_missing,
        books_kind="smg",
        read_books=read_smg_books,
        uses_spare=True,
        routes=NATIVE_ROUTES,
        unrouted=_UNROUTED,
    ),
    GatewayEntry(
        name="smg+finish_fix",
        summary="SMG 1.13.0 whose primary worker is reached through finish_fix (the gateway-side placement)",
        start=_start_smg_finish_fix,
        missing=smg_missing,
        books_kind="smg",
        uses_spare=True,
        routes=NATIVE_ROUTES,
        unrouted=_UNROUTED,
    ),
)
