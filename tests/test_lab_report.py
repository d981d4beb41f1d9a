"""The matrix as text (labs/table.py) and as HTML (labs/report_html.py): same words, same cells;
and the HTML's views for a person: the versions table and the comparison with `direct`."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest

from labs.outcome import Outcome, change
from labs.report_html import render_html
from labs.table import render_table

#: Each cell its own id, as in a run.
_CELL_NUMBERS = itertools.count(1)


def _cell(scenario, client, gateway, outcome, *, books=None, mismatch=False):
    number = next(_CELL_NUMBERS)
    return {
        "scenario": scenario,
        "client": client,
        "gateway": gateway,
        "cell_id": f"c{number:04d}",
        "outcome": Outcome(outcome),
        "why": f"because {outcome}",
        "request_model": "m",
        "report": {
            "completed": outcome == "ok",
            "text": "The quick",
            "reasoning": "",
            "finish_reason": None,
            "tool_calls": [],
            "error_class": None,
            "error_message": "</script><b>x</b>",
            "ttft_s": 0.1,
            "duration_s": 0.2,
            "timed_out": outcome == "hang",
            "http_status": 200,
            "connection": None,
        },
        "books": books,
        "books_entry": {"verdict": "clean"} if books else None,
        "books_mismatch": mismatch,
    }


RESULT: dict[str, Any] = {
    "duration_s": 12.0,
    "versions": {"node": {"node": "20.20.2", "undici": "6.24.1"}, "python": {"python": "3.12.1", "openai": "3.57.0"}},
    "clients": ["openai-python", "pi-ai"],
    "gateways": ["direct", "finish_fix"],
    "scenarios": [
        {
            "name": "reason-omitted",
            "title": "omitted",
            "fault_summary": None,
            "worker_stream": "data: [DONE]",
            "expected": {"text": "The quick brown", "finish_reason": "stop", "tool_calls": 0},
        },
        {
            "name": "stall",
            "title": "stall",
            "fault_summary": "silence",
            "worker_stream": "",
            "expected": {"text": "The quick brown", "finish_reason": "stop", "tool_calls": 0},
        },
    ],
    "cells": [
        _cell("reason-omitted", "openai-python", "direct", "ok"),
        _cell("reason-omitted", "pi-ai", "direct", "error"),
        _cell("stall", "openai-python", "direct", "hang"),
        _cell("stall", "pi-ai", "direct", "silent-truncation"),
        _cell("reason-omitted", "openai-python", "finish_fix", "ok", books="ok"),
        _cell("reason-omitted", "pi-ai", "finish_fix", "error", books="ok", mismatch=True),
        _cell("stall", "openai-python", "finish_fix", "error", books="error"),
        _cell("stall", "pi-ai", "finish_fix", "flagged", books="error"),
    ],
}


def test_table_has_one_block_per_gateway_with_scenario_rows_and_client_columns():
    text = render_table(RESULT)
    assert text.index("gateway: direct") < text.index("gateway: finish_fix")
    direct_block = text[: text.index("gateway: finish_fix")].splitlines()
    assert direct_block[1].split() == ["scenario", "openai-python", "pi-ai"]
    rows = {line.split()[0]: line.split()[1:] for line in direct_block[3:] if line.strip()}
    assert rows == {"reason-omitted": ["ok", "error"], "stall": ["hang", "silent-truncation"]}


def test_table_marks_books_that_disagree_and_counts_the_books():
    text = render_table(RESULT)
    finish_fix_block = text[text.index("gateway: finish_fix") :]
    assert "error!" in finish_fix_block
    assert "ok 2" in finish_fix_block
    assert "error 2" in finish_fix_block  # the stall row's books
    assert "! the gateway's books disagree with what the client saw" in text


def test_table_summary_counts_every_outcome_word():
    assert "cells: ok 2, error 3, flagged 1, hang 1, silent-truncation 1; 8 in 12 s" in render_table(RESULT)


def test_table_colours_only_on_request():
    assert "\033[" not in render_table(RESULT)
    assert "\033[1;31msilent-truncation" in render_table(RESULT, colour=True)


def test_html_grid_uses_the_outcome_words_as_classes_and_text():
    page = render_html(RESULT)
    for outcome in Outcome:
        assert f">{outcome.value}<" in page or f">{outcome.value}<small" in page
        assert f"td.{outcome.value}" in page
    assert 'class="cell error mismatch"' in page


def test_html_is_self_contained_and_escapes_client_text():
    page = render_html(RESULT)
    assert not re.search(r"""(src|href)=["']?https?:""", page)
    # The embedded JSON must not end the script element early.
    assert "</script><b>x</b>" not in page
    assert page.count("<script") == 2


