"""`python -m labs.grade server --dialect messages|responses`: in each dialect a healthy worker passes
every check, and each worker defect fails exactly the checks named after it (the rest pass, or are
`not tested` naming the check that failed), as `tests/test_grade_server.py` pins for Chat. The
verdicts are the core's in that dialect; the worker comes from the package's pytest plugin."""

from __future__ import annotations

import json

import pytest

from finishline import Dialect
from labs.grade.card import EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_PASSED, Mark
from labs.grade.cli import main
from labs.grade.server_checks import TOOL_CALL_TOKENS
from labs.grade.server_grader import grade_server
from labs.grade.server_suites import SERVER_SUITES
from tests.dialect_streams import messages_stream, responses_stream
from tests.upstream_server import Script

MESSAGES, RESPONSES = Dialect.MESSAGES, Dialect.RESPONSES

# The worker answers 16 content tokens by default, and OpenAI refuses a `max_output_tokens` below
# 16: the Responses truncation request asks for 16, so a worker that truncates it needs more tokens.
BASE = {MESSAGES: "", RESPONSES: "tokens=24; "}


def checks(dialect: Dialect) -> set[str]:
    return {c.check for c in SERVER_SUITES[dialect].checks}


MESSAGES_REASON_VALUES = {"messages-reason-end-turn", "messages-reason-max-tokens", "messages-reason-tool-use"}
RESPONSES_REASON_VALUES = {"responses-reason-completed", "responses-reason-incomplete", "responses-reason-tool-call"}
# Checks with nothing to judge once every stream and every JSON answer ended in an error.
MESSAGES_NEED_AN_ANSWER = checks(MESSAGES) - {"messages-no-error", "messages-json-no-error"}
RESPONSES_NEED_AN_ANSWER = checks(RESPONSES) - {"responses-no-error", "responses-json-no-error", "responses-sequence-numbers"}
# Without a terminal event there is no status to judge, and no finished stream to compare.
RESPONSES_NEED_A_TERMINAL = RESPONSES_REASON_VALUES | {"responses-terminal-status", "responses-stream-json-agree"}

# (dialect, defect) -> (checks that fail, checks that are not tested); every other check passes.
DEFECTS = {
    (MESSAGES, "finish=omitted"): ({"messages-stop-reason", "messages-json-stop-reason"}, MESSAGES_REASON_VALUES),
    (MESSAGES, "finish=empty"): ({"messages-stop-reason", "messages-json-stop-reason"}, MESSAGES_REASON_VALUES),
    (MESSAGES, "null_reason=1"): ({"messages-stop-reason", "messages-json-stop-reason"}, MESSAGES_REASON_VALUES),
    (MESSAGES, "done=0"): ({"messages-stop-last"}, set()),
    (MESSAGES, "error_after=2"): ({"messages-no-error", "messages-json-no-error"}, MESSAGES_NEED_AN_ANSWER),
    # A bare `data: {"error":...}` frame is no Messages error event: the core books a cut.
    (MESSAGES, "error_after=2; bare_error=1"): ({"messages-no-error", "messages-json-no-error"}, MESSAGES_NEED_AN_ANSWER),
    (RESPONSES, "finish=omitted"): ({"responses-terminal-event", "responses-json-status"}, RESPONSES_NEED_A_TERMINAL),
    (RESPONSES, "finish=empty"): ({"responses-terminal-status", "responses-json-status"}, RESPONSES_REASON_VALUES),
    (RESPONSES, "null_reason=1"): ({"responses-terminal-status", "responses-json-status"}, RESPONSES_REASON_VALUES),
    (RESPONSES, "done=0"): ({"responses-terminal-event"}, RESPONSES_NEED_A_TERMINAL),
    (RESPONSES, "error_after=2"): ({"responses-no-error", "responses-json-no-error"}, RESPONSES_NEED_AN_ANSWER),
    (RESPONSES, "error_after=2; bare_error=1"): ({"responses-no-error", "responses-json-no-error"}, RESPONSES_NEED_AN_ANSWER),
}


def marks(card) -> dict[str, Mark]:
    return {row.check: row.mark for row in card.results}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("dialect", [MESSAGES, RESPONSES])
