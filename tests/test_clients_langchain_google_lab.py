"""`langchain` in Gemini through the lab: LangChain's `ChatGoogleGenerativeAI` (langchain-google-genai
4.4.2, in its own environment), driven by its own Python host against the worker, through `direct`
and `finish_fix`, judged by the lab as any cell is.

One small real run (`labs.runner.run_lab`: toxiproxy, the worker, the hub where a scenario has it,
mitmdump with finish_fix, both Python hosts). Chat's `healthy` runs in the same run, so `langchain`
is one name split across two hosts (`labs.clients.hosts.SplitHost`) and both answer.

What langchain does, measured (shared/notes/gemini.md section 4, row `lc`): a stream that ends
without a `finishReason` (a cut the hub closes cleanly, a reason left out) is returned silently, the
partial text and no reason (`response_metadata` gets a `finish_reason` only when the chunk's is
truthy), which the judge calls a silent truncation; a reset is `httpx.ReadError`; an upstream
`{"error": ...}` frame makes google-genai raise `ServerError`, which LangChain re-raises as its
`GoogleAPIError`. Through finish_fix the frame it appends (G2) is raised the same way: every fault
is an `error`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from finishline import Dialect
from labs.outcome import Outcome
from labs.plan import LabConfig
from labs.runner import run_lab
from labs.scenario import SCENARIO_DIR, Scenario, load_scenario
from tests.fixtures_lab import run_trio

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

#: The faults of issue 29's done-when, and an upstream error frame.
FAULTS = ("cut-after-tokens-hub-close", "cut-after-tokens-reset", "reason-omitted", "bare-error-frame")
GATEWAYS = ("direct", "finish_fix")
SILENT = (Outcome.SILENT_TRUNCATION, None)
#: (scenario, gateway) -> (outcome, error class): what langchain-google-genai 4.4.2 does.
EXPECTED: dict[tuple[str, str], tuple[Outcome, str | None]] = {
    # Without a finishReason: the partial answer, silently.
    ("cut-after-tokens-hub-close", "direct"): SILENT,
    ("reason-omitted", "direct"): SILENT,
    # The reset reaches httpx (google-genai 2.34.0 reads with httpx).
    ("cut-after-tokens-reset", "direct"): (Outcome.ERROR, "ReadError"),
    # The worker's `{"error": {"code": 500, ...}}` frame: google-genai's ServerError, re-raised.
    ("bare-error-frame", "direct"): (Outcome.ERROR, "GoogleAPIError"),
    # finish_fix's appended frame (G2), or the upstream's passed on (G4), raised the same way.
    **{(fault, "finish_fix"): (Outcome.ERROR, "GoogleAPIError") for fault in FAULTS},
}
#: The whole run's backstop: a few cells, a minute on an idle 2-core machine.
RUN_DEADLINE_S = 420


def _in(name: str, dialect: Dialect) -> Scenario:
    scenario = load_scenario(SCENARIO_DIR / f"{name}.toml")
    assert dialect in scenario.dialects, f"{name} does not list {dialect}"
    return dataclasses.replace(
        scenario, name=f"{dialect.value}:{name}", dialects=(dialect,), gateways=GATEWAYS, clients=("langchain",)
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Any:
    results: Path = tmp_path_factory.mktemp("langchain-google")
    scenarios = (_in("healthy", Dialect.CHAT), _in("healthy", Dialect.GEMINI), *(_in(name, Dialect.GEMINI) for name in FAULTS))
    config = LabConfig(
        scenarios=scenarios,
        clients=("langchain",),
        gateways=GATEWAYS,
        dialects=(Dialect.CHAT, Dialect.GEMINI),
        results_dir=results,
    )
    return run_trio(run_lab, config, deadline=RUN_DEADLINE_S)


def _cell(run: Any, scenario: str, gateway: str) -> Any:
    (cell,) = [c for c in run.cells if (c.scenario, c.gateway) == (scenario, gateway)]
    return cell


def test_each_dialect_runs_in_its_own_host_and_names_its_versions(run):
    assert run.versions["langchain-google"]["langchain-google-genai"] == "4.4.2"
    # google-genai below 3: not the lab's 3.3.0, so nothing of the lab's environment was imported.
    assert run.versions["langchain-google"]["google-genai"] == "2.34.0"
    assert run.versions["python"]["langchain-openai"]


@pytest.mark.parametrize("gateway", GATEWAYS)
@pytest.mark.parametrize("dialect", [Dialect.CHAT, Dialect.GEMINI])
def test_healthy_is_ok(run, dialect, gateway):
    cell = _cell(run, f"{dialect.value}:healthy", gateway)
    assert cell.outcome is Outcome.OK, cell.why
    assert cell.report["finish_reason"] == ("STOP" if dialect is Dialect.GEMINI else "stop")


@pytest.mark.parametrize(("scenario", "gateway"), list(EXPECTED), ids=[f"{s}-{g}" for s, g in EXPECTED])
def test_each_fault_as_langchain_surfaces_it(run, scenario, gateway):
    cell = _cell(run, f"gemini:{scenario}", gateway)
    outcome, error_class = EXPECTED[(scenario, gateway)]
    assert (cell.outcome, cell.report["error_class"]) == (outcome, error_class), cell.why
    if error_class is None:
        # Silent: what came, and no reason (none is surfaced without a truthy `finishReason`).
        assert cell.report["text"] and cell.report["finish_reason"] is None
