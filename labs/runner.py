"""The lab runner: every scenario x dialect x gateway x client cell, concurrently on trio.

Theory of operation
-------------------
One simulated worker (in this process), one toxiproxy server with one proxy ("the tunnel") in
front of the worker, the gateways in front of the tunnel, and one driver host per client runtime.
Scenarios run one after another, because a fault belongs to the tunnel and every cell of a scenario
must go through it; the cells of one scenario run at once (at most `jobs` at a time), which is what
makes a full matrix take a minute rather than ten. A scenario's agent cells (the coding-agent CLIs,
labs.clients.agent_clis) run after its library cells, under the same fault, at most `AGENT_JOBS` at
a time: each CLI's start costs a second or more of CPU, and a scenario's worth of them starting at
once beside the library cells starved those past their deadlines (a `--all` run on a 2-core
machine booked healthy cells as hangs).

Topologies (labs.scenario.Topology): a scenario with `[hub]` puts the hub (labs.hub, in this
process, in front of the tunnel) between the gateways and the tunnel, and sets its policy for the
scenario; `[pool] workers = 2` adds a second, healthy worker (the spare, in this process, no
tunnel) as the gateways' second upstream. Gateways are told their upstreams at start, so each
topology the run needs gets its own set of gateways, and scenarios run grouped by topology: the
next topology's gateways start while the cells of the one before run. LiteLLM, the slowest to
start (25-90 s on a busy 2-core machine), is one process for every topology of the run, told
every topology's upstreams at once (labs.topology). Which worker answered a
cell is read from the workers' own records (`RunningWorker.arrivals`): the spare if it saw the
cell's request (it is healthy: it answered in full), else the primary.

Dialects: a cell is (scenario, dialect, gateway, client): the client set is the dialect's
(`labs.clients.CLIENTS_BY_DIALECT`), and a gateway the lab does not send the dialect through (its
registry entry's `routes`) has no cells there but an `n/a` with the reason
(`LabResult.not_applicable`). The worker speaks the dialect of the cell's route (its upstream
dialect: the client's own, unless the gateway translates, labs.scenario explains when a translated
cell runs). A scenario runs once per upstream dialect its cells need, one after another like
scenarios, since the same settings give other bytes in each dialect and a byte-exact fault is laid
out on the bytes the worker sends (labs.fault_plan); a translated cell runs with the untranslated
cells whose worker speaks its upstream dialect, under the same fault.

Every cell's request carries the scenario's worker settings and its own cell id in the model name
(labs.scenario), so the worker serves every scenario at once and the gateways' books can be matched
to cells. Before each scenario the tunnel is switched off and on, which closes every pooled
connection: each cell then opens a fresh connection with the fault already in place (toxiproxy's
reset arm and byte counts are per connection, see faults/catalog.py). The hub opens one tunnel
connection per request for the same reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import trio

from faults.catalog import Fault
from faults.toxiproxy_server import open_toxiproxy_server
from finishline import Dialect
from labs.cell_requests import cell_request, run_probe, summarised
from labs.clients import AGENT_CLIENTS, CLIENTS_BY_DIALECT
from labs.clients.agent_host import agent_refusal
from labs.clients.hosts import open_driver_hosts
from labs.dialects import LAB_DIALECTS
from labs.evidence import probe_id, probe_model_name
from labs.fault_plan import build_fault
from labs.gateway_versions import gateway_versions
from labs.gateways.services import (
    BOOKS_NONE,
    Gateway,
    books_entry,
    captured_stream,
    configure_gateways,
    prepare_gateways,
    read_books,
)
from labs.hub import Hub, open_hub
from labs.outcome import BOOKS_ERROR, ClientReport, Expected, Judgement, Outcome, books_mismatch, judge
from labs.plan import (
    LabConfig,
    NotApplicable,
    models_by_topology,
    plan_cells,
    plan_not_applicable,
    repeat_label,
    routes_of,
    scenario_runs,
    spoken_dialects,
)
from labs.repeat import merge_repeats
from labs.scenario import CELL_ID_TEMPLATE, MAX_CELLS, Scenario, Topology
from labs.topology import HUB, PRIMARY, SPARE, AnyWorker, attach_workers, open_gateway_sets, topology_groups, topology_line
from labs.worker.real import SIMULATED, needs_simulated_worker
from labs.worker.truth import CapturedTruth, ComputedTruth, WorkerTruth
from labs.workers import REAL_WORKER_IDLE_TIMEOUT_S, for_real_worker, open_lab_workers, prepare_real_workers, worker_truth

__all__ = [
    "PRIMARY",
    "SPARE",
    "GATEWAYS_RUNTIME",
    "TUNNEL",
    "CellResult",
    "LabError",
    "LabResult",
    "run_lab",
]

#: The toxiproxy proxy in front of the worker (the lab's and `make ui`'s).
TUNNEL = "worker"
#: Agent cells in flight at once (after the scenario's library cells; module docstring). A `--all`
#: run had 28 of them at once beside 70 library cells and none missed its 60 s deadline, so 8 alone
#: leave room; `--jobs` lower than this lowers it too.
AGENT_JOBS = 8
#: LiteLLM's callbacks write their books after the response went out: the runner waits until every
#: cell of a books-keeping gateway has its entry, at most this many seconds after the cell ended
#: (so a cell that ended early in the run costs no wait at its end); a cell still without one is
#: reported as `no entry`.
BOOKS_DEADLINE_S = 15.0
#: The books word for a cell whose gateway keeps books but wrote nothing for it.
BOOKS_NO_ENTRY = "no entry"
#: The `versions` key of the gateways' versions (beside the driver hosts' runtimes).
GATEWAYS_RUNTIME = "gateways"


class LabError(ValueError):
    """The lab cannot run as configured; the message says what to change."""


@dataclass(slots=True, kw_only=True)
class CellResult:
    scenario: str
    #: The dialect the client's request spoke.
    dialect: Dialect = Dialect.CHAT
    #: The dialect the worker spoke for it: another than `dialect` when the gateway translated
    #: (its route, `labs.gateways.registry`); None in a result from before there were routes.
    upstream_dialect: Dialect | None = None
    client: str
    gateway: str
    cell_id: str
    outcome: Outcome
    why: str
    report: dict[str, Any]
    request_model: str
    books: str | None = None
    books_entry: dict[str, Any] | None = None
    books_mismatch: bool = False
    #: The stream as finish_fix sent it on, for the finish_fix gateways.
    finish_fix_stream: str | None = None
    #: `tunnel`, `hub`, `tunnel+spare` or `hub+spare` (labs.scenario.Topology.label).
    topology: str = "tunnel"
    #: The worker whose answer the client got: `spare` if the spare saw the request (it is
    #: healthy), else `primary` if the primary did; None: no worker saw it.
    answered_by: str | None = None
    #: How many times each worker was asked for this cell (a gateway's retries show here).
    worker_requests: dict[str, int] = field(default_factory=dict)
    #: What the hub did, one line per request it relayed for this cell (labs.hub.HubExchange).
    hub: list[str] = field(default_factory=list)
    #: Every request the hub and the workers saw for this cell, oldest first
    #: (`labs.worker.attempts.Attempt` as JSON; labs.topology.attach_workers).
    attempts: list[dict[str, Any]] = field(default_factory=list)
    #: How many times the gateway (or the client) asked: the requests at the first server behind
    #: the gateway (the hub, else the primary) plus the spare's; None when nothing recorded them.
    tries: int | None = None
    #: Seconds from the client's request to its first token (the client's report), None if none came.
    first_token_s: float | None = None
    #: Seconds from the client's request to its end (the client's report, else the runner's clock).
    total_s: float | None = None
    #: Which repeat of the cell this is (`--repeat`), 1 for the first.
    repeat: int = 1
    #: Every repeat's outcome and books, when the run repeated cells (labs.repeat); else empty.
    repeats: list[dict[str, Any]] = field(default_factory=list)
    #: Whether the repeats differ in outcome or books (labs.repeat.merge_repeats).
    unstable: bool = False
    #: A scenario of several requests per cell (`requests_per_cell`): each request's outcome, why
    #: and seconds, in the order sent; empty for a cell of one request.
    requests: list[dict[str, Any]] = field(default_factory=list)
    #: Seconds from the first attempt to the second (labs.evidence), None with fewer than two.
    first_gap_s: float | None = None
    #: The most attempts within any one second (labs.evidence): hammering shows here.
    max_attempts_per_s: int = 0
    #: The healthy request sent after the cell through the same gateway and client
    #: (labs.evidence.probe_json: `ok`, `outcome`, `why`, `cell_id`, `tries`, `total_s`); None for
    #: an agent's cell.
    probe: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True, kw_only=True)
class LabResult:
    started: float
    duration_s: float
    scenarios: list[dict[str, Any]]
    clients: list[str]
    gateways: list[str]
    versions: dict[str, Any]
    run_dir: str
    cells: list[CellResult] = field(default_factory=list)
    #: Per dialect, its clients that have cells, in the dialect's column order.
    clients_by_dialect: dict[str, list[str]] = field(default_factory=dict)
    #: The gateways of the run that the lab does not send a dialect through (`n/a`, not run).
    not_applicable: list[NotApplicable] = field(default_factory=list)
    #: How many times every cell ran (`--repeat`).
    repeat: int = 1
    #: Per server (`primary`, `spare`, `hub`), how many late requests of a finished scenario run
    #: it refused (409) instead of serving them under another run's policy and fault.
    stale_refused: dict[str, int] = field(default_factory=dict)
    #: Per gateway of the run, per dialect its cells' clients spoke, how the request went through
    #: it (the registry entry's route: e.g. LiteLLM's Chat bridge to the worker's Chat endpoint).
    routes: dict[str, dict[str, str]] = field(default_factory=dict)
    #: The worker the cells met (`--worker`): `worker` (`simulated`, `llama.cpp` or the URL) and,
    #: for a real one, `model`, and for llama.cpp `model_file`, `xllamacpp_version`, `llama_cpp_version`.
    worker: dict[str, Any] = field(default_factory=lambda: {"worker": SIMULATED})
    #: The scenarios left out because they need the simulated worker's knobs (`--worker` real):
    #: each `{"name", "why", "settings"}`, shown `n/a (needs the simulated worker)`.
    needs_simulated: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["cells"] = [c.to_json() for c in self.cells]
        return data


def _request_model(scenario: Scenario, gateway: Gateway, cell: str | int, dialect: Dialect) -> str:
    """The model a cell's request names: the gateway's route prefix (in the client's dialect),
    the cell id, the settings."""
    return gateway.model_for(dialect, scenario.model_name(cell if isinstance(cell, str) else CELL_ID_TEMPLATE.format(cell)))


async def _run_cell(
    scenario: Scenario,
    dialect: Dialect,
    upstream: Dialect,
    client: str,
    gateway: Gateway,
    cell_id: str,
    hosts: dict,
    limiter: trio.CapacityLimiter,
    expected: Expected,
) -> CellResult:
    model = _request_model(scenario, gateway, cell_id, dialect)
    request = cell_request(scenario, dialect, client, gateway, cell_id, model)
    sent: list[tuple[ClientReport, Judgement, float]] = []
    async with limiter:
        # One request, or a scenario's run of them one after another (`requests_per_cell`).
        for _ in range(scenario.requests_per_cell):
            began = trio.current_time()
            raw = await hosts[client].run(request)
            took = trio.current_time() - began
            one = ClientReport.from_json({"client": client, "completed": False, **raw})
            sent.append((one, judge(one, expected), took))
    report, judgement, took = summarised(sent)
    return CellResult(
        scenario=scenario.name,
        dialect=dialect,
        upstream_dialect=upstream,
        client=client,
        gateway=gateway.name,
        topology=scenario.topology.label,
        cell_id=cell_id,
        outcome=judgement.outcome,
        why=judgement.reason,
        report=report.to_json(),
        request_model=model,
        first_token_s=report.ttft_s,
        total_s=report.duration_s if report.duration_s is not None else round(took, 3),
        requests=[
            {"outcome": j.outcome, "why": j.reason, "total_s": r.duration_s if r.duration_s is not None else round(t, 3)}
            for r, j, t in sent
        ]
        if len(sent) > 1
        else [],
    )


def _probe_model(gateway: Gateway, number: int, dialect: Dialect) -> str:
    """The model a cell's probe names at its gateway (labs.evidence.probe_model_name)."""
    return gateway.model_for(dialect, probe_model_name(CELL_ID_TEMPLATE.format(number)))


async def _drop_pooled_connections(toxiproxy, proxy: str) -> None:
    # Disabling closes every live connection through the tunnel (FIN both sides); clients and
    # gateways then open fresh ones, on which the scenario's fault is armed from the start.
    await trio.to_thread.run_sync(toxiproxy.client.set_enabled, proxy, False)
    await trio.to_thread.run_sync(toxiproxy.client.set_enabled, proxy, True)
    await trio.sleep(0.2)


async def run_lab(config: LabConfig, progress: Callable[[str, int, int], None] | None = None) -> LabResult:
    """Run the matrix; `progress(message, done, total)` is called as each scenario starts
    (`"<scenario>: starting, N cells"`) and as cells finish (`"<scenario>: <client> via <gateway>: <outcome>"`)."""
    started = time.time()
    clock = time.monotonic()
    if config.worker != SIMULATED:
        config = dataclasses.replace(config, scenarios=tuple(for_real_worker(s) for s in config.scenarios))
    planned = plan_cells(config)
    total = len(planned) * config.repeat
    if total > MAX_CELLS:
        # Cell ids are fixed-width (labs.scenario.CELL_ID_TEMPLATE): a wider id would change every
        # model name's length and with it the byte offsets of the exact cuts.
        raise LabError(
            f"{total} cells planned, at most {MAX_CELLS} fit in one run; run fewer scenarios, clients, gateways or repeats"
        )
    # Before anything starts: agents that cannot run here are one line, not a run of failed cells.
    refusal = await trio.to_thread.run_sync(agent_refusal, tuple(dict.fromkeys(cell.client for cell in planned)))
    if refusal is not None:
        raise LabError(refusal)
    if config.worker != SIMULATED:
        for scenario in config.scenarios:
            if knobs := needs_simulated_worker(scenario.worker, faulted=scenario.fault is not None):
                raise LabError(
                    f"scenario {scenario.name!r} needs the simulated worker ({', '.join(knobs)}): not with --worker {config.worker}"
                )
    run_dir = (config.results_dir / time.strftime("%Y%m%d-%H%M%S", time.localtime(started))).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)

    report = progress or (lambda message, done, total: None)
    results: list[CellResult] = []
    client_names = tuple(dict.fromkeys(cell.client for cell in planned))
    groups = topology_groups(config.scenarios, planned)
    if config.worker == SIMULATED:
        # A bad fault is refused before anything starts (a real worker's are laid out on its
        # captured answers, once it runs).
        for s in config.scenarios:
            for u in scenario_runs(planned, s):
                build_fault(s, u)

    async with AsyncExitStack() as stack:
        # The most cells of one scenario run: what a real server must serve at once.
        slots = max(
            (
                sum(1 for c in planned if c.scenario is s and c.upstream == u)
                for s in config.scenarios
                for u in scenario_runs(planned, s)
            ),
            default=1,
        )
        workers = await stack.enter_async_context(
            open_lab_workers(
                config, spare=any(topology.workers == 2 for topology in groups), slots=min(slots, config.jobs), run_dir=run_dir
            )
        )
        worker = workers[PRIMARY]
        toxiproxy = await stack.enter_async_context(open_toxiproxy_server(log_path=str(run_dir / "toxiproxy.log")))
        tunnel = await trio.to_thread.run_sync(
            lambda: toxiproxy.client.create_proxy(
                TUNNEL, upstream=f"127.0.0.1:{worker.port}", listen=f"127.0.0.1:{config.tunnel_port}"
            )
        )
        tunnel_url = f"http://127.0.0.1:{tunnel.listen_port}"
        hub = None
        if any(topology.hub for topology in groups):
            hub = await stack.enter_async_context(open_hub(upstream_port=tunnel.listen_port))
        report(topology_line(worker, tunnel.listen_port, workers.get(SPARE), hub) + "; starting gateways", 0, total)
        upstreams = {
            topology: (
                hub.url if topology.hub and hub is not None else tunnel_url,
                workers[SPARE].base_url.removesuffix("/v1") if topology.workers == 2 else None,
            )
            for topology in groups
        }
        gateway_sets = await stack.enter_async_context(
            open_gateway_sets(
                {
                    topology: tuple(dict.fromkeys(c.gateway for c in planned if c.scenario.topology == topology))
                    for topology in groups
                },
                upstreams,
                run_dir,
                external_url=config.external_url,
                external_api_key=config.external_api_key,
                models=models_by_topology(planned, config.repeat),
                finish_fix_idle_timeout_s=REAL_WORKER_IDLE_TIMEOUT_S if config.worker != SIMULATED else 2.0,
            )
        )
        # The dialects the run's clients speak: the Python host imports their libraries before its hello.
        run_dialects = tuple(d for d in LAB_DIALECTS if any(c.dialect == d for c in planned))
        hosts = await stack.enter_async_context(open_driver_hosts(client_names, run_dir, run_dialects))
        if config.worker != SIMULATED:
            report(f"{config.worker}: capturing its healthy answers", 0, total)
        # While the gateways start: the truth about the worker's answers (labs.worker.truth), and
        # one fault per scenario and dialect the worker speaks in it, laid out on those answers'
        # bytes (they differ per dialect).
        truth = await worker_truth(workers, [(s, d) for s in config.scenarios for d in spoken_dialects(planned, s)])
        faults = {
            (s.name, u): build_fault(s, u, layout=truth.layout(s, u)) for s in config.scenarios for u in scenario_runs(planned, s)
        }
        # Read while the first gateways start (a few short child runs; labs.gateway_versions).
        gateways_versions = await trio.to_thread.run_sync(gateway_versions)
        if groups:
            await gateway_sets.get(next(iter(groups)))
        versions = {host.runtime: host.hello.get("versions", {}) for host in hosts.values()}
        versions[GATEWAYS_RUNTIME] = gateways_versions
        limiter = trio.CapacityLimiter(max(1, config.jobs))
        agent_limiter = trio.CapacityLimiter(max(1, min(config.jobs, AGENT_JOBS)))
        done = 0
        #: When each cell ended (trio's clock), for the books' deadline.
        ended: dict[str, float] = {}

        def on_cell(label: str, result: CellResult) -> None:
            nonlocal done
            done += 1
            ended[result.cell_id] = trio.current_time()
            report(f"{label}: {result.client} via {result.gateway}: {result.outcome}", done, total)

        # Cell ids in matrix order, whatever order the topology groups run in; repeat r of the
        # matrix is numbered after repeat r - 1 (each repeat is a cell of its own until merged).
        numbered = list(enumerate(planned, start=1))
        servers = _servers(workers, hub)
        by_topology: dict[Topology, list[CellResult]] = {}
        for topology, scenarios in groups.items():
            if not gateway_sets.is_ready(topology):
                report(f"waiting for the gateways of the {topology.label} topology to start", done, total)
            gateways = await gateway_sets.get(topology)
            group_results = by_topology.setdefault(topology, [])
            for scenario in scenarios:
                for upstream, repeat in ((u, r) for u in scenario_runs(planned, scenario) for r in range(1, config.repeat + 1)):
                    cells = [
                        (n + (repeat - 1) * len(planned), c.client, c.gateway, c.dialect)
                        for n, c in numbered
                        if c.scenario is scenario and c.upstream == upstream
                    ]
                    if not cells:
                        continue
                    label = repeat_label(scenario.label(upstream), repeat, config.repeat)
                    if hub is not None and scenario.hub_policy is not None:
                        hub.on_tunnel_drop = scenario.hub_policy
                    # Isolation (issue 14): from here on the hub and the workers serve this run's
                    # cells only; a gateway's late retry of an earlier cell is refused (409) and
                    # counted, never served under this run's policy and fault. Set before SMG's
                    # registration, whose probes name this run's cells.
                    numbers = [CELL_ID_TEMPLATE.format(n) for n, _, _, _ in cells]
                    _serve_only(servers, frozenset(numbers + [probe_id(cell) for cell in numbers]))
                    prepare_real_workers(workers, scenario, truth)
                    if hub is not None and isinstance(truth, CapturedTruth):
                        hub.first_token_body_ends = truth.first_token_body_ends(scenario)
                    # "LABEL: ..." like every cell's line, so a progress display knows the scenario
                    # from its first moment (a stall's cells finish only at its deadline).
                    report(f"{label}: starting, {len(cells)} cells", done, total)
                    # Every finish_fix in this run's paths runs it with the scenario's options
                    # (`[finish_fix]`), the lab's own when it has none (as the hub's policy above).
                    await configure_gateways(
                        [gateways[name] for name in dict.fromkeys(g for _, _, g, _ in cells)], scenario.finish_fix_options
                    )
                    # Before the fault and the drop: SMG registers each model's workers (probes).
                    await prepare_gateways(
                        gateways,
                        [(g, _request_model(scenario, gateways[g], n, d)) for n, _, g, d in cells]
                        + [(g, _probe_model(gateways[g], n, d)) for n, _, g, d in cells],
                    )
                    await _drop_pooled_connections(toxiproxy, TUNNEL)
                    run_results = await _run_scenario(
                        scenario,
                        upstream,
                        cells,
                        faults[(scenario.name, upstream)],
                        label=label,
                        gateways=gateways,
                        hosts=hosts,
                        limiter=limiter,
                        agent_limiter=agent_limiter,
                        toxiproxy=toxiproxy,
                        on_cell=on_cell,
                        truth=truth,
                    )
                    for result in run_results:
                        result.repeat = repeat
                    group_results += run_results
                    # Between runs nothing is current: whatever still arrives for a finished cell
                    # is refused.
                    _serve_only(servers, frozenset())
        _serve_only(servers, None)
        # Every topology's books at once: one deadline for the run, not one per gateway set.
        async with trio.open_nursery() as nursery:
            for topology, group_results in by_topology.items():
                nursery.start_soon(_wait_for_books, group_results, gateway_sets.opened[topology], ended)
        for topology, group_results in by_topology.items():
            _attach_books(group_results, gateway_sets.opened[topology])
            results += group_results
        attach_workers(results, workers, hub)
        stale = {name: server.stale_refused for name, server in servers.items()}
    results = merge_repeats(sorted(results, key=lambda r: r.cell_id), config.repeat)
    return LabResult(
        started=started,
        duration_s=time.monotonic() - clock,
        # One entry per scenario and dialect its cells' clients or its worker spoke, in `Dialect` order.
        scenarios=[
            {
                "name": s.name,
                "dialect": d,
                "label": s.label(d),
                "title": s.title,
                "deadline_s": s.deadline_s,
                "fault": s.fault,
                "fault_summary": fault.summary if (fault := faults.get((s.name, d))) else None,
                "worker": s.worker.to_header(),
                "expected": dataclasses.asdict(truth.expected(s, d)),
                "worker_stream": truth.stream(s, d),
                "topology": s.topology.label,
                "hub": s.hub_policy.value if s.hub_policy else None,
                "workers": s.pool_workers,
            }
            for d in LAB_DIALECTS
            for s in config.scenarios
            if d in spoken_dialects(planned, s)
        ],
        clients=list(client_names),
        gateways=list(dict.fromkeys(c.gateway for c in planned)),
        versions=versions,
        run_dir=str(run_dir),
        cells=results,
        clients_by_dialect={
            d.value: [c for c in CLIENTS_BY_DIALECT[d] if any(p.dialect == d and p.client == c for p in planned)]
            for d in LAB_DIALECTS
            if any(p.dialect == d for p in planned)
        },
        not_applicable=plan_not_applicable(config),
        repeat=config.repeat,
        stale_refused={name: count for name, count in stale.items() if count},
        routes=routes_of(planned),
        worker=dict(truth.facts),
    )


