"""What a cell's client is asked to send, how a cell of several requests is summarised, and the
probe after a cell (labs.evidence): the parts of a cell's run that are about its requests.

A cell is one request, or a scenario's run of them (`requests_per_cell`, labs.scenario): each
request is judged, and the cell is the loudest of them with the count of each word (`summarised`).
After the cell, its probe (`run_probe`) is one healthy request by the same client through the same
gateway with the cell's settings and its own id.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import trio

from finishline import Dialect
from labs.cell_result import CellResult
from labs.clients import LAB_API_KEY
from labs.evidence import probe_expected, probe_id, probe_json, probe_model_name
from labs.gateways.services import Gateway
from labs.outcome import ClientReport, Expected, Judgement, Outcome, judge
from labs.scenario import Scenario

__all__ = ["cell_request", "run_probe", "summarised"]


def cell_request(scenario: Scenario, dialect: Dialect, client: str, gateway: Gateway, cell_id: str, model: str) -> dict[str, Any]:
    """What a cell's driver is asked to send (a probe's: the same with its own id and model)."""
    return {
        "id": cell_id,
        "client": client,
        # The driver speaks this dialect to the gateway's root, `/v1` unless the gateway names
        # another for the dialect (its library adds the path).
        "dialect": dialect.value,
        "base_url": gateway.base_url_for(dialect),
        "model": model,
        "deadline_s": scenario.deadline_for(client),
        **scenario.request(),
        "api_key": gateway.api_key or LAB_API_KEY,
    }


async def run_probe(
    scenario: Scenario,
    result: CellResult,
    gateway: Gateway,
    hosts: dict,
    limiter: trio.CapacityLimiter,
    expected: Expected | None = None,
) -> None:
    """The cell's probe (labs.evidence): one healthy request through its gateway by its client,
    with its own id, judged against `expected` (default: the simulated worker's answer to the
    probe's settings, `probe_expected`); kept in `result.probe`."""
    probe_cell = probe_id(result.cell_id)
    model = gateway.model_for(result.dialect, probe_model_name(result.cell_id))
    request = cell_request(scenario, result.dialect, result.client, gateway, probe_cell, model)
    async with limiter:
        raw = await hosts[result.client].run(request)
    report = ClientReport.from_json({"client": result.client, "completed": False, **raw})
    truth = expected if expected is not None else probe_expected(result.dialect)
    result.probe = probe_json(probe_cell, report, judge(report, truth))


def summarised(sent: list[tuple[ClientReport, Judgement, float]]) -> tuple[ClientReport, Judgement, float]:
    """A cell's report, judgement and seconds from its requests (each with its own): one request's
    own, or for several the loudest one's report (`Outcome.severity`, the first of equals) with the
    outcome of it and a reason that counts each word, e.g. `20 requests: ok 17 / error 3; first
    error: ...`, and the seconds of them all."""
    if len(sent) == 1:
        return sent[0]
    worst = max(range(len(sent)), key=lambda i: (sent[i][1].outcome.severity, -i))
    report, judgement, _ = sent[worst]
    counts = Counter(j.outcome for _, j, _ in sent)
    split = " / ".join(f"{outcome} {counts[outcome]}" for outcome in Outcome if outcome in counts)
    why = f"{len(sent)} requests: {split}"
    if judgement.outcome is not Outcome.OK:
        why += f"; first {judgement.outcome} (request {worst + 1}): {judgement.reason}"
    return report, Judgement(outcome=judgement.outcome, reason=why), sum(t for _, _, t in sent)
