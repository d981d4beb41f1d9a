"""The hub's attempt records and its refusal of stale cells (issue 14), relaying to a real worker."""

from __future__ import annotations

import json

import httpx

from finishline import Dialect
from labs.hub import open_hub
from labs.scenario import CELL_ID_TEMPLATE
from labs.worker import WorkerSettings, attempts_of, open_worker
from tests.fixtures_lab import run_trio

CELL = CELL_ID_TEMPLATE.format(3)
OTHER = CELL_ID_TEMPLATE.format(4)


def through_hub(models: list[str], *, current_cells=None, stream: bool = True):
    async def scenario():
        async with open_worker(name="primary") as worker, open_hub(upstream_port=worker.port) as hub:
            hub.current_cells = current_cells
            statuses = []
            async with httpx.AsyncClient(base_url=hub.url, timeout=10) as client:
                for model in models:
                    response = await client.post(
                        "/v1/chat/completions",
                        json={"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]},
                    )
                    statuses.append((response.status_code, response.text))
            return statuses, hub, worker

    return run_trio(scenario)


def test_the_hub_records_a_relayed_stream_with_its_head_and_first_token():
    statuses, hub, worker = through_hub([WorkerSettings(tokens=3).to_model_name(CELL)])
    assert statuses[0][0] == 200
    [attempt] = hub.attempts
    assert (attempt.cell_id, attempt.server, attempt.dialect, attempt.ended, attempt.status) == (
        CELL,
        "hub",
        Dialect.CHAT,
        "complete",
        200,
    )
    assert attempt.head_s is not None and attempt.first_token_s is not None
    assert [a.server for a in attempts_of(CELL, hub, worker)] == ["hub", "primary"]


def test_no_first_token_through_the_hub_when_the_stream_has_none():
    _, hub, _ = through_hub([WorkerSettings(tokens=0).to_model_name(CELL), WorkerSettings(http_error=500).to_model_name(OTHER)])
    assert [(a.ended, a.first_token_s) for a in hub.attempts] == [("complete", None), ("http_error:500", None)]


def test_the_hub_refuses_a_stale_cell_and_never_relays_it():
    statuses, hub, worker = through_hub(
        [WorkerSettings().to_model_name(OTHER), WorkerSettings(tokens=2).to_model_name(CELL)], current_cells=frozenset({CELL})
    )
    assert statuses[0][0] == 409 and OTHER in json.loads(statuses[0][1])["error"]["message"]
    assert statuses[1][0] == 200
    assert [(a.cell_id, a.ended) for a in hub.attempts] == [(OTHER, "refused_stale"), (CELL, "complete")]
    assert hub.stale_refused == 1
    assert [a.cell_id for a in worker.attempts] == [CELL]
