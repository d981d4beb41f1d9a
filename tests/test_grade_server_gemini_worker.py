"""`python -m labs.grade server --dialect gemini` against the lab's worker speaking Gemini: a healthy
worker passes every check (the mid-stream error frame is `not tested`: a healthy worker sends none),
and each worker defect fails exactly the checks named after it (the rest pass, or are `not tested`
naming the check that failed), as `tests/test_grade_server_dialects.py` pins for Messages and
Responses. The worker comes from the package's pytest plugin."""

from __future__ import annotations

import json

import pytest

from finishline import Dialect
from labs.grade.card import EXIT_FAILED, EXIT_PASSED, Mark
from labs.grade.cli import main
from labs.grade.server_grader import grade_server
from labs.grade.server_suites import SERVER_SUITES

GEMINI = Dialect.GEMINI
CHECKS = {c.check for c in SERVER_SUITES[GEMINI].checks}
REASON_VALUES = {"gemini-reason-stop", "gemini-reason-max-tokens", "gemini-reason-tool-call"}
FRAME = "gemini-error-frame"
# Checks with nothing to judge once every stream and every whole answer ended in an error.
NEED_AN_ANSWER = CHECKS - {"gemini-no-error", "gemini-json-no-error", "gemini-error-shape", FRAME}
REASONLESS = ({"gemini-finish-reason", "gemini-json-finish-reason"}, REASON_VALUES | {FRAME})

# defect -> (checks that fail, checks that are not tested); every other check passes.
DEFECTS = {
    "finish=omitted": REASONLESS,
    "finish=empty": REASONLESS,
    "null_reason=1": REASONLESS,
    # A truncation that says STOP (a gateway that hides the limit).
    "hide_limit=1": ({"gemini-reason-max-tokens"}, {FRAME}),
    # An error chunk after two chunks: its shape is right, so the error-frame check passes.
    "error_after=2": ({"gemini-no-error", "gemini-json-no-error"}, NEED_AN_ANSWER),
    "malformed_chunk=1": ({"gemini-no-error"}, {FRAME}),
}


def marks(card) -> dict[str, Mark]:
    return {row.check: row.mark for row in card.results}


@pytest.mark.timeout(600)
def test_a_healthy_worker_passes_every_check(finishline_worker):
    card = grade_server(finishline_worker(), dialect=GEMINI)
    expected = dict.fromkeys(CHECKS, Mark.PASS) | {FRAME: Mark.NOT_TESTED}
    assert marks(card) == expected, [r.evidence for r in card.results if r.mark is not Mark.PASS]
    assert card.exit_status == EXIT_PASSED
    assert card.result(FRAME).evidence == "no stream sent an error chunk (a server sends one only when it fails mid-stream)"
    # The bad request got Gemini's error body, its code the HTTP status.
    assert card.result("gemini-error-shape").evidence.startswith(
        "a request whose body is not JSON: HTTP 400, error 400 INVALID_ARGUMENT"
    )


@pytest.mark.timeout(600)
@pytest.mark.parametrize("defect", list(DEFECTS))
def test_each_defect_fails_exactly_the_checks_it_breaks(finishline_worker, defect):
    failing, untested = DEFECTS[defect]
    card = grade_server(finishline_worker(defect), dialect=GEMINI)
    expected = {check: Mark.FAIL if check in failing else Mark.NOT_TESTED if check in untested else Mark.PASS for check in CHECKS}
    assert marks(card) == expected, {r.check: r.evidence for r in card.results}
    assert card.exit_status == EXIT_FAILED
    for row in card.results:
        if row.mark is Mark.NOT_TESTED and row.check != FRAME:
            assert any(name in row.evidence for name in failing), row.evidence


@pytest.mark.timeout(600)
def test_the_evidence_says_what_was_seen_and_what_the_core_did(finishline_worker):
    card = grade_server(finishline_worker("tokens=3; finish=omitted"), dialect=GEMINI)
    assert card.result("gemini-finish-reason").evidence == (
        "stream a natural stop: its last candidate chunk (3 of 3) carries no finishReason; the core: interrupted after "
        "the first token (clean end without a finishReason) after 3 events; sent an error event"
    )
    card = grade_server(finishline_worker("error_after=2"), dialect=GEMINI)
    assert card.result("gemini-no-error").evidence.startswith("stream a natural stop sent an error chunk after 2 chunks: ")
    assert card.result(FRAME).evidence == '3 error chunks, each {"error": {"code", "message", "status"}} with a code in 400-599'


@pytest.mark.timeout(600)
def test_a_cap_gives_max_tokens_in_both_forms(finishline_worker):
    row = grade_server(finishline_worker(), dialect=GEMINI).result("gemini-reason-max-tokens")
    assert (row.mark, row.evidence) == (Mark.PASS, "maxOutputTokens=5: stream: MAX_TOKENS, JSON: MAX_TOKENS")
    row = grade_server(finishline_worker("hide_limit=1"), dialect=GEMINI).result("gemini-reason-max-tokens")
    assert (row.mark, row.evidence) == (Mark.FAIL, "stream maxOutputTokens=5 ended with 'STOP', expected 'MAX_TOKENS'")


@pytest.mark.timeout(600)
def test_cli_dialect_gemini_prints_the_card_and_what_it_does_not_run(finishline_worker, tmp_path, capsys):
    url = finishline_worker()
    assert main(["server", "--url", url, "--dialect", "gemini", "--json", str(tmp_path / "card.json")]) == EXIT_PASSED
    out = capsys.readouterr().out
    assert out.startswith(f"server {url} (gemini)\n")
    assert "not run: stream-done-last: " in out and out.rstrip().endswith("9 pass, 1 not tested; exit status 0")
    saved = json.loads((tmp_path / "card.json").read_text())
    assert {r["check"] for r in saved["results"]} == CHECKS
    assert saved["setup"]["answers"]["JSON a bad request"].startswith("HTTP 400; ")
    assert main(["server", "--url", finishline_worker("finish=omitted"), "--dialect", "gemini"]) == EXIT_FAILED
