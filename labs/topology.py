"""The lab's topologies at run time: which scenarios share gateways, starting each topology's
gateways, and which worker answered each cell.

A topology (`labs.scenario.Topology`) is what sits between the gateways and the workers: the hub
or not, one worker or two. Gateways are told their upstreams when they start, so each topology a
run needs gets its own set of gateways (`open_gateway_sets`), and the runner (labs.runner) runs the
scenarios grouped by topology (`topology_groups`). Which worker answered a cell is read from the
workers' own records (`attach_workers`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from finishline import Dialect
from labs.cell_ids import cell_id_of
from labs.cell_result import CellResult
from labs.evidence import first_gap_s, max_attempts_per_s
from labs.gateways.registry import RunServices, TopologyPlan
from labs.gateways.services import Gateway, open_gateways
from labs.hub import Hub
from labs.plan import PlannedCell
from labs.scenario import Scenario, Topology
from labs.worker.attempts import PRIMARY, SPARE, Attempt, HasAttempts, attempts_of
from labs.worker.real import RealWorker
from labs.worker.server import RunningWorker

__all__ = [
    "HUB",
    "AnyWorker",
    "GatewaySets",
    "attach_workers",
    "attempt_json",
    "open_gateway_sets",
    "route_prefix",
    "topology_groups",
    "topology_line",
]

#: The hub, as `LabResult.stale_refused` names it (and a topology's label starts with it).
HUB = "hub"


def attempt_json(attempt: Attempt, at: str) -> dict[str, Any]:
    """One attempt as `result.json` keeps it: its fields (enums as their words), and `at`, the
    server that recorded it as the lab names it (`hub`, `primary`, `spare`)."""
    data = dataclasses.asdict(attempt)
    return {"at": at, **{key: (value.value if isinstance(value, enum.Enum) else value) for key, value in data.items()}}


def topology_groups(scenarios: tuple[Scenario, ...], planned: list[PlannedCell]) -> dict[Topology, list[Scenario]]:
    """The scenarios that have cells (in any dialect), by topology: the default one (no hub, one
    worker) first, each group in the order the scenarios were given."""
    groups: dict[Topology, list[Scenario]] = {}
    having_cells = {id(cell.scenario) for cell in planned}
    for scenario in scenarios:
        if id(scenario) in having_cells:
            groups.setdefault(scenario.topology, []).append(scenario)
    return dict(sorted(groups.items()))


def route_prefix(topology: Topology) -> str:
    """The model-name prefix of a topology's cells at a gateway that serves every topology from
    one process (`TopologyPlan.route_prefix`): none for the default topology, else its label
    (`hub/`, `hub+spare/`)."""
    return "" if topology == Topology() else f"{topology.label}/"


#: The lab's worker: the simulated one, or the front of a real server (labs.worker.real).
AnyWorker = RunningWorker | RealWorker


def topology_line(worker: AnyWorker, tunnel_port: int, spare: AnyWorker | None, hub: Hub | None) -> str:
    line = f"worker on 127.0.0.1:{worker.port}, tunnel (toxiproxy) on 127.0.0.1:{tunnel_port}"
    if isinstance(worker, RealWorker):
        line = f"{worker.facts['worker']} at {worker.upstream.base_url} (model {worker.upstream.model}) behind its front; " + line
    if hub is not None:
        line += f", hub on 127.0.0.1:{hub.port}"
    if spare is not None:
        line += f", spare worker on 127.0.0.1:{spare.port}"
    return line


class GatewaySets:
    """Each topology's gateways, as they come up (`open_gateway_sets`)."""

    def __init__(self, topologies: Iterable[Topology]) -> None:
        self.opened: dict[Topology, dict[str, Gateway]] = {}
        self._ready = {topology: trio.Event() for topology in topologies}

    def is_ready(self, topology: Topology) -> bool:
        return self._ready[topology].is_set()

    async def get(self, topology: Topology) -> dict[str, Gateway]:
        """The topology's gateways, once they all answer."""
        await self._ready[topology].wait()
        return self.opened[topology]

    def _set(self, topology: Topology, gateways: dict[str, Gateway]) -> None:
        self.opened[topology] = gateways
        self._ready[topology].set()


