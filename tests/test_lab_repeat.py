"""`--repeat N` (labs/repeat.py, labs/__main__.py): repeats fold into one cell per matrix position,
marked unstable when their outcome or books differ, shown `~` in the terminal and as the split in
the report; and the cell's tries and seconds (`error(3)`, `error · 3 tries · 41 s`)."""

from __future__ import annotations

import pytest

from finishline import Dialect
from labs.__main__ import main
from labs.cell_result import CellResult
from labs.outcome import Outcome
from labs.plan import LabConfig, repeat_label, run_labels
from labs.repeat import merge_repeats, split_text
from labs.report_html import cell_label, render_html
from labs.scenario import SCENARIO_DIR, load_scenario
from labs.table import cell_text, render_table


def _result(number, repeat, outcome, *, client="pi-ai", books="ok", mismatch=False):
    return CellResult(
        scenario="healthy",
        dialect=Dialect.CHAT,
        client=client,
        gateway="envoy",
        cell_id=f"c{number:04d}",
        outcome=Outcome(outcome),
        why=outcome,
        report={},
        request_model="m",
        books=books,
        books_mismatch=mismatch,
        repeat=repeat,
        tries=1,
        total_s=1.0,
    )


def test_one_run_per_cell_is_left_as_it_was():
    results = [_result(1, 1, "ok")]
    assert merge_repeats(results, 1) is results
    assert results[0].repeats == [] and results[0].unstable is False


def test_repeats_that_agree_are_one_stable_cell_with_every_repeat_kept():
    merged = merge_repeats([_result(1, 1, "ok"), _result(2, 2, "ok"), _result(3, 3, "ok")], 3)
    assert len(merged) == 1
    assert merged[0].unstable is False
    assert [r["cell_id"] for r in merged[0].repeats] == ["c0001", "c0002", "c0003"]


def test_repeats_whose_outcomes_differ_are_unstable_and_show_the_louder_word_on_a_tie():
    merged = merge_repeats([_result(1, 1, "ok"), _result(2, 2, "error", books="error")], 2)
    assert merged[0].unstable is True
    assert merged[0].outcome == "error"


def test_the_shown_cell_is_the_outcome_most_repeats_had():
    merged = merge_repeats([_result(1, 1, "error"), _result(2, 2, "ok"), _result(3, 3, "ok")], 3)
    assert (merged[0].outcome, merged[0].cell_id) == ("ok", "c0002")
    assert split_text(merged[0].to_json()) == "ok 2 / error 1"


def test_a_flip_of_the_books_alone_is_unstable_too():
    # Envoy's `DC` books: every client `ok`, the books `ok` once and `error` once.
    merged = merge_repeats([_result(1, 1, "ok"), _result(2, 2, "ok", books="error", mismatch=True)], 2)
    assert merged[0].unstable is True
    assert split_text(merged[0].to_json()) == "ok 2; books ok 1 / error! 1"


def test_each_position_folds_separately():
    merged = merge_repeats(
        [
            _result(1, 1, "ok"),
            _result(2, 1, "ok", client="openai-node"),
            _result(3, 2, "ok"),
            _result(4, 2, "error", client="openai-node"),
        ],
        2,
    )
    assert {(m.client, m.unstable) for m in merged} == {("pi-ai", False), ("openai-node", True)}


def test_every_repeat_of_a_scenario_run_has_its_own_label():
    config = LabConfig(
        scenarios=(load_scenario(SCENARIO_DIR / "healthy.toml"),), clients=("pi-ai",), gateways=("direct",), repeat=3
    )
    assert run_labels(config) == ["healthy #1", "healthy #2", "healthy #3"]
    assert repeat_label("healthy", 1, 1) == "healthy"


@pytest.mark.parametrize("value", ["0", "-1", "three"])
def test_a_bad_repeat_is_one_line_and_exit_2(value, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["--repeat", value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: argument --repeat:")


def _cell(outcome, *, tries=1, unstable=False, mismatch=False, total_s=41.2, repeats=()):
    return {
        "scenario": "healthy",
        "dialect": "chat",
        "client": "pi-ai",
        "gateway": "envoy",
        "cell_id": "c0001",
        "outcome": Outcome(outcome),
        "why": outcome,
        "books": "ok",
        "books_mismatch": mismatch,
        "tries": tries,
        "total_s": total_s,
        "unstable": unstable,
        "repeats": list(repeats),
        "request_model": "m",
        "report": {"completed": outcome == "ok", "text": "", "reasoning": "", "tool_calls": []},
    }


def test_the_terminal_cell_shows_tries_above_one_the_books_mark_and_the_unstable_mark():
    assert cell_text(_cell("ok")) == "ok"
    assert cell_text(_cell("error", tries=3)) == "error(3)"
    assert cell_text(_cell("error", tries=3, mismatch=True, unstable=True)) == "error(3)!~"


def test_the_html_cell_shows_the_tries_and_the_seconds():
    assert cell_label(_cell("error", tries=3)) == "error &middot; 3 tries &middot; 41 s"
    assert cell_label(_cell("ok", tries=1, total_s=0.4)) == "ok &middot; 1 try &middot; 0 s"


def _repeated_result():
    repeats = [
        {"repeat": n, "cell_id": f"c{n:04d}", "outcome": o, "books": "ok", "books_mismatch": False, "tries": 1, "total_s": 1.0}
        for n, o in enumerate(["ok", "ok", "error"], start=1)
    ]
    return {
        "duration_s": 3.0,
        "repeat": 3,
        "versions": {},
        "clients": ["pi-ai"],
        "gateways": ["envoy"],
        "scenarios": [
            {
                "name": "healthy",
                "dialect": "chat",
                "title": "Healthy",
                "expected": {"text": "", "finish_reason": "stop", "tool_calls": []},
            }
        ],
        "cells": [_cell("ok", unstable=True, repeats=repeats)],
    }


def test_the_terminal_lists_each_unstable_cell_with_its_split():
    text = render_table(_repeated_result())
    assert "ok~" in text
    assert "envoy / healthy (chat) / pi-ai: ok 2 / error 1" in text


def test_the_report_shows_the_split_under_an_unstable_cell():
    page = render_html(_repeated_result())
    assert '<small class="split">ok 2 / error 1</small>' in page
    assert "each run 3 times" in page
