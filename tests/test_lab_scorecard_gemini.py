"""The scorecard reads Gemini cells (labs/scorecard.py): each column judges them as it judges the
other dialects', and a Gemini stream without a `finishReason` (omitted, or `""`: rule G3), which
reads exactly as a cut, is judged as one in `finish-reason-on-natural-end`: only an error tells the
client, so an error is the rule followed there, where in Chat (a `[DONE]` still comes, the reason
can be inferred) it is only `safe`."""

from __future__ import annotations

import pytest

from labs.scorecard import build_scorecard, render_scorecard_markdown
from tests.test_lab_scorecard import _cell, _scenario

WORKERS = {
    "healthy": "tokens=12",
    "reason-omitted": "reasoning_tokens=4; tokens=12; token_delay=0.01; finish=omitted",
    "reason-empty": "tokens=12; finish=empty",
    "cut-after-tokens-hub-close": "tokens=12; token_delay=0.05",
}


def _gemini(scenario, gateway, outcome, *, client="google-genai", dialect="gemini"):
    return {**_cell(scenario, gateway, outcome, client=client), "dialect": dialect}


def _card(*cells):
    scenarios = [
        {**_scenario(name, finish_reason="STOP" if dialect == "gemini" else "stop", worker=worker), "dialect": dialect}
        for name, worker in WORKERS.items()
        for dialect in ("chat", "responses", "gemini")
    ]
    gateways = list(dict.fromkeys(c["gateway"] for c in cells))
    return build_scorecard({"scenarios": scenarios, "cells": list(cells), "gateways": gateways, "versions": {}})


def _column(card, gateway, column):
    return card["gateways"][gateway][column]


def test_the_say_why_column_reads_gemini_cells():
    card = _card(
        _gemini("cut-after-tokens-hub-close", "direct", "silent-truncation"),
        _gemini("cut-after-tokens-hub-close", "finish_fix", "error"),
        _gemini("healthy", "finish_fix", "ok", client="gemini-cli"),
    )
    direct = _column(card, "direct", "say-why-after-first-token")
    assert direct["score"] == "fail"
    assert [(e["dialect"], e["client"]) for e in direct["evidence"]] == [("gemini", "google-genai")]
    assert _column(card, "finish_fix", "say-why-after-first-token")["score"] == "pass"
    assert _column(card, "finish_fix", "finish-reason-on-natural-end")["score"] == "pass"
    markdown = render_scorecard_markdown(card)
    assert "direct" in markdown and "finish_fix" in markdown


@pytest.mark.parametrize("scenario", ["reason-omitted", "reason-empty"])
@pytest.mark.parametrize(
    ("outcome", "score"), [("error", "pass"), ("flagged", "safe"), ("silent-truncation", "fail"), ("ok", "pass")]
)
def test_a_gemini_stream_without_a_finish_reason_is_judged_as_a_cut(scenario, outcome, score):
    column = _column(_card(_gemini(scenario, "g", outcome)), "g", "finish-reason-on-natural-end")
    assert column["score"] == score
    if outcome == "error":
        assert column["why"] == "1 of 1 cells: error: without its reason, a gemini stream ends like a cut"


@pytest.mark.parametrize(
    ("dialect", "scenario", "score"),
    [
        # A [DONE] still comes: the reason can be inferred, so an error loses an answer: safe.
        ("chat", "reason-omitted", "safe"),
        # No terminal event at all: a cut.
        ("responses", "reason-omitted", "pass"),
        # A terminal event with status "": the end is known, the reason can be read from it.
        ("responses", "reason-empty", "safe"),
    ],
)
def test_the_other_dialects_keep_their_own_truth(dialect, scenario, score):
    cell = _gemini(scenario, "g", "error", client="openai-python", dialect=dialect)
    assert _column(_card(cell), "g", "finish-reason-on-natural-end")["score"] == score
