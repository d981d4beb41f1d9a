"""Isolation between scenario runs (issue 14, item 1): a late request of a finished cell never meets
the next run's policy and fault; the worker refuses it (409) and the run counts it.

One small real run (toxiproxy, the worker, the Python driver host, `direct`): a stall whose cell
hangs, then `healthy`. A gateway that keeps retrying a hung cell (LiteLLM's chain in the incident
row, 138-146 s) is scripted here: as `healthy` starts, the test sends the stalled cell's request
again to the worker, as that gateway's next retry would arrive (straight, not through the tunnel,
which the runner switches off and on as each run starts). Starting LiteLLM for this
alone would add 25-90 s to the suite; the late request is the same bytes a gateway sends.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import trio

from labs.outcome import Outcome
from labs.plan import LabConfig
from labs.runner import run_lab
from labs.scenario import SCENARIO_DIR, load_scenario
from tests.fixtures_lab import chat_request

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_a_late_retry_of_a_hung_cell_is_refused_and_every_healthy_cell_is_ok(tmp_path: Path):
    stall = dataclasses.replace(
        load_scenario(SCENARIO_DIR / "stall-after-tokens.toml"), deadline_s=2.0, gateways=("direct",), clients=("httpx-sse",)
    )
    healthy = dataclasses.replace(load_scenario(SCENARIO_DIR / "healthy.toml"), gateways=("direct",))
    config = LabConfig(
        scenarios=(stall, healthy),
        clients=("httpx-sse", "openai-python", "langchain"),
        gateways=("direct",),
        results_dir=tmp_path,
    )
    late: dict[str, int] = {}
    # The stalled cell is the run's first (cell ids follow the plan: the stall's one cell first).
    late_model = stall.model_name("c0001")

    async def retry_the_hung_cell(port: int) -> None:
        body = {"model": late_model, "stream": True, "messages": [{"role": "user", "content": "again"}]}
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(chat_request(body, headers={"connection": "close"}))
            received = b""
            while chunk := await stream.receive_some(65536):
                received += chunk
        late["status"] = int(received.split(b" ", 2)[1])

    send_port, receive_port = trio.open_memory_channel[int](1)

    def progress(message: str, done: int, total: int) -> None:
        # Straight to the worker: the tunnel is switched off and on as each run starts.
        found = re.search(r"worker on 127\.0\.0\.1:(\d+)", message)
        if found:
            late["port"] = int(found.group(1))
        if message.startswith("healthy: starting"):
            send_port.send_nowait(late["port"])

    async def bounded():
        with trio.fail_after(150):
            async with trio.open_nursery() as nursery:

                async def when_healthy_starts() -> None:
                    await retry_the_hung_cell(await receive_port.receive())

                nursery.start_soon(when_healthy_starts)
                return await run_lab(config, progress)

    result = trio.run(bounded)
    cells = {(c.scenario, c.client): c for c in result.cells}
    assert cells[("stall-after-tokens", "httpx-sse")].outcome == Outcome.HANG.value
    healthy_cells = [c for c in result.cells if c.scenario == "healthy"]
    assert len(healthy_cells) == 3
    assert {c.outcome for c in healthy_cells} == {Outcome.OK.value}
    assert late["status"] == 409
    assert result.stale_refused == {"primary": 1}
    # The refused request is in the hung cell's attempts, not in any healthy cell's.
    hung = cells[("stall-after-tokens", "httpx-sse")]
    assert [a["status"] for a in hung.attempts][-1] == 409
    assert all(len(c.attempts) == 1 and c.tries == 1 for c in healthy_cells)
    json.dumps(result.to_json())  # what result.json holds
