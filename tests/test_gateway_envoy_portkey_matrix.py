"""A small real matrix through Envoy and Portkey: real clients, the real gateways, the worker, the
tunnel (toxiproxy) and the hub, with the cells each gateway's source says they must have.

One lab run serves every test here (both gateways start in about a second, but the driver hosts
and the incident's 13.7 s prefill are worth paying once). Clients: openai-python and openai-node
(the two the incident shows as silently truncated) and pi-ai (the one that says "Stream ended
without finish_reason").

What the sources say, cited per test:
- Envoy 1.40 (envoyproxy/envoy source/common/router/router.cc): the router forwards the upstream's
  head and body as they come; `Filter::maybeRetryReset` never retries once
  `downstream_response_started_`, and `onUpstreamAbort` then resets the downstream stream instead
  of answering (a connection closed without the chunked terminator, for HTTP/1). A cut of the
  chunked body is a codec protocol error: response flag `UPE`, details
  `upstream_reset_after_response_started{protocol_error}`. A clean end from the hub is a clean end.
- Portkey 1.15.2 (Portkey-AI/gateway src/handlers/streamHandler.ts): `readStream` passes an
  OpenAI provider's events on unchanged; `handleStreamingMode` catches a read error and closes
  the writer normally, so a cut is a clean end of the body; its request log
  (src/middlewares/log/index.ts) is written when the handler returned, with the 200 of the head.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from finishline import Dialect
from labs.dialects import LAB_DIALECTS
from labs.plan import LabConfig
from labs.runner import run_lab
from labs.scenario import SCENARIO_DIR, load_scenario
from tests.fixtures_chaos import in_dialects
from tests.fixtures_lab import run_trio

pytestmark = pytest.mark.e2e

CLIENTS = ("openai-python", "openai-node", "pi-ai")
GATEWAYS = ("envoy", "portkey", "portkey+finish_fix")
#: The other two dialects' rows (`<dialect>:<scenario>`): a client of each, and pi-ai in both.
DIALECT_CLIENTS = {Dialect.MESSAGES: ("anthropic-python", "pi-ai"), Dialect.RESPONSES: ("openai-python", "pi-ai")}
DIALECT_SCENARIOS = ("healthy", "cut-after-tokens-fin")
SCENARIOS = ("reason-omitted", "cut-after-tokens-fin", "incident-prefill-cut-hub-close", "rule1-prefill-cut-hub-abort-spare")
#: The run takes ~45 s on a 2-core machine (the incident alone waits 13.7 s for its cut).
MATRIX_DEADLINE_S = 240


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], dict[str, Any]]:
    scenarios = tuple(
        dataclasses.replace(
            load_scenario(SCENARIO_DIR / f"{name}.toml"), gateways=GATEWAYS, clients=CLIENTS, dialects=(Dialect.CHAT,)
        )
        for name in SCENARIOS
    )
    scenarios += tuple(
        copy
        for dialect, clients in DIALECT_CLIENTS.items()
        for name in DIALECT_SCENARIOS
        for copy in in_dialects(name, (dialect,), gateways=GATEWAYS, clients=clients)
    )
    config = LabConfig(
        scenarios=scenarios,
        clients=(*CLIENTS, "anthropic-python"),
        dialects=LAB_DIALECTS,
        gateways=GATEWAYS,
        jobs=12,
        results_dir=Path(tmp_path_factory.mktemp("gateway-matrix")),
    )

    result = run_trio(run_lab, config, deadline=MATRIX_DEADLINE_S).to_json()
    return {(c["scenario"], c["client"], c["gateway"]): c for c in result["cells"]}


def row(matrix, scenario: str, gateway: str) -> dict[str, str]:
    """{client: outcome, with `!` when the books disagree} for one scenario and gateway."""
    return {
        client: matrix[(scenario, client, gateway)]["outcome"]
        + ("!" if matrix[(scenario, client, gateway)]["books_mismatch"] else "")
        for client in CLIENTS
    }


def books(matrix, scenario: str, gateway: str) -> list[dict[str, Any]]:
    return [matrix[(scenario, client, gateway)]["books_entry"] for client in CLIENTS]


# -- Envoy ----------------------------------------------------------------------------------------


def test_envoy_passes_an_omitted_finish_reason_through(matrix):
    # Envoy does not read the body: the clients see what `direct` shows (pi-ai alone refuses a
    # stream without a finish_reason, so Envoy's `ok` disagrees with it: `!`). The access log says
    # 200 with no flags for all three: the worker sends `[DONE]` with the chunked terminator, so
    # the stream has ended in Envoy before any client (openai-node and pi-ai hang up at `[DONE]`)
    # can leave; `DC` would mean one left first (labs/gateways/envoy.py, module docstring).
    assert row(matrix, "reason-omitted", "envoy") == {"openai-python": "ok", "openai-node": "ok", "pi-ai": "error!"}
    for entry in books(matrix, "reason-omitted", "envoy"):
        assert (entry["response_code"], entry["response_flags"], entry["response_code_details"]) == (200, "-", "via_upstream")


def test_envoy_resets_the_client_after_a_cut_and_its_books_say_why(matrix):
    # router.cc: after the head went downstream a reset cannot be retried or answered; the stream
    # is reset, which every client reports as an error. The access log agrees: `UPE`.
    assert row(matrix, "cut-after-tokens-fin", "envoy") == {"openai-python": "error", "openai-node": "error", "pi-ai": "error"}
    for entry in books(matrix, "cut-after-tokens-fin", "envoy"):
        assert (entry["response_code"], entry["response_flags"]) == (200, "UPE")
        assert entry["response_code_details"] == "upstream_reset_after_response_started{protocol_error}"


def test_envoy_forwards_the_incidents_clean_end_and_books_it_as_a_success(matrix):
    # The hub ends the response with the chunked terminator: a complete HTTP response to Envoy,
    # forwarded as such. The clients get a 200 with no event at all, as through `direct`.
    assert row(matrix, "incident-prefill-cut-hub-close", "envoy") == {
        "openai-python": "silent-truncation!",
        "openai-node": "silent-truncation!",
        "pi-ai": "error!",
    }
    assert (
        matrix[("incident-prefill-cut-hub-close", "pi-ai", "envoy")]["report"]["error_message"]
        == "Stream ended without finish_reason"
    )
    assert all(
        entry["response_flags"] == "-" and entry["bytes_sent"] == 0
        for entry in books(matrix, "incident-prefill-cut-hub-close", "envoy")
    )


def test_envoy_does_not_retry_a_prefill_cut_once_the_head_went_downstream(matrix):
    # Rule 1 fails here for a reason in Envoy's design, not its config: the worker sent its head at
    # once, so the retry policy (which would send a reset before the head to the spare) never
    # applies (`maybeRetryReset`: `downstream_response_started_`). One attempt, on the primary.
    assert row(matrix, "rule1-prefill-cut-hub-abort-spare", "envoy") == {
        "openai-python": "error",
        "openai-node": "error",
        "pi-ai": "error",
    }
    for client in CLIENTS:
        cell = matrix[("rule1-prefill-cut-hub-abort-spare", client, "envoy")]
        assert cell["answered_by"] == "primary"
        assert (cell["books_entry"]["attempts"], cell["books_entry"]["response_flags"]) == (1, "UPE")


# -- Portkey --------------------------------------------------------------------------------------


def test_portkey_passes_an_omitted_finish_reason_through(matrix):
    # readStream: no stream transformer for the openai provider, events go on unchanged.
    assert row(matrix, "reason-omitted", "portkey") == {"openai-python": "ok", "openai-node": "ok", "pi-ai": "error!"}


def test_portkey_hides_a_cut_as_a_clean_end_and_books_a_200(matrix):
    # handleStreamingMode catches the read error and closes the writer: the Python and Node SDKs
    # take the clean end for the end of the answer. Its request log has the head's 200.
    assert row(matrix, "cut-after-tokens-fin", "portkey") == {
        "openai-python": "silent-truncation!",
        "openai-node": "silent-truncation!",
        "pi-ai": "error!",
    }
    assert [entry["status"] for entry in books(matrix, "cut-after-tokens-fin", "portkey")] == [200, 200, 200]


def test_portkey_forwards_the_incidents_clean_end(matrix):
    assert row(matrix, "incident-prefill-cut-hub-close", "portkey") == {
        "openai-python": "silent-truncation!",
        "openai-node": "silent-truncation!",
        "pi-ai": "error!",
    }
    assert (
        matrix[("incident-prefill-cut-hub-close", "pi-ai", "portkey")]["report"]["error_message"]
        == "Stream ended without finish_reason"
    )


def test_portkey_neither_retries_nor_falls_back_after_a_200_head(matrix):
    # retryRequest and the fallback loop judge the response status only; the 200 head came before
    # the cut, so the primary's broken stream is what the client gets (hidden as a clean end).
    assert row(matrix, "rule1-prefill-cut-hub-abort-spare", "portkey") == {
        "openai-python": "silent-truncation!",
        "openai-node": "silent-truncation!",
        "pi-ai": "error!",
    }
    for client in CLIENTS:
        cell = matrix[("rule1-prefill-cut-hub-abort-spare", client, "portkey")]
        assert cell["answered_by"] == "primary"
        assert [attempt["option_index"] for attempt in cell["books_entry"]["attempts"]] == ["config.targets[0]"]


# -- Portkey with finish_fix behind it --------------------------------------------------------------


def test_finish_fix_behind_portkey_repairs_an_omitted_reason(matrix):
    assert row(matrix, "reason-omitted", "portkey+finish_fix") == {"openai-python": "ok", "openai-node": "ok", "pi-ai": "ok"}


@pytest.mark.parametrize(
    "scenario", ["cut-after-tokens-fin", "incident-prefill-cut-hub-close", "rule1-prefill-cut-hub-abort-spare"]
)
def test_finish_fix_behind_portkey_turns_every_hidden_cut_into_an_error_but_portkeys_books_still_say_200(matrix, scenario):
    # finish_fix's error event is an event like any other to Portkey's readStream, so it reaches
    # the client; Portkey's own books were written at the head and still say 200 (flagged).
    assert row(matrix, scenario, "portkey+finish_fix") == {"openai-python": "error!", "openai-node": "error!", "pi-ai": "error!"}
    for client in CLIENTS:
        assert "stream was interrupted" in matrix[(scenario, client, "portkey+finish_fix")]["report"]["error_message"]
    assert [entry["status"] for entry in books(matrix, scenario, "portkey+finish_fix")] == [200, 200, 200]


def test_finish_fix_says_the_incident_stopped_before_the_first_token(matrix):
    message = matrix[("incident-prefill-cut-hub-close", "openai-python", "portkey+finish_fix")]["report"]["error_message"]
    assert "before the first token" in message


# -- The other two dialects -----------------------------------------------------------------------


def dialect_cells(matrix, dialect: Dialect, scenario: str, gateway: str) -> dict[str, dict[str, Any]]:
    found = {client: matrix[(f"{dialect.value}:{scenario}", client, gateway)] for client in DIALECT_CLIENTS[dialect]}
    assert {(c["dialect"], c["upstream_dialect"]) for c in found.values()} == {(dialect.value, dialect.value)}
    return found


@pytest.mark.parametrize("dialect", [Dialect.MESSAGES, Dialect.RESPONSES])
@pytest.mark.parametrize("gateway", GATEWAYS)
def test_both_other_dialects_pass_through_byte_for_byte_and_are_booked(matrix, gateway, dialect):
    # Envoy relays bytes whatever the path; Portkey serves /v1/responses with the `openai`
    # provider and /v1/messages with `anthropic` (the lab's launcher gives each path its config).
    cells = dialect_cells(matrix, dialect, "healthy", gateway)
    assert {client: (c["outcome"], c["books"]) for client, c in cells.items()} == dict.fromkeys(
        DIALECT_CLIENTS[dialect], ("ok", "ok")
    )


@pytest.mark.parametrize("dialect", [Dialect.MESSAGES, Dialect.RESPONSES])
def test_envoy_resets_a_cut_stream_in_every_dialect_and_books_it_upe(matrix, dialect):
    for client, cell in dialect_cells(matrix, dialect, "cut-after-tokens-fin", "envoy").items():
        assert (cell["outcome"], cell["books"]) == ("error", "error"), client
        assert cell["books_entry"]["response_flags"] == "UPE"


@pytest.mark.parametrize("dialect", [Dialect.MESSAGES, Dialect.RESPONSES])
def test_portkey_hides_a_cut_in_every_dialect_and_finish_fix_behind_it_says_so(matrix, dialect):
    # streamHandler.ts catches the read error and closes the writer normally, whatever the route:
    # the SDK client reports a short success (pi-ai alone says the stream never ended), and its
    # request log says 200. finish_fix between Portkey and the worker turns the cut into the
    # dialect's error event, which Portkey passes on like any event.
    sdk = DIALECT_CLIENTS[dialect][0]
    hidden = dialect_cells(matrix, dialect, "cut-after-tokens-fin", "portkey")
    assert {client: (c["outcome"], c["books"]) for client, c in hidden.items()} == {
        sdk: ("silent-truncation", "ok"),
        "pi-ai": ("error", "ok"),
    }
    for client, cell in dialect_cells(matrix, dialect, "cut-after-tokens-fin", "portkey+finish_fix").items():
        assert cell["outcome"] == "error" and "stream was interrupted" in cell["why"], client
