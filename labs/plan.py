"""What a lab run covers, decided before anything starts: its configuration (`LabConfig`), its cells
(`plan_cells`: a scenario in one dialect, through one gateway, with one client, and the dialect the
worker speaks for it), the gateways shown `n/a` and why (`plan_not_applicable`), and the scenario
runs they make (`scenario_runs`, `run_labels`).

A cell's worker speaks the dialect of its gateway's route (labs.gateways.registry `routes`): the
client's own, or another for a gateway that translates, when the scenario lets its worker speak it
(`Scenario.speaks`). A scenario runs once per dialect its cells' worker speaks, since a byte-exact
fault is laid out on the worker's bytes. Pure: no process, no socket; `labs.runner` runs the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from finishline import Dialect
from labs.cell_ids import CELL_ID_TEMPLATE
from labs.clients import AGENT_CLIENTS, CLIENTS_BY_DIALECT, EVERY_CLIENT
from labs.dialects import LAB_DIALECTS
from labs.evidence import probe_model_name
from labs.gateways import EXTERNAL, GATEWAYS
from labs.gateways.registry import lookup, unserved_reason, upstream_dialect
from labs.scenario import Scenario, Topology

__all__ = [
    "LabConfig",
    "NotApplicable",
    "PlannedCell",
    "cell_upstream",
    "models_by_topology",
    "plan_cells",
    "plan_not_applicable",
    "repeat_label",
    "routes_of",
    "run_dialects",
    "run_labels",
    "scenario_runs",
    "spoken_dialects",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class LabConfig:
    scenarios: tuple[Scenario, ...]
    #: Client names; each runs in every dialect that has it (`CLIENTS_BY_DIALECT`).
    clients: tuple[str, ...] = EVERY_CLIENT
    gateways: tuple[str, ...] = GATEWAYS
    #: The dialects to run, each scenario in those of them it lists (`Scenario.dialects`).
    dialects: tuple[Dialect, ...] = (Dialect.CHAT,)
    jobs: int = 12
    results_dir: Path = Path("lab-results")
    external_url: str | None = None
    external_api_key: str | None = None
    #: Fixed port for the tunnel (so an external gateway can be pointed at it); 0: any free port.
    tunnel_port: int = 0
    #: How many times every cell runs (`--repeat`); each repeat is a cell of its own (its own id)
    #: until `labs.repeat.merge_repeats` folds them into one, marked unstable where they differ.
    repeat: int = 1
    #: The worker (`--worker`): `simulated`, `llama.cpp` (started by the lab), or the base URL of an
    #: OpenAI-compatible server (labs.worker.real).
    worker: str = "simulated"
    #: The model to ask a URL worker for (`--worker-model`); None: the first its `/models` lists.
    worker_model: str | None = None


@dataclass(frozen=True, slots=True)
class PlannedCell:
    """One cell the run covers: a scenario in one dialect, through one gateway, with one client;
    `upstream` is the dialect the worker speaks for it (the gateway's route's)."""

    scenario: Scenario
    dialect: Dialect
    gateway: str
    client: str
    upstream: Dialect


@dataclass(frozen=True, slots=True, kw_only=True)
class NotApplicable:
    """A gateway the lab does not send a dialect through: its cells there are `n/a`, not run."""

    dialect: Dialect
    gateway: str
    #: One sentence a user reads (labs.gateways.registry.unserved_reason).
    why: str


def run_dialects(config: LabConfig, scenario: Scenario) -> list[Dialect]:
    """The dialects a scenario runs in for this run, in `Dialect` order."""
    return [d for d in LAB_DIALECTS if d in config.dialects and d in scenario.dialects]


def _gateways(config: LabConfig, scenario: Scenario) -> list[str]:
    """The run's gateways a scenario goes through, whatever the dialect.

    The `external` gateway runs only today's topology: its upstream is the tunnel's fixed port
    (`--tunnel-port`), so a scenario with the hub or the spare worker would not reach it.
    """
    return [
        gateway
        for gateway in config.gateways
        if (scenario.gateways is None or gateway in scenario.gateways or gateway == EXTERNAL)
        and not (gateway == EXTERNAL and scenario.topology != Topology())
    ]


def _clients(config: LabConfig, scenario: Scenario, dialect: Dialect) -> list[str]:
    """The run's clients that speak `dialect`, in the run's order (the matrix's columns follow
    the dialect's own order: `LabResult.clients_by_dialect`); the coding agents only where the
    scenario says `agents = true` (`python -m labs` sets it for a scenario asked for by name)."""
    return [
        client
        for client in config.clients
        if client in CLIENTS_BY_DIALECT[dialect]
        and (scenario.clients is None or client in scenario.clients)
        and (scenario.agents or client not in AGENT_CLIENTS)
    ]


def cell_upstream(scenario: Scenario, dialect: Dialect, gateway: str) -> Dialect | None:
    """The dialect the worker speaks for a `dialect` client of `scenario` through `gateway`, or
    None when that cell is not run: the gateway has no route for the dialect, or its route's
    dialect is not one the scenario has the worker speak (`Scenario.speaks`). `external` is taken
    to route as the scenario says (its `upstream_dialect`, else untranslated)."""
    if gateway == EXTERNAL:
        return scenario.upstream_dialect or dialect
    if unserved_reason(gateway, dialect) is not None:
        return None
    upstream = upstream_dialect(gateway, dialect)
    return upstream if scenario.speaks(upstream, dialect) else None


def plan_cells(config: LabConfig) -> list[PlannedCell]:
    """Every cell the run covers, in matrix order: by dialect (Chat first), scenario, gateway,
    client. A gateway the lab does not send a dialect through has no cells in it
    (`plan_not_applicable` says why)."""
    cells = []
    for dialect in (d for d in LAB_DIALECTS if d in config.dialects):
        for scenario in config.scenarios:
            if dialect not in scenario.dialects:
                continue
            for gateway in _gateways(config, scenario):
                upstream = cell_upstream(scenario, dialect, gateway)
                if upstream is None:
                    continue
                cells += [
                    PlannedCell(scenario, dialect, gateway, client, upstream) for client in _clients(config, scenario, dialect)
                ]
    return cells


def scenario_runs(planned: list[PlannedCell], scenario: Scenario) -> list[Dialect]:
    """The upstream dialects one scenario runs in (a run each, under its own fault), in `Dialect`
    order."""
    wanted = {cell.upstream for cell in planned if cell.scenario is scenario}
    return [d for d in LAB_DIALECTS if d in wanted]


def plan_not_applicable(config: LabConfig) -> list[NotApplicable]:
    """Each (dialect, gateway) of the run whose cells would exist but for the gateway not serving
    the dialect: shown `n/a` with the reason, never run."""
    found: dict[tuple[Dialect, str], NotApplicable] = {}
    for scenario in config.scenarios:
        for dialect in run_dialects(config, scenario):
            if not _clients(config, scenario, dialect):
                continue
            for gateway in _gateways(config, scenario):
                why = unserved_reason(gateway, dialect)
                if why is not None:
                    found.setdefault((dialect, gateway), NotApplicable(dialect=dialect, gateway=gateway, why=why))
    order = {gateway: number for number, gateway in enumerate(config.gateways)}
    return sorted(found.values(), key=lambda n: (LAB_DIALECTS.index(n.dialect), order[n.gateway]))


def repeat_label(label: str, repeat: int, repeats: int) -> str:
    """A scenario run as progress lines and timings name it: `label` alone when cells run once,
    `label #2` for the second of several repeats."""
    return label if repeats == 1 else f"{label} #{repeat}"


def run_labels(config: LabConfig) -> list[str]:
    """Every scenario run's label (`repeat_label`), in the order the cells plan them."""
    labels = dict.fromkeys(cell.scenario.label(cell.upstream) for cell in plan_cells(config))
    return [repeat_label(label, r, config.repeat) for label in labels for r in range(1, config.repeat + 1)]


def routes_of(planned: list[PlannedCell]) -> dict[str, dict[str, str]]:
    """`labs.runner.LabResult.routes`: per gateway, per dialect its cells' clients spoke, the route's words."""
    routes: dict[str, dict[str, str]] = {}
    for cell in planned:
        if cell.gateway == EXTERNAL:
            text = "your gateway" + (f", from the worker's {cell.upstream.value}" if cell.upstream != cell.dialect else "")
        else:
            text = lookup(cell.gateway).route_text(cell.dialect)
        routes.setdefault(cell.gateway, {}).setdefault(cell.dialect.value, text)
    return routes


def spoken_dialects(planned: list[PlannedCell], scenario: Scenario) -> set[Dialect]:
    """The dialects a scenario's cells speak, on either side of their gateways."""
    return {d for cell in planned if cell.scenario is scenario for d in (cell.dialect, cell.upstream)}


def models_by_topology(planned: list[PlannedCell], repeats: int) -> dict[Topology, dict[tuple[str, Dialect], tuple[str, ...]]]:
    """Per topology, per (gateway, client dialect), the models its cells will name (every repeat
    numbered as the run numbers it), for a gateway configured with every model before it starts
    (`labs.gateways.registry.TopologyPlan.models`)."""
    found: dict[Topology, dict[tuple[str, Dialect], list[str]]] = {}
    for repeat in range(repeats):
        for number, cell in enumerate(planned, start=1):
            cell_id = CELL_ID_TEMPLATE.format(number + repeat * len(planned))
            # The cell's model, and its probe's (labs.evidence), which goes through the same routes.
            for model in (cell.scenario.model_name(cell_id), probe_model_name(cell_id)):
                found.setdefault(cell.scenario.topology, {}).setdefault((cell.gateway, cell.dialect), []).append(model)
    return {topology: {key: tuple(models) for key, models in by_key.items()} for topology, by_key in found.items()}
