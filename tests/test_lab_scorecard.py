"""The scorecard (labs/scorecard.py): each column's rule from synthetic cells, the worst cell
decides, an unstable cell fails its column, and the three renderings hold the same cells
(terminal, HTML, SCORECARD.md == result.json["scorecard"])."""

from __future__ import annotations

import itertools
import re

import pytest

from labs.dialects import LAB_DIALECTS
from labs.gateways.finish_fix_proxy import finish_fix_books
from labs.outcome import Outcome
from labs.report_html import render_html
from labs.scorecard import COLUMNS, Score, build_scorecard, render_scorecard_markdown, render_scorecard_text
from tests.feeding import run
from tests.test_core_malformed import healthy, with_malformed

_numbers = itertools.count(1)


def _cell(
    scenario,
    gateway,
    outcome,
    *,
    client="openai-python",
    books=None,
    mismatch=False,
    error_class=None,
    attempts=(),
    tries=None,
    unstable=False,
    repeats=(),
):
    return {
        "scenario": scenario,
        "dialect": "chat",
        "client": client,
        "gateway": gateway,
        "cell_id": f"c{next(_numbers):04d}",
        "outcome": Outcome(outcome),
        "why": outcome,
        "request_model": "m",
        "report": {
            "completed": outcome == "ok",
            "text": "",
            "reasoning": "",
            "finish_reason": None,
            "tool_calls": [],
            "error_class": error_class,
            "error_message": None,
            "ttft_s": None,
            "duration_s": 1.0,
            "timed_out": outcome == "hang",
            "http_status": 200,
            "connection": None,
        },
        "books": books,
        "books_entry": None,
        "books_mismatch": mismatch,
        "attempts": list(attempts),
        "tries": tries,
        "unstable": unstable,
        "repeats": list(repeats),
    }


def _scenario(name, *, finish_reason="stop", worker=""):
    return {
        "name": name,
        "dialect": "chat",
        "title": name,
        "worker": worker,
        "expected": {"text": "The quick", "finish_reason": finish_reason, "tool_calls": []},
    }


def _attempt(at, arrived_at, *, head_s=0.01, status=200):
    return {
        "at": at,
        "cell_id": "x",
        "server": at,
        "dialect": "chat",
        "arrived_at": arrived_at,
        "head_s": head_s,
        "first_token_s": None,
        "ended": "complete",
        "status": status,
    }


SCENARIOS = [
    _scenario("healthy"),
    _scenario("length-omitted", finish_reason="length"),
    _scenario("cut-after-tokens-fin"),
    _scenario("stall-after-tokens"),
    _scenario("rule1-prefill-cut-hub-abort-spare"),
    _scenario("http-429-retry-after", worker="http_429_retry_after=2"),
    _scenario("http-400-context-length", finish_reason=None, worker="http_400_context_length=1"),
]


def _card(*cells, gateways=None):
    result = {
        "scenarios": SCENARIOS,
        "cells": list(cells),
        "gateways": gateways or list(dict.fromkeys(c["gateway"] for c in cells)),
        "versions": {"gateways": {"LiteLLM": "1.108.7", "Envoy": "1.40.0"}},
    }
    return build_scorecard(result)


def _score(card, gateway, column):
    return card["gateways"][gateway][column]["score"]


def test_the_columns_are_the_issues_names_in_order():
    assert [c.name for c in COLUMNS] == [
        "retry-before-first-token",
        "say-why-after-first-token",
        "books-say-error",
        "finish-reason-on-natural-end",
        "stall-ends-in-error",
        "retry-after-honoured",
        "no-retry-of-a-400",
        "backs-off-on-429",
        "fails-over-on-503",
        "no-retry-of-a-content-policy-400",
        "no-prefill-400-after-cut",
        "circuit-opens",
        "fallback-model-and-usage",
        "healthy-afterwards",
    ]


@pytest.mark.parametrize(
    "outcomes, score",
    [
        (["ok", "ok"], "pass"),
        (["ok", "error"], "safe"),
        (["error", "flagged"], "safe"),
        (["ok", "silent-truncation"], "fail"),
        (["error", "hang"], "fail"),
    ],
)
def test_rule_1_passes_with_the_spares_answer_is_safe_with_a_clean_error_and_fails_otherwise(outcomes, score):
    card = _card(*(_cell("rule1-prefill-cut-hub-abort-spare", "g", o, client=f"c{n}") for n, o in enumerate(outcomes)))
    assert _score(card, "g", "retry-before-first-token") == score


