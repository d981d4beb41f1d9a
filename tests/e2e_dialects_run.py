"""One run of the Messages and Responses end-to-end topology (tests/test_finish_fix_e2e_dialects.py).

    request --> mitmdump -s addons/finish_fix.py --> worker                                  FINISH_FIX_AT_WORKER
    request --> mitmdump -s addons/finish_fix.py --> hub --> toxiproxy tunnel --> worker     FINISH_FIX_AT_HUB
    request ---------------------------------------> hub --> toxiproxy tunnel --> worker     HUB
    request -------------------------------------------------------------------> worker     WORKER

Every part is the real one: the worker (labs.worker), the hub (labs.hub, its policy `close` ends
the response cleanly when the tunnel drops), the toxiproxy server, two mitmdumps with finish_fix and
a ledger each (default options otherwise), and the lab's driver hosts (labs.clients.hosts) running the
real client libraries. A request is either a client (its driver report) or raw httpx (the bytes
as received, tests.e2e_support.raw_post).

The run goes phase by phase; a phase's requests run concurrently, under the phase's fault on the
tunnel (toxiproxy counts a `limit_data` toxic's bytes per connection, so each request is cut at
the same offset). Every request's model is `<id>;<settings>` with ids of one length, so one plan
gives every request's bytes in a phase (the worker echoes the model name in its events).
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from faults.catalog import Fault, cut_after_tokens
from faults.toxiproxy_client import ToxiproxyClient
from finishline import Dialect
from labs.clients import DEFAULT_MAX_TOKENS, LAB_API_KEY
from labs.clients.hosts import open_driver_hosts
from labs.gateways.services import FINISH_FIX_SCRIPT, MITM_LISTENING, read_books
from labs.hub import HubExchange, TunnelDropPolicy, open_hub
from labs.processes import open_service
from labs.scenario import WORKER_TOOL
from labs.worker import parse_settings, response_plan
from labs.worker.server import open_worker
from labs.worker.wire import ResponsePlan
from tests.e2e_support import RawResponse, raw_post
from tests.fixtures_lab import open_proxy
from tests.mitmdump_process import mitmdump_executable

__all__ = ["Phase", "Request", "Route", "RunResult", "cut_phase", "plan_for", "request_body", "run_topology"]

PROMPT = "Say the sentence about the fox."
#: What each driver is given; the lab's backstop waits this plus its grace before calling a hang.
CLIENT_DEADLINE_S = 30.0
#: How long after the last phase a flow's ledger line may still be on its way.
LEDGER_WAIT_S = 120.0
PATHS = {Dialect.MESSAGES: "/v1/messages", Dialect.RESPONSES: "/v1/responses"}


class Route(enum.StrEnum):
    """Where a request goes in (see the module docstring)."""

    WORKER = "worker"
    FINISH_FIX_AT_WORKER = "finish_fix_at_worker"
    FINISH_FIX_AT_HUB = "finish_fix_at_hub"
    HUB = "hub"


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One request of the run: `client` None is raw httpx. `key` names it in the result."""

    key: str
    dialect: Dialect
    settings: str
    route: Route
    client: str | None = None
    #: Declare the worker's tool (labs.scenario.WORKER_TOOL) in a client's request line, as an agent would.
    tools: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Phase:
    """Requests run together, with `fault` (if any) on the tunnel while they run."""

    requests: tuple[Request, ...]
    fault: Fault | None = None


@dataclass(kw_only=True)
class RunResult:
    """What every request got, and the books of the parts it went through."""

    raw: dict[str, RawResponse] = field(default_factory=dict)
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: dict[str, Request] = field(default_factory=dict)
    #: The model each request sent (its ledger line's `model`).
    models: dict[str, str] = field(default_factory=dict)
    ledgers: dict[Route, list[dict[str, Any]]] = field(default_factory=dict)
    hub_exchanges: list[HubExchange] = field(default_factory=list)
    mitmdump_logs: dict[Route, str] = field(default_factory=dict)

    def plan(self, key: str) -> ResponsePlan:
        """What the worker sends for the request `key` (its own model name included)."""
        return plan_for(self.requests[key].dialect, self.models[key])

    def ledger_rows(self, key: str, route: Route) -> list[dict[str, Any]]:
        """The ledger lines of the mitmdump on `route` for the request `key` (by its model)."""
        return [row for row in self.ledgers[route] if row.get("model") == self.models[key]]