def test_a_flagged_cell_is_its_own_word_and_colour():
    assert "flagged" in render_table(RESULT).split()
    assert "\033[36mflagged" in render_table(RESULT, colour=True)
    assert 'class="cell flagged"' in render_html(RESULT)


def test_html_versions_are_a_table_of_runtime_package_version_not_json():
    page = render_html(RESULT)
    versions = page[page.index("<h2>versions</h2>") : page.index("<h2>scenarios</h2>")]
    assert '<th rowspan="2">node</th><td>node</td><td class="version">20.20.2</td>' in versions
    assert '<td>undici</td><td class="version">6.24.1</td>' in versions
    assert '<th rowspan="2">python</th><td>python</td><td class="version">3.12.1</td>' in versions
    assert "{" not in versions


@pytest.mark.parametrize(
    ("direct", "gateway", "how"),
    [
        ("ok", "ok", "same"),
        ("error", "ok", "better"),
        ("silent-truncation", "error", "better"),
        ("silent-truncation", "flagged", "better"),
        ("flagged", "error", "better"),  # a raised error reaches an application that checks nothing
        ("hang", "error", "better"),
        ("ok", "error", "worse"),
        ("error", "silent-truncation", "worse"),
        ("error", "hang", "worse"),
    ],
)
def test_a_gateways_change_is_judged_by_the_outcome_severity(direct, gateway, how):
    assert change(Outcome(direct), Outcome(gateway)) == how


def _comparison(page: str) -> str:
    return page[page.index("compared with direct") : page.index("the matrix, per gateway")]


def test_html_compares_each_gateways_cells_with_directs_per_scenario():
    comparison = _comparison(render_html(RESULT))
    # stall: openai-python hung through direct and got an error through finish_fix.
    assert re.search(r'class="cell error better" data-id="c\d+" title="because error">hang &rarr; error</td>', comparison)
    assert re.search(
        r'class="cell flagged better" data-id="c\d+" title="because flagged">silent-truncation &rarr; flagged</td>', comparison
    )
    # Unchanged cells show the word once; direct is the first row of each scenario.
    assert re.search(r'class="cell ok same" data-id="c\d+" title="because ok">ok</td>', comparison)
    grid = comparison[comparison.index('class="grid changes"') :]
    assert grid.index("<th class=baseline>direct</th>") < grid.index("<th>finish_fix</th>")
    # The tally: finish_fix made 2 cells better, none worse, left 2 the same.
    assert "<tr><th>finish_fix</th><td>2</td><td>0</td><td>2</td></tr>" in comparison


def test_html_has_no_comparison_without_direct_in_the_run():
    only_finish_fix = {
        **RESULT,
        "gateways": ["finish_fix"],
        "cells": [c for c in RESULT["cells"] if c["gateway"] == "finish_fix"],
    }
    assert "compared with direct" not in render_html(only_finish_fix)


def test_html_says_where_the_time_went_when_the_run_recorded_it():
    timed = {
        **RESULT,
        "timings": {
            "startup_s": 20.0,
            "between_s": 7.0,
            "books_s": 4.0,
            "total_s": 47.0,
            "scenarios": [
                {"name": "reason-omitted", "seconds": 3.0, "cells": 4, "seconds_per_cell": 0.75},
                {"name": "stall", "seconds": 13.0, "cells": 4, "seconds_per_cell": 3.25},
            ],
        },
    }
    page = render_html(timed)
    assert "<b>stall</b>: stall (fault: silence) <small>(13.0 s for 4 cells)</small>" in page
    assert (
        "Time: 20 s to start the worker, toxiproxy, the gateways and the driver hosts; 16 s in the scenarios; "
        "7 s between them (the gateways of the next topology); 4 s for the books and shutdown."
    ) in page
    assert "Time:" not in render_html(RESULT)


def test_html_notes_the_cells_the_spare_worker_answered():
    retried = _cell("stall", "openai-python", "litellm", "ok")
    with_spare = {
        **RESULT,
        "gateways": [*RESULT["gateways"], "litellm"],
        "cells": [*RESULT["cells"], {**retried, "answered_by": "spare", "worker_requests": {"primary": 1, "spare": 1}}],
    }
    page = render_html(with_spare)
    # In the comparison (hang through direct, the spare's full answer through litellm) and in the grid.
    assert "hang &rarr; ok<small>answered by the spare</small>" in _comparison(page)
    assert page.count("answered by the spare</small>") == 2


