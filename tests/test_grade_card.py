"""The card as data and its renderings: the exit status, the marks' words, one-line evidence, the
Markdown table of several cards."""

from __future__ import annotations

import json

import pytest

from labs.grade.card import EXIT_FAILED, EXIT_PASSED, Card, CheckResult, Mark, shortened
from labs.grade.render import render_cards_markdown, render_html, render_terminal


def row(check: str, mark: Mark, rule: str = "rule 2", evidence: str = "seen") -> CheckResult:
    return CheckResult(rule=rule, check=check, title=f"{check} title", mark=mark, evidence=evidence)


@pytest.mark.parametrize(
    ("marks", "status"),
    [
        ((Mark.PASS, Mark.PASS), EXIT_PASSED),
        ((Mark.PASS, Mark.NOT_TESTED, Mark.NOT_CHECKED), EXIT_PASSED),
        ((Mark.PASS, Mark.FAIL, Mark.NOT_TESTED), EXIT_FAILED),
        ((), EXIT_PASSED),
    ],
)
def test_exit_status_is_1_only_when_a_check_that_ran_failed(marks, status):
    card = Card(kind="gateway", target="http://g", results=[row(f"c{i}", m) for i, m in enumerate(marks)])
    assert card.exit_status == status


def test_evidence_is_always_one_line():
    assert (
        row("x", Mark.FAIL, evidence="HTTP 502: <html>\n<head>\n  <title>502</title>").evidence
        == "HTTP 502: <html> <head> <title>502</title>"
    )


def test_terminal_card_aligns_columns_and_ends_with_counts_and_status():
    card = Card(
        kind="server", target="http://s/v1", results=[row("a", Mark.PASS, rule="streaming"), row("long-check", Mark.NOT_TESTED)]
    )
    assert render_terminal(card).splitlines() == [
        "server http://s/v1",
        "rule       check       mark        evidence",
        "streaming  a           pass        seen",
        "rule 2     long-check  not tested  seen",
        "1 pass, 1 not tested; exit status 0",
    ]


def test_json_and_html_carry_the_same_words():
    card = Card(kind="server", target="http://s/v1", results=[row("a", Mark.FAIL, evidence='"finish_reason": "" <b>')])
    data = json.loads(json.dumps(card.to_json()))
    assert data["results"][0]["mark"] == "fail" and data["exit_status"] == 1
    assert data["counts"] == {"pass": 0, "fail": 1, "not tested": 0, "not checked": 0}
    page = render_html(card)
    assert ">fail<" in page and "&lt;b&gt;" in page and "<b>" not in page


def test_cards_side_by_side_rows_are_checks_columns_are_gateways():
    first = Card(kind="gateway", target="a", results=[row("healthy", Mark.PASS, rule="baseline"), row("cut", Mark.FAIL)])
    second = Card(kind="gateway", target="b", results=[row("healthy", Mark.PASS, rule="baseline"), row("cut", Mark.PASS)])
    assert render_cards_markdown({"direct": first, "finish_fix": second}).splitlines() == [
        "| rule | check | direct | finish_fix |",
        "| --- | --- | --- | --- |",
        "| baseline | `healthy` | pass | pass |",
        "| rule 2 | `cut` | fail | pass |",
    ]


def test_a_missing_check_is_named_with_the_ones_there():
    card = Card(kind="server", target="s", results=[row("a", Mark.PASS)])
    with pytest.raises(KeyError, match="no check 'b' on this card; checks: a"):
        card.result("b")


def test_evidence_cut_short_says_so():
    assert shortened("a" * 10, 10) == "a" * 10
    assert shortened("a" * 11, 10) == "a" * 9 + "…"
    assert shortened("é".encode() * 20, 10) == "é" * 9 + "…"  # bytes are read as UTF-8 first