def test_a_healthy_worker_passes_every_check(finishline_worker, dialect):
    card = grade_server(finishline_worker(BASE[dialect] or None), dialect=dialect)
    assert marks(card) == dict.fromkeys(checks(dialect), Mark.PASS), [r.evidence for r in card.results if r.mark is not Mark.PASS]
    assert card.exit_status == EXIT_PASSED
    assert card.setup["dialect"] == dialect and card.setup["path"] == SERVER_SUITES[dialect].path
    # Chat's checks with no meaning here are no rows: the card says why instead.
    assert set(card.not_run) == {"stream-null-not-empty", "stream-usage-after-finish", "n-choices"}
    assert not checks(dialect) & checks(Dialect.CHAT)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("dialect", "defect"), list(DEFECTS), ids=[f"{d}-{k}" for d, k in DEFECTS])
def test_each_defect_fails_exactly_the_checks_it_breaks(finishline_worker, dialect, defect):
    failing, untested = DEFECTS[dialect, defect]
    card = grade_server(finishline_worker(BASE[dialect] + defect), dialect=dialect)
    expected = {
        check: Mark.FAIL if check in failing else Mark.NOT_TESTED if check in untested else Mark.PASS for check in checks(dialect)
    }
    assert marks(card) == expected, {r.check: r.evidence for r in card.results}
    assert card.exit_status == EXIT_FAILED
    for row in card.results:
        if row.mark is Mark.NOT_TESTED:
            assert any(name in row.evidence for name in failing), row.evidence


@pytest.mark.timeout(600)
def test_messages_evidence_says_what_was_seen_and_what_the_core_did(finishline_worker):
    card = grade_server(finishline_worker("null_reason=1"), dialect=MESSAGES)
    assert card.result("messages-stop-reason").evidence == (
        "stream a natural stop: no non-empty stop_reason before message_stop (its message_delta says stop_reason null); "
        "the core: injected stop_reason 'end_turn' before message_stop"
    )
    assert card.result("messages-json-stop-reason").evidence == (
        "JSON a natural stop: stop_reason is null or missing; the core: repaired: set stop_reason 'end_turn'"
    )
    card = grade_server(finishline_worker("done=0"), dialect=MESSAGES)
    assert card.result("messages-stop-last").evidence.endswith(
        "(end, last event: message_delta); the core: terminator lost: appended message_stop (clean end without message_stop)"
    )
    card = grade_server(finishline_worker("error_after=2; bare_error=1"), dialect=MESSAGES)
    assert card.result("messages-no-error").evidence.endswith(
        '; its data: {"error": ...} frame has no event: error line, which the Anthropic SDKs skip'
    )


@pytest.mark.timeout(600)
def test_responses_evidence_says_what_was_seen_and_what_the_core_did(finishline_worker):
    card = grade_server(finishline_worker("tokens=24; done=0"), dialect=RESPONSES)
    evidence = card.result("responses-terminal-event").evidence
    assert evidence.startswith(
        "stream a natural stop ended without response.completed or response.incomplete (end, last event: response.output_item.done); "
        "the core: interrupted after the first token (clean end without a terminal event)"
    )
    card = grade_server(finishline_worker("tokens=24; finish=omitted"), dialect=RESPONSES)
    assert "(end, last event: data: [DONE])" in card.result("responses-terminal-event").evidence
    card = grade_server(finishline_worker("tokens=24; finish=empty"), dialect=RESPONSES)
    assert (
        card.result("responses-terminal-status").evidence
        == "stream a natural stop: response.completed carries status '', expected 'completed'"
    )
    card = grade_server(finishline_worker("tokens=24; error_after=2; bare_error=1"), dialect=RESPONSES)
    assert card.result("responses-no-error").evidence.startswith(
        "stream a natural stop sent a bare error frame after 6 events: Rate limit reached"
    )


@pytest.mark.timeout(600)
def test_an_answer_that_stopped_below_the_cap_has_no_truncation_to_judge(finishline_worker):
    # 10 tokens where 16 were allowed: the answer ended by itself, and `completed` is its truth;
    # the check needs a truncation, so it is not tested, never a pass or a fail.
    row = grade_server(finishline_worker("tokens=10"), dialect=RESPONSES).result("responses-reason-incomplete")
    assert (row.mark, row.evidence) == (
        Mark.NOT_TESTED,
        "stream max_output_tokens=16: the model stopped by itself (response.completed, status 'completed', "
        "no incomplete_details, output_tokens 10): no truncation to judge",
    )