def request_body(dialect: Dialect, model: str) -> dict[str, Any]:
    """The raw request body in `dialect`, shaped as the lab's drivers shape theirs."""
    messages = [{"role": "user", "content": PROMPT}]
    if dialect is Dialect.MESSAGES:
        return {"model": model, "max_tokens": DEFAULT_MAX_TOKENS, "stream": True, "messages": messages}
    return {"model": model, "stream": True, "input": messages}


def model_name(number: int, settings: str) -> str:
    """`q0007;tokens=12`: an id of fixed length (a name item the worker ignores), then the settings."""
    return f"q{number:04d};{settings}"


def plan_for(dialect: Dialect, model: str) -> ResponsePlan:
    """The worker's plan for a request of this run with this model name (`<id>;<settings>`)."""
    return response_plan(parse_settings(model).for_request(request_body(dialect, model), dialect), dialect=dialect)


def cut_phase(dialect: Dialect, settings: str, tokens: int, requests: Sequence[Request]) -> Phase:
    """A phase whose tunnel drops (FIN) right after `tokens` token events of the dialect's stream
    (every model name is as long, so any one's plan gives every request's offset)."""
    return Phase(requests=tuple(requests), fault=cut_after_tokens(tokens, plan_for(dialect, model_name(0, settings))))


def run_topology(
    phases: Sequence[Phase], *, toxiproxy: ToxiproxyClient, confdir: Path, run_dir: Path, deadline_s: float
) -> RunResult:
    """Start the topology, run the phases in order, wait for every finish_fix flow's ledger line.

    Returns once every request has its outcome (a client's report may be the lab's timeout record:
    a hang is an outcome, not an exception).

    Raises:
        trio.TooSlowError: the whole run took more than `deadline_s`.
    """
    result = RunResult()
    numbers = iter(range(10_000))
    for phase in phases:
        for request in phase.requests:
            result.requests[request.key] = request
            result.models[request.key] = model_name(next(numbers), request.settings)
    clients = tuple(dict.fromkeys(r.client for p in phases for r in p.requests if r.client is not None))

    async def run() -> None:
        with trio.fail_after(deadline_s):
            await serve_and_run()

    async def serve_and_run() -> None:
        async with (
            open_worker() as worker,
            open_proxy(toxiproxy, worker.port) as tunnel,
            open_hub(upstream_port=tunnel.listen_port, on_tunnel_drop=TunnelDropPolicy.CLOSE) as hub,
            _open_finish_fix(f"http://127.0.0.1:{worker.port}", confdir, run_dir, Route.FINISH_FIX_AT_WORKER) as at_worker,
            _open_finish_fix(hub.url, confdir, run_dir, Route.FINISH_FIX_AT_HUB) as at_hub,
            open_driver_hosts(clients, run_dir / "hosts", tuple(PATHS)) as hosts,
        ):
            origins = {
                Route.WORKER: f"http://127.0.0.1:{worker.port}",
                Route.FINISH_FIX_AT_WORKER: at_worker.url,
                Route.FINISH_FIX_AT_HUB: at_hub.url,
                Route.HUB: hub.url,
            }
            proxies = {Route.FINISH_FIX_AT_WORKER: at_worker, Route.FINISH_FIX_AT_HUB: at_hub}
            try:
                for phase in phases:
                    if phase.fault is None:
                        await _run_phase(phase, result, origins, hosts)
                    else:
                        async with phase.fault.applied(toxiproxy, tunnel.name):
                            await _run_phase(phase, result, origins, hosts)
                await _wait_for_ledger_lines(phases, result, proxies)
            finally:
                result.hub_exchanges = list(hub.exchanges)
                for route, proxy in proxies.items():
                    result.ledgers[route] = read_books(proxy.ledger)

    try:
        trio.run(run)
    finally:
        for route in (Route.FINISH_FIX_AT_WORKER, Route.FINISH_FIX_AT_HUB):
            log = _log_path(run_dir, route)
            result.mitmdump_logs[route] = log.read_text(errors="replace") if log.exists() else ""
            print(f"--- mitmdump {route} ---\n{result.mitmdump_logs[route]}")
    return result


