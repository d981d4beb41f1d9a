"""One run of a scenario: its cells whose worker speaks one dialect, under the scenario's fault
on the tunnel, then each cell's probe once the fault is lifted.

The runner (labs.runner) sets the servers and the gateways for the run, then calls `run_scenario`:
its library cells at once (at most `limiter` at a time), then its agent cells (`agent_limiter`:
each CLI's start costs a second or more of CPU, labs.runner's `AGENT_JOBS`), with the fault on the
tunnel for as long as any runs. Each cell is judged against the worker's true answer
(labs.worker.truth); its probe (labs.cell_requests.run_probe) runs after the fault is lifted and
the pooled connections that met it are closed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import trio

from faults.catalog import Fault
from finishline import Dialect
from labs.cell_ids import CELL_ID_TEMPLATE
from labs.cell_requests import cell_request, run_probe, summarised
from labs.cell_result import CellResult
from labs.clients import AGENT_CLIENTS
from labs.evidence import probe_model_name
from labs.gateways.services import Gateway
from labs.outcome import ClientReport, Expected, Judgement, judge
from labs.scenario import Scenario
from labs.worker.truth import CapturedTruth, ComputedTruth, WorkerTruth

__all__ = ["TUNNEL", "Cells", "drop_pooled_connections", "probe_model", "request_model", "run_scenario"]

#: The toxiproxy proxy in front of the worker (the lab's and `make ui`'s).
TUNNEL = "worker"
#: A run's cells: (number, client, gateway, the client's dialect).
Cells = list[tuple[int, str, str, Dialect]]


def request_model(scenario: Scenario, gateway: Gateway, cell: str | int, dialect: Dialect) -> str:
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
    model = request_model(scenario, gateway, cell_id, dialect)
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


def probe_model(gateway: Gateway, number: int, dialect: Dialect) -> str:
    """The model a cell's probe names at its gateway (labs.evidence.probe_model_name)."""
    return gateway.model_for(dialect, probe_model_name(CELL_ID_TEMPLATE.format(number)))


async def drop_pooled_connections(toxiproxy, proxy: str) -> None:
    # Disabling closes every live connection through the tunnel (FIN both sides); clients and
    # gateways then open fresh ones, on which the scenario's fault is armed from the start.
    await trio.to_thread.run_sync(toxiproxy.client.set_enabled, proxy, False)
    await trio.to_thread.run_sync(toxiproxy.client.set_enabled, proxy, True)
    await trio.sleep(0.2)


async def run_scenario(
    scenario: Scenario,
    upstream: Dialect,
    cells: Cells,
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
        await drop_pooled_connections(toxiproxy, TUNNEL)
    async with trio.open_nursery() as nursery:
        for result in results:
            if result.client not in AGENT_CLIENTS:
                # A real worker answers the probe as it answered the capture of the same request
                # (its prompt, limit and dialect); the simulated one the probe's own settings.
                healthy = known.expected(scenario, result.dialect) if isinstance(known, CapturedTruth) else None
                nursery.start_soon(run_probe, scenario, result, gateways[result.gateway], hosts, limiter, healthy)
    return sorted(results, key=lambda r: r.cell_id)
