"""`python -m labs.grade gateway`: run the gateway checks through the user's gateway and grade them.

Topology: `clients -> the user's gateway -> hub (127.0.0.1:P) -> tunnel (toxiproxy) -> worker`,
and, with a spare port Q, `gateway -> spare worker (127.0.0.1:Q)`, healthy. The lab starts
everything right of the gateway; the user points the gateway's upstream(s) at P (and Q).

Each request's model name is `[--model prefix]c0007;<worker settings>;model=finishline-worker`:
the request id first (the gateway's books record it; `labs.scenario.cell_id_of` reads it back),
the worker settings of the check's scenario next (so the gateway must pass the model name through
to its upstream, as a wildcard route does), and the name the worker echoes pinned last, so the
bytes, and with them the byte-exact cuts, do not depend on how the gateway renames the model.

Dialects (`GatewayTarget.dialect`): the clients and the byte-level reader speak one dialect to the
gateway, whose path and body are that dialect's; the worker speaks `upstream_dialect` (the same,
unless the gateway translates), which is the dialect each check's fault is laid out on; the
answers are judged in the clients' dialect. Which checks run in a (dialect, upstream) pair is the
checks' own business (`GatewayCheck.why_not`); the others are listed under the card's `not run`.
The request ids of every check are planned before the first one runs (`plan_checks`), so a gateway
that must know its models before it starts (the lab's LiteLLM, for its routes to a Responses
upstream) can be told them.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import trio

from faults.toxiproxy_server import open_toxiproxy_server
from finishline import Dialect

# How long a cut's books entry may take (LiteLLM writes its books after the response): the lab's wait.
from labs.cell_ids import CELL_ID_TEMPLATE, cell_id_of
from labs.clients import LAB_API_KEY
from labs.clients.hosts import host_versions, open_driver_hosts
from labs.clients.python_messages import messages_body
from labs.clients.python_responses import responses_body
from labs.entry import leaf_errors
from labs.fault_plan import build_fault
from labs.gateways.services import BOOKS_DEADLINE_S
from labs.grade.books import BOOKS_NO_ENTRY, read_books_file
from labs.grade.card import Card, CheckResult, GradeError, Mark, shortened
from labs.grade.fetch import cannot_connect, fetch_stream, grading_client
from labs.grade.gateway_checks import (
    BOOKS_CHECK,
    BYTES_CLIENT,
    GATEWAY_CHECK_IDS,
    CheckRun,
    RequestResult,
    judge_run,
)
from labs.grade.gateway_plan import (
    CheckPlan,
    GatewayTarget,
    Plan,
    plan_checks,
    request_model,
    require_dialect_clients,
)
from labs.grade.reading import CLEAN_END, TRANSPORT_ERROR, StreamReading
from labs.grade.server_checks_gemini import gemini_request
from labs.grade.server_suites import SERVER_SUITES
from labs.hub import TunnelDropPolicy, open_hub
from labs.outcome import BOOKS_ERROR, ClientReport, judge
from labs.worker.attempts import PRIMARY, SPARE
from labs.worker.server import RunningWorker, open_worker

__all__ = [
    "DEFAULT_STALL_DEADLINE_S",
    "GradingLab",
    "grade_gateway",
    "grade_with",
    "open_grading_lab",
]

#: How long a gateway has to end a stalled stream, when neither `--stall-deadline` nor the
#: gateway's own setting says.
DEFAULT_STALL_DEADLINE_S = 30.0
_TUNNEL = "worker"
_WHAT = "the gateway"
#: Seconds the gateway has to accept a connection (the whole answer has the check's deadline).
CONNECT_TIMEOUT_S = 10.0
_RULE_ORDER = ("baseline", "rule 1", "rule 2", "rule 3", "finish reasons", "stalls")


def _require_free(port: int, option: str) -> None:
    with socket.socket() as probe:
        # As trio's listeners do: connections of a previous run in TIME_WAIT do not hold the port.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as error:
            raise GradeError(
                f"{option} {port}: 127.0.0.1:{port} is taken ({error.strerror}); the lab listens there, so stop what holds it or pick another port"
            ) from None


async def _require_reachable(url: str) -> None:
    parts = urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80))

    def connect() -> None:
        try:
            with socket.create_connection(address, timeout=CONNECT_TIMEOUT_S):
                pass
        except TimeoutError:
            raise TimeoutError(f"no answer within {CONNECT_TIMEOUT_S:g} s") from None

    try:
        await trio.to_thread.run_sync(connect)
    except OSError as error:
        raise cannot_connect(_WHAT, url, error) from None


def _bytes_body(dialect: Dialect, model: str, request: dict[str, Any]) -> dict[str, Any]:
    """The byte-level reader's request in `dialect`, shaped as the lab's drivers shape theirs (in
    Gemini the model and the stream are the path's: `_read_bytes`)."""
    line = {"model": model, **request}
    if dialect is Dialect.GEMINI:
        return gemini_request(line)
    if dialect is Dialect.MESSAGES:
        return {**messages_body(line), "stream": True}
    if dialect is Dialect.RESPONSES:
        return {**responses_body(line), "stream": True}
    return {**line, "stream": True}


async def _read_bytes(
    url: str, model: str, body: dict[str, Any], api_key: str, deadline_s: float, dialect: Dialect
) -> StreamReading:
    """The gateway's response body as it arrived, and how it ended, within the deadline."""
    suite = SERVER_SUITES[dialect]  # where each dialect is asked, and with which headers
    client = grading_client(
        timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
        api_key=api_key,
        headers=suite.headers,
        api_key_header=suite.api_key_header,
    )
    async with client:
        target = suite.url(url, model=model, stream=True)
        return await fetch_stream(client, target, body, what=_WHAT, deadline_s=deadline_s, dialect=dialect)


def _bytes_report(reading: StreamReading) -> ClientReport:
    """The byte-level reader as a client that believes what it reads (like a raw SSE loop)."""
    choice = reading.choices.get(0)
    failed: tuple[str, str] | None = None
    if reading.timed_out:
        return ClientReport(client=BYTES_CLIENT, completed=False, timed_out=True, text=choice.content if choice else "")
    if not reading.status:  # no response head: what happened instead, in words
        failed = ("transport error", reading.status_words())
    elif reading.status != 200:
        failed = (f"HTTP {reading.status}", shortened(reading.body, 160))
    elif reading.compressed is not None:
        failed = ("compressed body", reading.compression_note() or "")
    elif reading.error_positions:
        failed = ("error event", reading.error_message() or "")
    elif reading.ending != CLEAN_END:
        failed = ("transport error", reading.ending.removeprefix(TRANSPORT_ERROR))
    if failed is not None:
        return ClientReport(
            client=BYTES_CLIENT,
            completed=False,
            error_class=failed[0],
            error_message=failed[1],
            text=choice.content if choice else "",
        )
    return ClientReport(
        client=BYTES_CLIENT,
        completed=True,
        text=choice.content if choice else "",
        finish_reason=choice.finish_reason if choice else None,
        tool_calls=[dict(c) for c in choice.tool_calls] if choice else [],
    )


@dataclass(slots=True, kw_only=True)
class GradingLab:
    """Everything right of the gateway, and the clients left of it: open once, grade one or more
    gateways with it (`grade_with`), one after another."""

    primary: RunningWorker
    spare: RunningWorker | None
    hub: Any
    toxiproxy: Any
    tunnel_port: int
    hosts: dict[str, Any]
    clients: tuple[str, ...]
    run_dir: Path
    next_number: int = 1

    def new_id(self) -> str:
        request_id = CELL_ID_TEMPLATE.format(self.next_number)
        self.next_number += 1
        return request_id

    def workers_for(self, request_id: str) -> dict[str, int]:
        seen = {}
        for name, worker in ((PRIMARY, self.primary), (SPARE, self.spare)):
            count = sum(1 for model in worker.arrivals if cell_id_of(model) == request_id) if worker is not None else 0
            if count:
                seen[name] = count
        return seen


@contextlib.asynccontextmanager
async def open_grading_lab(
    *,
    upstream_port: int,
    spare_port: int | None,
    clients: tuple[str, ...],
    results_dir: Path,
    dialect: Dialect = Dialect.CHAT,
) -> AsyncIterator[GradingLab]:
    """The worker, its toxiproxy tunnel, the hub on 127.0.0.1:`upstream_port`, the spare worker on
    `spare_port` (if any), and the clients' driver hosts for `dialect` (the one the clients speak:
    a client may run in a host of its own there, as `langchain` in Gemini)."""
    run_dir = (results_dir / time.strftime("grade-%Y%m%d-%H%M%S")).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    async with open_worker() as primary, open_toxiproxy_server(log_path=str(run_dir / "toxiproxy.log")) as toxiproxy:
        tunnel = await trio.to_thread.run_sync(
            lambda: toxiproxy.client.create_proxy(_TUNNEL, upstream=f"127.0.0.1:{primary.port}")
        )
        async with (
            open_hub(upstream_port=tunnel.listen_port, port=upstream_port) as hub,
            _maybe_spare(spare_port) as spare,
            open_driver_hosts(clients, run_dir, (dialect,)) as hosts,
        ):
            yield GradingLab(
                primary=primary,
                spare=spare,
                hub=hub,
                toxiproxy=toxiproxy,
                tunnel_port=tunnel.listen_port,
                hosts=hosts,
                clients=clients,
                run_dir=run_dir,
            )


class _Grader:
    def __init__(self, target: GatewayTarget, lab: GradingLab) -> None:
        self.target, self.lab = target, lab
        self.primary, self.spare, self.hub, self.toxiproxy, self.hosts = lab.primary, lab.spare, lab.hub, lab.toxiproxy, lab.hosts
        self.stall_deadline_s = target.stall_deadline_s or DEFAULT_STALL_DEADLINE_S

    def workers_for(self, request_id: str) -> dict[str, int]:
        return self.lab.workers_for(request_id)

    async def run(self, plan: CheckPlan) -> CheckRun:
        check, scenario, dialect = plan.check, plan.scenario, self.target.dialect
        self.hub.on_tunnel_drop = check.hub or scenario.hub_policy or TunnelDropPolicy.ABORT
        # The fault is laid out on the bytes the worker sends: in the dialect it speaks.
        fault = build_fault(scenario, self.target.upstream)
        deadline_s = self.stall_deadline_s if check.stall else scenario.deadline_s
        expected = scenario.expected(dialect)
        results: list[RequestResult] = []
        relayed_before = len(self.hub.exchanges)
        # A fresh tunnel for each check: nothing pooled from the last one outlives its fault.
        await trio.to_thread.run_sync(self.toxiproxy.client.set_enabled, _TUNNEL, False)
        await trio.to_thread.run_sync(self.toxiproxy.client.set_enabled, _TUNNEL, True)

        if self.target.prepare is not None:
            await self.target.prepare(plan.models(self.target.model))

        async def client(name: str) -> None:
            request_id = plan.client_ids[name]
            request = {
                "id": request_id,
                "client": name,
                "dialect": dialect.value,
                "base_url": self.target.url,
                "model": request_model(scenario, request_id, self.target.model),
                "deadline_s": deadline_s,
                **scenario.request(),
                "api_key": self.target.api_key or LAB_API_KEY,
            }
            raw = await self.hosts[name].run(request)
            report = ClientReport.from_json({"client": name, "completed": False, **raw})
            judged = judge(report, expected)
            results.append(RequestResult(client=name, request_id=request_id, outcome=judged.outcome, why=judged.reason))

        async def raw_bytes() -> None:
            for request_id in plan.bytes_ids:
                model = request_model(scenario, request_id, self.target.model)
                body = _bytes_body(dialect, model, scenario.request())
                key = self.target.api_key or LAB_API_KEY
                reading = await _read_bytes(self.target.url, model, body, key, deadline_s, dialect)
                judged = judge(_bytes_report(reading), expected)
                result = RequestResult(
                    client=BYTES_CLIENT,
                    request_id=request_id,
                    outcome=judged.outcome,
                    why=judged.reason,
                    reading=reading,
                    workers=self.workers_for(request_id),
                )
                # A gateway that balances load may send a fault check's request to the healthy
                # spare: ask again, so the bytes judged are the ones that met the fault.
                if result.reached_primary or fault is None or check.needs_spare or self.spare is None:
                    break
            results.append(result)

        async with fault.applied(self.toxiproxy.client, _TUNNEL) if fault is not None else contextlib.nullcontext():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(raw_bytes)
                for name in self.target.clients:
                    nursery.start_soon(client, name)
        for result in results:
            result.workers = self.workers_for(result.request_id)
        hub_lines = [e.summary() for e in self.hub.exchanges[relayed_before:]]
        order = {name: i for i, name in enumerate((BYTES_CLIENT, *self.target.clients))}
        return CheckRun(
            results=sorted(results, key=lambda r: order[r.client]), spare=self.spare is not None, hub=hub_lines, dialect=dialect
        )


def _details(run: CheckRun) -> dict[str, Any]:
    requests = []
    for r in run.results:
        item: dict[str, Any] = {
            "client": r.client,
            "request_id": r.request_id,
            "outcome": str(r.outcome),
            "why": r.why,
            "workers": r.workers,
        }
        if r.books is not None:
            item["books"] = r.books
        if r.reading is not None:
            item["stream"] = r.reading.summary()
            item["bytes"] = r.reading.body[:4096].decode("utf-8", "replace")
        requests.append(item)
    return {"requests": requests, "hub": run.hub}


def _books_lookup(target: GatewayTarget) -> Callable[[str], tuple[str | None, dict[str, Any] | None]] | None:
    if target.books_lookup is not None:
        return target.books_lookup
    if target.books_path is None:
        return None
    path = target.books_path
    return lambda request_id: read_books_file(path).get(request_id, (None, None))


async def _books_row(target: GatewayTarget, cut: list[RequestResult]) -> CheckResult:
    rule, check, title = BOOKS_CHECK
    lookup = _books_lookup(target)
    if lookup is None:
        return CheckResult(
            rule=rule,
            check=check,
            title=title,
            mark=Mark.NOT_CHECKED,
            evidence=target.no_books_reason
            or f"the gateway's books were not read: pass {target.option_prefix}books FILE (JSON lines, see docs/grading.md: the books file)",
        )
    cut = [r for r in cut if r.reached_primary]
    if not cut:
        return CheckResult(
            rule=rule, check=check, title=title, mark=Mark.NOT_TESTED, evidence="no cut request reached the faulty worker"
        )

    def look_up_all() -> bool:
        """Fill in every cut's books entry; True when each has one."""
        for r in cut:
            word, entry = lookup(r.request_id)
            r.books, r.books_entry = (word if entry is not None else BOOKS_NO_ENTRY), entry
        return all(r.books_entry is not None for r in cut)

    with trio.move_on_after(BOOKS_DEADLINE_S):
        while not await trio.to_thread.run_sync(look_up_all):
            await trio.sleep(0.2)
    wrong = [r for r in cut if r.books != BOOKS_ERROR]
    details = {
        "requests": [{"client": r.client, "request_id": r.request_id, "books": r.books, "entry": r.books_entry} for r in cut]
    }
    if wrong:
        evidence = "; ".join(f"{r.request_id} ({r.client}, client saw {r.outcome}): books say {r.books}" for r in wrong)
        return CheckResult(rule=rule, check=check, title=title, mark=Mark.FAIL, evidence=evidence, details=details)
    return CheckResult(
        rule=rule,
        check=check,
        title=title,
        mark=Mark.PASS,
        evidence=f"all {len(cut)} cut requests are errors in the books",
        details=details,
    )


async def grade_gateway(target: GatewayTarget) -> Card:
    """The gateway's card.

    Raises:
        GradeError: it cannot run (a port taken, the gateway unreachable, a healthy request that
            never reaches the lab's upstream); raised as itself, not inside an exception group.
    """
    try:
        return await _grade_gateway(target)
    except BaseExceptionGroup as group:
        # trio's nurseries wrap what is raised inside them; a GradeError is one line for a user.
        leaves = leaf_errors(group)
        if leaves and all(isinstance(leaf, GradeError) for leaf in leaves):
            raise leaves[0] from None
        raise


async def _grade_gateway(target: GatewayTarget) -> Card:
    require_dialect_clients(target.clients, target.dialect, f"{target.option_prefix}client")
    _require_free(target.upstream_port, f"{target.option_prefix}upstream-port")
    if target.spare_port is not None:
        _require_free(target.spare_port, f"{target.option_prefix}spare-port")
    await _require_reachable(target.url)
    async with open_grading_lab(
        upstream_port=target.upstream_port,
        spare_port=target.spare_port,
        clients=target.clients,
        results_dir=target.results_dir,
        dialect=target.dialect,
    ) as lab:
        return await grade_with(lab, target)


async def grade_with(lab: GradingLab, target: GatewayTarget, plan: Plan | None = None) -> Card:
    """Run the checks through `target`'s gateway, whose upstream is `lab`'s hub (and spare); `plan`:
    the checks as `plan_checks` planned them (planned here when not given)."""
    say = target.progress or (lambda line: None)
    grader = _Grader(target, lab)
    plan = plan if plan is not None else plan_checks(lab, target)
    card = Card(kind="gateway", target=target.url, not_run=dict(plan.not_run))
    card.setup = {
        "upstream": f"hub on 127.0.0.1:{lab.hub.port} -> tunnel (toxiproxy) 127.0.0.1:{lab.tunnel_port} -> worker 127.0.0.1:{lab.primary.port}",
        "spare": f"worker on 127.0.0.1:{lab.spare.port}" if lab.spare is not None else "none (rule 1 not tested)",
        "clients": [BYTES_CLIENT, *target.clients],
        "stall_deadline_s": grader.stall_deadline_s,
        "versions": host_versions(lab.hosts),
        "run_dir": str(lab.run_dir),
    }
    if (target.dialect, target.upstream) != (Dialect.CHAT, Dialect.CHAT):
        # Chat's card is as it was before there were dialects.
        card.setup = {"dialect": str(target.dialect), "upstream_dialect": str(target.upstream), **card.setup}
    card.results += plan.not_tested
    cut: list[RequestResult] = []
    for planned in plan.checks:
        check = planned.check
        title = check.title_in(target.dialect)
        say(f"{check.check}: {title}")
        run = await grader.run(planned)
        if check.check == "healthy":
            _require_upstream_reached(run, target, lab)
        mark, evidence = judge_run(check, run)
        card.results.append(
            CheckResult(rule=check.rule, check=check.check, title=title, mark=mark, evidence=evidence, details=_details(run))
        )
        if check.booked_as_cut:
            cut += run.results
    if target.only is None or BOOKS_CHECK[1] in target.only:
        say(f"{BOOKS_CHECK[1]}: reading the books")
        card.results.append(await _books_row(target, cut))
    # Rows in card order (the rule 3 row after rule 2), whatever order they were made in.
    order = {check: number for number, check in enumerate(GATEWAY_CHECK_IDS)}
    card.results.sort(key=lambda r: (_RULE_ORDER.index(r.rule), order[r.check]))
    return card


def _require_upstream_reached(run: CheckRun, target: GatewayTarget, lab: GradingLab) -> None:
    """The healthy request must reach the lab's worker with its settings, or nothing can be judged."""
    raw = run.raw
    if raw is None or raw.reached_primary or raw.workers.get(SPARE):
        return
    reading = raw.reading
    answer = (
        f"answered HTTP {reading.status}"
        if reading is not None and reading.status
        else f"ended with {reading.ending if reading else 'nothing'}"
    )
    raise GradeError(
        f"the gateway {answer} to a healthy request that never reached 127.0.0.1:{lab.hub.port}: "
        f"point its upstream at http://127.0.0.1:{lab.hub.port}/v1 and let the model name through unchanged"
    )


@contextlib.asynccontextmanager
async def _maybe_spare(port: int | None) -> AsyncIterator[RunningWorker | None]:
    """The healthy spare worker on its port, or None without one."""
    if port is None:
        yield None
        return
    async with open_worker(port=port) as spare:
        yield spare
