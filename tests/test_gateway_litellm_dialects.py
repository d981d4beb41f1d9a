"""LiteLLM's routes in the Messages and Responses dialects, and its two translating bridges: one small
real run (real clients of both dialects, the real LiteLLM proxy, finish_fix's mitmdump, the worker,
the tunnel and the hub), with the cells LiteLLM's source says each route must have.

The translation rows: a Chat worker whose stream omits its finish reason (`reason-omitted`), and
one cut after 5 tokens with the hub closing the response cleanly (`cut-after-tokens-hub-close`),
through the Chat bridge to every Messages and Responses client, and the same worker speaking
Responses through the Responses bridge to every Messages client; each also with finish_fix between
LiteLLM and the worker (the `+finish_fix` variants), which repairs the stream before it is
translated.

What LiteLLM 1.108.7's source says (paths under site-packages/litellm):
- Messages through the Chat bridge (`llms/anthropic/pass_through/adapters/streaming_iterator.py`):
  at the upstream's end it always queues `message_delta` + `message_stop`; the finish reason comes
  from `finish_reason_handler` (`litellm_core_utils/streaming_handler.py`), which makes up `stop`
  when none came, and `adapters/transformation.py` maps `stop` (and anything it does not know) to
  `end_turn`. An exception from the upstream becomes an `event: error` frame.
- Responses through the Chat bridge (`responses/litellm_completion_transformation/streaming_iterator.py`):
  the upstream's end is `response.completed` (`response.incomplete` for `length`); an exception
  becomes the proxy's `event: response.failed` (`proxy/common_utils/responses_stream_errors.py`).
- Messages through the Responses bridge (`llms/anthropic/pass_through/responses_adapters/`): the
  native Responses iterator (`responses/streaming_iterator.py`) raises "... closed the responses
  stream before any terminal event" when the upstream ends without one, which the bridge turns
  into an `event: error`.
- Messages natively (`anthropic/`): `PassThroughStreamingHandler.chunk_processor` relays the bytes,
  adding nothing at a clean end.
- Responses natively (`openai/`): the same native iterator, its exception written as
  `event: response.failed` with the stream's response id.

What a cell waits on (issue 25): its client's own end, the stream's last event, an error or the
cut; never a clock. Neither scenario stalls, so every cell ends by itself, and the cells' deadline
(`CELL_DEADLINE_S`; the scenarios' own is 15 s) is only the backstop that would call a real hang
one. The 15 s once called healthy cells `hang`: the Messages clients of the Chat bridge, under a
parallel C++ build on the same 2 cores. They are among the run's first cells through LiteLLM, and
LiteLLM's first requests on a route do work its later ones do not (about 1.5 s of its CPU more
for the run's first 28 cells than for the same 28 later, read from /proc), on its one event loop:
on an almost idle machine every first cell's request reached the worker within the same 50 ms,
3.4 s after the scenario began, where later cells take 0.5 s in all. `/health/liveliness` answers
before that work is done, so no readiness check sees it; a loaded machine stretches it, and the
requests queued behind it, past 15 s: stopping LiteLLM (SIGSTOP) for 16 s as the first cells
start makes exactly those 28 cells `hang` with 15 s, and leaves every cell's word as on an idle
machine with `CELL_DEADLINE_S`. So the cells' deadline has a loaded machine's room, and so has the
run's (`RUN_DEADLINE_S`, LiteLLM's start included); an idle machine still takes 40 s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from finishline import Dialect
from labs.clients import LIBRARY_CLIENTS_BY_DIALECT
from labs.gateways.litellm_proxy import VARIANTS
from labs.table import render_table
from tests.fixtures_chaos import run_lab_over
from tests.fixtures_lab import CELL_BACKSTOP_S

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SCENARIOS = ("reason-omitted", "cut-after-tokens-hub-close")
#: `direct`, and every LiteLLM variant: its native routes and its two bridges, each alone and with
#: finish_fix behind it.
GATEWAYS = ("direct", *VARIANTS)
DIALECTS = (Dialect.MESSAGES, Dialect.RESPONSES)
#: LiteLLM takes 25-90 s to start on a busy 2-core machine, and over 2 minutes under a parallel
#: C++ build; the cells then take seconds. A backstop: the run ends when its cells have.
RUN_DEADLINE_S = 600
#: Every cell's deadline: a backstop for a real hang only (the module docstring says why).
CELL_DEADLINE_S = CELL_BACKSTOP_S

Matrix = dict[tuple[str, str, str, str], dict[str, Any]]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_lab_over(
        SCENARIOS,
        Path(tmp_path_factory.mktemp("litellm-dialects")),
        clients=tuple(dict.fromkeys(c for d in DIALECTS for c in LIBRARY_CLIENTS_BY_DIALECT[d])),
        gateways=GATEWAYS,
        dialects=DIALECTS,
        deadline=RUN_DEADLINE_S,
        jobs=64,
        each={"gateways": GATEWAYS, "dialects": DIALECTS, "deadline_s": CELL_DEADLINE_S},
    )


@pytest.fixture(scope="module")
def matrix(run) -> Matrix:
    return {(c["scenario"], c["dialect"], c["client"], c["gateway"]): c for c in run["cells"]}


def row(matrix: Matrix, scenario: str, dialect: Dialect, gateway: str) -> dict[str, dict[str, Any]]:
    """The cells of one scenario, dialect and gateway, by client (every client of the dialect)."""
    return {client: matrix[(scenario, dialect.value, client, gateway)] for client in LIBRARY_CLIENTS_BY_DIALECT[dialect]}


def words(cells: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {client: cell["outcome"] for client, cell in cells.items()}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_through_the_chat_bridge_the_worker_speaks_chat_and_a_cut_becomes_a_complete_looking_answer(matrix, dialect):
    cells = row(matrix, "cut-after-tokens-hub-close", dialect, "litellm-chat-bridge")
    # The worker was asked in Chat: LiteLLM translated, from the stream the hub ended cleanly.
    for cell in cells.values():
        assert cell["upstream_dialect"] == "chat"
        assert {a["dialect"] for a in cell["attempts"]} == {"chat"}
    # A clean end is no error to LiteLLM: `end_turn` + `message_stop`, or `response.completed`,
    # after 5 tokens. Every client takes it for the whole answer, and LiteLLM books a success.
    assert words(cells) == dict.fromkeys(LIBRARY_CLIENTS_BY_DIALECT[dialect], "silent-truncation")
    assert {cell["books"] for cell in cells.values()} == {"ok"}
    sdk = LIBRARY_CLIENTS_BY_DIALECT[dialect][0]
    assert cells[sdk]["report"]["text"] == "The quick brown fox jumps"
    assert cells[sdk]["report"]["finish_reason"] == ("end_turn" if dialect is Dialect.MESSAGES else "completed")


def test_behind_the_chat_bridge_finish_fix_turns_every_cut_into_an_error_before_it_is_translated(matrix):
    # finish_fix ends the Chat stream with its error event; LiteLLM raises on it, and translates
    # the exception into the client's dialect: `event: error` (every Messages client raises), or
    # `response.failed` (openai-python's and openai-node's plain streams yield it without raising,
    # and openai-node's helper resolves with the failed response: `flagged`).
    messages = row(matrix, "cut-after-tokens-hub-close", Dialect.MESSAGES, "litellm-chat-bridge+finish_fix")
    assert words(messages) == dict.fromkeys(LIBRARY_CLIENTS_BY_DIALECT[Dialect.MESSAGES], "error")
    responses = row(matrix, "cut-after-tokens-hub-close", Dialect.RESPONSES, "litellm-chat-bridge+finish_fix")
    assert words(responses) == {
        "openai-python": "flagged",
        "openai-python-helper": "error",
        "langchain": "error",
        "openai-node": "flagged",
        "openai-node-helper": "flagged",
        "ai-sdk-openai": "error",
        "pi-ai": "error",
    }
    for cell in (*messages.values(), *responses.values()):
        assert cell["books"] == "error", cell["client"]
        assert "stream was interrupted" in cell["finish_fix_stream"]


@pytest.mark.parametrize("gateway", ["litellm-chat-bridge", "litellm-chat-bridge+finish_fix"])
def test_a_chat_upstream_that_omits_its_finish_reason_gets_a_made_up_end_turn_or_completed(matrix, gateway):
    # The worker's answer is whole and its true reason `stop`: LiteLLM's made-up `stop` is right
    # here by luck (it would be `end_turn` for a lost `length` too). finish_fix, behind the bridge,
    # injects the `stop` itself. Messages: every client `ok`.
    assert words(row(matrix, "reason-omitted", Dialect.MESSAGES, gateway)) == dict.fromkeys(
        LIBRARY_CLIENTS_BY_DIALECT[Dialect.MESSAGES], "ok"
    )
    # Responses: the scenario's reasoning deltas come out of the bridge as
    # `response.reasoning_summary_text.delta` events without `summary_index`, which the AI SDK's
    # schema requires (a TypeValidationError), and openai-node's helper finds no summary part to
    # add them to ("missing content at index undefined"); the other clients read the text.
    responses = row(matrix, "reason-omitted", Dialect.RESPONSES, gateway)
    assert words(responses) == {
        **dict.fromkeys(LIBRARY_CLIENTS_BY_DIALECT[Dialect.RESPONSES], "ok"),
        "openai-node-helper": "error",
        "ai-sdk-openai": "error",
    }
    assert responses["ai-sdk-openai"]["report"]["error_class"] == "TypeValidationError"
    assert responses["openai-node-helper"]["report"]["error_message"] == "missing content at index undefined"


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("gateway", ["litellm-responses-bridge", "litellm-responses-bridge+finish_fix"])
def test_the_responses_bridge_raises_on_a_stream_without_a_terminal_event(matrix, scenario, gateway):
    # `reason-omitted` in Responses is a stream with no terminal event, as is the hub's clean end
    # after 5 tokens: LiteLLM's Responses iterator raises, and the bridge sends `event: error`.
    # (Its books are not pinned: LiteLLM books such a request as a failure and then, depending on
    # when the client lets go, sometimes also as a success; labs/gateways/litellm_proxy.py.)
    cells = row(matrix, scenario, Dialect.MESSAGES, gateway)
    assert words(cells) == dict.fromkeys(LIBRARY_CLIENTS_BY_DIALECT[Dialect.MESSAGES], "error")
    for cell in cells.values():
        assert cell["upstream_dialect"] == "responses"
    if not gateway.endswith("+finish_fix"):
        # (Behind finish_fix the stream ends in its `error` and `response.failed`; which message
        # LiteLLM then raises with depends on the items before them, and is not pinned.)
        assert "closed the responses stream before any terminal event" in cells["anthropic-python"]["report"]["error_message"]


def test_litellm_relays_a_messages_stream_that_ends_cleanly_without_message_stop_as_it_came(matrix):
    # The anthropic/ route relays bytes: the cut reaches the clients as it does through direct
    # (the four SDK readers take the 5 tokens for the answer), and LiteLLM books a success.
    direct = words(row(matrix, "cut-after-tokens-hub-close", Dialect.MESSAGES, "direct"))
    cells = row(matrix, "cut-after-tokens-hub-close", Dialect.MESSAGES, "litellm")
    assert words(cells) == direct
    assert {cell["books"] for cell in cells.values()} == {"ok"}


def test_litellms_native_responses_route_fails_a_stream_without_a_terminal_event(matrix):
    # The native iterator raises; the proxy writes `response.failed` and books a failure. The plain
    # streams yield it without raising (`flagged`), the helpers and pi-ai raise.
    cells = row(matrix, "cut-after-tokens-hub-close", Dialect.RESPONSES, "litellm")
    assert "silent-truncation" not in words(cells).values() and "hang" not in words(cells).values()
    assert words(cells)["openai-python"] == "flagged"
    assert {cell["books"] for cell in cells.values()} == {"error"}


def test_the_matrix_names_the_translation_and_compares_it_with_direct_untranslated(run):
    text = render_table(run)
    assert "gateway: litellm-chat-bridge  (translated: the worker spoke chat)" in text
    assert "gateway: litellm-responses-bridge  (translated: the worker spoke responses)" in text
    assert "  litellm-chat-bridge (messages) from chat " in text
    assert run["routes"]["litellm-chat-bridge"]["messages"].startswith("LiteLLM: /v1/messages through its Chat bridge")
