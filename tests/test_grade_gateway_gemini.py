"""`labs.grade gateway --dialect gemini`, aimed at the lab's Gemini gateways: finish_fix and the
direct connection (no gateway), with the worker speaking Gemini and google-genai as the client. One
grading lab and one start of the gateways serve both cards; each runs a few checks
(`GatewayTarget.only`). The full cards are `python -m labs.grade lab-gateways --dialect gemini`
(docs/grading.md).

Why each card reads as it does: a Gemini stream has no terminator, so a cut at a chunk boundary (the
hub ending cleanly) and a stream without a `finishReason` both read as a clean end, and
google-genai hands the partial answer on in silence (shared/notes/gemini.md §4): direct fails rule 2
and `no-finish-reason`. finish_fix ends both with Gemini's error frame (rule G2), on which
google-genai raises, and books them `interrupted`.
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

GEMINI = Dialect.GEMINI
CLIENTS = ("google-genai",)
#: gateway -> the checks its card runs
CARDS = {
    "finish_fix": ("cut-after-tokens-hub-close", "cut-after-tokens-hub-error-event", "no-finish-reason", "cuts-booked-as-errors"),
    "direct": ("cut-after-tokens-hub-close", "no-finish-reason"),
}
RUN_DEADLINE_S = 360


@pytest.fixture(scope="module")
def cards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Card]:
    results = Path(tmp_path_factory.mktemp("grade-gemini"))

    async def grade_all() -> dict[str, Card]:
        async with open_grading_lab(upstream_port=0, spare_port=None, clients=CLIENTS, results_dir=results) as lab:
            targets = {
                name: GatewayTarget(
                    url="",
                    upstream_port=lab.hub.port,
                    clients=CLIENTS,
                    dialect=GEMINI,
                    only=only,
                    results_dir=results,
                    stall_deadline_s=10.0,
                )
                for name, only in CARDS.items()
            }
            plans = {name: plan_checks(lab, target) for name, target in targets.items()}
            async with open_gateways(
                tuple(CARDS),
                primary_url=f"http://127.0.0.1:{lab.hub.port}",
                spare_url=None,
                run_dir=lab.run_dir,
                models={(name, GEMINI): tuple(plan.models()) for name, plan in plans.items()},
            ) as gateways:
                graded = {}
                for name, target in targets.items():
                    gateway = gateways[name]

                    def books(request_id: str, gateway=gateway) -> tuple[str | None, dict | None]:
                        return books_entry(gateway, read_books(gateway.books_path), request_id)

                    target = dataclasses.replace(
                        target,
                        url=gateway.base_url.rstrip("/"),
                        model=gateway.model_for(GEMINI, "") or None,
                        api_key=gateway.api_key,
                        books_lookup=books if gateway.books_kind is not None else None,
                    )
                    graded[name] = await grade_with(lab, target, plans[name])
                return graded

    return run_trio(grade_all, deadline=RUN_DEADLINE_S)


def marks(card: Card) -> dict[str, Mark]:
    return {row.check: row.mark for row in card.results}


def test_finish_fix_ends_a_cut_and_a_missing_finish_reason_with_geminis_error_frame(cards):
    card = cards["finish_fix"]
    assert marks(card) == {
        "healthy": Mark.PASS,
        "cut-after-tokens-hub-close": Mark.PASS,
        "cut-after-tokens-hub-error-event": Mark.PASS,
        "no-finish-reason": Mark.PASS,
        "cuts-booked-as-errors": Mark.PASS,
    }, {row.check: row.evidence for row in card.results}
    assert card.exit_status == EXIT_PASSED
    assert card.setup["dialect"] == "gemini"
    assert card.result("no-finish-reason").title == "the stream ends without a finishReason: an error frame, no made-up STOP"
    assert card.result("cut-after-tokens-hub-close").title == (
        "cut after tokens, hub ends cleanly: an error event, no finishReason chunk, no made-up reason"
    )
    # The finish-reason checks do not run from a Gemini worker: without its reason, a stream is a cut.
    assert set(card.not_run) >= {"reason-omitted", "reason-empty", "length-omitted", "tool-calls-omitted"}


def test_without_a_gateway_a_gemini_cut_and_a_missing_finish_reason_are_silent(cards):
    card = cards["direct"]
    assert marks(card) == {
        "healthy": Mark.PASS,
        "cut-after-tokens-hub-close": Mark.FAIL,
        "no-finish-reason": Mark.FAIL,
    }, {row.check: row.evidence for row in card.results}
    assert card.exit_status == EXIT_FAILED
    evidence = card.result("no-finish-reason").evidence
    assert evidence.startswith("the stream just stopped: ") and "google-genai: silent-truncation" in evidence
