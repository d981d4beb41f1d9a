"""The lab runner: every scenario x dialect x gateway x client cell, concurrently on trio.

`run_lab` is five steps, each a function below: plan (`_plan`: the cells, and every check that can
refuse the run before anything starts), open the topology (`_open_topology`: workers, tunnel, hub,
gateways, driver hosts), run the cells (`_run_cells`, one scenario run at a time through
labs.scenario_run), read the records (`_read_records`: the gateways' books, labs.cell_books, and
the workers' and the hub's, labs.topology), then merge the repeats (labs.repeat) and report
(`_lab_result`). A cell's result is `labs.cell_result.CellResult`.

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

import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from faults.catalog import Fault
from faults.toxiproxy_server import ToxiproxyServer, open_toxiproxy_server
from finishline import Dialect
from labs.cell_books import attach_books, wait_for_books
from labs.cell_ids import CELL_ID_TEMPLATE, MAX_CELLS
from labs.cell_result import CellResult
from labs.clients import CLIENTS_BY_DIALECT
from labs.clients.agent_host import agent_refusal
from labs.clients.hosts import host_versions, open_driver_hosts
from labs.dialects import LAB_DIALECTS
from labs.evidence import probe_id
from labs.fault_plan import build_fault
from labs.gateway_versions import gateway_versions
from labs.gateways.services import Gateway, configure_gateways, prepare_gateways
from labs.hub import Hub, open_hub
from labs.plan import (
    LabConfig,
    NotApplicable,
    PlannedCell,
    models_by_topology,
    plan_cells,
    plan_not_applicable,
    repeat_label,
    routes_of,
    scenario_runs,
    spoken_dialects,
)
from labs.repeat import merge_repeats
from labs.scenario import Scenario, Topology
from labs.scenario_run import TUNNEL, Cells, drop_pooled_connections, probe_model, request_model, run_scenario
from labs.topology import (
    HUB,
    AnyWorker,
    GatewaySets,
    attach_workers,
    open_gateway_sets,
    topology_groups,
    topology_line,
)
from labs.worker.attempts import PRIMARY, SPARE
from labs.worker.real import SIMULATED, needs_simulated_worker
from labs.worker.truth import CapturedTruth, WorkerTruth
from labs.workers import REAL_WORKER_IDLE_TIMEOUT_S, for_real_worker, open_lab_workers, prepare_real_workers, worker_truth

__all__ = [
    "PRIMARY",
    "SPARE",
    "GATEWAYS_RUNTIME",
    "LabError",
    "LabResult",
    "run_lab",
]

#: Agent cells in flight at once (after the scenario's library cells; module docstring). A `--all`
#: run had 28 of them at once beside 70 library cells and none missed its 60 s deadline, so 8 alone
#: leave room; `--jobs` lower than this lowers it too.
AGENT_JOBS = 8
#: The `versions` key of the gateways' versions (beside the driver hosts' runtimes).
GATEWAYS_RUNTIME = "gateways"
#: `run_lab`'s `progress(message, done, total)`.
Progress = Callable[[str, int, int], None]


class LabError(ValueError):
    """The lab cannot run as configured; the message says what to change."""


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


async def run_lab(config: LabConfig, progress: Progress | None = None) -> LabResult:
    """Run the matrix; `progress(message, done, total)` is called as each scenario starts
    (`"<scenario>: starting, N cells"`) and as cells finish (`"<scenario>: <client> via <gateway>: <outcome>"`).

    Raises:
        LabError: the run cannot go as configured (too many cells, an agent that cannot run here,
            a scenario a real worker cannot play), before any server starts.
    """
    plan = await _plan(config)
    tally = _Tally(progress or _no_progress, plan.total)
    async with _open_topology(plan, tally) as rig:
        by_topology = await _run_cells(plan, rig, tally)
        results = await _read_records(rig, by_topology, tally.ended)
        stale = {name: server.stale_refused for name, server in rig.servers.items()}
    results = merge_repeats(sorted(results, key=lambda r: r.cell_id), plan.config.repeat)
    return _lab_result(plan, rig, results, stale)


def _no_progress(message: str, done: int, total: int) -> None:
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class _Plan:
    """What a run covers, checked before anything starts (`_plan`)."""

    config: LabConfig
    #: Every cell of one repeat, in matrix order.
    planned: list[PlannedCell]
    #: The scenarios with cells, by topology (labs.topology.topology_groups).
    groups: dict[Topology, list[Scenario]]
    run_dir: Path
    #: When the run started: the wall clock (for the run's folder and `LabResult.started`) and
    #: the monotonic one (for its duration).
    started: float
    clock: float

    @property
    def total(self) -> int:
        """Every cell of every repeat."""
        return len(self.planned) * self.config.repeat

    @property
    def client_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(cell.client for cell in self.planned))

    def cells(self, scenario: Scenario, upstream: Dialect, repeat: int) -> Cells:
        """One run's cells: the scenario's whose worker speaks `upstream`, numbered in matrix
        order whatever order the topology groups run in; repeat r of the matrix is numbered after
        repeat r - 1 (each repeat is a cell of its own until merged)."""
        return [
            (n + (repeat - 1) * len(self.planned), c.client, c.gateway, c.dialect)
            for n, c in enumerate(self.planned, start=1)
            if c.scenario is scenario and c.upstream == upstream
        ]


async def _plan(config: LabConfig) -> _Plan:
    """Step 1: the cells the run covers, and every check that can refuse the run before anything
    starts; makes the run's folder."""
    started = time.time()
    clock = time.monotonic()
    if config.worker != SIMULATED:
        config = dataclasses.replace(config, scenarios=tuple(for_real_worker(s) for s in config.scenarios))
    planned = plan_cells(config)
    total = len(planned) * config.repeat
    if total > MAX_CELLS:
        # Cell ids are fixed-width (labs.cell_ids.CELL_ID_TEMPLATE): a wider id would change every
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
    if config.worker == SIMULATED:
        # A bad fault is refused before anything starts (a real worker's are laid out on its
        # captured answers, once it runs).
        for s in config.scenarios:
            for u in scenario_runs(planned, s):
                build_fault(s, u)
    groups = topology_groups(config.scenarios, planned)
    return _Plan(config=config, planned=planned, groups=groups, run_dir=run_dir, started=started, clock=clock)


