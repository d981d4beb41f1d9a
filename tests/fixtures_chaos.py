"""Fixtures for the chaos lab (labs/): one small real matrix, run once per test session.

`small_matrix` runs real clients (every driver, Python and Node) through real gateways (direct,
finish_fix, and LiteLLM with and without finish_fix for a few clients) against the real worker and
toxiproxy, with a few of the default scenarios plus a short stall (so `hang` is measured, not
simulated), and the hub's rows (the incident, an error event, the rule-1 rows with a spare worker),
which add two topologies and so two more sets of gateways. Tests then read cells from it. One run serves all the lab's end-to-end tests: starting
LiteLLM alone takes ~15 s.

`run_lab_over` is how a test module runs a lab of its own: default scenarios by name (or made
scenarios), each changed alike, in one `LabConfig`, under a deadline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from finishline import Dialect
from labs.clients import ALL_CLIENTS
from labs.plan import LabConfig
from labs.runner import run_lab
from labs.scenario import SCENARIO_DIR, Scenario, load_scenario
from tests.fixtures_lab import CELL_BACKSTOP_S, run_trio

#: Scenarios of the default set the pinned-behaviour tests read, through direct and finish_fix.
PINNED_SCENARIOS = ("reason-omitted", "cut-after-tokens-fin", "length-omitted")
#: More scenarios whose finish_fix column the pinned tests read (every client, finish_fix only).
FINISH_FIX_SCENARIOS = (
    "reason-empty",
    "tool-calls-omitted",
    "cut-during-prefill",
    "cut-after-tokens-reset",
    "cut-after-tokens-conn-close",
)
#: Clients through `litellm+finish_fix` (the gateway-side placement) for the pinned scenarios.
LITELLM_FINISH_FIX_CLIENTS = ("openai-python", "httpx-sse", "openai-node")
#: A backstop for the whole small matrix (~60 s on an idle 2-core machine; LiteLLM's start alone
#: took over 2 minutes under a parallel build, issue 25).
SMALL_MATRIX_DEADLINE_S = 480


def run_lab_over(
    scenarios: Iterable[str | Scenario],
    results_dir: Path,
    *,
    clients: tuple[str, ...],
    gateways: tuple[str, ...],
    deadline: float,
    dialects: tuple[Dialect, ...] | None = None,
    jobs: int | None = None,
    each: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The lab's result, as JSON, over `scenarios` (a default scenario's name, or a Scenario), each
    with the Scenario fields in `each` replaced, run with these clients, gateways and dialects
    (else the lab's default), `jobs` at once (else the lab's default), failing past `deadline` s."""
    loaded = (load_scenario(SCENARIO_DIR / f"{s}.toml") if isinstance(s, str) else s for s in scenarios)
    config = LabConfig(
        scenarios=tuple(dataclasses.replace(scenario, **(each or {})) for scenario in loaded),
        clients=clients,
        gateways=gateways,
        results_dir=results_dir,
    )
    # Only what was given: the rest stays LabConfig's own default.
    if dialects is not None:
        config = dataclasses.replace(config, dialects=dialects)
    if jobs is not None:
        config = dataclasses.replace(config, jobs=jobs)
    return run_trio(run_lab, config, deadline=deadline).to_json()


