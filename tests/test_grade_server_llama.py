"""`python -m labs.grade server` against a real server: llama.cpp (tests/fixtures_llama.py, SmolLM2-135M,
greedy), its card in each dialect as docs/grading.md "Real servers" shows it.

What the card must tell of it is its truth: no transport failure read as `HTTP 0` (llama.cpp closes a
kept-alive connection after a stream without `Connection: close`, which the grader asks again, once,
as the SDKs do, and notes); no false fail (SmolLM2's chat template has no tools, so the forced tool
call is prose to the limit: `not tested`, not a fail); and the two true faults of its Responses
layer, each a fail with evidence: a `max_output_tokens` truncation that ends `response.completed`,
and no `sequence_number` on any event (shared/notes/real-servers.md). llama.cpp does not speak
Gemini: graded in it, the grader says so in one line and stops.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from finishline import Dialect
from labs.dialects import LAB_DIALECTS
from labs.gateways.services import read_books
from labs.grade.card import Card, GradeError, Mark
from labs.grade.cli import main
from labs.grade.render import render_terminal
from labs.grade.server_grader import grade_server
from labs.worker.llama_cpp import LlamaCppServer
from tests.mitmdump_process import running_finish_fix

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

#: The dialects llama.cpp's server speaks: OpenAI's and Anthropic's, not Gemini.
LLAMA_DIALECTS = tuple(dialect for dialect in LAB_DIALECTS if dialect is not Dialect.GEMINI)

#: The checks that need the model to call a tool, which SmolLM2 does not.
TOOL_CHECKS = {
    Dialect.CHAT: "reason-tool-calls",
    Dialect.MESSAGES: "messages-reason-tool-use",
    Dialect.RESPONSES: "responses-reason-tool-call",
}
#: llama.cpp's true faults: its Responses layer hard-codes `completed` and numbers no event.
TRUE_FAILS = {
    Dialect.CHAT: set(),
    Dialect.MESSAGES: set(),
    Dialect.RESPONSES: {"responses-reason-incomplete", "responses-sequence-numbers"},
}
#: The checks whose evidence may note a request asked again (the kept-alive race comes and goes).
NO_ERROR_CHECKS = {
    "stream-no-error",
    "json-no-error",
    "messages-no-error",
    "messages-json-no-error",
    "responses-no-error",
    "responses-json-no-error",
}


@pytest.fixture(scope="module")
def cards(llama_cpp: LlamaCppServer) -> dict[Dialect, Card]:
    # One after another: one request at a time, so greedy decoding gives the streamed and the JSON
    # answer the same tokens (llama.cpp batches concurrent requests' steps together).
    return {dialect: grade_server(llama_cpp.base_url, dialect=dialect) for dialect in LLAMA_DIALECTS}


@pytest.mark.parametrize("dialect", list(LLAMA_DIALECTS))
def test_no_false_fail(cards, dialect):
    card = cards[dialect]
    marks = {row.check: row.mark for row in card.results}
    expected = {
        check: Mark.FAIL if check in TRUE_FAILS[dialect] else Mark.NOT_TESTED if check == TOOL_CHECKS[dialect] else Mark.PASS
        for check in marks
    }
    assert marks == expected, render_terminal(card)


@pytest.mark.parametrize("dialect", list(LLAMA_DIALECTS))
def test_no_transport_failure_reads_as_http_0(cards, dialect):
    card = cards[dialect]
    assert "HTTP 0" not in render_terminal(card)
    assert "HTTP 0" not in json.dumps(card.to_json())
    # A request asked again is a note on the no-error checks, never a fail.
    noted = {row.check: row.mark for row in card.results if "kept-alive" in row.evidence}
    assert set(noted) <= NO_ERROR_CHECKS and set(noted.values()) <= {Mark.PASS}, render_terminal(card)


@pytest.mark.parametrize("dialect", list(LLAMA_DIALECTS))
def test_a_model_that_calls_no_tool_leaves_the_tool_check_not_tested_saying_so(cards, dialect):
    row = cards[dialect].result(TOOL_CHECKS[dialect])
    assert row.mark is Mark.NOT_TESTED
    assert "the model made no whole tool call (stream: plain text" in row.evidence
    assert row.evidence.endswith("the check needs a model that calls tools; not a protocol fault")


def test_a_server_that_does_not_speak_gemini_is_one_line(llama_cpp, capsys):
    # llama.cpp answers the Gemini path 404 (its routes are OpenAI's and Anthropic's): one line that
    # says so and where a Gemini base URL points, exit status 2; no card, no traceback.
    with pytest.raises(GradeError, match="the server does not speak Gemini there"):
        grade_server(llama_cpp.base_url, dialect=Dialect.GEMINI)
    assert main(["server", "--url", llama_cpp.base_url, "--dialect", "gemini"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "answered HTTP 404" in err and "does not speak Gemini" in err, err


def test_the_responses_truncation_is_a_fail_with_evidence(cards):
    row = cards[Dialect.RESPONSES].result("responses-reason-incomplete")
    assert (row.mark, row.evidence) == (
        Mark.FAIL,
        "stream max_output_tokens=16 ended with response.completed, status 'completed', no incomplete_details, "
        "output_tokens 16; a truncation ends with response.incomplete, status 'incomplete', "
        "incomplete_details.reason 'max_output_tokens'",
    )
    row = cards[Dialect.RESPONSES].result("responses-sequence-numbers")
    assert row.evidence == "stream a natural stop: event 1 (response.created) has no integer sequence_number"


#: What the ledger books for the card's truncation request, streamed and whole (rule R6).
R6_REPAIRS = (
    "limit reason (R6): 'response.completed' at 16 output tokens of the request's 16 sent as 'response.incomplete'",
    "limit reason (R6): 'completed' at 16 output tokens of the request's 16 sent as 'incomplete'",
)


def test_through_finish_fix_the_responses_card_passes_what_llama_cpp_gets_wrong(
    llama_cpp: LlamaCppServer, mitmproxy_confdir: Path, tmp_path: Path
) -> None:
    # finish_fix in front of the same server (default options): the truncation ends as the spec says
    # (rule R6) and every event is numbered (R7), so both true fails above pass; the ledger books R6.
    ledger = tmp_path / "ledger.jsonl"
    with running_finish_fix(confdir=mitmproxy_confdir, upstream_url=llama_cpp.url, ledger=ledger) as mitmdump:
        card = grade_server(f"{mitmdump.url}/v1", dialect=Dialect.RESPONSES)
        # A flow's ledger line comes when it ends, just after the grader read it: wait for the two
        # truncation lines, with room for a loaded machine.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not set(R6_REPAIRS) <= _repairs(ledger):
            time.sleep(0.05)
    marks = {row.check: row.mark for row in card.results}
    tool_check = TOOL_CHECKS[Dialect.RESPONSES]
    assert marks == {check: Mark.NOT_TESTED if check == tool_check else Mark.PASS for check in marks}, render_terminal(card)
    assert card.result("responses-reason-incomplete").evidence == (
        "max_output_tokens=16: stream: response.incomplete, status 'incomplete', incomplete_details.reason "
        "'max_output_tokens', output_tokens 16; JSON: status 'incomplete', incomplete_details.reason "
        "'max_output_tokens', output_tokens 16"
    )
    assert set(R6_REPAIRS) <= _repairs(ledger), _repairs(ledger)


def _repairs(ledger: Path) -> set[str]:
    return {repair for row in read_books(ledger) for repair in row.get("repairs", ())}
