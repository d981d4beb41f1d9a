"""A small real matrix through SMG, SMG with finish_fix behind it, and vllm-router: real clients,
the real routers (their pinned environments under .tools/gateways), the worker, the tunnel
(toxiproxy), the hub and the spare worker, with the cells each router's source says they must have.

One lab run serves every test here (the incident's 13.7 s prefill is worth paying once).
Clients: openai-python and openai-node (the two the incident shows as silently truncated) and
pi-ai (the one that says "Stream ended without finish_reason").

What the sources say:
- SMG (lightseekorg/smg, model_gateway/src/routers/http/router.rs; the newest source here is
  after v1.9.0, the wheel is 1.13.0): `Router::send_typed_request` relays the worker's body chunk
  by chunk and adds nothing (no `finish_reason`, no `[DONE]`; a clean end is a clean end);
  `Router::route_typed_request` retries through `RetryExecutor` only on what
  `is_retryable_status` (routers/common/retry.rs) names, judged on the response head, so a
  failure after a 200 head is never retried. On a body error the 1.13.0 binary writes an SSE
  error frame (`SseErrorFrame`, type `stream_error`, message "Stream error: ...") and `[DONE]`,
  and logs "Stream ended by the worker before completion" at WARN in the request's span.
- vllm-router (vllm-project/router, src/routers/http/router.rs): the same relay
  (`send_typed_request` forwards `bytes_stream()`; an upstream error ends the body with an error,
  which the client sees as a broken connection) and the same head-only retry
  (`route_typed_request`, `|res, _attempt| is_retryable_status(res.status())`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import trio

from faults.child_processes import START_DEADLINE_S
from finishline import Dialect
from labs.dialects import LAB_DIALECTS
from labs.plan import LabConfig
from labs.runner import run_lab
from labs.scenario import SCENARIO_DIR, load_scenario
from tests.fixtures_chaos import in_dialects
from tests.fixtures_lab import run_trio

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

CLIENTS = ("openai-python", "openai-node", "pi-ai")
GATEWAYS = ("smg", "smg+finish_fix", "vllm-router")
#: The other two dialects' rows (`<dialect>:<scenario>`): a client of each, and pi-ai in both.
DIALECT_CLIENTS = {Dialect.MESSAGES: ("anthropic-python", "pi-ai"), Dialect.RESPONSES: ("openai-python", "pi-ai")}
DIALECT_SCENARIOS = ("healthy", "cut-after-tokens-fin", "cut-after-tokens-hub-close")
SCENARIOS = (
    "reason-omitted",
    "cut-after-tokens-fin",
    "incident-prefill-cut-hub-close",
    "rule1-prefill-cut-hub-close-spare",
    "rule1-prefill-cut-hub-abort-spare",
)
#: About a minute on a 2-core machine (the incident alone waits 13.7 s for its cut).
MATRIX_DEADLINE_S = 360


#: Rule 1 where a router can follow it: the tunnel refuses connections, so the request fails before
#: any head, with the spare worker there (a scenario of this test's own).
TUNNEL_DOWN = "tunnel-down-spare"
TUNNEL_DOWN_TOML = """
title = "Tunnel down (connections refused), spare worker available"
deadline_s = 20
[worker]
tokens = 12
token_delay = 0.01
[fault]
kind = "down"
[pool]
workers = 2
"""


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], dict[str, Any]]:
    own = tmp_path_factory.mktemp("router-scenarios") / f"{TUNNEL_DOWN}.toml"
    own.write_text(TUNNEL_DOWN_TOML)
    scenarios = tuple(
        dataclasses.replace(load_scenario(path), gateways=GATEWAYS, clients=CLIENTS, dialects=(Dialect.CHAT,))
        for path in (*(SCENARIO_DIR / f"{name}.toml" for name in SCENARIOS), own)
    )
    scenarios += tuple(
        copy
        for dialect, clients in DIALECT_CLIENTS.items()
        for name in DIALECT_SCENARIOS
        for copy in in_dialects(name, (dialect,), gateways=GATEWAYS, clients=clients)
    )
    config = LabConfig(
        scenarios=scenarios,
        clients=("openai-python", "openai-node", "pi-ai", "anthropic-python"),
        dialects=LAB_DIALECTS,
        gateways=GATEWAYS,
        jobs=12,
        results_dir=Path(tmp_path_factory.mktemp("router-matrix")),
    )

    result = run_trio(run_lab, config, deadline=MATRIX_DEADLINE_S).to_json()
    return {(c["scenario"], c["client"], c["gateway"]): c for c in result["cells"]}


def cells(matrix, scenario: str, gateway: str) -> dict[str, dict[str, Any]]:
    return {client: matrix[(scenario, client, gateway)] for client in CLIENTS}


def outcomes(matrix, scenario: str, gateway: str) -> dict[str, str]:
    return {client: cell["outcome"] for client, cell in cells(matrix, scenario, gateway).items()}


@pytest.mark.parametrize("router", ["smg", "vllm-router"])
def test_an_omitted_finish_reason_passes_through_the_routers_unchanged(matrix, router):
    # send_typed_request relays the body as it came: `[DONE]` without a finish_reason reaches the
    # client, and only pi-ai says so.
    assert outcomes(matrix, "reason-omitted", router) == {"openai-python": "ok", "openai-node": "ok", "pi-ai": "error"}
    assert "Stream ended without finish_reason" in cells(matrix, "reason-omitted", router)["pi-ai"]["why"]


def test_finish_fix_behind_smg_repairs_the_omitted_reason_for_every_client(matrix):
    assert set(outcomes(matrix, "reason-omitted", "smg+finish_fix").values()) == {"ok"}


def test_smg_ends_a_cut_stream_with_its_stream_error_frame_and_books_it(matrix):
    for client, cell in cells(matrix, "cut-after-tokens-fin", "smg").items():
        assert cell["outcome"] == "error", client
        assert "Stream error: error decoding response body" in cell["why"], client
        # Its log: the 200 of the head, and the WARN it wrote for the cut in the request's span.
        assert cell["books"] == "error" and cell["books_entry"]["status_code"] == 200
        assert any("Stream ended by the worker before completion" in p for p in cell["books_entry"]["problems"])
        assert not cell["books_mismatch"]


def test_vllm_router_passes_a_cut_on_as_a_broken_connection_and_keeps_no_books(matrix):
    by_client = cells(matrix, "cut-after-tokens-fin", "vllm-router")
    assert {c["outcome"] for c in by_client.values()} == {"error"}
    assert "peer closed connection without sending complete message body" in by_client["openai-python"]["why"]
    assert "other side closed" in by_client["openai-node"]["why"]
    assert {c["books"] for c in by_client.values()} == {"none"}


def test_behind_smg_finish_fix_says_why_but_smg_books_the_cut_as_a_success(matrix):
    for client, cell in cells(matrix, "cut-after-tokens-fin", "smg+finish_fix").items():
        assert cell["outcome"] == "error" and "stream was interrupted" in cell["why"], client
        # finish_fix ends the response cleanly after its error event: nothing failed for SMG.
        assert (cell["books"], cell["books_mismatch"]) == ("ok", True)


@pytest.mark.parametrize("router", ["smg", "vllm-router"])
def test_the_incident_through_a_router_is_the_incident_direct(matrix, router):
    # The hub ends the 200 cleanly; the routers relay the clean end and add nothing.
    assert outcomes(matrix, "incident-prefill-cut-hub-close", router) == {
        "openai-python": "silent-truncation",
        "openai-node": "silent-truncation",
        "pi-ai": "error",
    }
    assert "Stream ended without finish_reason" in cells(matrix, "incident-prefill-cut-hub-close", router)["pi-ai"]["why"]


def test_smg_books_the_incident_as_a_success(matrix):
    for client, cell in cells(matrix, "incident-prefill-cut-hub-close", "smg").items():
        assert (cell["books"], cell["books_entry"]["status_code"], cell["books_entry"]["problems"]) == ("ok", 200, []), client
        assert cell["books_mismatch"], client


def test_behind_smg_finish_fix_turns_the_incident_into_an_error_before_the_first_token(matrix):
    for client, cell in cells(matrix, "incident-prefill-cut-hub-close", "smg+finish_fix").items():
        assert cell["outcome"] == "error" and "before the first token" in cell["why"], client


@pytest.mark.parametrize(
    ("scenario", "router", "expected"),
    [
        # A clean end: nothing for SMG to see; the clients are where they are direct.
        (
            "rule1-prefill-cut-hub-close-spare",
            "smg",
            {"openai-python": "silent-truncation", "openai-node": "silent-truncation", "pi-ai": "error"},
        ),
        # finish_fix behind SMG makes the clean end an error event, after the same 200 head.
        (
            "rule1-prefill-cut-hub-close-spare",
            "smg+finish_fix",
            {"openai-python": "error", "openai-node": "error", "pi-ai": "error"},
        ),
        ("rule1-prefill-cut-hub-abort-spare", "smg", {"openai-python": "error", "openai-node": "error", "pi-ai": "error"}),
        (
            "rule1-prefill-cut-hub-abort-spare",
            "smg+finish_fix",
            {"openai-python": "error", "openai-node": "error", "pi-ai": "error"},
        ),
    ],
)
def test_smg_does_not_retry_a_prefill_cut_on_the_spare_the_head_went_out_first(matrix, scenario, router, expected):
    # The worker's 200 head reached SMG before the cut, and is_retryable_status judges heads: every
    # request stays on the primary, which round robin gives each model's first request (labs/gateways/smg.py).
    assert outcomes(matrix, scenario, router) == expected
    assert {c["answered_by"] for c in cells(matrix, scenario, router).values()} == {"primary"}


def test_smg_books_the_hub_s_clean_end_as_a_success_and_the_passed_on_fin_as_an_error(matrix):
    close = cells(matrix, "rule1-prefill-cut-hub-close-spare", "smg")
    abort = cells(matrix, "rule1-prefill-cut-hub-abort-spare", "smg")
    assert {c["books"] for c in close.values()} == {"ok"}
    assert {c["books"] for c in abort.values()} == {"error"}


@pytest.mark.parametrize(
    ("scenario", "failure"),
    [
        ("rule1-prefill-cut-hub-close-spare", "silent-truncation"),
        ("rule1-prefill-cut-hub-abort-spare", "error"),
    ],
)
def test_vllm_router_sends_a_request_to_whichever_worker_is_next_and_never_retries_after_the_head(matrix, scenario, failure):
    # Its workers have no model (`unknown`), so one round-robin counter serves every request:
    # which worker a cell's request meets depends on the order the concurrent cells arrive in.
    # The primary's failure is the client's; only a request that met the spare gets the answer.
    cell = matrix[(scenario, "openai-python", "vllm-router")]
    assert (cell["outcome"], cell["answered_by"]) in {(failure, "primary"), ("ok", "spare")}


@pytest.mark.parametrize("router", ["smg", "smg+finish_fix"])
def test_smg_retries_a_request_that_failed_before_any_head_on_the_spare(matrix, router):
    # The send fails (or finish_fix answers 502 for its refused upstream): is_retryable_status
    # says retry, and round robin gives the model's second worker, the spare, which answers.
    for client, cell in cells(matrix, TUNNEL_DOWN, router).items():
        assert (cell["outcome"], cell["answered_by"]) == ("ok", "spare"), client
        assert cell["books"] == "ok"
        assert len(cell["books_entry"]["workers"]) == 2, client  # its log: the primary, then the spare


def test_vllm_router_retries_a_request_that_failed_before_any_head_until_a_worker_answers(matrix):
    for client, cell in cells(matrix, TUNNEL_DOWN, "vllm-router").items():
        assert (cell["outcome"], cell["answered_by"]) == ("ok", "spare"), client


def test_smg_refusing_a_worker_is_one_line_naming_it_and_smg_s_reason(tmp_path):
    from labs.gateways.services import open_gateways
    from labs.gateways.smg import RunningSmg, SmgRegistrationError
    from labs.worker.server import open_worker

    async def register_twice() -> str:
        with trio.fail_after(START_DEADLINE_S):  # SMG's start and two registrations: a backstop
            async with (
                open_worker() as worker,
                open_gateways(("smg",), primary_url=f"http://127.0.0.1:{worker.port}", run_dir=tmp_path) as gateways,
            ):
                running = getattr(gateways["smg"].prepare, "__self__", None)  # whose `register_models` it is
                assert isinstance(running, RunningSmg), running
                await running.register_models(["c0001;tokens=3"])
                running._registered.clear()  # forget it, as a second lab run on the same SMG would
                with pytest.raises(SmgRegistrationError) as refused:
                    await running.register_models(["c0001;tokens=3"])
                return str(refused.value)

    message = trio.run(register_twice)
    assert "\n" not in message
    assert (
        message.startswith("SMG refused the worker http://127.0.0.1:")
        and "/cells/c0001 for 'c0001;tokens=3': HTTP 409" in message
    )
    assert "WORKER_ALREADY_EXISTS" in message


# -- The other two dialects -----------------------------------------------------------------------


def dialect_row(matrix, dialect: Dialect, scenario: str, gateway: str) -> dict[str, str]:
    """{client: outcome, `!` when the books disagree} for a `<dialect>:<scenario>` row."""
    found = {}
    for client in DIALECT_CLIENTS[dialect]:
        cell = matrix[(f"{dialect.value}:{scenario}", client, gateway)]
        assert (cell["dialect"], cell["upstream_dialect"]) == (dialect.value, dialect.value)
        found[client] = cell["outcome"] + ("!" if cell["books_mismatch"] else "")
    return found


@pytest.mark.parametrize("dialect", [Dialect.MESSAGES, Dialect.RESPONSES])
@pytest.mark.parametrize("router", GATEWAYS)
def test_the_routers_forward_both_other_dialects_to_the_workers_same_path(matrix, router, dialect):
    # SMG's HTTP router sends /v1/messages and /v1/responses to the worker's same path (its
    # `route_messages`, `route_responses`); vllm-router 0.1.17 has a /v1/responses route and
    # forwards /v1/messages through its catch-all proxy route. The worker saw the client's dialect.
    assert set(dialect_row(matrix, dialect, "healthy", router).values()) == {"ok"}
    for client in DIALECT_CLIENTS[dialect]:
        cell = matrix[(f"{dialect.value}:healthy", client, router)]
        assert [(a["at"], a["dialect"]) for a in cell["attempts"]] == [("primary", dialect.value)]
        assert cell["books"] == ("none" if router == "vllm-router" else "ok")


def test_smg_writes_a_cut_as_each_dialects_own_error_and_books_it(matrix):
    # Observed in the 1.13.0 binary (its source is not published past v1.9.0): a cut after the
    # head becomes an Anthropic `event: error` frame in a Messages stream and the Chat-style
    # `data: {"error":...}` + `[DONE]` in a Responses stream; both are errors to these clients.
    # Its log has the WARN "Stream ended by the worker before completion" in the request's span:
    # books `error`, for both paths (the books read every dialect's completion path).
    for dialect in (Dialect.MESSAGES, Dialect.RESPONSES):
        assert dialect_row(matrix, dialect, "cut-after-tokens-fin", "smg") == dict.fromkeys(DIALECT_CLIENTS[dialect], "error")
    message = matrix[("messages:cut-after-tokens-fin", "anthropic-python", "smg")]["report"]["error_message"]
    assert "Stream error:" in message and "api_error" in message


@pytest.mark.parametrize("dialect", [Dialect.MESSAGES, Dialect.RESPONSES])
def test_a_clean_end_without_a_terminal_event_passes_through_both_routers(matrix, dialect):
    # The hub's clean end after 5 tokens: a complete HTTP body to the routers, relayed as such. The
    # SDK client reports a short success; pi-ai says the stream ended before its terminal event.
    expected = {DIALECT_CLIENTS[dialect][0]: "silent-truncation", "pi-ai": "error"}
    assert dialect_row(matrix, dialect, "cut-after-tokens-hub-close", "vllm-router") == expected
    # SMG books a 200 with no WARN: its books call the cut a success.
    assert dialect_row(matrix, dialect, "cut-after-tokens-hub-close", "smg") == {k: v + "!" for k, v in expected.items()}


@pytest.mark.parametrize("dialect", [Dialect.MESSAGES, Dialect.RESPONSES])
def test_finish_fix_behind_smg_ends_every_cut_in_the_dialects_error(matrix, dialect):
    for scenario in ("cut-after-tokens-fin", "cut-after-tokens-hub-close"):
        row = dialect_row(matrix, dialect, scenario, "smg+finish_fix")
        assert {outcome.rstrip("!") for outcome in row.values()} == {"error"}, (scenario, row)
        for client in DIALECT_CLIENTS[dialect]:
            assert "stream was interrupted" in matrix[(f"{dialect.value}:{scenario}", client, "smg+finish_fix")]["why"]