@asynccontextmanager
async def open_gateway_sets(
    names: dict[Topology, tuple[str, ...]],
    upstreams: dict[Topology, tuple[str, str | None]],
    run_dir: Path,
    *,
    external_url: str | None = None,
    external_api_key: str | None = None,
    models: dict[Topology, dict[tuple[str, Dialect], tuple[str, ...]]] | None = None,
    finish_fix_idle_timeout_s: float = 2.0,
) -> AsyncIterator[GatewaySets]:
    """Every topology's gateways, opened in the background one set after another, in `names`
    order, and stopped when the block ends; one that fails to start ends the run with its error.

    The first topology's cells run while the next one's gateways start, so only the first set's
    start is waited for in full. One set at a time: a set's gateways already start at once
    (labs.gateways.services). A gateway that serves every topology from one process (LiteLLM,
    the slowest to start) is a run-wide service (`RunServices`): the first set starts it with the
    routes of every topology, which its cells tell apart by the topology's route prefix
    (`route_prefix`), so the later sets start only light processes while cells run. The default
    topology's gateways keep their logs and books in `run_dir`, the others in a folder named
    after the topology (`run_dir/hub`, `run_dir/hub+spare`); run-wide services keep theirs in
    `run_dir`. `models`: per topology, the models each (gateway, client dialect) will be asked for
    (`TopologyPlan.models`).
    """
    sets = GatewaySets(names)
    release = trio.Event()
    plans = {}
    for topology, gateway_names in names.items():
        primary_url, spare_url = upstreams[topology]
        directory = run_dir if topology == Topology() else run_dir / topology.label
        directory.mkdir(parents=True, exist_ok=True)
        plans[topology.label] = TopologyPlan(
            primary_url=primary_url,
            spare_url=spare_url,
            run_dir=directory,
            names=gateway_names,
            route_prefix=route_prefix(topology),
            models=(models or {}).get(topology, {}),
        )
    run = RunServices(run_dir=run_dir, finish_fix_idle_timeout_s=finish_fix_idle_timeout_s)

    async def open_all() -> None:
        async with run.stack, AsyncExitStack() as stack:
            for topology, gateway_names in names.items():
                plan = plans[topology.label]
                sets._set(
                    topology,
                    await stack.enter_async_context(
                        open_gateways(
                            gateway_names,
                            primary_url=plan.primary_url,
                            spare_url=plan.spare_url,
                            run_dir=plan.run_dir,
                            external_url=external_url,
                            external_api_key=external_api_key,
                            topology=topology.label,
                            topologies=plans,
                            run=run,
                        )
                    ),
                )
            await release.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(open_all)
        try:
            yield sets
        finally:
            release.set()


def attach_workers(results: list[CellResult], workers: dict[str, AnyWorker], hub: Hub | None) -> None:
    """Which worker answered each cell, how often each was asked, what the hub did, and every
    request the hub and the workers saw for it (`attempts`, oldest first) with the count of tries:
    the requests at the first server behind the gateway (the hub when the cell's topology has
    it, else the primary) plus the spare's, since through the hub each try also reaches the
    primary (the tunnel), and counting both would count it twice."""
    asked: dict[str, dict[str, int]] = {}
    for name, worker in workers.items():
        for model in worker.arrivals:
            cell = cell_id_of(model)
            if cell is not None:
                counts = asked.setdefault(cell, {})
                counts[name] = counts.get(name, 0) + 1
    relayed: dict[str, list[str]] = {}
    for exchange in hub.exchanges if hub is not None else ():
        cell = cell_id_of(exchange.model)
        if cell is not None:
            relayed.setdefault(cell, []).append(exchange.summary())
    for result in results:
        result.worker_requests = asked.get(result.cell_id, {})
        result.answered_by = SPARE if SPARE in result.worker_requests else PRIMARY if result.worker_requests else None
        result.hub = relayed.get(result.cell_id, [])
        servers: dict[str, HasAttempts] = {**({HUB: hub} if hub is not None else {}), **workers}
        seen = [attempt_json(a, name) for name, server in servers.items() for a in attempts_of(result.cell_id, server)]
        result.attempts = sorted(seen, key=lambda a: a["arrived_at"])
        first_hop = hub if hub is not None and result.topology.startswith(HUB) else workers[PRIMARY]
        asked_by_gateway = [first_hop, *([workers[SPARE]] if SPARE in workers else [])]
        made = attempts_of(result.cell_id, *asked_by_gateway)
        result.tries = len(made)
        # The failover suites' evidence (labs.evidence), from the attempts the gateway made.
        result.first_gap_s = first_gap_s([a.arrived_at for a in made])
        result.max_attempts_per_s = max_attempts_per_s([a.arrived_at for a in made])
        if result.probe is not None:
            result.probe["tries"] = len(attempts_of(result.probe["cell_id"], *asked_by_gateway))
