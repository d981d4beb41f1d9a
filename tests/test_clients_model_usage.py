"""The raw SDK drivers report the model the response named and the usage it carried (the scorecard's
`fallback-model-and-usage` reads them): through a spare that answers as its own model with its own
usage, in every dialect, Python and Node."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from finishline import Dialect
from labs.clients import LAB_API_KEY
from labs.clients.hosts import open_driver_hosts
from labs.dialects import LAB_DIALECTS
from labs.worker import WorkerSettings, open_worker
from tests.fixtures_lab import run_trio

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

CELLS = [
    (Dialect.CHAT, "openai-python"),
    (Dialect.CHAT, "openai-node"),
    (Dialect.MESSAGES, "anthropic-python"),
    (Dialect.MESSAGES, "anthropic-node"),
    (Dialect.RESPONSES, "openai-python"),
    (Dialect.RESPONSES, "openai-node"),
    (Dialect.GEMINI, "google-genai-node"),
]
SETTINGS = WorkerSettings(tokens=3, include_usage=True, spare_model="finishline-spare", spare_prompt_tokens=21)


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[tuple[Dialect, str], dict]:
    log_dir: Path = tmp_path_factory.mktemp("model-usage")
    clients = tuple(dict.fromkeys(client for _, client in CELLS))

    async def run_all() -> dict[tuple[Dialect, str], dict]:
        results: dict[tuple[Dialect, str], dict] = {}
        async with open_worker(name="spare", spare=True) as worker, open_driver_hosts(clients, log_dir, LAB_DIALECTS) as hosts:

            async def one(number: int, dialect: Dialect, client: str) -> None:
                cell_id = f"c{number:04d}"
                results[(dialect, client)] = await hosts[client].run(
                    {
                        "id": cell_id,
                        "client": client,
                        "dialect": dialect.value,
                        "base_url": worker.base_url,
                        "model": SETTINGS.to_model_name(cell_id),
                        "messages": [{"role": "user", "content": "Say the sentence about the fox."}],
                        "deadline_s": 30.0,
                        "api_key": LAB_API_KEY,
                    }
                )

            async with trio.open_nursery() as nursery:
                for number, (dialect, client) in enumerate(CELLS, start=1):
                    nursery.start_soon(one, number, dialect, client)
        return results

    return run_trio(run_all, deadline=150)


@pytest.mark.parametrize(("dialect", "client"), CELLS, ids=[f"{d.value}-{c}" for d, c in CELLS])
def test_the_raw_driver_reports_the_answering_models_name_and_usage(reports, dialect, client):
    report = reports[(dialect, client)]
    assert report["completed"] is True, report
    assert report["model"] == "finishline-spare"
    # Chat's `prompt_tokens`, Messages' and Responses' `input_tokens`, Gemini's `promptTokenCount`.
    usage = report["usage"]
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", usage.get("promptTokenCount")))
    assert prompt == 21, report["usage"]