class _Tally:
    """The run's progress: cells done, when each ended (trio's clock, for the books' deadline),
    and the lines for `progress`."""

    def __init__(self, progress: Progress, total: int) -> None:
        self.progress = progress
        self.total = total
        self.done = 0
        self.ended: dict[str, float] = {}

    def say(self, message: str) -> None:
        self.progress(message, self.done, self.total)

    def on_cell(self, label: str, result: CellResult) -> None:
        self.done += 1
        self.ended[result.cell_id] = trio.current_time()
        self.say(f"{label}: {result.client} via {result.gateway}: {result.outcome}")


@dataclass(slots=True, kw_only=True)
class _Rig:
    """The run's servers and what they told at start (`_open_topology`)."""

    workers: dict[str, AnyWorker]
    toxiproxy: ToxiproxyServer
    hub: Hub | None
    #: Every server that sees a cell's requests, by the name `stale_refused` counts them under.
    servers: dict[str, AnyWorker | Hub]
    gateway_sets: GatewaySets
    #: The driver hosts, by client name.
    hosts: dict
    truth: WorkerTruth
    #: One fault per scenario and upstream dialect (None: the scenario has none).
    faults: dict[tuple[str, Dialect], Fault | None]
    versions: dict[str, Any]
    limiter: trio.CapacityLimiter
    agent_limiter: trio.CapacityLimiter