class Matrix:
    """A finished lab run, indexed by (scenario, client, gateway)."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.result = result
        self.cells = {(c["scenario"], c["client"], c["gateway"]): c for c in result["cells"]}

    def cell(self, scenario: str, client: str, gateway: str) -> dict[str, Any]:
        return self.cells[(scenario, client, gateway)]


def in_dialects(name: str, dialects: tuple[Dialect, ...], **fields: Any) -> list[Scenario]:
    """Copies of a default scenario, one per dialect, each running in that dialect alone and named
    `<dialect>:<name>`, so a test's matrix keyed by (scenario, client, gateway) holds one client's
    cells of several dialects apart; `fields` replace others (gateways, clients)."""
    scenario = load_scenario(SCENARIO_DIR / f"{name}.toml")
    return [dataclasses.replace(scenario, name=f"{dialect.value}:{name}", dialects=(dialect,), **fields) for dialect in dialects]


#: The incident's clients (the post-mortem's screenshot and the two OpenAI SDKs).
INCIDENT_CLIENTS = ("openai-python", "openai-node", "pi-ai")
#: The incident's tunnel drop in the small matrix: shorter than the default set's 13.7 s (the
#: topology is the same; only the wait is shorter).
INCIDENT_DROP_S = 2.0


def hub_scenarios() -> list:
    """The hub's rows in the small matrix: the incident through direct and finish_fix, the fixed
    hub's error event through direct, and the rule-1 rows (a spare worker) through direct and LiteLLM."""
    incident = load_scenario(SCENARIO_DIR / "incident-prefill-cut-hub-close.toml")
    assert incident.fault is not None
    rows = [
        dataclasses.replace(
            incident,
            fault={**incident.fault, "after_seconds": INCIDENT_DROP_S},
            deadline_s=20.0,
            gateways=("direct", "finish_fix"),
            clients=INCIDENT_CLIENTS,
        )
    ]
    # The incident through LiteLLM, for its books: run with the spare worker present, so that it
    # shares the rule-1 rows' LiteLLM (the hub ends the body cleanly: nothing for LiteLLM to retry,
    # so the spare changes nothing here, and `answered_by` shows it).
    rows.append(
        dataclasses.replace(
            rows[0],
            name=f"{incident.name}-litellm",
            pool_workers=2,
            gateways=("litellm",),
            clients=("httpx-sse",),
        )
    )
    error_event = load_scenario(SCENARIO_DIR / "cut-after-tokens-hub-error-event.toml")
    rows.append(dataclasses.replace(error_event, gateways=("direct",), clients=("openai-python", "pi-ai")))
    rows += [
        dataclasses.replace(load_scenario(SCENARIO_DIR / f"{name}.toml"), gateways=("direct", "litellm"), clients=("httpx-sse",))
        for name in ("rule1-prefill-cut-hub-close-spare", "rule1-prefill-cut-hub-abort-spare")
    ]
    return rows


@pytest.fixture(scope="session")
def small_matrix(tmp_path_factory: pytest.TempPathFactory) -> Matrix:
    scenarios = [
        dataclasses.replace(load_scenario(SCENARIO_DIR / f"{name}.toml"), gateways=("direct", "finish_fix"))
        for name in PINNED_SCENARIOS
    ]
    scenarios += [
        dataclasses.replace(load_scenario(SCENARIO_DIR / f"{name}.toml"), gateways=("finish_fix",))
        for name in FINISH_FIX_SCENARIOS
    ]
    # finish_fix behind LiteLLM, for a few clients (the proxy is already started for the books row).
    scenarios += [
        dataclasses.replace(
            load_scenario(SCENARIO_DIR / f"{name}.toml"),
            name=f"{name}-litellm+finish_fix",
            gateways=("litellm+finish_fix",),
            clients=LITELLM_FINISH_FIX_CLIENTS,
        )
        for name in ("reason-omitted", "cut-after-tokens-fin")
    ]
    # The `Connection: close` trap through direct, for openai-node's plain stream and its helper.
    conn_close = load_scenario(SCENARIO_DIR / "cut-after-tokens-conn-close.toml")
    scenarios.append(
        dataclasses.replace(
            conn_close,
            name="cut-after-tokens-conn-close-direct",
            gateways=("direct",),
            clients=("openai-node", "openai-node-helper"),
        )
    )
    # LiteLLM's books, for one client: the proxy is the slow part to start.
    omitted = load_scenario(SCENARIO_DIR / "length-omitted.toml")
    scenarios.append(dataclasses.replace(omitted, name="length-omitted-litellm", gateways=("litellm",), clients=("httpx-sse",)))
    scenarios += hub_scenarios()
    # Every scenario so far ends by itself: its deadline is only a backstop (CELL_BACKSTOP_S).
    scenarios = [dataclasses.replace(scenario, deadline_s=CELL_BACKSTOP_S) for scenario in scenarios]
    # A short stall: every client through direct must hang (the lab's deadline ends it).
    stall = load_scenario(SCENARIO_DIR / "stall-after-tokens.toml")
    scenarios.append(dataclasses.replace(stall, deadline_s=3.0, gateways=("direct",), clients=("httpx-sse", "openai-node")))
    config = LabConfig(
        scenarios=tuple(scenarios),
        clients=ALL_CLIENTS,
        gateways=("direct", "finish_fix", "litellm", "litellm+finish_fix"),
        jobs=18,
        results_dir=Path(tmp_path_factory.mktemp("lab-results")),
    )

    return Matrix(run_trio(run_lab, config, deadline=SMALL_MATRIX_DEADLINE_S).to_json())