def test_table_counts_per_gateway_the_cells_better_or_worse_than_direct():
    text = render_table(RESULT)
    assert "compared with direct (same scenario and client):\n  finish_fix  better 2, worse 0, same 2\n" in text
    only_finish_fix = {
        **RESULT,
        "gateways": ["finish_fix"],
        "cells": [c for c in RESULT["cells"] if c["gateway"] == "finish_fix"],
    }
    assert "compared with direct" not in render_table(only_finish_fix)


# -- dialects (issue 13) ----------------------------------------------------------------------------


def _in(dialect, cell):
    return {**cell, "dialect": dialect}


NOT_ROUTED = "litellm: the lab does not yet route /v1/messages through this gateway"
DIALECTS = {
    **RESULT,
    "gateways": ["direct", "finish_fix", "litellm"],
    "clients": ["openai-python", "pi-ai", "anthropic-python"],
    "clients_by_dialect": {"chat": ["openai-python", "pi-ai"], "messages": ["anthropic-python", "pi-ai"]},
    "scenarios": [
        *({**s, "dialect": "chat"} for s in RESULT["scenarios"]),
        {
            "name": "stall",
            "dialect": "messages",
            "label": "stall (messages)",
            "title": "stall",
            "fault_summary": "silence",
            "worker_stream": "event: message_start",
            "expected": {"text": "The quick brown", "finish_reason": "end_turn", "tool_calls": 0},
        },
    ],
    "cells": [
        *(_in("chat", c) for c in RESULT["cells"]),
        _in("messages", _cell("stall", "anthropic-python", "direct", "silent-truncation")),
        _in("messages", _cell("stall", "pi-ai", "direct", "error")),
        _in("messages", _cell("stall", "anthropic-python", "finish_fix", "error", books="error")),
        _in("messages", _cell("stall", "pi-ai", "finish_fix", "error", books="error")),
    ],
    "not_applicable": [{"dialect": "messages", "gateway": "litellm", "why": NOT_ROUTED}],
}


def test_a_chat_only_run_has_no_dialect_heading():
    assert "dialect:" not in render_table(RESULT)
    assert "dialect:" not in render_html(RESULT)


def test_table_has_a_heading_per_dialect_chat_first_and_laid_out_as_before():
    text = render_table(DIALECTS)
    assert text.index("dialect: chat") < text.index("dialect: messages")
    chat = text[text.index("dialect: chat") : text.index("dialect: messages")]
    # Chat's blocks are the Chat-only run's, word for word.
    assert chat.split("\n", 3)[3] == render_table(RESULT).split("! the gateway's books")[0]
    messages = text[text.index("dialect: messages") :]
    direct = messages[messages.index("gateway: direct") : messages.index("gateway: finish_fix")].splitlines()
    # The dialect's own clients, in its order.
    assert direct[1].split() == ["scenario", "anthropic-python", "pi-ai"]
    assert direct[3].split() == ["stall", "silent-truncation", "error"]


def test_table_says_n_a_for_a_gateway_the_lab_does_not_send_the_dialect_through():
    text = render_table(DIALECTS)
    messages = text[text.index("dialect: messages") :]
    assert f"n/a  {NOT_ROUTED}\n" in messages
    # litellm has no Chat cells in this result either, and n/a only where it was not run.
    assert "gateway: litellm" not in text
    assert "n/a" not in text[: text.index("dialect: messages")]


def test_table_compares_with_direct_within_each_dialect():
    text = render_table(DIALECTS)
    assert "compared with direct (same scenario, dialect and client):\n" in text
    assert "  finish_fix (chat)      better 2, worse 0, same 2\n" in text
    # Messages: silent-truncation -> error (better), error -> error (same).
    assert "  finish_fix (messages)  better 1, worse 0, same 1\n" in text


def test_html_has_a_section_per_dialect_with_its_grids_comparison_and_n_a():
    page = render_html(DIALECTS)
    chat, messages = page.index("dialect: chat</h1>"), page.index("dialect: messages</h1>")
    assert chat < messages
    chat_section, messages_section = page[chat:messages], page[messages:]
    assert "compared with direct" in chat_section and "compared with direct" in messages_section
    assert "<th>anthropic-python</th>" in messages_section and "<th>anthropic-python</th>" not in chat_section
    assert re.search(
        r'class="cell error better" data-id="c\d+" title="because error">silent-truncation &rarr; error</td>', messages_section
    )
    assert f"<tr><th>litellm</th><td>n/a</td><td>{NOT_ROUTED}</td></tr>" in messages_section
    assert "n/a" not in chat_section
    # The scenario list names each scenario in each dialect, and a cell's details find its own.
    assert "<li><b>stall (messages)</b>: stall (fault: silence)</li>" in page
    assert "s.name + ' ' + (s.dialect ?? 'chat')" in page and "c.scenario + ' ' + (c.dialect ?? 'chat')" in page