@asynccontextmanager
async def _open_topology(plan: _Plan, tally: _Tally) -> AsyncIterator[_Rig]:
    """Step 2: the workers, the tunnel, the hub, every topology's gateways (in the background)
    and the driver hosts, for the block; the truth about the worker's answers and the faults laid
    out on them; the versions of everything."""
    config, planned, groups = plan.config, plan.planned, plan.groups
    async with AsyncExitStack() as stack:
        workers, toxiproxy, tunnel_port, hub = await _open_servers(stack, plan, tally)
        tunnel_url = f"http://127.0.0.1:{tunnel_port}"
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
                plan.run_dir,
                external_url=config.external_url,
                external_api_key=config.external_api_key,
                models=models_by_topology(planned, config.repeat),
                finish_fix_idle_timeout_s=REAL_WORKER_IDLE_TIMEOUT_S if config.worker != SIMULATED else 2.0,
            )
        )
        # The dialects the run's clients speak: the Python host imports their libraries before its hello.
        run_dialects = tuple(d for d in LAB_DIALECTS if any(c.dialect == d for c in planned))
        hosts = await stack.enter_async_context(open_driver_hosts(plan.client_names, plan.run_dir, run_dialects))
        if config.worker != SIMULATED:
            tally.say(f"{config.worker}: capturing its healthy answers")
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
        versions = host_versions(hosts)
        versions[GATEWAYS_RUNTIME] = gateways_versions
        yield _Rig(
            workers=workers,
            toxiproxy=toxiproxy,
            hub=hub,
            servers={**workers, **({HUB: hub} if hub is not None else {})},
            gateway_sets=gateway_sets,
            hosts=hosts,
            truth=truth,
            faults=faults,
            versions=versions,
            limiter=trio.CapacityLimiter(max(1, config.jobs)),
            agent_limiter=trio.CapacityLimiter(max(1, min(config.jobs, AGENT_JOBS))),
        )


async def _open_servers(
    stack: AsyncExitStack, plan: _Plan, tally: _Tally
) -> tuple[dict[str, AnyWorker], ToxiproxyServer, int, Hub | None]:
    """The workers, the toxiproxy server with the tunnel to the primary, and the hub if a topology
    has it, on `stack`; the tunnel's port."""
    config, planned, groups = plan.config, plan.planned, plan.groups
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
            config, spare=any(topology.workers == 2 for topology in groups), slots=min(slots, config.jobs), run_dir=plan.run_dir
        )
    )
    worker = workers[PRIMARY]
    toxiproxy = await stack.enter_async_context(open_toxiproxy_server(log_path=str(plan.run_dir / "toxiproxy.log")))
    tunnel = await trio.to_thread.run_sync(
        lambda: toxiproxy.client.create_proxy(
            TUNNEL, upstream=f"127.0.0.1:{worker.port}", listen=f"127.0.0.1:{config.tunnel_port}"
        )
    )
    hub = None
    if any(topology.hub for topology in groups):
        hub = await stack.enter_async_context(open_hub(upstream_port=tunnel.listen_port))
    tally.say(topology_line(worker, tunnel.listen_port, workers.get(SPARE), hub) + "; starting gateways")
    return workers, toxiproxy, tunnel.listen_port, hub


async def _run_cells(plan: _Plan, rig: _Rig, tally: _Tally) -> dict[Topology, list[CellResult]]:
    """Step 3: every cell, by topology (each group once its gateways are up), scenario, upstream
    dialect and repeat, one run after another."""
    by_topology: dict[Topology, list[CellResult]] = {}
    for topology, scenarios in plan.groups.items():
        if not rig.gateway_sets.is_ready(topology):
            tally.say(f"waiting for the gateways of the {topology.label} topology to start")
        gateways = await rig.gateway_sets.get(topology)
        group_results = by_topology.setdefault(topology, [])
        for scenario in scenarios:
            for upstream in scenario_runs(plan.planned, scenario):
                for repeat in range(1, plan.config.repeat + 1):
                    cells = plan.cells(scenario, upstream, repeat)
                    if cells:
                        label = repeat_label(scenario.label(upstream), repeat, plan.config.repeat)
                        group_results += await _run_one(rig, tally, gateways, scenario, upstream, cells, label, repeat)
    _serve_only(rig.servers, None)
    return by_topology


