"""`labs.grade gateway` in the Messages and Responses dialects, aimed at the lab's real gateways:
finish_fix, LiteLLM's native routes and its Chat bridge (with the worker speaking Chat behind it).
One grading lab (worker, tunnel, hub, spare, the clients) and one start of the gateways (one LiteLLM
serves both of its variants) serve every card; each card runs a few checks (`GatewayTarget.only`)
to keep the file to about a minute. The full cards are `python -m labs.grade lab-gateways
--dialect messages|responses [--upstream-dialect chat]` (docs/grading.md).

Why each card reads as it does, from the sources named in tests/test_gateway_litellm_dialects.py:
finish_fix ends a cut with the dialect's error event and repairs a missing stop_reason (rules M2,
M4, R3); LiteLLM's native Responses route fails a stream without a terminal event with
`response.failed`; its Chat bridge makes a cut Chat stream a complete-looking `end_turn` +
`message_stop` (rule 2 fails: a made-up reason).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from finishline import Dialect
from labs.gateways.services import books_entry, open_gateways, read_books
from labs.grade.card import EXIT_FAILED, EXIT_PASSED, Card, Mark
from labs.grade.gateway_grader import grade_with, open_grading_lab
from labs.grade.gateway_plan import GatewayTarget, plan_checks
from tests.fixtures_lab import run_trio

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

CLIENTS = {Dialect.MESSAGES: ("anthropic-python", "pi-ai"), Dialect.RESPONSES: ("openai-python", "pi-ai")}
#: (gateway, clients' dialect, worker's dialect, the checks run)
CARDS = (
    (
        "finish_fix",
        Dialect.MESSAGES,
        Dialect.MESSAGES,
        (
            "cut-after-tokens-hub-close",
            "cut-after-tokens-hub-error-event",
            "stop-reason-null",
            "cuts-booked-as-errors",
            "length-omitted",
        ),
    ),
    (
        "finish_fix",
        Dialect.RESPONSES,
        Dialect.RESPONSES,
        ("cut-after-tokens-hub-close", "cut-after-tokens-hub-error-event", "close-after-reasoning"),
    ),
    ("litellm", Dialect.RESPONSES, Dialect.RESPONSES, ("cut-after-tokens-hub-close", "cuts-booked-as-errors")),
    (
        "litellm-chat-bridge",
        Dialect.MESSAGES,
        Dialect.CHAT,
        ("cut-after-tokens-hub-close", "reason-omitted", "cuts-booked-as-errors"),
    ),
)
RUN_DEADLINE_S = 360


@pytest.fixture(scope="module")
def cards(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, Dialect], Card]:
    results = Path(tmp_path_factory.mktemp("grade-dialects"))
    every_client = tuple(dict.fromkeys(c for clients in CLIENTS.values() for c in clients))

    async def grade_all() -> dict[tuple[str, Dialect], Card]:
        async with open_grading_lab(upstream_port=0, spare_port=0, clients=every_client, results_dir=results) as lab:
            assert lab.spare is not None
            targets = {
                (name, dialect): GatewayTarget(
                    url="",
                    upstream_port=lab.hub.port,
                    spare_port=lab.spare.port,
                    clients=CLIENTS[dialect],
                    dialect=dialect,
                    upstream_dialect=upstream,
                    only=only,
                    results_dir=results,
                    stall_deadline_s=10.0,
                )
                for name, dialect, upstream, only in CARDS
            }
            # Every card's request ids before the gateways start: LiteLLM is told its models.
            plans = {key: plan_checks(lab, target) for key, target in targets.items()}
            models: dict[tuple[str, Dialect], tuple[str, ...]] = {}
            for (name, dialect), plan in plans.items():
                models[(name, dialect)] = models.get((name, dialect), ()) + tuple(plan.models())
            names = tuple(dict.fromkeys(name for name, *_ in CARDS))
            async with open_gateways(
                names,
                primary_url=f"http://127.0.0.1:{lab.hub.port}",
                spare_url=f"http://127.0.0.1:{lab.spare.port}",
                run_dir=lab.run_dir,
                models=models,
            ) as gateways:
                graded = {}
                for (name, dialect), target in targets.items():
                    gateway = gateways[name]

                    def books(request_id: str, gateway=gateway) -> tuple[str | None, dict | None]:
                        return books_entry(gateway, read_books(gateway.books_path), request_id)

                    target = dataclasses.replace(
                        target,
                        url=gateway.base_url.rstrip("/"),
                        model=gateway.model_for(dialect, "") or None,
                        api_key=gateway.api_key,
                        books_lookup=books,
                    )
                    graded[(name, dialect)] = await grade_with(lab, target, plans[(name, dialect)])
                return graded

    return run_trio(grade_all, deadline=RUN_DEADLINE_S)


def marks(card: Card) -> dict[str, Mark]:
    return {row.check: row.mark for row in card.results}


def test_finish_fix_passes_in_messages_and_its_card_says_so_in_messages_words(cards):
    card = cards[("finish_fix", Dialect.MESSAGES)]
    assert marks(card) == {
        "healthy": Mark.PASS,
        "cut-after-tokens-hub-close": Mark.PASS,
        "cut-after-tokens-hub-error-event": Mark.PASS,
        "cuts-booked-as-errors": Mark.PASS,
        "stop-reason-null": Mark.PASS,
        # No `message_delta` at all: the token deltas reach the request's max_tokens (rule M2).
        "length-omitted": Mark.PASS,
    }
    assert card.exit_status == EXIT_PASSED
    assert card.setup["dialect"] == "messages" and card.setup["upstream_dialect"] == "messages"
    # The hub's error ending is Anthropic's `event: error`, which both SDK clients and pi-ai raise on.
    assert "agent disconnected mid-request" in card.result("cut-after-tokens-hub-error-event").evidence
    assert card.result("cut-after-tokens-hub-close").title == (
        "cut after tokens, hub ends cleanly: an error event, no message_stop, no made-up reason"
    )
    # Every check means something in Messages: nothing is left out (the hub's error event is the
    # client's dialect's since issue 25).
    assert card.not_run == {}


def test_finish_fix_passes_in_responses_where_a_cut_and_a_close_after_reasoning_are_errors(cards):
    card = cards[("finish_fix", Dialect.RESPONSES)]
    assert marks(card) == {
        "healthy": Mark.PASS,
        "cut-after-tokens-hub-close": Mark.PASS,
        "cut-after-tokens-hub-error-event": Mark.PASS,
        "close-after-reasoning": Mark.PASS,
    }
    # The hub's own error ending reached every client: openai-python and pi-ai raised on its words.
    assert "agent disconnected mid-request" in card.result("cut-after-tokens-hub-error-event").evidence
    assert card.exit_status == EXIT_PASSED
    assert "reason-omitted" in card.not_run


def test_litellms_native_responses_route_ends_a_cut_in_response_failed_and_books_it(cards):
    card = cards[("litellm", Dialect.RESPONSES)]
    assert marks(card) == {"healthy": Mark.PASS, "cut-after-tokens-hub-close": Mark.PASS, "cuts-booked-as-errors": Mark.PASS}
    assert card.exit_status == EXIT_PASSED


def test_litellms_chat_bridge_fails_rule_2_with_a_made_up_end_turn_and_the_card_exits_1(cards):
    card = cards[("litellm-chat-bridge", Dialect.MESSAGES)]
    assert card.setup["upstream_dialect"] == "chat"
    assert marks(card) == {
        "healthy": Mark.PASS,
        "cut-after-tokens-hub-close": Mark.FAIL,
        "cuts-booked-as-errors": Mark.FAIL,
        "reason-omitted": Mark.PASS,
    }
    assert card.result("cut-after-tokens-hub-close").evidence.startswith(
        "the gateway made up stop_reason 'end_turn' and message_stop for a cut stream"
    )
    assert card.exit_status == EXIT_FAILED