@pytest.mark.parametrize(
    "outcomes, score",
    [
        (["error", "error"], "pass"),
        (["error", "flagged"], "safe"),
        (["error", "silent-truncation"], "fail"),
        (["flagged", "hang"], "fail"),
    ],
)
def test_say_why_after_first_token_wants_every_client_to_raise(outcomes, score):
    card = _card(*(_cell("cut-after-tokens-fin", "g", o, client=f"c{n}") for n, o in enumerate(outcomes)))
    assert _score(card, "g", "say-why-after-first-token") == score


def test_the_fail_evidence_names_the_failing_cells_only():
    failing = _cell("cut-after-tokens-fin", "g", "silent-truncation", client="openai-node")
    card = _card(_cell("cut-after-tokens-fin", "g", "error"), failing)
    entry = card["gateways"]["g"]["say-why-after-first-token"]
    assert [e["cell_id"] for e in entry["evidence"]] == [failing["cell_id"]]
    assert entry["evidence"][0]["client"] == "openai-node"


@pytest.mark.parametrize(
    "books, outcome, mismatch, score",
    [
        ("error", "error", False, "pass"),
        ("ok", "ok", False, "pass"),
        ("error", "ok", True, "safe"),
        ("ok", "silent-truncation", True, "fail"),
        ("no entry", "error", True, "fail"),
    ],
)
def test_books_say_error_for_every_request_whose_client_did_not_get_the_answer(books, outcome, mismatch, score):
    card = _card(_cell("healthy", "g", outcome, books=books, mismatch=mismatch))
    assert _score(card, "g", "books-say-error") == score


@pytest.mark.parametrize(
    "scenario, error_class, score",
    [
        ("length-omitted", "LengthFinishReasonError", "pass"),  # the client's answer to a delivered `length`
        ("length-omitted", "APIError", "fail"),
        ("healthy", "LengthFinishReasonError", "fail"),
    ],
)
def test_books_ok_for_a_client_that_raises_on_a_delivered_length_by_design(scenario, error_class, score):
    card = _card(_cell(scenario, "g", "error", books="ok", error_class=error_class, client="openai-python-helper"))
    assert _score(card, "g", "books-say-error") == score


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
@pytest.mark.parametrize("before_issue_25", [False, True])
def test_a_malformed_chunk_through_finish_fix_is_judged_by_its_ledger_verdict(dialect, before_issue_25):
    # The ledger line as the core writes it for the worker's malformed event, the word as the lab's
    # finish_fix books reader takes it, the line as the cell keeps it. Booked `clean`, as before
    # issue 25, the same cell fails the column.
    _, repair = run(with_malformed(healthy(dialect), dialect)[0], dialect=dialect)
    entry = {**repair.report.booking().to_json(), "model": "c0001;malformed_chunk=1"}
    if before_issue_25:
        entry["verdict"] = "clean"
    cell = {
        **_cell("malformed-chunk", "finish_fix", "error", books=finish_fix_books(entry)),
        "dialect": str(dialect),
        "books_entry": entry,
    }
    result = {
        "scenarios": [{**_scenario("malformed-chunk", worker="malformed_chunk=1"), "dialect": str(dialect)}],
        "cells": [cell],
        "gateways": ["finish_fix"],
    }
    column = build_scorecard(result)["gateways"]["finish_fix"]["books-say-error"]
    if before_issue_25:
        assert (column["score"], column["why"]) == ("fail", "1 of 1 cells: error, books ok (clean)")
    else:
        assert (column["score"], column["why"]) == ("pass", "1 of 1 cells: error, books error (malformed)")


def test_a_gateway_without_books_is_n_a_in_the_books_column():
    card = _card(_cell("healthy", "vllm-router", "ok", books="none"), _cell("healthy", "direct", "ok"))
    assert _score(card, "vllm-router", "books-say-error") == "n/a"
    assert _score(card, "direct", "books-say-error") == "n/a"