@pytest.mark.timeout(600)
def test_a_truncation_the_server_does_not_report_fails_the_reason_check(finishline_worker):
    # The worker's 16 tokens fit in max_output_tokens=16: it says completed where a server that
    # truncated must say incomplete (and a Messages max_tokens above the answer: end_turn).
    row = grade_server(finishline_worker(), dialect=RESPONSES).result("responses-reason-incomplete")
    assert (row.mark, row.evidence) == (
        Mark.FAIL,
        "stream max_output_tokens=16 ended with response.completed, status 'completed', no incomplete_details, "
        "output_tokens 16; a truncation ends with response.incomplete, status 'incomplete', "
        "incomplete_details.reason 'max_output_tokens'",
    )
    row = grade_server(finishline_worker("max_tokens=100"), dialect=MESSAGES).result("messages-reason-max-tokens")
    assert (row.mark, row.evidence) == (Mark.FAIL, "stream max_tokens=5 ended with 'end_turn', expected 'max_tokens'")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("dialect", [MESSAGES, RESPONSES])
def test_cli_dialect_prints_the_card_and_what_it_does_not_run(finishline_worker, tmp_path, capsys, dialect):
    url = finishline_worker(BASE[dialect] or None)
    assert main(["server", "--url", url, "--dialect", dialect, "--json", str(tmp_path / "card.json")]) == EXIT_PASSED
    out = capsys.readouterr().out
    count = len(checks(dialect))
    assert out.startswith(f"server {url} ({dialect})\n")
    assert "not run: n-choices: " in out and out.rstrip().endswith(f"{count} pass; exit status 0")
    saved = json.loads((tmp_path / "card.json").read_text())
    assert {r["check"] for r in saved["results"]} == checks(dialect) and set(saved["not_run"]) == set(
        SERVER_SUITES[dialect].not_run
    )
    assert main(["server", "--url", finishline_worker(BASE[dialect] + "done=0"), "--dialect", dialect]) == EXIT_FAILED


def test_a_bad_dialect_is_one_line_naming_the_valid_ones(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["server", "--url", "http://127.0.0.1:9/v1", "--dialect", "anthropic"])
    assert exited.value.code == EXIT_CANNOT_RUN
    err = capsys.readouterr().err
    assert err.startswith("error: argument --dialect: invalid choice: 'anthropic'") and err.count("\n") == 1, err
    assert all(word in err for word in ("chat", "messages", "responses"))


@pytest.mark.timeout(600)
def test_the_requests_are_each_dialects_own(upstream):
    # Messages: POST .../messages with max_tokens, Anthropic's version and key headers; Responses:
    # POST .../responses with input and max_output_tokens.
    prefix = upstream.route(Script(pieces=messages_stream(["The", " quick"])))
    grade_server(f"{upstream.origin}{prefix}/v1", model="m", api_key="k", dialect=MESSAGES)
    sent = upstream.requests_under(prefix)
    assert {r.target for r in sent} == {f"{prefix}/v1/messages"}
    assert all("max_tokens" in r.json() and "messages" in r.json() for r in sent)
    assert {(r.header("anthropic-version"), r.header("x-api-key"), r.header("authorization")) for r in sent} == {
        ("2023-06-01", "k", "Bearer k")
    }
    assert {json.dumps(r.json().get("tool_choice")) for r in sent} == {"null", '{"type": "any"}'}
    prefix = upstream.route(Script(pieces=responses_stream(["The", " quick"])))
    grade_server(f"{upstream.origin}{prefix}/v1", model="m", dialect=RESPONSES)
    sent = upstream.requests_under(prefix)
    assert {r.target for r in sent} == {f"{prefix}/v1/responses"}
    assert all("input" in r.json() and "messages" not in r.json() for r in sent)
    assert sorted(r.json().get("max_output_tokens") for r in sent if "max_output_tokens" in r.json()) == [
        16,
        16,
        TOOL_CALL_TOKENS,
        TOOL_CALL_TOKENS,
    ]


@pytest.mark.timeout(600)
def test_responses_sequence_numbers_that_go_back_fail_and_a_trailing_done_is_allowed(upstream):
    # R1: a `data: [DONE]` after the terminal event is part of a well-formed stream.
    prefix = upstream.route(Script(pieces=responses_stream(["The", " quick"], done_marker=True)))
    card = grade_server(f"{upstream.origin}{prefix}/v1", model="m", dialect=RESPONSES)
    assert card.result("responses-terminal-event").mark is Mark.PASS
    assert card.result("responses-sequence-numbers").mark is Mark.PASS
    events = responses_stream(["The", " quick", " brown"])
    events[5] = events[5].replace(b'"sequence_number":5', b'"sequence_number":3')
    prefix = upstream.route(Script(pieces=events))
    row = grade_server(f"{upstream.origin}{prefix}/v1", model="m", dialect=RESPONSES).result("responses-sequence-numbers")
    assert (row.mark, row.evidence) == (
        Mark.FAIL,
        "stream a natural stop: event 6 (response.output_text.delta) has sequence_number 3 after 4",
    )