async def _run_phase(phase: Phase, result: RunResult, origins: dict[Route, str], hosts: dict) -> None:
    async def one(request: Request) -> None:
        model = result.models[request.key]
        origin = origins[request.route]
        if request.client is None:
            url = origin + PATHS[request.dialect]
            body = request_body(request.dialect, model)
            result.raw[request.key] = await trio.to_thread.run_sync(partial(raw_post, url, body=body))
            return
        result.reports[request.key] = await hosts[request.client].run(
            {
                "id": request.key,
                "client": request.client,
                "dialect": request.dialect.value,
                "base_url": f"{origin}/v1",
                "model": model,
                "messages": [{"role": "user", "content": PROMPT}],
                "deadline_s": CLIENT_DEADLINE_S,
                "api_key": LAB_API_KEY,
                **({"tools": [WORKER_TOOL]} if request.tools else {}),
            }
        )

    async with trio.open_nursery() as nursery:
        for request in phase.requests:
            nursery.start_soon(one, request)


async def _wait_for_ledger_lines(phases: Sequence[Phase], result: RunResult, proxies: dict[Route, _FinishFix]) -> None:
    """Until each request through a finish_fix has at least one ledger line (finish_fix writes it
    when the flow ends, which can be just after the client saw the end), or LEDGER_WAIT_S passed;
    the tests then say which is missing."""
    wanted = [(r.route, result.models[r.key]) for p in phases for r in p.requests if r.route in proxies]
    deadline = trio.current_time() + LEDGER_WAIT_S
    while trio.current_time() < deadline:
        seen = {(route, row.get("model")) for route, proxy in proxies.items() for row in read_books(proxy.ledger)}
        if all(item in seen for item in wanted):
            await trio.sleep(0.3)  # so that a second line for the same flow would be seen too
            return
        await trio.sleep(0.1)


@dataclass(frozen=True, slots=True)
class _FinishFix:
    """A running mitmdump with finish_fix: where it listens and its ledger."""

    url: str
    ledger: Path


@asynccontextmanager
async def _open_finish_fix(upstream: str, confdir: Path, run_dir: Path, route: Route) -> AsyncIterator[_FinishFix]:
    """`mitmdump --mode reverse:<upstream> -s addons/finish_fix.py` with a ledger and default
    options otherwise. Started with the lab's `open_service`, which forks on the trio thread: a
    child forked in a worker thread (`tests.mitmdump_process.start` via `trio.to_thread`) gets its
    parent-death signal when that thread idles out (faults/child_processes.py)."""
    ledger, log = run_dir / f"ledger-{route}.jsonl", _log_path(run_dir, route)
    argv = [
        str(mitmdump_executable()),
        "--set",
        f"confdir={confdir}",
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        "0",
        "--mode",
        f"reverse:{upstream}",
        "-s",
        str(FINISH_FIX_SCRIPT),
        "--set",
        f"finish_fix_ledger={ledger}",
    ]
    async with open_service(f"mitmdump ({route})", argv, port=0, port_in_log=MITM_LISTENING, log_path=log) as (
        _,
        port,
    ):
        yield _FinishFix(url=f"http://127.0.0.1:{port}", ledger=ledger)


def _log_path(run_dir: Path, route: Route) -> Path:
    return run_dir / f"mitmdump-{route}.log"