@pytest.mark.parametrize(
    "scenario, outcome, error_class, score",
    [
        ("healthy", "ok", None, "pass"),
        ("length-omitted", "silent-truncation", None, "fail"),
        ("length-omitted", "error", "LengthFinishReasonError", "pass"),
        ("healthy", "error", "LengthFinishReasonError", "safe"),
        ("length-omitted", "error", "APIError", "safe"),
    ],
)
def test_finish_reason_on_natural_end(scenario, outcome, error_class, score):
    card = _card(_cell(scenario, "g", outcome, error_class=error_class))
    assert _score(card, "g", "finish-reason-on-natural-end") == score


@pytest.mark.parametrize("outcome, score", [("error", "pass"), ("flagged", "safe"), ("hang", "fail")])
def test_a_stall_must_end_in_an_error(outcome, score):
    assert _score(_card(_cell("stall-after-tokens", "g", outcome)), "g", "stall-ends-in-error") == score


@pytest.mark.parametrize(
    "attempts, outcome, score",
    [
        ([_attempt("primary", 10.0), _attempt("primary", 12.5)], "ok", "pass"),
        ([_attempt("primary", 10.0), _attempt("primary", 10.4)], "ok", "fail"),
        ([_attempt("primary", 10.0)], "error", "safe"),
        ([_attempt("primary", 10.0)], "silent-truncation", "fail"),
        # Through the hub, the hub's attempts are the gateway's (each also reaches the primary).
        ([_attempt("hub", 10.0), _attempt("primary", 10.0), _attempt("hub", 12.2), _attempt("primary", 12.2)], "ok", "pass"),
    ],
)
def test_retry_after_is_honoured_when_the_retry_waits_as_long_as_the_429_asked(attempts, outcome, score):
    card = _card(_cell("http-429-retry-after", "g", outcome, attempts=attempts, tries=len(attempts)))
    assert _score(card, "g", "retry-after-honoured") == score


@pytest.mark.parametrize(
    "outcome, tries, score",
    [
        ("error", 1, "pass"),
        ("error", 3, "fail"),
        ("silent-truncation", 1, "fail"),
        ("flagged", 1, "safe"),
    ],
)
def test_a_400_context_length_must_not_be_retried(outcome, tries, score):
    card = _card(_cell("http-400-context-length", "g", outcome, tries=tries))
    assert _score(card, "g", "no-retry-of-a-400") == score


def test_a_column_whose_scenarios_the_run_did_not_include_is_n_a():
    card = _card(_cell("healthy", "g", "ok"))
    for column in (
        "retry-before-first-token",
        "say-why-after-first-token",
        "stall-ends-in-error",
        "retry-after-honoured",
        "no-retry-of-a-400",
    ):
        assert _score(card, "g", column) == "n/a"


def test_an_unstable_cell_fails_its_column_with_the_split_as_evidence():
    repeats = [
        {"repeat": n, "cell_id": f"c{n}", "outcome": o, "books": "ok", "books_mismatch": False, "tries": 1, "total_s": 1.0}
        for n, o in enumerate(["ok", "ok", "error"], start=1)
    ]
    flip = _cell("healthy", "envoy", "ok", books="ok", unstable=True, repeats=repeats)
    card = _card(_cell("healthy", "envoy", "ok", books="ok", client="pi-ai"), flip)
    entry = card["gateways"]["envoy"]["finish-reason-on-natural-end"]
    assert entry["score"] == "fail"
    assert entry["evidence"][0]["cell_id"] == flip["cell_id"]
    assert "ok 2 / error 1" in entry["evidence"][0]["why"]
    assert _score(card, "envoy", "books-say-error") == "fail"


def _mixed_card():
    return _card(
        _cell("cut-after-tokens-fin", "direct", "silent-truncation"),
        _cell("stall-after-tokens", "direct", "hang"),
        _cell("cut-after-tokens-fin", "finish_fix", "error", books="error"),
        _cell("stall-after-tokens", "finish_fix", "error", books="error"),
        _cell("healthy", "finish_fix", "ok", books="ok"),
    )