async def _run_one(
    rig: _Rig,
    tally: _Tally,
    gateways: dict[str, Gateway],
    scenario: Scenario,
    upstream: Dialect,
    cells: Cells,
    label: str,
    repeat: int,
) -> list[CellResult]:
    """One run of a scenario's cells whose worker speaks `upstream`: the servers and gateways set
    for it, the pooled connections dropped, then its cells under its fault (`_run_scenario`)."""
    hub = rig.hub
    if hub is not None and scenario.hub_policy is not None:
        hub.on_tunnel_drop = scenario.hub_policy
    # Isolation (issue 14): from here on the hub and the workers serve this run's cells only; a
    # gateway's late retry of an earlier cell is refused (409) and counted, never served under
    # this run's policy and fault. Set before SMG's registration, whose probes name this run's cells.
    numbers = [CELL_ID_TEMPLATE.format(n) for n, _, _, _ in cells]
    _serve_only(rig.servers, frozenset(numbers + [probe_id(cell) for cell in numbers]))
    prepare_real_workers(rig.workers, scenario, rig.truth)
    if hub is not None and isinstance(rig.truth, CapturedTruth):
        hub.first_token_body_ends = rig.truth.first_token_body_ends(scenario)
    # "LABEL: ..." like every cell's line, so a progress display knows the scenario from its first
    # moment (a stall's cells finish only at its deadline).
    tally.say(f"{label}: starting, {len(cells)} cells")
    # Every finish_fix in this run's paths runs it with the scenario's options (`[finish_fix]`),
    # the lab's own when it has none (as the hub's policy above).
    await configure_gateways([gateways[name] for name in dict.fromkeys(g for _, _, g, _ in cells)], scenario.finish_fix_options)
    # Before the fault and the drop: SMG registers each model's workers (probes).
    await prepare_gateways(
        gateways,
        [(g, request_model(scenario, gateways[g], n, d)) for n, _, g, d in cells]
        + [(g, probe_model(gateways[g], n, d)) for n, _, g, d in cells],
    )
    await drop_pooled_connections(rig.toxiproxy, TUNNEL)
    results = await run_scenario(
        scenario,
        upstream,
        cells,
        rig.faults[(scenario.name, upstream)],
        label=label,
        gateways=gateways,
        hosts=rig.hosts,
        limiter=rig.limiter,
        agent_limiter=rig.agent_limiter,
        toxiproxy=rig.toxiproxy,
        on_cell=tally.on_cell,
        truth=rig.truth,
    )
    for result in results:
        result.repeat = repeat
    # Between runs nothing is current: whatever still arrives for a finished cell is refused.
    _serve_only(rig.servers, frozenset())
    return results


async def _read_records(rig: _Rig, by_topology: dict[Topology, list[CellResult]], ended: dict[str, float]) -> list[CellResult]:
    """Step 4: every cell with its gateway's books and the workers' and the hub's records of it."""
    # Every topology's books at once: one deadline for the run, not one per gateway set.
    async with trio.open_nursery() as nursery:
        for topology, group_results in by_topology.items():
            nursery.start_soon(wait_for_books, group_results, rig.gateway_sets.opened[topology], ended)
    results: list[CellResult] = []
    for topology, group_results in by_topology.items():
        attach_books(group_results, rig.gateway_sets.opened[topology])
        results += group_results
    attach_workers(results, rig.workers, rig.hub)
    return results


def _lab_result(plan: _Plan, rig: _Rig, results: list[CellResult], stale: dict[str, int]) -> LabResult:
    """Step 5 (after the repeats are merged): the run's report."""
    config, planned = plan.config, plan.planned
    return LabResult(
        started=plan.started,
        duration_s=time.monotonic() - plan.clock,
        # One entry per scenario and dialect its cells' clients or its worker spoke, in `Dialect` order.
        scenarios=[
            {
                "name": s.name,
                "dialect": d,
                "label": s.label(d),
                "title": s.title,
                "deadline_s": s.deadline_s,
                "fault": s.fault,
                "fault_summary": fault.summary if (fault := rig.faults.get((s.name, d))) else None,
                "worker": s.worker.to_header(),
                "expected": dataclasses.asdict(rig.truth.expected(s, d)),
                "worker_stream": rig.truth.stream(s, d),
                "topology": s.topology.label,
                "hub": s.hub_policy.value if s.hub_policy else None,
                "workers": s.pool_workers,
            }
            for d in LAB_DIALECTS
            for s in config.scenarios
            if d in spoken_dialects(planned, s)
        ],
        clients=list(plan.client_names),
        gateways=list(dict.fromkeys(c.gateway for c in planned)),
        versions=rig.versions,
        run_dir=str(plan.run_dir),
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
        worker=dict(rig.truth.facts),
    )


def _serve_only(servers: dict[str, AnyWorker | Hub], cells: frozenset[str] | None) -> None:
    """Tell every server which cells are current (labs.worker.attempts: a request of any other
    cell is refused 409 and counted); None: every request is served (the lab is done)."""
    for server in servers.values():
        server.current_cells = cells
