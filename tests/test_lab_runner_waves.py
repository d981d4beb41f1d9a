"""How the runner schedules one scenario's cells: its library cells at once, then its agent cells,
a few at a time (labs/scenario_run.py, with labs/runner.py's `AGENT_JOBS`). A `--all` run that started a scenario's 28 agent
CLIs beside its 70 library cells starved those past their deadlines on a 2-core machine.

The hosts here only record when each request began and ended (trio's mock clock): what is tested is
the runner's order, not a client."""

from __future__ import annotations

import trio
import trio.testing

from finishline import Dialect
from labs.clients import AGENT_CLIENTS
from labs.gateways.services import Gateway
from labs.scenario import CELL_ID_TEMPLATE, SCENARIO_DIR, load_scenario
from labs.scenario_run import run_scenario
from tests.fixtures_lab import run_trio

LIBRARIES = ("openai-python", "pi-ai")


class _RecordingHost:
    """A driver host that takes `seconds` to answer, and writes down when each request ran."""

    def __init__(self, seconds: float, spans: dict[str, tuple[float, float]]) -> None:
        self.seconds = seconds
        self.spans = spans

    async def run(self, request: dict) -> dict:
        began = trio.current_time()
        await trio.sleep(self.seconds)
        self.spans[request["client"] + "/" + request["id"]] = (began, trio.current_time())
        return {"completed": True, "text": "", "finish_reason": "stop", "duration_s": self.seconds}


def _run(agent_jobs: int) -> dict[str, tuple[float, float]]:
    """The cells' spans (their probes' left out: `_run_with_probes`)."""
    return {key: span for key, span in _run_with_probes(agent_jobs).items() if "/c" in key}


def _run_with_probes(agent_jobs: int) -> dict[str, tuple[float, float]]:
    scenario = load_scenario(SCENARIO_DIR / "healthy.toml")
    spans: dict[str, tuple[float, float]] = {}
    # Libraries answer in 1 s, agents take 5 s: run together, every agent would overlap them.
    hosts = {name: _RecordingHost(1.0, spans) for name in LIBRARIES} | {
        name: _RecordingHost(5.0, spans) for name in AGENT_CLIENTS
    }
    clients = (*AGENT_CLIENTS, *LIBRARIES, *AGENT_CLIENTS)  # agents planned first and last
    cells = [(n, client, "direct", Dialect.CHAT) for n, client in enumerate(clients, start=1)]
    ended: list[str] = []

    async def main() -> None:
        await run_scenario(
            scenario,
            Dialect.CHAT,
            cells,
            None,
            gateways={"direct": Gateway(name="direct", base_url="http://127.0.0.1:9/v1")},
            hosts=hosts,
            limiter=trio.CapacityLimiter(64),
            agent_limiter=trio.CapacityLimiter(agent_jobs),
            toxiproxy=None,
            on_cell=lambda label, result: ended.append(result.cell_id),
        )

    run_trio(main, deadline=600, clock=trio.testing.MockClock(autojump_threshold=0))
    assert sorted(ended) == [CELL_ID_TEMPLATE.format(n) for n in range(1, len(clients) + 1)]
    return spans


def test_a_scenarios_agent_cells_start_after_its_library_cells_ended():
    spans = _run(agent_jobs=8)
    libraries = [span for key, span in spans.items() if key.split("/")[0] in LIBRARIES]
    agents = [span for key, span in spans.items() if key.split("/")[0] in AGENT_CLIENTS]
    assert len(libraries) == 2 and len(agents) == 2 * len(AGENT_CLIENTS)
    # The libraries all at once, the agents all after the last of them.
    assert {began for began, _ in libraries} == {0.0}
    assert min(began for began, _ in agents) >= max(end for _, end in libraries)


def test_agent_cells_run_at_most_the_agent_limit_at_a_time():
    spans = _run(agent_jobs=2)
    agents = sorted(span for key, span in spans.items() if key.split("/")[0] in AGENT_CLIENTS)
    for began, _ in agents:
        assert sum(1 for b, e in agents if b <= began < e) <= 2
    # Each agent planned twice, two cells at a time after the 1 s of the libraries: rounds of 5 s.
    rounds = -(-2 * len(AGENT_CLIENTS) // 2)
    assert len(agents) == 2 * len(AGENT_CLIENTS)
    assert max(end for _, end in agents) == 1.0 + rounds * 5.0


def test_each_library_cell_gets_one_probe_after_every_cell_of_the_scenario_ended_and_an_agent_none():
    spans = _run_with_probes(agent_jobs=8)
    probes = {key: span for key, span in spans.items() if "/p" in key}
    cells = {key: span for key, span in spans.items() if "/c" in key}
    library_cells = sorted(key for key in cells if key.split("/")[0] in LIBRARIES)
    # One probe per library cell, under the cell's number after `p` (labs.evidence.probe_id).
    assert sorted(probes) == [key.replace("/c", "/p") for key in library_cells]
    assert min(began for began, _ in probes.values()) >= max(end for _, end in cells.values())