async def _run_scenario(
    scenario: Scenario,
    upstream: Dialect,
    cells: list[tuple[int, str, str, Dialect]],
    fault: Fault | None,
    *,
    gateways: dict[str, Gateway],
    hosts: dict,
    limiter: trio.CapacityLimiter,
    agent_limiter: trio.CapacityLimiter,
    toxiproxy,
    on_cell: Callable[[str, CellResult], None],
    truth: WorkerTruth | None = None,
    label: str | None = None,
) -> list[CellResult]:
    """All cells of one scenario whose worker speaks `upstream` (`cells`: number, client, gateway,
    the client's dialect): its library cells at once (`limiter`), then its agent cells
    (`agent_limiter`; module docstring), with its fault on the tunnel for as long as any runs;
    `on_cell(label, result)` as each ends (`label`: the run's, by default the scenario's in
    `upstream`)."""
    results: list[CellResult] = []
    label = label or scenario.label(upstream)
    known = truth or ComputedTruth()

    async def one(cell_id: str, client: str, gateway: str, dialect: Dialect, cells_limiter: trio.CapacityLimiter) -> None:
        expected = known.expected(scenario, dialect)
        result = await _run_cell(scenario, dialect, upstream, client, gateways[gateway], cell_id, hosts, cells_limiter, expected)
        results.append(result)
        on_cell(label, result)

    waves = (
        ([c for c in cells if c[1] not in AGENT_CLIENTS], limiter),
        ([c for c in cells if c[1] in AGENT_CLIENTS], agent_limiter),
    )
    async with fault.applied(toxiproxy.client, TUNNEL) if fault is not None else contextlib.nullcontext():
        for wave, wave_limiter in waves:
            async with trio.open_nursery() as nursery:
                for number, client, gateway, dialect in wave:
                    nursery.start_soon(one, CELL_ID_TEMPLATE.format(number), client, gateway, dialect, wave_limiter)
    # The probes, once the fault is lifted (a tunnel fault would cut a probe too) and the pooled
    # connections that met it are closed (a stalled one would stall a probe): all at once, like the
    # cells; an agent's cell has none (labs.evidence).
    if fault is not None:
        await _drop_pooled_connections(toxiproxy, TUNNEL)
    async with trio.open_nursery() as nursery:
        for result in results:
            if result.client not in AGENT_CLIENTS:
                # A real worker answers the probe as it answered the capture of the same request
                # (its prompt, limit and dialect); the simulated one the probe's own settings.
                healthy = known.expected(scenario, result.dialect) if isinstance(known, CapturedTruth) else None
                nursery.start_soon(run_probe, scenario, result, gateways[result.gateway], hosts, limiter, healthy)
    return sorted(results, key=lambda r: r.cell_id)