def test_scorecard_md_holds_the_same_cells_as_result_json():
    card = _mixed_card()
    markdown = render_scorecard_markdown(card)
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert header == ["gateway", *card["columns"]]
    table = {
        cells[0]: dict(zip(header[1:], cells[1:]))
        for cells in ([c.strip() for c in row.strip("|").split("|")] for row in rows[1:])
    }
    assert table == {g: {name: entry["score"] for name, entry in scores.items()} for g, scores in card["gateways"].items()}
    assert "- LiteLLM: 1.108.7" in markdown


def test_the_terminal_card_has_a_row_per_gateway_and_says_why_each_fail():
    text = render_scorecard_text(_mixed_card())
    lines = text.splitlines()
    assert lines[1].split() == ["gateway", *(c.name for c in COLUMNS)]
    # The failover columns (and the probes' column) have no cell here: n/a.
    assert lines[3].split() == ["direct", "n/a", "fail", "n/a", "n/a", "fail", "n/a", "n/a", *["n/a"] * 7]
    assert lines[4].split() == ["finish_fix", "n/a", "pass", "pass", "pass", "pass", "n/a", "n/a", *["n/a"] * 7]
    assert "direct say-why-after-first-token fail: cut-after-tokens-fin/chat/openai-python: silent-truncation" in text
    assert "gateway versions: LiteLLM 1.108.7, Envoy 1.40.0" in text


def test_the_report_puts_the_card_first_with_each_evidence_a_link_to_its_cell():
    card = _mixed_card()
    failing = card["gateways"]["direct"]["stall-ends-in-error"]["evidence"][0]
    result = {
        "duration_s": 1.0,
        "versions": {},
        "clients": ["openai-python"],
        "gateways": ["direct", "finish_fix"],
        "scenarios": SCENARIOS,
        "cells": [],
        "scorecard": card,
    }
    page = render_html(result)
    assert page.index("<h2>scorecard</h2>") < page.index("<h2>versions</h2>")
    assert f'<a href="#" class="evidence" data-id="{failing["cell_id"]}"' in page
    # Every word of the card is in the report's table, row by row.
    grid = page[page.index('class="grid scorecard"') :]
    for gateway, scores in card["gateways"].items():
        row = grid[grid.index(f"<tr><th>{gateway}</th>") :]
        row = row[: row.index("</tr>")]
        assert re.findall(r"<b>([^<]+)</b>", row) == [scores[name]["score"] for name in card["columns"]]
    assert Score.FAIL.value in page


@pytest.mark.parametrize("dialect", ["messages", "responses"])
@pytest.mark.parametrize(
    ("scenario", "worker", "column", "failing"),
    [
        # A retry 0.3 s after a 429 that asked for 2 s.
        ("http-429-retry-after", "http_429_retry_after=2", "retry-after-honoured", {"outcome": "ok", "tries": 2}),
        # The 400 sent three times.
        ("http-400-context-length", "http_400_context_length=1", "no-retry-of-a-400", {"outcome": "error", "tries": 3}),
    ],
)
def test_the_conduct_columns_read_the_cells_of_every_dialect(dialect, scenario, worker, column, failing):
    # Chat passes; the same scenario's cell in another dialect decides the column and is its evidence.
    retried_early = [_attempt("primary", 10.0), _attempt("primary", 10.3)]
    chat = _cell(scenario, "g", "error" if column == "no-retry-of-a-400" else "ok", tries=1, attempts=[_attempt("primary", 10.0)])
    other = {
        **_cell(scenario, "g", failing["outcome"], client="anthropic-python", tries=failing["tries"], attempts=retried_early),
        "dialect": dialect,
    }
    scenarios = [{**_scenario(scenario, worker=worker), "dialect": d} for d in ("chat", dialect)]
    card = build_scorecard({"scenarios": scenarios, "cells": [chat, other], "gateways": ["g"], "versions": {}})
    entry = card["gateways"]["g"][column]
    assert entry["score"] == "fail"
    assert [(e["dialect"], e["client"]) for e in entry["evidence"]] == [(dialect, "anthropic-python")]
    only_chat = build_scorecard({"scenarios": scenarios, "cells": [chat], "gateways": ["g"], "versions": {}})
    assert only_chat["gateways"]["g"][column]["score"] == "pass"
