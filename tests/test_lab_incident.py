"""The incident row (`incident-prefill-cut-hub-close`) through `direct`, `finish_fix`, `litellm` and
`litellm+finish_fix`, for every default client: one small real run (real clients, finish_fix's
mitmdump, the LiteLLM proxy, the worker, the tunnel and the hub), with the tunnel dropping 2 s into
the prefill instead of the default set's 13.7 s (the same topology and the same bytes, a shorter
wait), and a deadline long enough for every retry a client or LiteLLM makes to run to its end.

What the sources say (the versions the lab pins):
- @ai-sdk/openai 4.0.118 (`throwIfOpenAIStreamErrorBeforeOutput`): an error event that comes
  before any output is thrown as an `APICallError`, status 500 for finish_fix's `server_error`
  (`getStatusCode`), so retryable; `streamText` retries the call (`prepareRetries`, `maxRetries`
  2, 2 s then 4 s) and then raises `RetryError: Failed after 3 attempts. Last error: ...`.
  @ai-sdk/openai-compatible 3.0.92 has no such check: the error is a stream part, raised once.
- LiteLLM 1.108.7: for an empty body, `CustomStreamWrapper._finalize_completed_stream` makes up a
  `stop` chunk, and its success handler, with nothing to assemble, calls the callback's
  `async_log_stream_event` (labs/gateways/litellm_books.py). For finish_fix's error event,
  `Router._acompletion` reads the first chunk, so the error is inside its retries: the worker is
  asked 1 + num_retries (2) times, then the client gets a 500, which the OpenAI SDKs (max_retries
  2), LangChain (the same client) and the AI SDK (`maxRetries` 2) retry: 9 requests to the worker.
  pi-ai 1.6.0 does not retry (`retryProviderRequest`, `maxRetries` 0 by default): 3.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from labs.clients import DEFAULT_CLIENTS
from labs.plan import LabConfig
from labs.runner import run_lab
from labs.scenario import SCENARIO_DIR, load_scenario
from tests.fixtures_chaos import INCIDENT_DROP_S
from tests.fixtures_lab import run_trio

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

INCIDENT = "incident-prefill-cut-hub-close"
GATEWAYS = ("direct", "finish_fix", "litellm", "litellm+finish_fix")
#: Room for the longest chain (9 prefills, each cut after INCIDENT_DROP_S, and the clients'
#: backoffs): a cell still open then is a true hang, and the tests below would say so.
CELL_DEADLINE_S = 120.0
#: The run takes ~1.5 min on a 2-core machine (starting LiteLLM, then the 9-prefill chains).
RUN_DEADLINE_S = 360
#: The clients that retry a 500 from LiteLLM (and so start its three attempts over, twice).
RETRIES_A_500 = {
    "openai-python",
    "openai-python-helper",
    "langchain",
    "openai-node",
    "openai-node-helper",
    "ai-sdk-openai",
    "ai-sdk-compatible",
}
#: @ai-sdk/provider-utils 5.0.81, `retryWithExponentialBackoffRespectingRetryHeaders`: 2 retries,
#: the first after 2 s, then twice the delay.
AI_SDK_BACKOFFS_S = (2.0, 4.0)


@pytest.fixture(scope="module")
def row(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    incident = load_scenario(SCENARIO_DIR / f"{INCIDENT}.toml")
    assert incident.fault is not None
    scenario = dataclasses.replace(
        incident,
        fault={**incident.fault, "after_seconds": INCIDENT_DROP_S},
        deadline_s=CELL_DEADLINE_S,
        gateways=GATEWAYS,
        clients=DEFAULT_CLIENTS,
    )
    config = LabConfig(
        scenarios=(scenario,),
        clients=DEFAULT_CLIENTS,
        gateways=GATEWAYS,
        jobs=32,
        results_dir=Path(tmp_path_factory.mktemp("incident-row")),
    )

    result = run_trio(run_lab, config, deadline=RUN_DEADLINE_S).to_json()
    return {(c["client"], c["gateway"]): c for c in result["cells"]}


def outcomes(row, gateway: str) -> dict[str, str]:
    return {client: row[(client, gateway)]["outcome"] for client in DEFAULT_CLIENTS}


def test_the_default_incident_rows_deadline_covers_the_ai_sdks_retries_before_the_first_token():
    # Three prefills, each dropped after `after_seconds`, and the two backoffs between them: a
    # shorter deadline calls the AI SDK's legitimate retries (rule 1, done by the client) a hang.
    incident = load_scenario(SCENARIO_DIR / f"{INCIDENT}.toml")
    assert incident.deadline_s > 3 * incident.fault["after_seconds"] + sum(AI_SDK_BACKOFFS_S)


def test_direct_is_the_post_mortems_screenshot(row):
    assert outcomes(row, "direct") == {
        "openai-python": "silent-truncation",
        "openai-python-helper": "error",
        "langchain": "error",
        "openai-node": "silent-truncation",
        "openai-node-helper": "error",
        "ai-sdk-openai": "flagged",
        "ai-sdk-compatible": "error",
        "pi-ai": "error",
    }
    assert row[("pi-ai", "direct")]["report"]["error_message"] == "Stream ended without finish_reason"
    assert row[("ai-sdk-openai", "direct")]["report"]["finish_reason"] == "interrupted"
    for client in ("openai-python", "openai-node"):
        assert row[(client, "direct")]["report"]["text"] == ""
    assert {row[(c, "direct")]["books"] for c in DEFAULT_CLIENTS} == {None}


def test_through_finish_fix_every_client_is_told_the_stream_stopped_before_the_first_token(row):
    for client in DEFAULT_CLIENTS:
        cell = row[(client, "finish_fix")]
        assert cell["outcome"] == "error", cell
        assert "before the first token" in cell["report"]["error_message"], client
        assert (cell["books"], cell["books_entry"]["verdict"], cell["books_mismatch"]) == ("error", "interrupted", False)
    # Every client but the AI SDK's OpenAI provider takes the first error event for the answer.
    assert {c: row[(c, "finish_fix")]["worker_requests"] for c in DEFAULT_CLIENTS if c != "ai-sdk-openai"} == {
        c: {"primary": 1} for c in DEFAULT_CLIENTS if c != "ai-sdk-openai"
    }


def test_through_finish_fix_the_ai_sdks_openai_provider_retries_before_the_first_token_then_raises(row):
    cell = row[("ai-sdk-openai", "finish_fix")]
    assert cell["report"]["error_class"] == "RetryError"
    assert cell["report"]["error_message"].startswith("Failed after 3 attempts. Last error: ")
    assert cell["worker_requests"] == {"primary": 3}
    assert len(cell["hub"]) == 3


def test_through_litellm_the_empty_body_is_a_made_up_stop_that_its_books_call_a_success(row):
    # LiteLLM's made-up `stop` chunk has no role; openai-node's helper is the one client that
    # checks (`missing role for choice 0`).
    assert outcomes(row, "litellm") == {c: "error" if c == "openai-node-helper" else "silent-truncation" for c in DEFAULT_CLIENTS}
    for client in DEFAULT_CLIENTS:
        cell = row[(client, "litellm")]
        entry = cell["books_entry"]
        # Its success handler's stream event: a success with no response, no finish reason and no
        # usage, which disagrees with what every client got.
        assert (cell["books"], cell["books_mismatch"]) == ("ok", True), client
        assert (entry["hook"], entry["status"], entry["finish_reason"], entry["completion_tokens"]) == (
            "async_log_stream_event",
            "success",
            None,
            None,
        )
        assert cell["worker_requests"] == {"primary": 1}
    assert row[("openai-python", "litellm")]["report"]["finish_reason"] == "stop"


def test_through_litellm_with_finish_fix_behind_it_the_retries_run_out_and_every_client_errs(row):
    for client in DEFAULT_CLIENTS:
        cell = row[(client, "litellm+finish_fix")]
        assert cell["outcome"] == "error", cell
        # LiteLLM's 500 carries finish_fix's message.
        assert "before the first token" in cell["report"]["error_message"], client
        # Its failure callback booked each attempt; the last is the request's entry.
        assert (cell["books"], cell["books_entry"]["hook"], cell["books_mismatch"]) == ("error", "async_log_failure_event", False)
        # LiteLLM's three attempts, times the client's own three where it retries the 500.
        assert cell["worker_requests"] == {"primary": 9 if client in RETRIES_A_500 else 3}, client