def _servers(workers: dict[str, AnyWorker], hub: Hub | None) -> dict[str, AnyWorker | Hub]:
    """The servers that see a cell's requests, by the name `stale_refused` counts them under."""
    return {**workers, **({HUB: hub} if hub is not None else {})}


def _serve_only(servers: dict[str, AnyWorker | Hub], cells: frozenset[str] | None) -> None:
    """Tell every server which cells are current (labs.worker.attempts: a request of any other
    cell is refused 409 and counted); None: every request is served (the lab is done)."""
    for server in servers.values():
        server.current_cells = cells


def _missing_books(results: list[CellResult], gateways: dict[str, Gateway]) -> list[CellResult]:
    entries = {name: read_books(g.books_path) for name, g in gateways.items() if g.books_path is not None}
    return [
        r
        for r in results
        if gateways[r.gateway].books_path is not None
        and books_entry(gateways[r.gateway], entries[r.gateway], r.cell_id) == (None, None)
    ]


async def _wait_for_books(
    results: list[CellResult],
    gateways: dict[str, Gateway],
    ended: dict[str, float] | None = None,
    deadline_s: float = BOOKS_DEADLINE_S,
) -> None:
    """Until every cell through a books-keeping gateway has its entry, or `deadline_s` passed since
    each cell still without one ended (`ended`: trio's clock, by cell id; a cell not in it counts
    as ending when the wait starts)."""
    ended = ended or {}
    now = trio.current_time()
    while True:
        missing = _missing_books(results, gateways)
        if not missing or trio.current_time() >= max(ended.get(r.cell_id, now) for r in missing) + deadline_s:
            return
        await trio.sleep(0.1)


def _attach_books(results: list[CellResult], gateways: dict[str, Gateway]) -> None:
    entries = {name: read_books(g.books_path) for name, g in gateways.items()}
    captures = {name: read_books(g.capture_path) for name, g in gateways.items()}
    for result in results:
        gateway = gateways[result.gateway]
        result.finish_fix_stream = captured_stream(captures[result.gateway], result.cell_id)
        if gateway.books_path is None:
            # A gateway that keeps no per-request record says so (`none`), never a blank.
            result.books = BOOKS_NONE if gateway.books_kind == BOOKS_NONE else None
            continue
        word, entry = books_entry(gateway, entries[result.gateway], result.cell_id)
        if entry is None:
            # The gateway keeps books but has none for this request: say so, and flag it (a
            # request its books do not know about is exactly what an operator needs to see).
            result.books, result.books_entry, result.books_mismatch = BOOKS_NO_ENTRY, None, True
            continue
        if result.requests:
            # A cell of several requests (`requests_per_cell`) is booked as its outcome is judged:
            # `error` if the books say so for any of its requests, with that entry. A request's
            # lines are those that share its `call_id` (LiteLLM's: its retries and fallbacks), else
            # each line is one; each request is read by the gateway's own reader (its last line).
            by_request: dict[Any, list[dict[str, Any]]] = {}
            for number, line in enumerate(entries[result.gateway]):
                by_request.setdefault(line.get("call_id") or ("line", number), []).append(line)
            failed = [
                (one_word, one_entry)
                for one_word, one_entry in (books_entry(gateway, lines, result.cell_id) for lines in by_request.values())
                if one_entry is not None and one_word == BOOKS_ERROR
            ]
            word, entry = failed[0] if failed else (word, entry)
        result.books, result.books_entry = word, entry
        result.books_mismatch = books_mismatch(result.outcome, word)
